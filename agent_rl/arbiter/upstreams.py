"""Upstreams for the gateway that are not our own policies: any OpenAI-compatible chat-completions API.

A routing spec `openai:{"base_url": "https://api.openai.com/v1", "model": "gpt-4.1-mini", "api_key_env": "NAME"}`
loads an `OpenAIUpstream`. The key is read from the environment variable named by `api_key_env` when the
spec is loaded; the spec (stored in the pool's routing table) never holds the key itself, and a spec that
tries to (`"api_key": ...`) is refused without the value being repeated anywhere.

The gateway forwards a client's request body to `complete` (async, the fields the caller sent, with the
configured model); `act` makes the same upstream usable by the batch arbiter (/v1/ask) like any Policy.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import httpx
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, ValidationError

from agent_rl.agent.http_policy import RETRYABLE_STATUS, parse_chat_completion
from agent_rl.environments.messages import wire_messages
from agent_rl.agent.policy import Conversation, Policy, PolicyTurn, ToolSchema

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
T = TypeVar("T")


class UpstreamError(RuntimeError):
    """The upstream did not give a usable answer. `status` is what the gateway should answer with;
    `client_message` is safe to show the caller (it names no URL, key or configuration)."""

    def __init__(self, status: int, client_message: str, log_message: str) -> None:
        super().__init__(log_message)
        self.status = status
        self.client_message = client_message


class OpenAIUpstreamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(min_length=1, pattern=r"^https?://", description="OpenAI-style base URL including /v1")
    model: str = Field(min_length=1, max_length=200, description="model name sent upstream")
    api_key_env: str | None = Field(None, pattern=ENV_NAME_PATTERN,
                                    description="environment variable holding the upstream's API key (none: no key sent)")
    timeout_s: PositiveFloat = 60.0
    max_retries: NonNegativeInt = Field(2, le=5, description="extra attempts after a timeout, connection error, 429 or 5xx")
    retry_backoff_s: float = Field(0.25, ge=0, le=10)


def load_openai_upstream(raw: str) -> OpenAIUpstream:
    """The loader behind `openai:{...}` specs; errors name the bad field, never a value."""
    from agent_rl.arbiter.policy_errors import PolicyLoadError

    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise PolicyLoadError('openai upstream spec: expected openai:{"base_url": ..., "model": ..., "api_key_env": ...}') from exc
    if isinstance(data, dict) and "api_key" in data:
        raise PolicyLoadError("openai upstream spec: do not put the API key in the spec (it is stored in the pool); "
                              "set it in an environment variable on the arbiter and name that in api_key_env")
    try:
        config = OpenAIUpstreamConfig.model_validate(data)
    except ValidationError as exc:
        raise PolicyLoadError(f"openai upstream spec: {spec_problems(exc)}") from None
    return OpenAIUpstream(config)


def spec_problems(exc: Any) -> str:
    """A spec's validation errors as `field: message; ...`, without echoing the input (it may hold a secret)."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg']}"
                     for e in exc.errors(include_input=False, include_url=False))


class OpenAIUpstream(Policy):
    """An OpenAI-compatible server as a routed version."""

    def __init__(self, config: OpenAIUpstreamConfig) -> None:
        self.config = config
        self.version = f"openai:{config.model}"
        key = os.environ.get(config.api_key_env) if config.api_key_env else None
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._base = config.base_url.rstrip("/") + "/"
        self._async: dict[int, aiohttp.ClientSession] = {}  # one per event loop (tests run several)
        self._sync: httpx.Client | None = None

    # -- the gateway's path -----------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        # aiohttp, not httpx: at 64 concurrent calls httpx's connection pool cost ~4 ms of CPU per call
        # here (bench/gateway.py), which was most of the gateway's time.
        loop = id(asyncio.get_running_loop())
        session = self._async.get(loop)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                headers={**self._headers, "Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=self.config.timeout_s),
                connector=aiohttp.TCPConnector(limit=256, ttl_dns_cache=300),
            )
            self._async[loop] = session
        return session

    def _request(self, body: dict[str, Any]) -> tuple[str, bytes]:
        return self._base + "chat/completions", json.dumps(body, ensure_ascii=False).encode("utf-8")

    async def _backoff(self, attempt: int) -> None:
        """Exponential backoff before every attempt after the first (the retry policy of both request kinds)."""
        if attempt:
            await asyncio.sleep(self.config.retry_backoff_s * 2 ** (attempt - 1))

    def _gave_up(self, problem: str) -> UpstreamError:
        return UpstreamError(504 if "timed out" in problem else 502, "the upstream model did not answer; try again later",
                             f"upstream {self.config.model!r} failed after {self.config.max_retries + 1} attempt(s): "
                             f"{problem}")

    async def _with_retries(self, send: Callable[[], Awaitable[tuple[int, T]]]) -> tuple[int, T]:
        """The status and result of `send` (one request), sent again after a timeout, a connection error or a
        retryable status while attempts are left; the last attempt's answer is returned whatever its status."""
        problem = ""
        for attempt in range(self.config.max_retries + 1):
            await self._backoff(attempt)
            try:
                status, result = await send()
            except asyncio.TimeoutError:
                problem = f"timed out after {self.config.timeout_s:g} s"
                continue
            except aiohttp.ClientError as exc:
                problem = type(exc).__name__
                continue
            if status in RETRYABLE_STATUS and attempt < self.config.max_retries:
                problem = f"HTTP {status}"
                continue
            return status, result
        raise self._gave_up(problem)

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The upstream's chat completion (a dict) for `body`, with retries of transient failures."""
        body = {**body, "model": self.config.model, "stream": False}
        body.pop("stream_options", None)
        url, data = self._request(body)

        async def send() -> tuple[int, bytes]:
            async with self._session().post(url, data=data) as response:
                return response.status, await response.read()

        status, raw = await self._with_retries(send)
        return self._read(status, raw)

    async def open_stream(self, body: dict[str, Any]) -> aiohttp.ClientResponse:
        """Start a streamed completion: the upstream's response once it answered 200 (read it with `events`,
        then release it). Failures before that raise UpstreamError like `complete`, after the same retries."""
        body = {**body, "model": self.config.model, "stream": True, "stream_options": {"include_usage": True}}
        url, data = self._request(body)

        async def send() -> tuple[int, aiohttp.ClientResponse | bytes]:
            response = await self._session().post(url, data=data)
            if response.status == 200:
                return 200, response
            try:
                raw = await response.read()
            except (aiohttp.ClientError, asyncio.TimeoutError):
                raw = b""
            finally:
                response.release()
            return response.status, raw

        status, answer = await self._with_retries(send)
        if isinstance(answer, aiohttp.ClientResponse):
            return answer
        self._read(status, answer)  # raises for every error status
        raise UpstreamError(502, "the upstream model gave an unreadable answer",
                            f"upstream {self.config.model!r}: HTTP {status} to a stream request")

    @staticmethod
    async def events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
        """The JSON chunks of a server-sent-events completion, up to `data: [DONE]`."""
        async for line in response.content:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event names
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return
            chunk = json.loads(payload)
            if isinstance(chunk, dict) and chunk.get("error"):
                raise ValueError("the upstream sent an error event")
            if not isinstance(chunk, dict):
                raise ValueError("a stream chunk is not a JSON object")
            yield chunk

    def _read(self, status: int, raw: bytes) -> dict[str, Any]:
        if status in (400, 413, 422):
            # The upstream refuses this conversation (too long, bad tool schema): the caller's problem, in its words.
            raise UpstreamError(400, f"the upstream model refused the request: {_message(status, raw)}",
                                f"upstream {self.config.model!r} answered {status}")
        if status in (401, 403):
            # Our key is wrong or lacks access. The upstream's text is left out of the log too: some quote
            # part of the key they were sent.
            raise UpstreamError(502, "the upstream model is unavailable; try again later",
                                f"upstream {self.config.model!r} answered {status}: check the key in "
                                f"${self.config.api_key_env}" if self.config.api_key_env else
                                f"upstream {self.config.model!r} answered {status}: it wants an API key (api_key_env)")
        if status >= 400:
            # 404 and the like mean our configuration (URL, model) is wrong: nothing the caller may see.
            raise UpstreamError(502, "the upstream model is unavailable; try again later",
                                f"upstream {self.config.model!r} answered {status}: {_message(status, raw)}")
        try:
            payload = json.loads(raw)
            message = payload["choices"][0]["message"]
            if not isinstance(message, dict):
                raise TypeError("message is not an object")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise UpstreamError(502, "the upstream model gave an unreadable answer",
                                f"upstream {self.config.model!r}: unreadable response ({type(exc).__name__})") from None
        return payload

    async def aclose(self) -> None:
        loop = id(asyncio.get_running_loop())
        for key, session in list(self._async.items()):
            if key == loop:  # sessions of other (finished) loops cannot be closed from this one
                await session.close()
        self._async.clear()

    # -- the Policy interface (batch arbiter) ---------------------------------------------------

    def act(self, conversations: list[Conversation], tools: list[ToolSchema],
            max_new_tokens: int = 256) -> list[PolicyTurn]:  # fmt: skip
        if self._sync is None:
            self._sync = httpx.Client(base_url=self._base, headers=self._headers, timeout=self.config.timeout_s)
        turns = []
        for messages in conversations:
            body: dict[str, Any] = {"model": self.config.model, "messages": wire_messages(messages),
                                    "max_tokens": max_new_tokens}
            if tools:
                body["tools"] = tools
            turns.append(self._act_one(body))
        return turns

    def _act_one(self, body: dict[str, Any]) -> PolicyTurn:
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                time.sleep(self.config.retry_backoff_s * 2 ** (attempt - 1))
            try:
                response = self._sync.post("chat/completions", json=body)  # type: ignore[union-attr]
            except httpx.TransportError:
                continue
            if response.status_code in RETRYABLE_STATUS:
                continue
            if response.status_code >= 400:
                return PolicyTurn(parse_error=f"upstream answered HTTP {response.status_code}")
            try:
                return parse_chat_completion(response.json())
            except (ValueError, KeyError, IndexError, TypeError):
                return PolicyTurn(parse_error="upstream gave an unreadable answer")
        return PolicyTurn(parse_error="upstream did not answer")


def _message(status: int, raw: bytes) -> str:
    try:
        error = json.loads(raw).get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
    except (ValueError, AttributeError):
        pass
    return f"HTTP {status}"

"""A policy behind an OpenAI-compatible chat-completions endpoint (a vLLM server, any hosted API): native tool
calls, one concurrent request per conversation, timeouts and retries, token usage from the response."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from agent_rl.chat_client import ClosesOnExit
from agent_rl.agent.chat_format import parse_completion, parse_tool_call
from agent_rl.environments.messages import wire_messages
from agent_rl.agent.policy import Conversation, Policy, PolicyTurn, ToolCall, ToolSchema

# Worth another try: the server is busy, restarting or briefly unreachable.
RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504}
# The endpoint or credentials are wrong: every request would fail the same way.
FATAL_STATUS = {401, 403, 404}


class PolicyRequestError(RuntimeError):
    """The endpoint could not answer (unreachable, misconfigured, or still failing after retries)."""


class HttpPolicyConfig(BaseModel):
    """Where the model is served and how to call it."""

    model_config = ConfigDict(frozen=True)

    base_url: str = Field(description="OpenAI-style base URL including /v1, e.g. http://127.0.0.1:8000/v1")
    model: str = Field(description="model name sent in each request (vLLM: the served model name)")
    api_key: str | None = Field(None, description="bearer token; when unset, read from the `api_key_env` variable")
    api_key_env: str = "OPENAI_API_KEY"
    temperature: NonNegativeFloat = 0.0
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, description="sent to servers that support seeded sampling (vLLM, OpenAI)")
    timeout_s: PositiveFloat = Field(60.0, description="per request attempt")
    max_retries: NonNegativeInt = Field(2, description="extra attempts after a timeout, connection error or 5xx/429")
    retry_backoff_s: NonNegativeFloat = Field(0.5, description="first wait between attempts; doubles each time")
    concurrency: PositiveInt = Field(8, description="requests in flight at once for one batch")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="more request fields, sent as given")
    version: str | None = Field(None, description="recorded on episodes; defaults to 'http:<model>'")


class HttpPolicy(Policy, ClosesOnExit):
    """Sends each conversation of a batch as its own chat-completions request, concurrently."""

    def __init__(self, config: HttpPolicyConfig | None = None, **options: Any) -> None:
        self.config = config if config is not None else HttpPolicyConfig(**options)
        self.version = self.config.version or f"http:{self.config.model}"
        api_key = self.config.api_key or os.environ.get(self.config.api_key_env)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=self.config.base_url.rstrip("/") + "/",
            headers=headers,
            timeout=self.config.timeout_s,
            limits=httpx.Limits(max_connections=self.config.concurrency),
        )

    def close(self) -> None:
        self._client.close()

    def act(self, conversations: list[Conversation], tools: list[ToolSchema],
            max_new_tokens: int = 256) -> list[PolicyTurn]:
        if not conversations:
            return []
        bodies = [self.request_body(messages, tools, max_new_tokens) for messages in conversations]
        workers = min(self.config.concurrency, len(bodies))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="http-policy") as pool:
            return list(pool.map(self._complete, bodies))

    def request_body(self, messages: list[dict[str, Any]], tools: list[ToolSchema], max_new_tokens: int) -> dict:
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": wire_messages(messages),
            "max_tokens": max_new_tokens,
            "temperature": self.config.temperature,
            "top_p": self.config.top_p,
        }
        if tools:
            body["tools"] = tools
        if self.config.seed is not None:
            body["seed"] = self.config.seed
        body.update(self.config.extra_body)
        return body

    def _complete(self, body: dict[str, Any]) -> PolicyTurn:
        """One conversation's turn; retries transient failures, raises PolicyRequestError when out of tries."""
        problem, retry_after = "", None
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                time.sleep(self._backoff(attempt, retry_after))
                retry_after = None
            try:
                response = self._client.post("chat/completions", json=body)
            except httpx.TimeoutException:
                problem = f"timed out after {self.config.timeout_s:g} s"
                continue
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            status = response.status_code
            if status in FATAL_STATUS:
                raise PolicyRequestError(f"{self._url()} answered {status}: {_error_text(response)}")
            if status in RETRYABLE_STATUS:
                problem = f"HTTP {status}: {_error_text(response)}"
                retry_after = response.headers.get("Retry-After")
                continue
            if status >= 400:
                # The server refuses this conversation (e.g. longer than its context): that turn's error, not the batch's.
                return PolicyTurn(parse_error=f"endpoint rejected the request (HTTP {status}): {_error_text(response)}")
            try:
                return parse_chat_completion(response.json())
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                problem = f"unreadable response ({exc}): {response.text[:200]!r}"
        raise PolicyRequestError(
            f"{self._url()} failed after {self.config.max_retries + 1} attempt(s): {problem}")

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        wait = self.config.retry_backoff_s * 2 ** (attempt - 1)
        if retry_after:
            try:
                wait = max(wait, min(float(retry_after), 30.0))
            except ValueError:
                pass  # an HTTP-date Retry-After: keep our own backoff
        return wait

    def _url(self) -> str:
        return f"{self.config.base_url.rstrip('/')}/chat/completions"


def _error_text(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
    except (ValueError, AttributeError):
        pass
    return response.text[:300]


def parse_chat_completion(payload: dict[str, Any]) -> PolicyTurn:
    """The assistant turn of a chat-completions response. Native `tool_calls` are used when present; otherwise
    `<tool_call>` blocks in the text are parsed (servers started without a tool-call parser return them raw)."""
    message = payload["choices"][0]["message"]
    usage = payload.get("usage") or {}
    content = message.get("content") or ""
    native = message.get("tool_calls") or []
    if native:
        turn = PolicyTurn(content=content.strip() if isinstance(content, str) else str(content))
        errors = []
        for index, call in enumerate(native):
            try:
                parsed = _native_call(call)
            except ValueError as exc:
                errors.append(str(exc))
                continue
            parsed.id = call.get("id") or f"call_{index}"
            turn.tool_calls.append(parsed)
        turn.parse_error = "; ".join(errors) or None
    else:
        turn = parse_completion(content if isinstance(content, str) else str(content))
    turn.prompt_tokens = _int(usage.get("prompt_tokens"))
    turn.completion_tokens = _int(usage.get("completion_tokens"))
    return turn


def _native_call(call: Any) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise ValueError("tool call without a 'function' object")
    # The text parser's checks (name present, arguments an object or its JSON text) on the same data.
    return parse_tool_call(json.dumps({"name": function.get("name"), "arguments": function.get("arguments")}))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

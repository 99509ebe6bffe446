"""An OpenAI-compatible gateway: any agent built on the `openai` client runs on the arbiter by changing its base URL.

Endpoints (mounted by app.py): `POST /v1/chat/completions` (also `/s/{session}/v1/chat/completions`),
`GET /v1/models` (also under `/s/{session}`), `POST /v1/episodes/{episode_id}/end`. Callers authenticate
with their arbiter API key (keys.py); every error is OpenAI's shape `{"error": {"message", "type", "param",
"code"}}`.

Episodes. Every call belongs to one live episode:
  - named by the caller: the session in the URL (`/s/{session}/v1`, for SDKs that only take a base URL) or
    the `X-Agent-RL-Episode` header (the episode id the gateway returned works too). Names are scoped to
    the key's tenant and the declared context: another tenant's name, or id, starts an episode of its own
    and never touches this one;
  - else grouped by the conversation it extends: a call whose messages start with an episode's whole
    transcript (its last request plus the reply) continues it; anything else starts a new episode.
All calls of an episode go to the version routing picked for its first call (named sessions hash to the
version, so they stay put across workers and restarts). The episode id is in the `X-Agent-RL-Episode`
response header and in the body (`agent_rl.episode_id`, also on the final stream chunk).

Request `metadata` (OpenAI's field, string values) may declare `context` (the environment the agent works
in, stored as the episode's context; default "gateway"; the key must cover it), `environment` (the plug-in
whose tasks these are, stored as the episode's environment; default "gateway": an agent that is no plug-in,
whose declared tools are stored with the episode for SFT), `category` (the task category, stored as the
episode's; curation balances and gates on it), `task` (stored as the episode's question; default the first user
message) and `final_tool` (a tool name: a reply calling it ends
the episode).

An episode is written to the pool when it ends: `POST /v1/episodes/{id}/end`, a final-tool call, feedback on
it, the idle timeout, or the arbiter shutting down. It holds the messages exactly as the client sent them
followed by the last reply, token counts, upstream latency and the serving version; its outcome is
`unjudged` with no reward, so curation never takes it as a positive. Writes retry with backoff; an
explicit end that still cannot write answers 503 and the episode stays queued (the background flusher
keeps retrying). A request that fails validation or upstream leaves no trace in any episode.

Upstreams: our policies through `Policy.act` (messages and tools converted both ways), or an OpenAI-compatible
API (`openai:{...}` specs, upstreams.py) that gets the request forwarded. Streamed requests (`stream: true`)
to an OpenAI-compatible upstream are relayed chunk by chunk; our policies' replies are produced whole and
then sent as server-sent events. Either way the reply is recorded by the gateway, not by the client's
connection: a client that hangs up mid-stream loses nothing from its episode.

Sessions live in the worker process that served them: run the gateway with one worker, or behind a load
balancer that keeps a session on one worker. Live episodes are held in memory (at most `max_live`; beyond
it the least recently active one ends and is written): a process that is killed, not stopped, loses the
episodes it had not ended yet.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent_rl.agent.policy import Policy, PolicyTurn
from agent_rl.arbiter.keys import ApiKey
from agent_rl.arbiter.policies import PolicyLoadError
from agent_rl.arbiter.routing import public_version
from agent_rl.arbiter.upstreams import OpenAIUpstream, UpstreamError
from agent_rl.records import Episode, Outcome, utcnow

log = logging.getLogger("agent_rl.arbiter.gateway")

EPISODE_HEADER = "X-Agent-RL-Episode"
DEFAULT_CONTEXT = "gateway"
# Live traffic of an agent that is no plug-in of ours: curation and SFT take it, GRPO cannot run its tools.
DEFAULT_ENVIRONMENT = "gateway"
GATEWAY_PATH_PREFIXES = ("/v1/chat/", "/v1/models", "/v1/episodes/", "/s/")
SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
DEFAULT_MAX_TOKENS = 512
STREAM_PIECE_CHARS = 24
RECENT_WRITES = 10_000


def is_gateway_path(path: str) -> bool:
    return path.startswith(GATEWAY_PATH_PREFIXES)


# -- errors in OpenAI's shape ----------------------------------------------------------------------

_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 409: "conflict_error", 413: "invalid_request_error", 415: "invalid_request_error",
    422: "invalid_request_error", 429: "rate_limit_error",
}


def openai_error(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class GatewayError(Exception):
    """An error answered in OpenAI's shape; `log_detail` replaces the message in the log when it echoes input."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, log_detail: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers
        self.log_detail = message if log_detail is None else log_detail


# -- the request ---------------------------------------------------------------------------------


class _FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=200)
    arguments: str = Field(max_length=200_000)


class _ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str = Field(min_length=1, max_length=200)
    type: Literal["function"] = "function"
    function: _FunctionCall


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = Field(None, max_length=200)
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = Field(None, min_length=1, max_length=200)

    @model_validator(mode="after")
    def _by_role(self) -> _Message:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.role != "assistant" and self.tool_calls:
            raise ValueError("only assistant messages carry tool_calls")
        if self.role in ("system", "developer", "user", "tool") and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "assistant" and self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs content or tool_calls")
        return self


class _FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    function: _FunctionDef


class ChatRequest(BaseModel):
    """The fields the gateway reads; others are forwarded to OpenAI-compatible upstreams as sent."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=200)
    messages: list[_Message] = Field(min_length=1, max_length=4096)
    tools: list[_Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    n: int | None = Field(None, ge=1, le=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key, item in (value or {}).items():
            if not 1 <= len(key) <= 64:
                raise ValueError("keys must be 1 to 64 characters")
            if len(item) > 512:
                raise ValueError(f"value of {key!r} is over 512 characters")
        if value and "final_tool" in value and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", value["final_tool"]):
            raise ValueError("final_tool must be a tool name (letters, digits, '_' or '-')")
        if value and "context" in value and not value["context"].strip():
            raise ValueError("context must not be blank")
        if value and "environment" in value and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", value["environment"]):
            raise ValueError("environment must be an environment name (letters, digits, '_', '.' or '-')")
        if value and "category" in value and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", value["category"]):
            raise ValueError("category must be a category name (letters, digits, '_', '.' or '-')")
        return value

    @model_validator(mode="after")
    def _choice(self) -> ChatRequest:
        if isinstance(self.tool_choice, dict):
            function = self.tool_choice.get("function")
            names = {t.function.name for t in self.tools or []}
            if not isinstance(function, dict) or function.get("name") not in names:
                raise ValueError("tool_choice names a function that is not in tools")
        return self


def _param(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in ("function-after", "str", "list[dict[str,any]]", "literal['none','auto','required']", "dict[str,any]"):
            out += ("." if out else "") + str(part)
    return out


def _unstorable(value: Any, path: str = "") -> str | None:
    """The path of the first string neither pool backend can store (lone surrogate, NUL), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return path or "body" if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            bad = _unstorable(key, path) or _unstorable(item, f"{path}.{key}" if path else str(key))
            if bad:
                return bad
    elif isinstance(value, list):
        for index, item in enumerate(value):
            bad = _unstorable(item, f"{path}[{index}]")
            if bad:
                return bad
    return None


_SUSPECT_ESCAPE = re.compile(rb"\\u(?:[dD][89a-fA-F]|0000)")


def parse_chat_request(raw: bytes, content_type: str | None) -> tuple[ChatRequest, dict[str, Any]]:
    """The validated request and the body as sent (messages are stored exactly as the client wrote them)."""
    if content_type is not None and "json" not in content_type.lower():
        raise GatewayError(415, "send the body as JSON with 'Content-Type: application/json'")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise GatewayError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "the request body must be a JSON object")
    # Only a JSON escape can put a lone surrogate or NUL into a decoded string: skip the walk without one.
    bad = _unstorable(body) if _SUSPECT_ESCAPE.search(raw) else None
    if bad:
        raise GatewayError(400, f"{bad} contains invalid unicode (a lone surrogate escape or NUL)", param=bad)
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        param = _param(tuple(first.get("loc", ())))
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        if first.get("type") == "missing":
            message = "required"
        raise GatewayError(400, f"{param or 'body'}: {message}" + (f" (and {exc.error_count() - 1} more problem(s))"
                                                                    if exc.error_count() > 1 else ""),
                           param=param or None) from None
    return request, body


# -- messages between OpenAI's layout and ours -------------------------------------------------------


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text")


def to_policy_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI wire messages as our policies read them: text content, tool-call arguments as objects,
    tool results carrying the name of the tool they answer."""
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "developer":
            role = "system"
        converted: dict[str, Any] = {"role": role, "content": _text_of(message.get("content"))}
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = call["function"]
                try:
                    arguments = json.loads(function["arguments"]) if function["arguments"].strip() else {}
                except ValueError:
                    arguments = function["arguments"]
                names[call["id"]] = function["name"]
                calls.append({"id": call["id"], "type": "function",
                              "function": {"name": function["name"], "arguments": arguments}})
            converted["tool_calls"] = calls
        elif role == "tool":
            converted["tool_call_id"] = message["tool_call_id"]
            converted["name"] = message.get("name") or names.get(message["tool_call_id"], "")
        out.append(converted)
    return out


def turn_to_message(turn: PolicyTurn) -> dict[str, Any]:
    """A PolicyTurn as an OpenAI assistant message (arguments JSON-encoded, every call with an id)."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.content or None}
    if turn.tool_calls:
        message["tool_calls"] = [
            {"id": call.id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": call.name, "arguments": call.arguments if isinstance(call.arguments, str)
                          else json.dumps(call.arguments, ensure_ascii=False)}}
            for call in turn.tool_calls
        ]
    elif message["content"] is None:
        message["content"] = ""
    return message


def _canonical(message: dict[str, Any]) -> list[Any]:
    """What identifies a message when a client sends it back: SDKs add or drop empty fields
    (`refusal: null`, `content: null` vs "") when they re-serialize an assistant reply."""
    calls = [[c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")]
             for c in message.get("tool_calls") or []]
    return [message.get("role"), _text_of(message.get("content")), calls, message.get("tool_call_id")]


def prefix_hashes(messages: list[dict[str, Any]]) -> dict[int, str]:
    """Hash of messages[:i + 1] for every assistant message i (where an earlier reply can end)."""
    digest = hashlib.sha256()
    out: dict[int, str] = {}
    for index, message in enumerate(messages):
        digest.update(json.dumps(_canonical(message), ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        digest.update(b"\x1e")
        if message.get("role") == "assistant":
            out[index] = digest.hexdigest()
    return out


# -- live episodes -------------------------------------------------------------------------------


@dataclass(eq=False)
class LiveEpisode:
    episode_id: str
    tenant: str
    context: str
    task: str
    version: str
    spec: str
    session: str | None
    final_tool: str | None = None
    environment: str = DEFAULT_ENVIRONMENT
    category: str | None = None  # the caller's task category (curation balances and gates on it)
    tools: list[dict[str, Any]] | None = None  # as the client declared them on its latest call
    created_at: Any = field(default_factory=utcnow)
    messages: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    last_active: float = field(default_factory=time.monotonic)
    prefix: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    gone: bool = False  # ended or discarded: a caller that waited on the lock must look again

    def record(self) -> Episode:
        last = self.messages[-1] if self.messages else {}
        answer = _text_of(last.get("content")) or None
        if answer is None and self.final_tool:
            for call in last.get("tool_calls") or []:
                if call["function"]["name"] == self.final_tool:
                    answer = call["function"]["arguments"]
        return Episode(
            episode_id=self.episode_id, created_at=self.created_at, tenant=self.tenant, environment=self.environment,
            context=self.context, tools=self.tools, task_category=self.category,
            question=self.task, policy_version=self.version, messages=self.messages, final_answer=answer,
            outcome=Outcome.UNJUDGED, reward=None, turns=self.calls, prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens, latency_ms=round(self.latency_ms, 3),
        )


class PoolDown(RuntimeError):
    """The episode could not be written in time; it stays queued and is retried."""


class Gateway:
    """Sessions, routing, upstream calls and episode writes for the OpenAI-compatible endpoints."""

    def __init__(self, service: Any, idle_s: float = 300.0, write_retry_s: float = 3.0,
                 rate_per_s: float = 20.0, rate_burst: int = 40, max_live: int = 10_000) -> None:  # fmt: skip
        self.service = service
        self.idle_s = idle_s
        self.write_retry_s = write_retry_s
        self.rate_per_s = rate_per_s
        self.rate_burst = rate_burst
        self.max_live = max_live
        self.live: dict[str, LiveEpisode] = {}
        # Keyed by (tenant, context, ...): a key only ever reaches episodes of its tenant in contexts it may use.
        self.sessions: dict[tuple[str, str, str], LiveEpisode] = {}
        self.prefixes: dict[tuple[str, str, str], deque[LiveEpisode]] = {}
        self.pending: dict[str, Episode] = {}  # ended, not yet in the pool
        # Recently written, so that ending one again (a retry after a 503) is answered as done, not unknown.
        self.recent: OrderedDict[str, Episode] = OrderedDict()
        self.written = 0
        self._buckets: dict[str, tuple[float, float]] = {}
        self._task: asyncio.Task | None = None
        self._pumps: set[asyncio.Task] = set()  # relays of streaming upstreams in flight
        self._writes: set[asyncio.Task] = set()  # background episode writes in flight
        self._flushing = False

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.create_task(self._background(), name="gateway-flusher")

    async def close(self) -> None:
        if self._pumps:  # streams in flight finish (and are recorded) first
            await asyncio.wait(list(self._pumps), timeout=30)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for episode in list(self.live.values()):
            self._end(episode)
        await self._flush(deadline_s=max(self.write_retry_s, 5.0))
        if self.pending:
            # Nothing is dropped silently: the operators learn how many and which.
            log.error("gateway shut down with %d episode(s) not written to the pool: %s",
                      len(self.pending), sorted(self.pending))
        for policy in self.service.policies._policies.values():  # noqa: SLF001 - close upstream connections
            if isinstance(policy, OpenAIUpstream):
                await policy.aclose()

    async def _background(self) -> None:
        tick = max(0.05, min(1.0, self.idle_s / 4))
        while True:
            await asyncio.sleep(tick)
            try:
                now = time.monotonic()
                for episode in list(self.live.values()):
                    if not episode.lock.locked() and now - episode.last_active >= self.idle_s:
                        self._end(episode)
                if self.pending and not self._flushing:
                    await self._flush(deadline_s=0)
            except Exception:  # keep flushing whatever happens to one round
                log.exception("gateway background round failed")

    # -- rate limit ------------------------------------------------------------------------------

    def check_rate(self, key: ApiKey) -> None:
        now = time.monotonic()
        tokens, at = self._buckets.get(key.id, (float(self.rate_burst), now))
        tokens = min(float(self.rate_burst), tokens + (now - at) * self.rate_per_s)
        if tokens < 1:
            wait = (1 - tokens) / self.rate_per_s
            self._buckets[key.id] = (tokens, now)
            raise GatewayError(429, f"rate limit of {self.rate_per_s:g} requests per second for this API key exceeded; "
                                    f"retry after {wait:.1f} s", code="rate_limit_exceeded",
                               headers={"Retry-After": str(max(1, round(wait + 0.5)))})
        self._buckets[key.id] = (tokens - 1, now)

    # -- episodes ----------------------------------------------------------------------------------

    def _find(self, key: ApiKey, context: str, session: str | None,
              messages: list[dict[str, Any]]) -> LiveEpisode | None:  # fmt: skip
        if session is not None:
            episode = self.sessions.get((key.tenant, context, session))
            if episode is None:
                by_id = self.live.get(session)  # the episode id the gateway returned, echoed back
                if by_id is not None and by_id.tenant == key.tenant and by_id.context == context:
                    episode = by_id
            return episode
        hashes = prefix_hashes(messages)
        for index in sorted(hashes, reverse=True):
            queue = self.prefixes.get((key.tenant, context, hashes[index]))
            if queue:
                return queue[0]
        return None

    def _new(self, key: ApiKey, session: str | None, request: ChatRequest, context: str) -> LiveEpisode:
        request_key = f"gateway\0{key.tenant}\0{session}" if session is not None else None
        version, spec = self.service.router.choose(request_key)
        metadata = request.metadata or {}
        task = metadata.get("task") or next(
            (_text_of(m.content) for m in request.messages if m.role == "user"), "")
        episode = LiveEpisode(episode_id=str(uuid.uuid4()), tenant=key.tenant, context=context, task=task,
                              version=version, spec=spec, session=session,
                              environment=metadata.get("environment", DEFAULT_ENVIRONMENT),
                              category=metadata.get("category") or None)
        if len(self.live) >= self.max_live:
            self._evict()
        self.live[episode.episode_id] = episode
        if session is not None:
            self.sessions[(key.tenant, context, session)] = episode
        return episode

    def _evict(self) -> None:
        """End the least recently active idle episode (memory stays bounded; it is written, not dropped)."""
        for episode in self.live.values():  # ordered by last activity, oldest first
            if not episode.lock.locked() and episode.calls:
                log.info("gateway holds %d live episodes: ending the least recently active one", len(self.live))
                self._end_soon(episode)
                return

    def _unindex(self, episode: LiveEpisode) -> None:
        if episode.prefix is not None:
            where = (episode.tenant, episode.context, episode.prefix)
            queue = self.prefixes.get(where)
            if queue is not None:
                try:
                    queue.remove(episode)
                except ValueError:
                    pass
                if not queue:
                    del self.prefixes[where]
            episode.prefix = None

    def _forget(self, episode: LiveEpisode) -> None:
        episode.gone = True
        self.live.pop(episode.episode_id, None)
        where = (episode.tenant, episode.context, episode.session or "")
        if episode.session is not None and self.sessions.get(where) is episode:
            del self.sessions[where]
        self._unindex(episode)

    def _end(self, episode: LiveEpisode) -> Episode | None:
        """Take the episode out of serving and queue its record (None when it never completed a call)."""
        if episode.gone:
            return self.pending.get(episode.episode_id)
        self._forget(episode)
        if episode.calls == 0:
            return None
        record = episode.record()
        self.pending[episode.episode_id] = record
        return record

    async def _write(self, record: Episode) -> None:
        await asyncio.get_running_loop().run_in_executor(self.service.executor, self.service.pool.insert_episodes, [record])
        if self.pending.pop(record.episode_id, None) is not None:
            self.written += 1
            self.recent[record.episode_id] = record.model_copy(update={"messages": []})
            while len(self.recent) > RECENT_WRITES:
                self.recent.popitem(last=False)

    async def _write_retrying(self, record: Episode, deadline_s: float) -> None:
        """Write with backoff (0.05 s doubling, at most 1 s apart) until it lands or `deadline_s` passes."""
        deadline = time.monotonic() + deadline_s
        wait = 0.05
        while True:
            try:
                await self._write(record)
                return
            except Exception as exc:
                if record.episode_id not in self.pending:
                    return  # written meanwhile by another path
                if time.monotonic() + wait > deadline:
                    log.warning("episode %s not written to the pool yet (%s); it stays queued",
                                record.episode_id, type(exc).__name__)
                    raise PoolDown(type(exc).__name__) from exc
                await asyncio.sleep(wait)
                wait = min(wait * 2, 1.0)

    async def _flush(self, deadline_s: float) -> None:
        self._flushing = True
        try:
            for record in list(self.pending.values()):
                try:
                    await self._write_retrying(record, deadline_s)
                except PoolDown:
                    return  # the pool is down: try the rest on the next round
        finally:
            self._flushing = False

    def _end_soon(self, episode: LiveEpisode) -> None:
        record = self._end(episode)
        if record is not None:
            task = asyncio.create_task(self._write_background(record))
            self._writes.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._writes.discard)

    async def _write_background(self, record: Episode) -> None:
        try:
            await self._write_retrying(record, self.write_retry_s)
        except PoolDown:
            pass  # queued; the background round retries

    async def end(self, key: ApiKey, episode_id: str) -> tuple[Episode | None, bool]:
        """End a live episode of this key's tenant and write it now. Returns (record, was_live).

        Raises PoolDown when the write did not land within the retry budget (the episode stays queued).
        """
        episode = self.live.get(episode_id)
        record = None
        if episode is not None and episode.tenant == key.tenant and key.may_use(episode.context):
            async with episode.lock:
                record = self._end(episode)
        else:
            queued = self.pending.get(episode_id) or self.recent.get(episode_id)
            if queued is not None and queued.tenant == key.tenant and key.may_use(queued.inbox_id):
                record = queued
        if record is None:
            return None, False
        if record.episode_id in self.pending:
            await self._write_retrying(record, self.write_retry_s)
        return record, True

    # -- a call --------------------------------------------------------------------------------------

    async def complete(self, key: ApiKey, session: str | None, request: ChatRequest,
                       body: dict[str, Any]) -> tuple[dict[str, Any] | AsyncIterator[bytes], LiveEpisode, float | None]:  # fmt: skip
        """The completion, its episode and the seconds the upstream took; for a streamed request to an
        OpenAI-compatible upstream, the server-sent events relayed as they come (and None for the seconds)."""
        metadata = request.metadata or {}
        context = metadata.get("context", DEFAULT_CONTEXT).strip()
        if not key.may_use(context):
            raise GatewayError(403, "this API key may not use the requested context", param="metadata.context",
                               log_detail=f"key {key.id!r} may not use the requested context")
        messages = body["messages"]
        while True:
            episode = self._find(key, context, session, messages) or self._new(key, session, request, context)
            await episode.lock.acquire()
            if episode.gone:
                episode.lock.release()
                continue  # ended or discarded while this call waited; look again
            handed_over = False
            try:
                policy = await self._policy(episode.spec)
                if request.stream and isinstance(policy, OpenAIUpstream):
                    relay = await self._start_relay(episode, policy, request, body)
                    handed_over = True  # the relay's pump releases the lock when the upstream is done
                    return relay, episode, None
                message, usage, seconds = await self._call_upstream(episode, policy, request, body)
                self._append(episode, request, messages, message, usage, seconds)
                ended = self._ends(episode, message)
                if ended:
                    self._end_soon(episode)
                return self._response(episode, message, usage, ended), episode, seconds
            except BaseException:
                if episode.calls == 0:
                    self._forget(episode)  # a failed first call leaves no episode behind
                raise
            finally:
                if not handed_over:
                    episode.lock.release()

    @staticmethod
    def _ends(episode: LiveEpisode, message: dict[str, Any]) -> bool:
        return bool(episode.final_tool) and any(
            call["function"]["name"] == episode.final_tool for call in message.get("tool_calls") or [])

    async def _start_relay(self, episode: LiveEpisode, policy: OpenAIUpstream, request: ChatRequest,
                           body: dict[str, Any]) -> AsyncIterator[bytes]:  # fmt: skip
        """Open the upstream's stream (errors before its first byte are answered with a status code), then
        pump it into a queue from a task of its own: a client that hangs up stops reading, never the pump,
        so the reply is recorded whole."""
        forwarded = {k: v for k, v in body.items() if k not in ("metadata", "stream", "stream_options")}
        started = time.perf_counter()
        try:
            response = await policy.open_stream(forwarded)
        except UpstreamError as exc:
            log.error("gateway upstream for version %s: %s", episode.version, exc)
            raise GatewayError(exc.status, exc.client_message, code="upstream_error") from exc
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        include_usage = bool((request.stream_options or {}).get("include_usage"))
        task = asyncio.create_task(self._pump(episode, policy, request, body, response, queue, include_usage, started))
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)

        async def relay() -> AsyncIterator[bytes]:
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield item

        return relay()

    async def _pump(self, episode: LiveEpisode, policy: OpenAIUpstream, request: ChatRequest, body: dict[str, Any],
                    response: Any, queue: asyncio.Queue, include_usage: bool, started: float) -> None:  # fmt: skip
        content: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        finish, usage, held, first = None, None, None, None
        complete = False
        try:
            async for chunk in policy.events(response):
                chunk["model"] = public_version(episode.version)
                first = first or chunk
                if chunk.get("usage"):
                    usage = chunk["usage"]
                choices = chunk.get("choices") or []
                for choice in choices:
                    delta = choice.get("delta") or {}
                    if isinstance(delta.get("content"), str):
                        content.append(delta["content"])
                    for call in delta.get("tool_calls") or []:
                        slot = calls.setdefault(int(call.get("index", 0)), {"id": "", "name": "", "arguments": ""})
                        slot["id"] = call.get("id") or slot["id"]
                        function = call.get("function") or {}
                        slot["name"] += function.get("name") or ""
                        slot["arguments"] += function.get("arguments") or ""
                    finish = choice.get("finish_reason") or finish
                if not choices:
                    continue  # the usage chunk: sent at the end when the client asked for it
                if any(choice.get("finish_reason") for choice in choices):
                    held = chunk  # sent last, with the episode id
                    continue
                queue.put_nowait(_sse_bytes(chunk))
            complete = True
        except Exception as exc:  # noqa: BLE001 - whatever broke, the client gets an error event, nothing is recorded
            log.error("gateway upstream stream for version %s broke: %s", episode.version, type(exc).__name__)
            queue.put_nowait(_sse_bytes(openai_error(502, "the upstream model stopped answering mid-stream; try again",
                                                     code="upstream_error")))
        try:
            if complete:
                message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
                if calls:
                    message["tool_calls"] = [
                        {"id": c["id"] or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                         "function": {"name": c["name"], "arguments": c["arguments"]}}
                        for _, c in sorted(calls.items())]
                elif message["content"] is None:
                    message["content"] = ""
                counts = _usage((usage or {}).get("prompt_tokens"), (usage or {}).get("completion_tokens"))
                self._append(episode, request, body["messages"], message, counts, time.perf_counter() - started)
                ended = self._ends(episode, message)
                if ended:
                    self._end_soon(episode)
                meta = {"episode_id": episode.episode_id, "policy_version": public_version(episode.version),
                        "episode_ended": ended}
                base = {"id": (first or {}).get("id", f"chatcmpl-{uuid.uuid4().hex}"), "object": "chat.completion.chunk",
                        "created": (first or {}).get("created", int(time.time())),
                        "model": public_version(episode.version)}
                final = held or {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                      "finish_reason": finish or ("tool_calls" if calls else "stop")}]}
                queue.put_nowait(_sse_bytes({**final, "agent_rl": meta}))
                if include_usage:
                    total = counts["prompt_tokens"] + counts["completion_tokens"]
                    queue.put_nowait(_sse_bytes({**base, "choices": [], "usage": {**counts, "total_tokens": total},
                                                 "agent_rl": meta}))
            elif episode.calls == 0:
                self._forget(episode)
        finally:
            queue.put_nowait(b"data: [DONE]\n\n")
            queue.put_nowait(None)
            response.release()
            episode.lock.release()

    def _append(self, episode: LiveEpisode, request: ChatRequest, messages: list[dict[str, Any]],
                message: dict[str, Any], usage: dict[str, int], seconds: float) -> None:  # fmt: skip
        final_tool = (request.metadata or {}).get("final_tool")
        if final_tool:
            episode.final_tool = final_tool
        if request.tools:
            episode.tools = [t.model_dump(mode="json", exclude_none=True) for t in request.tools]
        episode.messages = [*messages, message]
        episode.calls += 1
        episode.prompt_tokens += usage["prompt_tokens"]
        episode.completion_tokens += usage["completion_tokens"]
        episode.latency_ms += seconds * 1000
        episode.last_active = time.monotonic()
        self.live.pop(episode.episode_id, None)
        self.live[episode.episode_id] = episode  # keep `live` ordered by last activity
        if episode.session is None:
            self._unindex(episode)
            episode.prefix = prefix_hashes(episode.messages)[len(episode.messages) - 1]
            self.prefixes.setdefault((episode.tenant, episode.context, episode.prefix), deque()).append(episode)

    async def _policy(self, spec: str) -> Policy:
        policies = self.service.policies
        if policies.is_loaded(spec):
            return policies.get(spec)
        try:
            return await asyncio.get_running_loop().run_in_executor(self.service.executor, policies.get, spec)
        except PolicyLoadError as exc:
            log.error("policy cannot be loaded for a gateway request: %s", exc)
            raise GatewayError(503, "the model version chosen for this episode cannot be loaded; try again later",
                               code="model_unavailable") from exc

    async def _call_upstream(self, episode: LiveEpisode, policy: Policy, request: ChatRequest,
                             body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int], float]:  # fmt: skip
        started = time.perf_counter()
        if isinstance(policy, OpenAIUpstream):
            forwarded = {k: v for k, v in body.items() if k not in ("metadata", "stream", "stream_options")}
            try:
                payload = await policy.complete(forwarded)
            except UpstreamError as exc:
                log.error("gateway upstream for version %s: %s", episode.version, exc)
                raise GatewayError(exc.status, exc.client_message, code="upstream_error") from exc
            seconds = time.perf_counter() - started
            message = dict(payload["choices"][0]["message"])
            message["role"] = "assistant"
            for extra in ("refusal", "annotations", "audio", "function_call", "reasoning_content"):
                if message.get(extra) in (None, [], ""):
                    message.pop(extra, None)
            usage = payload.get("usage") or {}
            return message, _usage(usage.get("prompt_tokens"), usage.get("completion_tokens")), seconds
        tools = [] if request.tool_choice == "none" else body.get("tools") or []
        conversation = to_policy_messages(body["messages"])
        max_tokens = request.max_completion_tokens or request.max_tokens or DEFAULT_MAX_TOKENS
        try:
            turns = await asyncio.get_running_loop().run_in_executor(
                self.service.executor, policy.act, [conversation], tools, max_tokens)
            turn = turns[0]
        except Exception as exc:
            log.error("gateway policy for version %s failed: %s: %s", episode.version, type(exc).__name__, exc)
            raise GatewayError(502, "the model failed to answer; try again later", code="upstream_error") from exc
        seconds = time.perf_counter() - started
        return turn_to_message(turn), _usage(turn.prompt_tokens, turn.completion_tokens), seconds

    def _response(self, episode: LiveEpisode, message: dict[str, Any], usage: dict[str, int],
                  ended: bool) -> dict[str, Any]:  # fmt: skip
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": public_version(episode.version),
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]},
            "agent_rl": {"episode_id": episode.episode_id, "policy_version": public_version(episode.version),
                         "episode_ended": ended},
        }


def _usage(prompt: Any, completion: Any) -> dict[str, int]:
    def count(value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
    return {"prompt_tokens": count(prompt), "completion_tokens": count(completion)}


# -- streaming -----------------------------------------------------------------------------------


def stream_chunks(response: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A finished completion as the chunks OpenAI streams: role, content pieces, tool calls (name, then
    argument pieces, by index), the finish reason, and the usage chunk when asked for."""
    base = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
            "model": response["model"]}
    choice = response["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    content = message.get("content") or ""
    for start in range(0, len(content), STREAM_PIECE_CHARS):
        chunks.append(chunk({"content": content[start:start + STREAM_PIECE_CHARS]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                              "function": {"name": call["function"]["name"], "arguments": ""}}]}))
        arguments = call["function"]["arguments"]
        for start in range(0, len(arguments), STREAM_PIECE_CHARS):
            chunks.append(chunk({"tool_calls": [{"index": index,
                                                 "function": {"arguments": arguments[start:start + STREAM_PIECE_CHARS]}}]}))
    final = chunk({}, choice["finish_reason"])
    final["agent_rl"] = response["agent_rl"]
    chunks.append(final)
    if include_usage:
        chunks.append({**base, "choices": [], "usage": response["usage"], "agent_rl": response["agent_rl"]})
    return chunks


def _sse_bytes(item: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


async def _sse(chunks: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    for item in chunks:
        yield _sse_bytes(item)
    yield b"data: [DONE]\n\n"


# -- routes --------------------------------------------------------------------------------------


def _session_of(request: Request, path_session: str | None) -> str | None:
    header = request.headers.get(EPISODE_HEADER)
    if header is not None:
        header = header.strip()
    for where, value in (("the session in the URL", path_session), (f"the {EPISODE_HEADER} header", header)):
        if value is not None and not SESSION_RE.fullmatch(value):
            raise GatewayError(400, f"{where} must be 1 to 128 letters, digits, '.', '_', ':' or '-', "
                                    "starting with a letter or digit", param="session")
    if path_session is not None and header is not None and header != path_session:
        raise GatewayError(400, f"the {EPISODE_HEADER} header and the session in the URL name different episodes",
                           param="session")
    return path_session if path_session is not None else header


def add_gateway_routes(app: FastAPI, require_key: Callable[[Request], ApiKey],
                       gateway_of: Callable[[Request], Gateway]) -> None:  # fmt: skip
    """Mount the gateway's endpoints; `require_key` authenticates (raising the app's 401/403)."""

    async def chat(request: Request, session: str | None) -> Any:
        key = require_key(request)
        gateway = gateway_of(request)
        gateway.check_rate(key)
        session = _session_of(request, session)
        parsed, body = parse_chat_request(await request.body(), request.headers.get("content-type"))
        response, episode, upstream_seconds = await gateway.complete(key, session, parsed, body)
        headers = {EPISODE_HEADER: episode.episode_id}
        if not isinstance(response, dict):  # relayed from a streaming upstream as it comes
            return StreamingResponse(response, media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        request.state.episode_ms = upstream_seconds * 1000  # Server-Timing: the rest of `total` is the gateway's
        if parsed.stream:
            include_usage = bool((parsed.stream_options or {}).get("include_usage"))
            return StreamingResponse(_sse(stream_chunks(response, include_usage)), media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        return JSONResponse(response, headers=headers)

    async def models(request: Request) -> dict[str, Any]:
        require_key(request)
        split = gateway_of(request).service.router.current()
        now = int(time.time())
        names = ["agent-rl", *(public_version(v) for v in split.versions)]
        return {"object": "list", "data": [{"id": name, "object": "model", "created": now, "owned_by": "agent-rl"}
                                           for name in names]}

    body_schema = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": ChatRequest.model_json_schema()}}}}  # the handler parses the body itself

    @app.post("/v1/chat/completions", tags=["gateway"], openapi_extra=body_schema)
    async def chat_completions(request: Request) -> Any:
        return await chat(request, None)

    @app.post("/s/{session}/v1/chat/completions", tags=["gateway"], openapi_extra=body_schema)
    async def session_chat_completions(request: Request, session: str) -> Any:
        return await chat(request, session)

    @app.get("/v1/models", tags=["gateway"])
    async def list_models(request: Request) -> dict[str, Any]:
        return await models(request)

    @app.get("/s/{session}/v1/models", tags=["gateway"])
    async def session_models(request: Request, session: str) -> dict[str, Any]:
        return await models(request)

    @app.post("/v1/episodes/{episode_id}/end", tags=["gateway"])
    async def end_episode(request: Request, episode_id: str) -> dict[str, Any]:
        key = require_key(request)
        gateway = gateway_of(request)
        if not SESSION_RE.fullmatch(episode_id):
            raise GatewayError(404, "no live episode with this id", param="episode_id")
        try:
            record, found = await gateway.end(key, episode_id)
        except PoolDown as exc:
            raise GatewayError(503, "the benchmark pool is unavailable; the episode is kept and will be written "
                                    "when it is back (ending it again is safe)", code="pool_unavailable",
                               headers={"Retry-After": "2"}) from exc
        if not found:
            raise GatewayError(404, "no live episode with this id", param="episode_id")
        return {"episode_id": episode_id, "ended": True, "written": True,
                "policy_version": public_version(record.policy_version) if record else None,
                "turns": record.turns if record else 0}



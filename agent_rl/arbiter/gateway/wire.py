"""The OpenAI chat-completions wire format as the gateway speaks it: the request it reads, its errors, its replies.

Every error is OpenAI's shape `{"error": {"message", "type", "param", "code"}}`, with `param` naming the
field at fault. A request is validated before anything else happens, so one that fails leaves no trace in
any episode; the body is kept as sent, because messages are stored exactly as the client wrote them. A body
nested more than `json_walk.MAX_JSON_DEPTH` (32) levels deep (a tool schema counts from the body's root), or
holding a string of JSON nested that deep (a tool result, tool-call arguments, a content written as JSON), is
refused with a 400 `json_too_deep` naming the field, before any upstream is asked.

Request `metadata` (OpenAI's field, string values) may declare `context` (the environment the agent works
in, stored as the episode's context; default "gateway"; the key must cover it), `environment` (the plug-in
whose tasks these are, stored as the episode's environment; default "gateway": an agent that is no plug-in,
whose declared tools are stored with the episode for SFT), `category` (the task category, stored as the
episode's; curation balances and gates on it), `task` (stored as the episode's question; default the first user
message) and `final_tool` (a tool name: a reply calling it ends the episode). Fields the gateway does not
read are forwarded to OpenAI-compatible upstreams as sent.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent_rl.json_walk import MAX_JSON_DEPTH, too_deep, walk


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


def store_unavailable(store: str, exc: Exception) -> GatewayError:
    """503 for a store that cannot be read or written now: the caller may retry; the cause goes to the log only."""
    return GatewayError(503, f"the {store} is unavailable; try again later", code="storage_unavailable",
                        headers={"Retry-After": "5"}, log_detail=str(exc))


def object_not_found(kind: str, given: str, well_formed: bool, param: str, code: str) -> GatewayError:
    """404 for an object id that is missing or another tenant's: one answer for both, and the id echoed only when
    it has the shape of one of ours (`well_formed`), so the message never carries more than the caller's own id."""
    shown = f": {given}" if well_formed else ""
    return GatewayError(404, f"No such {kind}{shown}", param=param, code=code,
                        log_detail=f"a {kind} that is missing or another tenant's")


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


def _unstorable_text(text: Any) -> bool:
    """Whether `text` is a string neither pool backend can store (a lone surrogate, NUL)."""
    if not isinstance(text, str):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return "\x00" in text


def _unstorable(body: Any) -> str | None:
    """The path of the first string neither pool backend can store, or None; a bad key is named by the path
    of the object that holds it."""
    for path, parent, key, node in walk(body):
        if _unstorable_text(key):
            return parent or "body"
        if _unstorable_text(node):
            return path or "body"
    return None


def too_deep_message(where: str) -> str:
    """What a request nested past MAX_JSON_DEPTH is told: the field, the limit, how it is counted; never the content."""
    where = "the request body" if where == "body" else where
    return (f"{where} is nested more than {MAX_JSON_DEPTH} levels deep (objects and arrays, counted in the body and "
            "in each string that holds JSON, such as tool results and tool-call arguments); send it flatter")


def _nested_too_deep(where: str) -> GatewayError:
    return GatewayError(400, too_deep_message(where), param=None if where == "body" else where, code="json_too_deep")


_SUSPECT_ESCAPE = re.compile(rb"\\u(?:[dD][89a-fA-F]|0000)")


def parse_chat_request(raw: bytes, content_type: str | None) -> tuple[ChatRequest, dict[str, Any]]:
    """The validated request and the body as sent (messages are stored exactly as the client wrote them)."""
    if content_type is not None and "json" not in content_type.lower():
        raise GatewayError(415, "send the body as JSON with 'Content-Type: application/json'")
    try:
        body = json.loads(raw.decode("utf-8"))
    except RecursionError:  # nested past what the parser takes
        raise _nested_too_deep("body") from None
    except (UnicodeDecodeError, ValueError):
        raise GatewayError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "the request body must be a JSON object")
    # Before anything reads the body further, and long before an upstream is asked: what nests deeper than the
    # pool's readers can walk (tool schemas, tool results, arguments, contents written as JSON) never gets in.
    deep = too_deep(body)
    if deep:
        raise _nested_too_deep(deep)
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


# -- replies -------------------------------------------------------------------------------------


def usage_counts(prompt: Any, completion: Any) -> dict[str, int]:
    """Token counts as OpenAI's `usage` holds them; what an upstream left out or garbled counts 0."""
    def count(value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
    return {"prompt_tokens": count(prompt), "completion_tokens": count(completion)}


def completion_body(message: dict[str, Any], usage: dict[str, int], meta: dict[str, Any]) -> dict[str, Any]:
    """A whole `chat.completion` for `message`; `meta` is the gateway's `agent_rl` field (episode id, the
    serving version's public name as `policy_version`, whether the episode ended)."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": meta["policy_version"],
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
        "usage": {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]},
        "agent_rl": meta,
    }

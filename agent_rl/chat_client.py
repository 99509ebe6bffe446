"""A small client for OpenAI-compatible chat-completions endpoints, with timeouts and retries.

The LLM scenario generator and the LLM judge both talk to such an endpoint and both need the
same thing: send messages, get text back, retry on transient failures or unusable replies.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Self, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat

T = TypeVar("T")


class ChatEndpoint(BaseModel):
    """Where and how to call an OpenAI-compatible `/chat/completions` endpoint."""

    model_config = ConfigDict(frozen=True)

    base_url: str = Field(description="API root including the version, e.g. http://127.0.0.1:8000/v1")
    model: str = Field(description="model name sent in every request")
    api_key_env: str | None = Field(
        default="OPENAI_API_KEY", description="environment variable holding the API key; unset means no auth header"
    )
    timeout_s: PositiveFloat = Field(default=60.0, description="per-request timeout")
    max_retries: NonNegativeInt = Field(default=2, description="extra attempts after the first one fails")
    retry_backoff_s: NonNegativeFloat = Field(default=0.5, description="sleep before retry n is n times this")
    temperature: float = 0.0
    max_tokens: int | None = None
    json_mode: bool = Field(
        default=True, description="send response_format=json_object (turn off for servers that reject it)"
    )

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


class ChatEndpointError(RuntimeError):
    """The endpoint kept failing (network, HTTP status or unusable replies) after all retries."""


class ChatReply(BaseModel):
    content: str
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ClosesOnExit:
    """`with holder:` calls `holder.close()` on leaving: the classes that hold an HTTP connection pool (ChatClient,
    HttpPolicy, the model judge) share this, so each says only what its `close` releases."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChatClient(ClosesOnExit):
    """Calls one endpoint; `complete` retries until `parse` accepts the reply or attempts run out."""

    def __init__(self, endpoint: ChatEndpoint, *, transport: httpx.BaseTransport | None = None) -> None:
        self.endpoint = endpoint
        headers = {"Content-Type": "application/json"}
        key = endpoint.api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.Client(
            base_url=endpoint.base_url.rstrip("/"), headers=headers, timeout=endpoint.timeout_s, transport=transport
        )
        self.attempts = 0  # counts every HTTP attempt, for reports

    def close(self) -> None:
        self._http.close()

    def _post(self, messages: list[dict[str, Any]], json_response: bool) -> ChatReply:
        payload: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": messages,
            "temperature": self.endpoint.temperature,
        }
        if self.endpoint.max_tokens is not None:
            payload["max_tokens"] = self.endpoint.max_tokens
        if json_response and self.endpoint.json_mode:
            payload["response_format"] = {"type": "json_object"}
        self.attempts += 1
        response = self._http.post("/chat/completions", json=payload)
        if response.status_code >= 400:
            raise _HTTPStatus(response.status_code, response.text[:300])
        try:
            data = response.json()
            message = data["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"response is not a chat completion: {response.text[:200]!r}") from exc
        usage = data.get("usage") or {}
        return ChatReply(
            content=message.get("content") or "",
            tool_calls=message.get("tool_calls") or [],
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        )

    def complete(
        self,
        messages: list[dict[str, Any]],
        parse: Callable[[ChatReply], T],
        *,
        json_response: bool = True,
    ) -> T:
        """Send `messages`; return `parse(reply)`. A ValueError from `parse` counts as a failed attempt."""
        errors: list[str] = []
        for attempt in range(self.endpoint.max_retries + 1):
            if attempt and self.endpoint.retry_backoff_s:
                time.sleep(self.endpoint.retry_backoff_s * attempt)
            try:
                return parse(self._post(messages, json_response))
            except _HTTPStatus as exc:
                errors.append(f"HTTP {exc.status}: {exc.body}")
                # Client errors other than rate limiting will not get better by asking again.
                if exc.status < 500 and exc.status != 429:
                    break
            except httpx.TimeoutException:
                errors.append(f"timed out after {self.endpoint.timeout_s}s")
            except httpx.HTTPError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            except ValueError as exc:
                errors.append(f"unusable reply: {exc}")
        raise ChatEndpointError(
            f"chat endpoint {self.endpoint.base_url} (model {self.endpoint.model!r}) failed after "
            f"{len(errors)} attempt(s): " + "; ".join(errors)
        )


class _HTTPStatus(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body


def extract_json(text: str) -> Any:
    """The JSON value in a model reply, tolerating ```json fences and prose around one object or list."""
    import json

    cleaned = text.strip()
    if cleaned.startswith("```"):
        cleaned = cleaned.strip("`")
        if cleaned.lower().startswith("json"):
            cleaned = cleaned[4:]
    try:
        return json.loads(cleaned)
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    for i, ch in enumerate(cleaned):
        if ch in "[{":
            try:
                value, _ = decoder.raw_decode(cleaned[i:])
                return value
            except ValueError:
                continue
    raise ValueError(f"no JSON found in reply {text[:120]!r}")

"""A real local HTTP server speaking the OpenAI chat-completions protocol, scripted by the test.

Usage (the fixture starts a server on 127.0.0.1 and stops it after the test):

    from tests.openai_stub import openai_stub, reply, tool_call, fail, delay  # noqa: F401 (fixture)

    def test_something(openai_stub):
        openai_stub.script(lambda request: "plain text answer")          # every request
        openai_stub.queue(fail(500), delay(2.0, "late"), reply("ok"))     # or one reply per request, in order
        client_base_url = openai_stub.url                                 # "http://127.0.0.1:PORT/v1"
        ...
        assert openai_stub.requests[0]["messages"][-1]["content"] == "..."

A responder gets the request JSON and returns one of:
  - a str: the assistant message content;
  - a dict: the assistant message itself (`{"content": ..., "tool_calls": [...]}`);
  - `reply(content, tool_calls=..., usage=...)`, `fail(status, body)`, `delay(seconds, then)`,
    `malformed(raw_text)` for a non-JSON HTTP 200 body.
Queued replies are used first; when the queue is empty the scripted responder answers (default:
"ok"). Endpoints: POST /v1/chat/completions, GET /v1/models. Streaming requests get 400 unless
`openai_stub.streams = True`: then the reply comes as server-sent events (role, content pieces, tool
calls by index with their arguments in pieces, the finish reason, usage when `stream_options.include_usage`).
Set `openai_stub.require_api_key = "sk-..."` to answer 401 to requests without that bearer token.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Reply:
    content: str | None = ""
    tool_calls: list[dict[str, Any]] | None = None
    usage: dict[str, int] | None = None
    finish_reason: str | None = None


@dataclass
class Fail:
    status: int = 500
    body: str = '{"error": {"message": "stub failure", "type": "server_error"}}'


@dataclass
class Delay:
    seconds: float
    then: Any = "ok"


@dataclass
class Malformed:
    raw: str = "this is not json"


def reply(content: str | None = "", tool_calls: list[dict[str, Any]] | None = None, usage: dict[str, int] | None = None,
          finish_reason: str | None = None) -> Reply:  # fmt: skip
    return Reply(content, tool_calls, usage, finish_reason)


def fail(status: int = 500, body: str | None = None) -> Fail:
    return Fail(status, body) if body is not None else Fail(status)


def delay(seconds: float, then: Any = "ok") -> Delay:
    return Delay(seconds, then)


def malformed(raw: str = "this is not json") -> Malformed:
    return Malformed(raw)


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    """One OpenAI tool call; arguments are JSON-encoded as the protocol wants."""
    return {
        "id": call_id or f"call_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
    }


Responder = Callable[[dict[str, Any]], Any]


@dataclass
class OpenAIStub:
    """The server state a test scripts and inspects."""

    host: str = "127.0.0.1"
    port: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    require_api_key: str | None = None
    streams: bool = False
    _responder: Responder = field(default=lambda request: "ok")
    _queue: deque = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL including /v1, as OpenAI clients expect."""
        return f"http://{self.host}:{self.port}/v1"

    def script(self, responder: Responder) -> None:
        """Answer every (unqueued) request with `responder(request_json)`."""
        self._responder = responder

    def queue(self, *replies: Any) -> None:
        """Answer the next requests with these replies, in order, before falling back to the script."""
        with self._lock:
            self._queue.extend(replies)

    def _next(self, request: dict[str, Any]) -> Any:
        with self._lock:
            self.requests.append(request)
            if self._queue:
                return self._queue.popleft()
        return self._responder(request)

    def start(self) -> OpenAIStub:
        self._server = ThreadingHTTPServer((self.host, self.port), _handler_for(self))
        self._server.daemon_threads = True  # a handler still sleeping in `delay` must not block shutdown
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="openai-stub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _completion(request: dict[str, Any], message: dict[str, Any], usage: dict[str, int] | None,
                finish_reason: str | None) -> dict[str, Any]:  # fmt: skip
    prompt_chars = sum(len(str(m.get("content") or "")) for m in request.get("messages", []))
    completion_chars = len(message.get("content") or "") + len(json.dumps(message.get("tool_calls") or []))
    usage = usage or {"prompt_tokens": max(1, prompt_chars // 4), "completion_tokens": max(1, completion_chars // 4)}
    usage.setdefault("total_tokens", usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0))
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "stub"),
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": finish_reason or ("tool_calls" if message.get("tool_calls") else "stop"),
        }],  # fmt: skip
        "usage": usage,
    }


def _chunks(completion: dict[str, Any], include_usage: bool, piece: int = 7) -> list[dict[str, Any]]:
    """A completion as the chunks OpenAI streams."""
    base = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"]}
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content") or ""
    out += [chunk({"content": text[i:i + piece]}) for i in range(0, len(text), piece)]
    for index, call in enumerate(message.get("tool_calls") or []):
        out.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                          "function": {"name": call["function"]["name"], "arguments": ""}}]}))
        arguments = call["function"]["arguments"]
        out += [chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[i:i + piece]}}]})
                for i in range(0, len(arguments), piece)]
    out.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        out.append({**base, "choices": [], "usage": completion["usage"]})
    return out


def _handler_for(stub: OpenAIStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

        def _send(self, status: int, body: str, content_type: str = "application/json") -> None:
            data = body.encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test); nothing to deliver

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, json.dumps({"object": "list", "data": [{"id": "stub", "object": "model"}]}))
            else:
                self._send(404, '{"error": {"message": "not found"}}')

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, '{"error": {"message": "only /v1/chat/completions is served"}}')
                return
            if stub.require_api_key and self.headers.get("Authorization") != f"Bearer {stub.require_api_key}":
                self._send(401, '{"error": {"message": "invalid api key", "type": "invalid_request_error"}}')
                return
            try:
                request = json.loads(raw)
            except ValueError:
                self._send(400, '{"error": {"message": "request body is not JSON"}}')
                return
            if request.get("stream") and not stub.streams:
                self._send(400, '{"error": {"message": "the stub does not stream"}}')
                return
            stub.headers.append(dict(self.headers.items()))
            try:
                outcome = stub._next(request)
                while isinstance(outcome, Delay):
                    time.sleep(outcome.seconds)
                    outcome = outcome.then
            except Exception as exc:  # a broken responder should fail the test loudly, not hang it
                self._send(500, json.dumps({"error": {"message": f"stub responder raised {exc!r}"}}))
                return
            if isinstance(outcome, Fail):
                self._send(outcome.status, outcome.body)
            elif isinstance(outcome, Malformed):
                self._send(200, outcome.raw, "text/plain")
            else:
                if isinstance(outcome, str) or outcome is None:
                    outcome = Reply(outcome)
                if isinstance(outcome, dict):
                    message = {"role": "assistant", "content": None, **outcome}
                    usage, finish = None, None
                else:
                    message = {"role": "assistant", "content": outcome.content}
                    if outcome.tool_calls:
                        message["tool_calls"] = outcome.tool_calls
                    usage, finish = outcome.usage, outcome.finish_reason
                completion = _completion(request, message, usage and dict(usage), finish)
                if request.get("stream"):
                    include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
                    self._send(200, "".join(f"data: {json.dumps(c)}\n\n" for c in _chunks(completion, include_usage))
                               + "data: [DONE]\n\n", "text/event-stream")
                else:
                    self._send(200, json.dumps(completion))

    return Handler


@pytest.fixture
def openai_stub() -> Iterator[OpenAIStub]:
    """A started stub server on a free loopback port; stopped after the test."""
    stub = OpenAIStub().start()
    try:
        yield stub
    finally:
        stub.stop()

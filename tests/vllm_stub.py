"""A real local HTTP server with exactly the endpoints of a vLLM server started with LoRA enabled and run-time
adapter updates allowed (`vllm serve BASE --enable-lora`, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True):

    POST /v1/load_lora_adapter    {"lora_name", "lora_path"}  200 text; 400 if already loaded or no adapter there
    POST /v1/unload_lora_adapter  {"lora_name"}               200 text; 404 if no such adapter
    POST /v1/chat/completions     model = the base model or a loaded adapter's name; 404 for any other model
    GET  /v1/models               the base model and the loaded adapters

vLLM itself needs a GPU, which the test machines do not have; this stands in for it so the arbiter's code path
(vllm_lora.py, the same that talks to a real server) runs over real HTTP on loopback. A chat completion answers
"<model> answers" so a test can tell which adapter served it.

    from tests.vllm_stub import vllm_stub  # noqa: F401 (fixture)
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest


@dataclass
class VllmStub:
    base_model: str = "base-model"
    adapters: dict[str, str] = field(default_factory=dict)  # name -> path
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (endpoint, body) of every POST
    server: ThreadingHTTPServer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]  # type: ignore[union-attr]
        return f"http://{host}:{port}/v1"

    def completions(self) -> list[dict[str, Any]]:
        return [body for endpoint, body in self.events if endpoint == "chat/completions"]


def _error(message: str, status: int) -> str:
    return json.dumps({"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": status})


def _handler_for(stub: VllmStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: str, content_type: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/v1/models":
                self._send(404, _error("not found", 404))
                return
            with stub.lock:
                names = [stub.base_model, *stub.adapters]
            self._send(200, json.dumps({"object": "list", "data": [{"id": n, "object": "model"} for n in names]}))

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            endpoint = self.path.rstrip("/").removeprefix("/v1/")
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(400, _error("body is not JSON", 400))
                return
            with stub.lock:
                stub.events.append((endpoint, body))
                if endpoint == "load_lora_adapter":
                    self._load(body)
                elif endpoint == "unload_lora_adapter":
                    self._unload(body)
                elif endpoint == "chat/completions":
                    self._complete(body)
                else:
                    self._send(404, _error("not found", 404))

        def _load(self, body: dict[str, Any]) -> None:
            name, path = body.get("lora_name"), body.get("lora_path")
            if not name or not path:
                self._send(400, _error("Both 'lora_name' and 'lora_path' must be provided.", 400))
            elif name in stub.adapters:
                self._send(400, _error(f"The lora adapter '{name}' has already been loaded.", 400))
            elif not (Path(path) / "adapter_config.json").is_file():
                self._send(400, _error(f"Loading lora {name} failed: No adapter found for {path}", 400))
            else:
                stub.adapters[name] = path
                self._send(200, f"Success: LoRA adapter '{name}' added successfully.", "text/plain")

        def _unload(self, body: dict[str, Any]) -> None:
            name = body.get("lora_name")
            if name not in stub.adapters:
                self._send(404, _error(f"The lora adapter '{name}' cannot be found.", 404))
            else:
                del stub.adapters[name]
                self._send(200, f"Success: LoRA adapter '{name}' removed successfully.", "text/plain")

        def _complete(self, body: dict[str, Any]) -> None:
            model = body.get("model")
            if model != stub.base_model and model not in stub.adapters:
                self._send(404, json.dumps({"error": {"message": f"The model `{model}` does not exist.",
                                                      "type": "NotFoundError", "code": 404}}))
                return
            self._send(200, json.dumps({
                "id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [{"index": 0, "finish_reason": "stop",
                                             "message": {"role": "assistant", "content": f"{model} answers"}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}))

    return Handler


@pytest.fixture
def vllm_stub():
    stub = VllmStub()
    stub.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(stub))
    thread = threading.Thread(target=stub.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        stub.server.shutdown()
        stub.server.server_close()

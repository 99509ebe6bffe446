"""An engine lives as long as the process that started it, not as long as the thread: the arbiter loads versions
on background threads (a test moving versions to their cores), and the kernel's parent-death signal follows the
thread that forked. The engine here is a small HTTP server that answers /v1/models as vLLM's does (starting vLLM
takes a minute); the process handling is EngineServer's own."""

from __future__ import annotations

import sys
import threading
import time

from agent_rl.agent.engine import EngineConfig, EngineServer

SERVER = """
import http.server, sys
class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"data": []}')
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Models).serve_forever()
"""


class StandIn(EngineServer):
    def command(self) -> list[str]:
        return [sys.executable, "-c", SERVER, str(self.port)]


def test_an_engine_started_from_a_thread_outlives_the_thread(tmp_path):
    engine = StandIn(EngineConfig(model=str(tmp_path), startup_timeout_s=30))
    loader = threading.Thread(target=engine.start)
    loader.start()
    loader.join()
    try:
        time.sleep(1.5)  # the parent-death signal, were it tied to the loader thread, has arrived by now
        assert engine.process is not None and engine.process.poll() is None
    finally:
        engine.stop()
    assert engine.process is None


DIES_ON_REQUEST = """
import http.server, os, sys
class Dies(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"data": []}')
    def do_POST(self):
        print("RuntimeError: out of KV cache blocks", file=sys.stderr, flush=True)
        os._exit(7)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Dies).serve_forever()
"""


class DiesOnRequest(EngineServer):
    def command(self) -> list[str]:
        return [sys.executable, "-c", DIES_ON_REQUEST, str(self.port)]


class Tokens:
    """Just what EnginePolicy asks of a tokenizer before a request: stop tokens."""

    eos_token_id = 0

    def convert_tokens_to_ids(self, token):
        return 0


def test_an_engine_that_dies_under_a_request_is_named_with_its_exit_code_and_its_log(tmp_path):
    import pytest

    from agent_rl.agent.engine import EngineError, EnginePolicy

    engine = DiesOnRequest(EngineConfig(model=str(tmp_path), startup_timeout_s=30))
    engine.start()
    try:
        assert engine.exit_note() == ""  # running: a failed request would be the connection's
        policy = EnginePolicy(engine, Tokens())
        policy.prompt_ids = lambda messages, tools: [1, 2, 3]
        with pytest.raises(EngineError) as failed:
            policy.act([[{"role": "user", "content": "hi"}]], [])
        engine.process.wait(timeout=10)
        message = str(failed.value)
        # the exit code and the engine's own last words, not only "did not answer"
        assert "did not answer" in message and "(code 7)" in message and "out of KV cache blocks" in message
    finally:
        engine.stop()

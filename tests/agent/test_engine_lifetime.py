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

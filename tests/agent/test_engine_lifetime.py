"""An engine lives as long as the process that started it, not as long as the thread: the arbiter loads versions
on background threads (a test moving versions to their cores), and the kernel's parent-death signal follows the
thread that forked. The engine here is a small HTTP server that answers /v1/models as vLLM's does (starting vLLM
takes a minute); the process handling is EngineServer's own."""

from __future__ import annotations

import os
import sys
import threading
import time

import httpx

from agent_rl.agent.engine import EngineConfig, EngineServer

# Answers /v1/models as vLLM's does, adding the cores it may run on and those of a child it started (vLLM's engine
# core and worker are children of its front end).
SERVER = """
import http.server, json, os, subprocess, sys
child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                       capture_output=True, text=True).stdout.strip()
class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = {"data": [], "own": sorted(os.sched_getaffinity(0)), "child": json.loads(child)}
        self.send_response(200); self.end_headers(); self.wfile.write(json.dumps(body).encode())
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


def cores_of(config: EngineConfig) -> dict:
    """What a stand-in engine started with `config` reports of its cores."""
    engine = StandIn(config)
    try:
        return httpx.get(f"{engine.start().base_url}/models", timeout=10).json()
    finally:
        engine.stop()


def test_a_placed_engine_and_its_children_stay_on_their_cores(tmp_path):
    machine = sorted(os.sched_getaffinity(0))
    one = machine[-1:]
    assert cores_of(EngineConfig(model=str(tmp_path), cores=tuple(one), startup_timeout_s=30)) == \
        {"data": [], "own": one, "child": one}
    # Not placed: every core this process may use, children included.
    assert cores_of(EngineConfig(model=str(tmp_path), startup_timeout_s=30)) == \
        {"data": [], "own": machine, "child": machine}


# Dies under its first `deaths` completion requests (counted in a file, across restarts), then answers them;
# records every adapter it is asked to load.
DIES_ON_REQUEST = """
import http.server, json, os, sys
port, state, deaths = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
class Dies(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"data": []}')
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.endswith("load_lora_adapter"):
            with open(os.path.join(state, "loaded"), "a") as f:
                f.write(body["lora_name"] + "\\n")
            self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
            return
        counter = os.path.join(state, "deaths")
        died = int(open(counter).read()) if os.path.exists(counter) else 0
        if died < deaths:
            open(counter, "w").write(str(died + 1))
            print("RuntimeError: out of KV cache blocks", file=sys.stderr, flush=True)
            os._exit(7)
        reply = {"choices": [{"text": "hello from " + body["model"]}],
                 "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        self.send_response(200); self.end_headers(); self.wfile.write(json.dumps(reply).encode())
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Dies).serve_forever()
"""


class DiesOnRequest(EngineServer):
    deaths = 1

    def command(self) -> list[str]:
        return [sys.executable, "-c", DIES_ON_REQUEST, str(self.port), self.config.model, str(self.deaths)]


class Tokens:
    """Just what EnginePolicy asks of a tokenizer before a request: stop tokens."""

    eos_token_id = 0

    def convert_tokens_to_ids(self, token):
        return 0


def _policy(engine, adapter=None):
    from agent_rl.agent.engine import EnginePolicy

    policy = EnginePolicy(engine, Tokens(), adapter=adapter)
    policy.prompt_ids = lambda messages, tools: [1, 2, 3]
    return policy


def test_an_engine_that_dies_under_a_request_starts_again_with_its_adapters_and_the_request_is_answered(tmp_path):
    engine = DiesOnRequest(EngineConfig(model=str(tmp_path), startup_timeout_s=30))
    engine.start()
    try:
        name = engine.load_adapter("v2", tmp_path)
        turns = _policy(engine, name).act([[{"role": "user", "content": "hi"}]] * 3, [])
        assert [t.content for t in turns] == ["hello from v2"] * 3  # every request in flight, sent again once
        assert engine.generation == 1 and engine.process.poll() is None
        assert (tmp_path / "loaded").read_text().split() == ["v2", "v2"]  # loaded again on the new process
    finally:
        engine.stop()


def test_an_engine_that_keeps_dying_is_named_with_its_exit_code_and_its_log(tmp_path):
    import pytest

    from agent_rl.agent.engine import MAX_REVIVALS, EngineError

    engine = DiesOnRequest(EngineConfig(model=str(tmp_path), startup_timeout_s=30))
    engine.deaths = 100
    engine.start()
    try:
        assert engine.exit_note() == ""  # running: a failed request would be the connection's
        messages = []
        for _ in range(MAX_REVIVALS + 1):
            with pytest.raises(EngineError) as failed:
                _policy(engine).act([[{"role": "user", "content": "hi"}]], [])
            messages.append(str(failed.value))
        assert engine.generation == MAX_REVIVALS
        # each failure says the process exited, with its code and its own last words, not only "did not answer"
        assert all("(code 7)" in m and "out of KV cache blocks" in m for m in messages)
        assert f"died again after {MAX_REVIVALS} restarts" in messages[-1]
    finally:
        engine.stop()


# The stub above, except that its second launch exits while starting (a restart that fails).
FAILS_SECOND_START = """
import os, sys
state = sys.argv[2]
launches = os.path.join(state, "launches")
n = int(open(launches).read()) if os.path.exists(launches) else 0
open(launches, "w").write(str(n + 1))
if n == 1:
    print("RuntimeError: Engine core initialization failed", file=sys.stderr, flush=True)
    sys.exit(1)
""" + DIES_ON_REQUEST


class FailsSecondStart(EngineServer):
    def command(self) -> list[str]:
        return [sys.executable, "-c", FAILS_SECOND_START, str(self.port), self.config.model, "1"]


def test_an_engine_whose_restart_failed_is_started_again_by_the_next_request(tmp_path):
    """A restart can fail too (memory was short when it ran): the engine is then down, not unreachable, and the next
    request starts it again instead of failing at once on the connection for as long as the process lives."""
    import pytest

    from agent_rl.agent.engine import EngineError

    engine = FailsSecondStart(EngineConfig(model=str(tmp_path), startup_timeout_s=30))
    engine.start()
    try:
        with pytest.raises(EngineError, match="exited while starting"):
            _policy(engine).act([[{"role": "user", "content": "hi"}]], [])  # dies; its restart fails
        assert engine.process is None
        turns = _policy(engine).act([[{"role": "user", "content": "hi"}]], [])  # started again, answered
        assert [t.content for t in turns] == ["hello from base"]
        assert (tmp_path / "launches").read_text() == "3" and engine.process.poll() is None
    finally:
        engine.stop()


def test_an_engine_past_its_restarts_rests_says_so_and_is_tried_again_after_its_cool_down(tmp_path):
    """An engine that keeps dying is not restarted in a loop: it rests (the arbiter's 503 with Retry-After, its
    health `resting`), then the next request starts it once more; a request never reads the outage as a turn."""
    import pytest

    from agent_rl.agent import engine as engines
    from agent_rl.environments.policy import PolicyUnavailable

    engine = DiesOnRequest(EngineConfig(model=str(tmp_path), startup_timeout_s=30))
    engine.deaths = engines.MAX_REVIVALS + 1  # dies under each of the first three processes' first request
    engine.start()
    try:
        assert engine.health() == {"state": "serving", "restarts": 0}
        for _ in range(engines.MAX_REVIVALS):  # dies, restarts, dies again under the request sent once more
            with pytest.raises(engines.EngineError):
                _policy(engine).act([[{"role": "user", "content": "hi"}]], [])
        with pytest.raises(PolicyUnavailable) as resting:
            _policy(engine).act([[{"role": "user", "content": "hi"}]], [])
        assert "rests" in str(resting.value) and "(code 7)" in str(resting.value)
        assert 0 < resting.value.retry_after_s <= engines.COOL_DOWN_S
        assert int(resting.value.retry_after()["Retry-After"]) >= 1
        health = engine.health()
        assert health["state"] == "resting" and health["restarts"] == engines.MAX_REVIVALS
        launches = engine.generation
        with pytest.raises(PolicyUnavailable):  # still resting: no restart tried
            _policy(engine).act([[{"role": "user", "content": "hi"}]], [])
        assert engine.generation == launches

        engine.down_since -= engines.COOL_DOWN_S  # the cool-down has passed
        turns = _policy(engine).act([[{"role": "user", "content": "hi"}]], [])
        assert [t.content for t in turns] == ["hello from base"]  # started once more; this process serves
        assert engine.health() == {"state": "serving", "restarts": engines.MAX_REVIVALS}
    finally:
        engine.stop()

"""Replayed traffic arriving on its own (`replay(rate=...)`): requests go out at their arrival times whether or not
earlier ones were answered, as independent users' do; without a rate, each sender waits for its answer. Checked
against a real local HTTP server that holds every answer until it has seen a given number of requests at once."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent_rl.arbiter.replay import replay
from agent_rl.records import Split


class Task:
    def __init__(self, i: int) -> None:
        self.id, self.context, self.prompt, self.split = f"t{i}", "ctx", f"question {i}", Split.TEST


class HoldingArbiter:
    """Answers /v1/ask only once `hold_for` requests are in flight together (or after `patience` seconds)."""

    def __init__(self, hold_for: int, patience: float = 3.0) -> None:
        self.hold_for, self.patience = hold_for, patience
        self.lock, self.in_flight, self.most_in_flight = threading.Lock(), 0, 0
        self.full = threading.Event()
        arbiter = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with arbiter.lock:
                    arbiter.in_flight += 1
                    arbiter.most_in_flight = max(arbiter.most_in_flight, arbiter.in_flight)
                    if arbiter.in_flight >= arbiter.hold_for:
                        arbiter.full.set()
                arbiter.full.wait(arbiter.patience)
                with arbiter.lock:
                    arbiter.in_flight -= 1
                answer = json.dumps({"policy_version": "v1", "outcome": "correct",
                                     "episode_id": f"e-{body['task_id']}"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def holding():
    arbiters: list[HoldingArbiter] = []

    def start(hold_for: int, patience: float = 3.0) -> HoldingArbiter:
        arbiters.append(HoldingArbiter(hold_for, patience))
        return arbiters[-1]

    yield start
    for arbiter in arbiters:
        arbiter.close()


def test_requests_arriving_at_a_rate_do_not_wait_for_earlier_answers(holding):
    arbiter = holding(hold_for=6)
    tasks = [Task(i) for i in range(6)]
    summary = asyncio.run(replay(arbiter.url, tasks, concurrency=8, rate=200.0, api_key="k"))
    assert summary.ok == 6 and arbiter.full.is_set() and arbiter.most_in_flight == 6
    assert sorted(e for e, _ in summary.answered) == [f"e-t{i}" for i in range(6)]


def test_without_a_rate_each_sender_waits_for_its_answer(holding):
    arbiter = holding(hold_for=6, patience=0.3)
    summary = asyncio.run(replay(arbiter.url, [Task(i) for i in range(6)], concurrency=2, api_key="k"))
    assert summary.ok == 6 and arbiter.most_in_flight == 2 and not arbiter.full.is_set()


def test_a_rate_still_caps_what_is_in_flight_and_a_bad_rate_is_refused(holding):
    arbiter = holding(hold_for=6, patience=0.3)
    summary = asyncio.run(replay(arbiter.url, [Task(i) for i in range(6)], concurrency=3, rate=200.0, api_key="k"))
    assert summary.ok == 6 and arbiter.most_in_flight == 3
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="rate must be a positive number of requests per second"):
            asyncio.run(replay(arbiter.url, [Task(0)], rate=bad, api_key="k"))


def test_the_replay_command_refuses_a_rate_that_is_not_positive():
    from typer.testing import CliRunner

    from agent_rl.arbiter.cli import traffic_app

    result = CliRunner().invoke(traffic_app, ["replay", "--url", "http://127.0.0.1:9", "--rate", "0", "--api-key", "k"])
    assert result.exit_code == 2 and "a positive number of requests per second" in result.output

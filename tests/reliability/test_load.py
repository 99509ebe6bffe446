"""Load and outage: many requests through a real arbiter process; every request gets an answer or a clear
error, and every answered request has exactly one episode in the pool, also across a PostgreSQL restart."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from reliability_support import (
    arbiter_process,
    build_world,
    drive,
    drive_async,
    pool_episode_ids,
    postgres_bin,
    private_postgres,
)
from tests.pg_server import INSTALL_HINT

N_REQUESTS = 10_000
CONCURRENCY = 32


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("load-world"))


def test_ten_thousand_requests_each_get_an_answer_and_exactly_one_episode(world, tmp_path):
    pool_url = f"sqlite:///{tmp_path / 'pool.db'}"
    with arbiter_process(world, pool_url, tmp_path / "arbiter.log", workers=2, log_level="warning") as arbiter:
        report = drive(arbiter.host, arbiter.port, world.ask_bodies(N_REQUESTS), CONCURRENCY)
    # The server has stopped (gracefully): whatever it answered must be committed by now.
    assert len(report.outcomes) == N_REQUESTS
    assert report.unclear() == [], report.unclear()[:3]
    assert report.statuses == {"200": N_REQUESTS}  # nothing wrong with the requests, so nothing refused

    answered = report.answered_ids
    assert len(set(answered)) == len(answered), "two answers share one episode id"
    stored = pool_episode_ids(pool_url)
    assert set(stored) == set(answered)  # none lost, none invented
    assert max(stored.values()) == 1  # and none stored twice


def _outage_run(world, tmp_path, retries: int):
    """Drive traffic at an arbiter on a private PostgreSQL; stop the database mid-run, start it again."""
    if postgres_bin() is None:  # a postgres test never skips: say what is missing
        pytest.fail(f"PostgreSQL server binaries are not installed; {INSTALL_HINT}")
    with private_postgres() as pg:
        with arbiter_process(world, pg.url, tmp_path / "arbiter.log", workers=1, log_level="info") as arbiter:
            bodies = world.ask_bodies(1500)
            result: dict = {}

            def traffic() -> None:
                import asyncio

                result["report"] = asyncio.run(
                    drive_async(arbiter.host, arbiter.port, bodies, 16, retries=retries, retry_pause_s=0.5)
                )

            thread = threading.Thread(target=traffic)
            thread.start()
            _wait_for_episodes(pg.url, 200)
            pg.stop("fast")  # kills every open connection, mid-transaction ones included
            assert not pg.running()
            time.sleep(3)  # longer than the routing cache (1 s): the arbiter must cope with a stale copy
            pg.start()
            thread.join(300)
            assert not thread.is_alive(), "traffic did not finish"
            report = result["report"]

            # Recovered without a restart: the same process answers fresh requests.
            after = drive(arbiter.host, arbiter.port, world.ask_bodies(50), 8)
            assert arbiter.process.poll() is None
            health = httpx.get(f"{arbiter.url}/healthz", timeout=10).json()
            log_text = arbiter.log_text
        stored = pool_episode_ids(pg.url)
        log = log_text()
    return report, after, stored, health, log


def _wait_for_episodes(url: str, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while sum(pool_episode_ids(url).values()) < n:
        assert time.monotonic() < deadline, f"fewer than {n} episodes reached the pool in {timeout} s"
        time.sleep(0.1)


@pytest.mark.postgres
def test_postgres_restart_mid_run_fails_cleanly_loses_nothing_and_recovers(world, tmp_path):
    report, after, stored, health, log = _outage_run(world, tmp_path, retries=0)

    assert report.unclear() == [], report.unclear()[:3]  # every refusal is JSON naming the problem
    refused = [o for o in report.outcomes if not o.answered]
    assert refused, "the outage was not noticed: no request was refused while the database was down"
    assert {o.status for o in refused} == {503}
    assert {o.body["error"] for o in refused} == {"benchmark pool unavailable"}

    answered = report.answered_ids + after.answered_ids
    assert after.statuses == {"200": 50}
    assert set(answered) <= set(stored), "an answered episode is missing from the pool"
    assert max(stored.values()) == 1
    assert health["status"] == "ok"
    # Refused on purpose, not by a crash: no request hit the arbiter's unhandled-error path. SQLAlchemy's pool may
    # log a traceback of its own ("Exception during reset or similar") when the server dies while a connection is
    # being handed back: that is the pool discarding a dead connection, not a failed request.
    assert "unhandled error" not in log and "internal error" not in log
    assert log.count("Traceback") == log.count("Exception during reset or similar"), log[-3000:]


@pytest.mark.postgres
def test_clients_that_retry_get_every_request_answered_through_a_restart(world, tmp_path):
    report, after, stored, _, _ = _outage_run(world, tmp_path, retries=40)

    assert report.statuses == {"200": 1500}, report.statuses
    assert any(o.attempts > 1 for o in report.outcomes), "no request needed a retry: the outage was missed"
    answered = report.answered_ids + after.answered_ids
    assert set(answered) <= set(stored) and max(stored.values()) == 1

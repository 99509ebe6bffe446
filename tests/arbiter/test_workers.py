"""`agent-rl arbiter serve --workers 2` as a real process tree: both workers answer, request keys stay sticky
across them, a routing change made through one reaches the other within the TTL, and SIGTERM loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from agent_rl.arbiter.server import free_port, wait_until_serving
from agent_rl.pool import PoolRepository
from arbiter_fixtures import API_TOKEN, api_key, bearer, demo_world  # noqa: F401  (pytest fixture)

ADMIN_TOKEN = "workers-admin-token-9d2e"
TTL_S = 0.5


@pytest.fixture
def two_workers(demo_world, sqlite_url):  # noqa: F811
    port = free_port()
    keys = json.dumps([api_key().model_dump(mode="json")])
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", AGENT_RL_ADMIN_TOKEN=ADMIN_TOKEN, AGENT_RL_API_KEYS=keys)
    # routing_ttl_s has no CLI flag: serve through the library with a typed config instead.
    code = (
        "import sys; from agent_rl.arbiter.config import ArbiterConfig; from agent_rl.arbiter.server import serve;"
        f"serve(ArbiterConfig(pool_url={sqlite_url!r}, inbox_url={demo_world.inbox_url!r},"
        f" scenarios_path={str(demo_world.scenarios_path)!r}, routing_ttl_s={TTL_S}),"
        f" port={port}, log_level='warning', workers=2)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, proc, timeout_s=90)
        yield url, proc, sqlite_url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def _fresh(url: str, method: str, path: str, **kwargs) -> httpx.Response:
    # A new connection each time, so the kernel hands requests to either worker.
    with httpx.Client(base_url=url, timeout=60, headers={"Connection": "close"}) as client:
        return client.request(method, path, **kwargs)


def test_two_workers_share_routing_and_lose_no_episode(two_workers, demo_world):  # noqa: F811
    url, proc, pool_url = two_workers
    workers = set()
    deadline = time.monotonic() + 60
    while len(workers) < 2 and time.monotonic() < deadline:
        workers.add(_fresh(url, "GET", "/healthz").json()["worker"])
    assert len(workers) == 2 and proc.pid not in workers

    scenario = demo_world.scenarios[0]
    changed = _fresh(
        url, "PUT", "/v1/routing",
        json={"weights": {"a": 1, "b": 1}, "specs": {"a": "heuristic", "b": "heuristic"}, "reason": "two workers"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )  # fmt: skip
    assert changed.status_code == 200, changed.text
    time.sleep(TTL_S + 0.3)  # the worker that did not take the PUT re-reads the table within the TTL

    answered: dict[str, str] = {}
    versions_by_key: dict[str, set[str]] = {}
    for i in range(40):
        key = f"user-{i % 8}"
        body = {"inbox": scenario.inbox_id, "question": scenario.question, "scenario_id": scenario.id, "request_key": key}
        response = _fresh(url, "POST", "/v1/ask", json=body, headers=bearer(API_TOKEN))
        assert response.status_code == 200, response.text
        served = response.json()
        answered[served["episode_id"]] = served["policy_version"]
        versions_by_key.setdefault(key, set()).add(served["policy_version"])
    assert set(answered.values()) == {"a", "b"}  # no worker still routes by the default ("heuristic")
    assert all(len(versions) == 1 for versions in versions_by_key.values())  # sticky across workers

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    pool = PoolRepository(pool_url)
    try:
        assert pool.count() == len(answered)
        for episode_id, version in answered.items():
            assert pool.get(episode_id).policy_version == version
    finally:
        pool.close()


def test_serve_refuses_zero_workers(demo_world, sqlite_url):  # noqa: F811
    from agent_rl.arbiter.config import ArbiterConfig
    from agent_rl.arbiter.server import serve

    with pytest.raises(ValueError, match="workers must be at least 1"):
        serve(ArbiterConfig(pool_url=sqlite_url, inbox_url=demo_world.inbox_url), workers=0)

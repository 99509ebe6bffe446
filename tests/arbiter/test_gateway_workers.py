"""The gateway on several worker processes: `serve(..., workers=3)` as a real process tree, driven over HTTP
by the official `openai` client against the OpenAI stub upstream, on SQLite and PostgreSQL.

Each test pins one keep-alive connection to each worker (a connection stays on the worker that accepted it;
/healthz names it) and sends a session's calls through different workers on purpose: every session must stay
one episode on one version, conversations grouped by their transcript likewise, an episode ends from any
worker and is written once, and another tenant reaches nothing of it from any worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest

from agent_rl.arbiter.server import free_port, stop_arbiter, wait_until_serving
from agent_rl.pool import PoolRepository
from tests.arbiter.arbiter_fixtures import api_key, bearer
from tests.arbiter.test_gateway import (
    TOKEN_A,
    TOKEN_B,
    TOOLS,
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    all_episodes,
    calculator,
    canonical,
    stub_responder,
    stub_spec,
    wait_for_episodes,
)
from tests.openai_stub import openai_stub  # noqa: F401 (fixture)

WORKERS = 3


@contextmanager
def workers_arbiter(pool_url: str, spec: str, idle_s: float = 300.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """An arbiter with WORKERS worker processes routing 50/50 between two versions of the stub upstream."""
    pool = PoolRepository(pool_url)
    pool.set_routing({"stub": 0.5, "stub-b": 0.5}, {"stub": spec, "stub-b": spec}, reason="workers test",
                     actor="tests")
    pool.close()
    port = free_port()
    keys = json.dumps([api_key(TOKEN_A, "a", "tenant-a").model_dump(mode="json"),
                       api_key(TOKEN_B, "b", "tenant-b").model_dump(mode="json")])
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", AGENT_RL_API_KEYS=keys,
               **{UPSTREAM_KEY_ENV: UPSTREAM_KEY})
    code = ("from agent_rl.arbiter.config import ArbiterConfig; from agent_rl.arbiter.server import serve;"
            f"serve(ArbiterConfig(pool_url={pool_url!r}, gateway_rate_per_s=1000.0, gateway_rate_burst=1000,"
            f" gateway_idle_s={idle_s}, routing_ttl_s=0.2), port={port}, log_level='warning', workers={WORKERS})")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, proc)
        yield url, proc
    finally:
        stop_arbiter(proc)


def pinned(url: str) -> list[httpx.Client]:
    """One client per worker process, each holding a single keep-alive connection to that worker."""
    clients: dict[int, httpx.Client] = {}
    for _ in range(200):
        client = httpx.Client(base_url=url, timeout=30, limits=httpx.Limits(max_connections=1))
        pid = client.get("/healthz").json()["worker"]
        if pid in clients:
            client.close()
        else:
            clients[pid] = client
        if len(clients) == WORKERS:
            return [clients[pid] for pid in sorted(clients)]
    raise AssertionError(f"reached only {len(clients)} of {WORKERS} workers")


def worker_of(client: httpx.Client) -> int:
    return client.get("/healthz").json()["worker"]


def conversation(clients: list[httpx.Client], url: str, token: str, question: str, first: int = 0,
                 session: str | None = None, header: str | None = None) -> dict[str, Any]:  # fmt: skip
    """An agent loop whose k-th call goes through worker (first + k); what each call got back."""
    base = f"{url}/s/{session}/v1" if session else f"{url}/v1"
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    got: dict[str, Any] = {"episodes": [], "models": [], "workers": [], "messages": messages}
    for k in range(6):
        http = clients[(first + k) % len(clients)]
        client = openai.OpenAI(base_url=base, api_key=token, http_client=http, max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="agent-rl", messages=messages, tools=TOOLS[:1],
            extra_headers={"X-Agent-RL-Episode": header} if header else None)
        completion = raw.parse()
        got["episodes"].append(raw.headers["x-agent-rl-episode"])
        got["models"].append(completion.model)
        got["workers"].append(worker_of(http))
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": calculator(json.loads(call.function.arguments)["expression"])})
    return got


def end_on(client: httpx.Client, token: str, episode: str) -> httpx.Response:
    return client.post(f"/v1/episodes/{episode}/end", headers=bearer(token))


@pytest.mark.slow
def test_sessions_continue_on_any_worker_and_are_written_once(store_url, openai_stub):  # noqa: F811
    openai_stub.script(stub_responder)
    with workers_arbiter(store_url, stub_spec(openai_stub)) as (url, _):
        clients = pinned(url)
        runs = [conversation(clients, url, TOKEN_A, f"What is {i} * 7?", first=i, session=f"job-{i}")
                for i in range(3)]
        runs += [conversation(clients, url, TOKEN_A, f"What is {i} + 9?", first=i, header=f"task-{i}")
                 for i in range(3)]
        runs += [conversation(clients, url, TOKEN_A, f"What is {i} - 2?", first=i) for i in range(3)]  # by transcript
        for run in runs:
            assert len(set(run["workers"])) > 1  # its calls did reach several workers
            assert len(set(run["episodes"])) == 1 and len(set(run["models"])) == 1  # one episode, one version
        # Another tenant, on any worker, reaches nothing of tenant A's.
        episode_a = runs[0]["episodes"][0]
        other = conversation(clients, url, TOKEN_B, "What is 1 + 1?", first=1, session="job-0")
        by_id = conversation(clients, url, TOKEN_B, "What is 2 + 2?", first=2, header=episode_a)
        assert episode_a not in other["episodes"] + by_id["episodes"]
        assert all(end_on(c, TOKEN_B, episode_a).status_code == 404 for c in clients)
        # Ended through a worker that did not serve its last call; ending again anywhere is answered as done.
        pids = [worker_of(c) for c in clients]
        for run in runs + [other, by_id]:
            episode, last = run["episodes"][-1], pids.index(run["workers"][-1])
            token = TOKEN_B if run in (other, by_id) else TOKEN_A
            ended = end_on(clients[(last + 1) % WORKERS], token, episode)
            assert ended.status_code == 200 and ended.json()["turns"] == len(run["episodes"]), ended.text
            again = end_on(clients[(last + 2) % WORKERS], token, episode)
            assert again.status_code == 200 and again.json()["written"] is True
    stored = all_episodes(store_url)
    assert set(stored) == {run["episodes"][0] for run in runs + [other, by_id]}  # each exactly once
    for run in runs:
        record = stored[run["episodes"][0]]
        assert record.tenant == "tenant-a" and record.turns == len(run["episodes"])
        assert record.policy_version == run["models"][0]
        assert canonical(record.messages) == canonical(run["messages"])
    assert stored[episode_a].messages[0]["content"] == "What is 0 * 7?"  # untouched by tenant B


@pytest.mark.slow
def test_forks_idle_ends_and_shutdown_across_workers(sqlite_url, openai_stub):  # noqa: F811
    openai_stub.script(stub_responder)
    with workers_arbiter(sqlite_url, stub_spec(openai_stub), idle_s=1.5) as (url, proc):
        clients = pinned(url)
        client = [openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, http_client=c, max_retries=0) for c in clients]
        start = [{"role": "user", "content": "What is 6 * 7?"}]
        first = client[0].chat.completions.with_raw_response.create(model="x", messages=start, tools=TOOLS[:1])
        message = first.parse().choices[0].message
        follow = [*start, message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "42"}]
        # The same state extended on two other workers: the first continues the episode, the second is a fork.
        second = client[1].chat.completions.with_raw_response.create(model="x", messages=follow, tools=TOOLS[:1])
        fork = client[2].chat.completions.with_raw_response.create(model="x", messages=follow, tools=TOOLS[:1])
        episode = first.headers["x-agent-rl-episode"]
        assert second.headers["x-agent-rl-episode"] == episode
        assert fork.headers["x-agent-rl-episode"] != episode
        # Neither is ended: the idle timeout ends both, each once, whichever worker sweeps first.
        stored = wait_for_episodes(sqlite_url, 2, timeout_s=30)
        assert {e.turns for e in stored.values()} == {2, 1} and stored[episode].turns == 2
        # A named session spread over every worker and never ended is written at shutdown.
        named = conversation(clients, url, TOKEN_A, "What is 5 * 5?", session="at-shutdown")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    stored = all_episodes(sqlite_url)
    assert len(stored) == 3 and stored[named["episodes"][0]].turns == len(named["episodes"])
    assert canonical(stored[named["episodes"][0]].messages) == canonical(named["messages"])

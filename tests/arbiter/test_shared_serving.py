"""The arbiter serving versions as adapters on one shared base, over real HTTP: requests of two versions that
arrive together decode in one mixed batch and each gets its own version's answer; /healthz and /metrics report
the loaded versions, adapter and cache memory and the queue; a version taken out of the routing drops its
adapter, not a model."""

from __future__ import annotations

import gc
import threading

import pytest

from agent_rl.environments.runner import RunnerConfig

from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
from agent_rl.agent.shared_base import MixedVersionPolicy
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.policy_specs import load_stacked
from arbiter_fixtures import demo_world, start_arbiter  # noqa: F401  (pytest fixtures)
from tests.adapter_fixtures import lora_spec as spec, versions

ADMIN_TOKEN = "shared-serving-admin-7d2e"
RUNNER = RunnerConfig(max_new_tokens=24, max_turns=2)


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    return versions(tmp_path_factory.mktemp("serving"))


def test_two_versions_decode_in_one_batch_each_with_its_own_answers(start_arbiter, demo_world, stacks,
                                                                    monkeypatch):
    base, adapters = stacks
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    batches: list[list[str]] = []
    act_rows = MixedVersionPolicy.act_rows

    def recorded(self, rows, *args, **kwargs):
        batches.append(list(rows))
        return act_rows(self, rows, *args, **kwargs)

    monkeypatch.setattr(MixedVersionPolicy, "act_rows", recorded)
    specs = {"one": spec(base, adapters["one"], "one"), "stack": spec(base, adapters["stack"], "stack")}
    scenarios = [s for s in demo_world.scenarios if s.answerable][:6]
    with start_arbiter(batch_window_ms=300, max_batch=16, runner=RUNNER) as arbiter:
        arbiter.client.put("/v1/routing", json={"weights": {"one": 1, "stack": 1}, "specs": specs, "reason": "A/B"},
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).raise_for_status()
        answers: dict[int, dict] = {}

        def ask(i: int) -> None:
            scenario = scenarios[i]
            body = {"inbox": scenario.inbox_id, "question": scenario.question, "request_key": f"user-{i}"}
            answers[i] = arbiter.client.post("/v1/ask", json=body).json()

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(scenarios))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert {a["policy_version"] for a in answers.values()} == {"one", "stack"}
        assert any(len(set(rows)) == 2 for rows in batches)  # both versions in one batch

        health = arbiter.client.get("/healthz").json()["serving"]
        assert set(health["versions"]) >= {"one", "stack"}
        assert health["adapter_bytes"] > 0 and health["cache_bytes"] > 0 and health["resident_bytes"] > 0
        assert health["queue"] == {"waiting": 0, "running_batches": 0}
        metrics = arbiter.client.get("/metrics")
        assert metrics.headers["content-type"].startswith("text/plain")
        assert 'agent_rl_arbiter_version_loaded{base="base:float32:cpu",version="stack"} 1' in metrics.text
        assert "agent_rl_arbiter_queue_waiting 0" in metrics.text

        # Each episode is what its version, loaded alone as a merged model, plays for the same question.
        store = open_inbox_store(demo_world.inbox_url)
        merged = {name: load_stacked(str(base), adapters[name], version=name, dtype="float32") for name in specs}
        for i, answer in answers.items():
            version = answer["policy_version"]
            task = EpisodeTask(inbox=scenarios[i].inbox_id, question=scenarios[i].question, policy_version=version)
            [alone] = run_episodes(merged[version], [task], store, RUNNER)
            logged = arbiter.pool.get(answer["episode_id"])
            assert logged.messages == alone.messages, version
        store.close()

        # Rolling "stack" back drops its adapter (and its caches); the base stays for "one".
        arbiter.client.put("/v1/routing", json={"weights": {"one": 1, "stack": 0}, "reason": "rollback"},
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).raise_for_status()
        gc.collect()
        health = arbiter.client.get("/healthz").json()["serving"]
        bases = [b for b in health["bases"] if b["base"] == "base:float32:cpu"]
        assert bases[0]["versions"] == ["one"]

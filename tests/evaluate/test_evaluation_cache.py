"""A model evaluated before on the same held-out world is not played again, and nothing else reuses its result."""

from __future__ import annotations

import json

from agent_rl.evaluate.cache import EvaluationCache, inputs_fingerprint, weights_fingerprint
from agent_rl.evaluate.metrics import compute_metrics
from agent_rl.records import Episode, Outcome


def _adapter(folder, weights: bytes):
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (folder / "adapter_model.safetensors").write_bytes(weights)
    (folder / "agent_rl_manifest.json").write_text(json.dumps({"where": str(folder)}))  # differs per copy
    return folder


def _episode(outcome: Outcome) -> Episode:
    return Episode(tenant="t", context="inbox", question="q?", policy_version="sft", messages=[],
                   outcome=outcome, reward=1.0 if outcome == Outcome.CORRECT else 0.0, turns=1,
                   task_id="s1", task_category="date")


def test_a_result_is_reused_only_for_the_same_weights_world_and_settings(tmp_path):
    trained = _adapter(tmp_path / "sft" / "adapter", b"weights-1")
    registered = _adapter(tmp_path / "registry" / "adapters" / "00", b"weights-1")  # the registry's copy
    other = _adapter(tmp_path / "other", b"weights-2")
    world = tmp_path / "world"
    world.mkdir()
    (world / "scenarios.jsonl").write_text('{"id": "s1"}\n')
    weights = weights_fingerprint("base", [trained])
    assert weights == weights_fingerprint("base", [registered])  # where the files live does not matter
    assert weights != weights_fingerprint("base", [other]) != weights_fingerprint("tiny", [trained])
    assert weights_fingerprint("base", [tmp_path / "world"]) is None  # not an adapter: never cached
    inputs = inputs_fingerprint(world, "settings-a")

    cache = EvaluationCache(tmp_path / "cache")
    assert cache.get(weights, inputs) is None
    episodes = [_episode(Outcome.CORRECT), _episode(Outcome.WRONG)]
    cache.put(weights, inputs, compute_metrics(episodes), episodes, 0.6)
    metrics, again, probe = cache.get(weights_fingerprint("base", [registered]), inputs)
    assert metrics.accuracy == 0.5 and [e.outcome for e in again] == [Outcome.CORRECT, Outcome.WRONG]
    assert probe == 0.6

    assert cache.get(weights, inputs_fingerprint(world, "settings-b")) is None  # other settings
    (world / "scenarios.jsonl").write_text('{"id": "s2"}\n')
    assert cache.get(weights, inputs_fingerprint(world, "settings-a")) is None  # another world
    assert cache.get(weights_fingerprint("base", [other]), inputs) is None

    for path in (tmp_path / "cache").iterdir():  # a damaged entry is evaluated again, never half read
        path.write_text("{not json")
    assert cache.get(weights, inputs) is None


def test_the_base_models_probe_is_measured_once_per_items_and_serving(tmp_path, monkeypatch):
    """Every week compares the candidate with the same base model: its forgetting probe is read back, not played
    again (loading the base on the engine costs a start-up of its own), unless the items or the serving differ."""
    import logging

    from agent_rl.agent.engine import DTYPE_ENV
    from agent_rl.environments.core import ProbeItem
    from agent_rl.evaluate import validation

    loads = []

    class Answers:
        model = "base"

        def act(self, conversations, tools, max_new_tokens):
            from agent_rl.agent.policy import PolicyTurn

            return [PolicyTurn(content="Paris", tool_calls=[]) for _ in conversations]

    def base():
        loads.append(1)
        return Answers()

    monkeypatch.setenv(DTYPE_ENV, "float32")
    cache, log = EvaluationCache(tmp_path / "cache"), logging.getLogger("test")
    items = [ProbeItem(question="Capital of France?", expected=["paris"]),
             ProbeItem(question="Capital of Italy?", expected=["rome"])]
    weights = weights_fingerprint("base", [])
    assert validation._base_probe(base, weights, items, cache, 1, log) == 0.5
    assert validation._base_probe(base, weights, items, cache, 1, log) == 0.5
    assert len(loads) == 1
    validation._base_probe(base, weights, items[:1], cache, 1, log)  # other items: measured
    monkeypatch.setenv(DTYPE_ENV, "bfloat16")  # other serving precision: measured
    validation._base_probe(base, weights, items, cache, 1, log)
    validation._base_probe(base, None, items, cache, 1, log)  # no fingerprint: never cached
    assert len(loads) == 4

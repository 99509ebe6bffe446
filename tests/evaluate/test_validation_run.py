"""The week's validation as a library (agent_rl/evaluate/validation.py) over the anonymized world the environment's own
privacy pass left (`World.reopen`): what the `evaluation_report` asset, GRPO's rows and GRPO's stage
config read, asked of the contract and the run's capabilities rather than of the environment's name."""

from __future__ import annotations

import pytest

from agent_rl.curation.datasets import load_jsonl, save_jsonl
from agent_rl.environments.email.grpo_rows import grpo_rows
from agent_rl.environments.gateway import GatewayEnvironment
from agent_rl.environments import worlds
from agent_rl.environments.core import Capabilities
from agent_rl.environments.email.environment import EmailEnvironment
from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.environments.email.scenarios.demo import build_demo_environment
from agent_rl.evaluate.cache import EvaluationCache
from agent_rl.evaluate.gates import GateSettings
from agent_rl.evaluate.harness import EvalConfig, evaluate_tasks
from agent_rl.evaluate.validation import Model, held_out_measure, validate
from agent_rl.records import Split
from agent_rl.train.environment import grpo_world
from agent_rl.train.plugin_rollouts import training_rows

CONFIG = EvalConfig(max_tasks=6, seed=3)
TIMED = {"latency_ms_p50", "latency_ms_p95"}  # wall-clock figures differ between any two plays


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)

    warning = info


@pytest.fixture
def stored(tmp_path):
    """A partition's anonymized_environment folder as the email assistant's privacy pass writes it."""
    out = tmp_path / "anonymized_environment"
    out.mkdir()
    store = open_inbox_store(f"sqlite:///{out / 'inbox.db'}")
    demo = build_demo_environment(store, seed=0, n_inboxes=3, n_emails=600)
    save_jsonl([s.model_dump(mode="json") for s in demo.scenarios], out / "scenarios.jsonl")
    yield out, store, demo.scenarios
    store.close()


def test_the_stored_world_gives_grpo_the_rows_and_the_store_it_had_by_name(stored):
    out, _, _ = stored
    assert grpo_world([EmailEnvironment()], out) == {"store_url": f"sqlite:///{out / 'inbox.db'}"}
    [world] = worlds.reopen([EmailEnvironment()], out)
    try:
        # GRPO's rows: byte for byte those the scenario file gave when the asset read it for the email assistant.
        before = save_jsonl(grpo_rows(load_jsonl(out / "scenarios.jsonl"), split="train"), out / "before.jsonl")
        after = save_jsonl(training_rows(world.environment, world.tasks), out / "after.jsonl")
        assert before == after and load_jsonl(out / "after.jsonl")
    finally:
        world.environment.close()


def test_held_out_tasks_of_the_stored_world_play_as_the_email_path_did(stored):
    out, store, scenarios = stored
    oracle = HeuristicPolicy(HeuristicConfig(scenarios=scenarios), store=store)
    held_out = held_out_measure(Capabilities(), CONFIG, worlds=lambda: worlds.reopen([EmailEnvironment()], out),
                                rated_good=lambda: pytest.fail("a world of ours is played, not replayed"))
    metrics, episodes = held_out.play(oracle, "sft")
    email = EmailEnvironment(store_url=f"sqlite:///{out / 'inbox.db'}", scenarios_path=str(out / "scenarios.jsonl"))
    expected = evaluate_tasks(oracle, email, email.tasks(Split.TEST), CONFIG, version="sft")
    email.close()
    held_out.close()
    assert metrics.model_dump(exclude=TIMED) == expected.metrics.model_dump(exclude=TIMED)
    assert [e.task_id for e in episodes] == [e.task_id for e in expected.episodes]
    assert held_out.probe_items is None and held_out.per_environment == {}


def test_live_traffic_is_replayed_and_no_world_is_opened():
    held_out = held_out_measure(GatewayEnvironment.capabilities, CONFIG, rated_good=lambda: [],
                                worlds=lambda: pytest.fail("live traffic has no world to open"))
    assert held_out.measure.startswith("replay of 0 held-out gateway episodes judged good (0 rated by users, 0 labeled")


def test_validate_weighs_the_better_trained_model_and_reuses_what_it_measured_before(stored, tmp_path):
    out, store, scenarios = stored

    def heuristic(**errors):
        return lambda: HeuristicPolicy(HeuristicConfig(scenarios=scenarios, **errors), store=store)

    models = {"sft": Model(heuristic(), lambda: "w-sft"), "grpo": Model(heuristic(wrong_rate=0.5), lambda: "w-grpo"),
              "incumbent": Model(heuristic(wrong_rate=0.6, seed=1), lambda: None, label=" (v0: heuristic)")}
    cache = EvaluationCache(tmp_path / "cache")

    def run(hacked=None):
        log = Log()
        held_out = held_out_measure(Capabilities(), CONFIG, rated_good=list,
                                    worlds=lambda: worlds.reopen([EmailEnvironment()], out))
        result = validate(models, held_out, base=heuristic(), gates=GateSettings(), incumbent_version="v0",
                          cache=cache, inputs="world-1", out_dir=tmp_path / "report", threads=1, hacked=hacked,
                          skipped=None, log=log)
        return result, held_out, log

    result, held_out, log = run()
    assert result.choice.name == "sft" and set(result.results) == {"sft", "grpo", "incumbent"}
    assert result.results["sft"].accuracy == 1.0 > result.results["incumbent"].accuracy
    report = result.report("run-1", ("v0", "heuristic"), held_out, None, None)
    assert report["measure"] == "held-out tasks played to the end and judged" and report["choice"]["candidate"] == "sft"
    assert report["metrics"]["candidate"] == report["metrics"]["sft"] and set(report["episodes"]) == set(result.results)
    assert "evaluating incumbent (v0: heuristic)" in log.lines

    again, _, log = run(hacked="reward hacking: same_answer 90% > 50%")
    assert set(again.results) == {"sft", "incumbent"} and again.choice.name == "sft"
    assert "SFT + GRPO disqualified, not evaluated: reward hacking: same_answer 90% > 50%" in log.lines
    assert any(line.startswith("sft: the same weights were evaluated") for line in log.lines)
    assert again.results["sft"] == result.results["sft"]  # reused, not played again

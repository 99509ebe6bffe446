"""The example environment (examples/timetable.py, no loop code touched) through the loop's library stages with
the tiny model: a teacher plays the training tasks, the episodes go through the pool (SQLite and PostgreSQL),
the curation gates and the SFT dataset, a real LoRA SFT run trains on them, and the trained adapter is served
and evaluated on the held-out tasks by the same runner."""

from __future__ import annotations


import pytest

from agent_rl.agent.local_policy import LocalPolicy
from agent_rl.agent.models import build_tiny_model
from agent_rl.environments.runner import Play, play_episodes
from agent_rl.curation.datasets import save_jsonl, sft_rows
from agent_rl.curation.validate import GateConfig, config_for, evaluate_gates, validate_episodes
from agent_rl.evaluate.metrics import compute_metrics
from agent_rl.pool import PoolRepository
from agent_rl.records import Outcome, Split
from agent_rl.train.config import SFTSettings
from agent_rl.train.sft import train_sft
from examples.timetable import TimetableEnvironment, TimetableTeacher


@pytest.mark.slow
def test_the_example_environment_runs_through_the_loop(store_url, tmp_path):
    env = TimetableEnvironment()
    train = env.tasks(Split.TRAIN)
    episodes = play_episodes(TimetableTeacher(), env, [Play(t) for t in train])
    assert all(e.environment == "timetable" and e.outcome == Outcome.CORRECT for e in episodes)

    pool = PoolRepository(store_url)
    try:
        pool.insert_episodes(episodes)
        exported = [e.model_dump(mode="json") for page in pool.iter_export() for e in page.episodes]
    finally:
        pool.close()
    assert len(exported) == len(train)

    result = validate_episodes(exported, config_for([env]))
    assert len(result.clean) == len(train) and not result.quarantined
    gates = {g.name: g.passed for g in evaluate_gates(result, GateConfig(min_points=10, min_categories=4))}
    assert gates["volume"] and gates["diversity"]
    assert set(result.report["environments"]["timetable"]) == set(env.categories)
    # An episode of an environment the run does not train on is quarantined, saying so.
    stray = dict(exported[0], episode_id="stray", environment="email")
    refused = validate_episodes([stray], config_for([env]))
    assert any("environment" in r for _, reasons in refused.quarantined for r in reasons)

    rows = sft_rows(result.clean, min_quality=0.0, tools=env.tool_schemas(), max_idk_share=None)
    assert len(rows) == len(train) and rows[0]["tools"] == env.tool_schemas()
    save_jsonl(rows, tmp_path / "sft.jsonl")
    tiny = build_tiny_model()
    sft = train_sft(tiny, tmp_path / "sft.jsonl", tmp_path / "sft",
                    SFTSettings(max_steps=2, save_steps=2, learning_rate=1e-3))
    assert sft.adapter_dir.is_dir()

    served = LocalPolicy(tiny, adapter=sft.adapter_dir, batch_size=4, version="timetable-sft")
    test = env.tasks(Split.TEST)
    held_out = play_episodes(served, env, [Play(t) for t in test])
    assert [e.task_id for e in held_out] == [t.id for t in test]
    assert all(e.policy_version == "timetable-sft" and e.environment == "timetable" for e in held_out)
    metrics = compute_metrics(held_out, tool_names=env.tool_names())
    assert metrics.n == len(test) and set(metrics.by_category) <= set(env.categories)

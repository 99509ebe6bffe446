"""The demo's two worlds: production on a model of ours (v0) or on the API model (distillation, non-inferiority)."""

from __future__ import annotations

import dagster as dg
import pytest


def test_a_week_against_the_api_model_runs_the_non_inferiority_gate_and_keeps_the_rest_of_the_profile(monkeypatch):
    monkeypatch.setenv("AGENT_RL_PROFILE", "demo")
    from demos.run import week_changes
    from pipelines.profiles import resource_config, resources_for

    defs = dg.Definitions(resources=resources_for())
    assert week_changes(ours=True, fast=False) == {} and week_changes(ours=False, fast=True) == {}
    config = resource_config(defs, week_changes(ours=False, fast=False))
    evaluation = config["evaluation"]["config"]
    assert evaluation["gate"] == "non_inferiority"
    assert evaluation["max_tasks"] == 94 and evaluation["batch_size"] == 32  # the demo profile's, not defaults
    v0 = resource_config(defs, {"training": {"grpo_enabled": False, "start_from": "base"}})["training"]["config"]
    assert v0["base_model"] == "base" and v0["grpo_overrides"]["max_steps"] == 2 and not v0["grpo_enabled"]


def test_the_run_config_is_one_the_retraining_job_accepts():
    from pipelines.definitions import defs
    from pipelines.profiles import resource_config

    job = defs.resolve_job_def("retraining_job")
    config = resource_config(defs, {"evaluation": {"gate": "non_inferiority"}, "training": {"grpo_enabled": False}})
    assert dg.validate_run_config(job, {"resources": config})


def test_an_incumbent_the_demo_does_not_simulate_is_refused_naming_the_one_it_does(capsys):
    from demos.demo import main

    with pytest.raises(SystemExit) as exited:
        main(["--fast", "--incumbent", "o3-sim", "--port", "1"])
    assert exited.value.code == 2
    assert "expected 'ours' or 'teacher'" in capsys.readouterr().err


def test_the_demos_arbiter_lets_a_turn_run_as_long_as_the_held_out_evaluation_does(monkeypatch):
    """Production and validation must judge the same model. At 128 tokens a turn the demo's arbiter cut the trained
    agent's three parallel reads (~140 tokens) into format errors the held-out evaluation (its own limit) never
    showed: 5 of 32 held-out requests served, 0 of them evaluated (docs/experiments.md, 2026-11-28)."""
    from typer.testing import CliRunner

    from agent_rl.agent.policy import Policy, PolicyTurn, ToolCall
    from agent_rl.cli import app
    from agent_rl.environments.registry import load_environment
    from agent_rl.evaluate.harness import EvalConfig, evaluate_tasks
    from agent_rl.records import Split
    from demos.run import arbiter_command

    served = {}
    monkeypatch.setattr("agent_rl.arbiter.server.serve", lambda config, **_: served.update(config=config))
    command = arbiter_command(8799, None)
    result = CliRunner().invoke(app, command[command.index("arbiter"):])
    assert result.exit_code == 0, result.output

    class Asked(Policy):
        """Answers at once, noting the token limit each turn was given."""
        limits: list[int] = []

        def act(self, conversations, tools, max_new_tokens=256):
            self.limits.append(max_new_tokens)
            return [PolicyTurn(tool_calls=[ToolCall("answer", {"answer": "-"})]) for _ in conversations]

    environment = load_environment("support")
    try:
        evaluate_tasks(Asked(), environment, environment.tasks(Split.TEST), EvalConfig(max_tasks=2))
    finally:
        environment.close()
    assert Asked.limits and set(Asked.limits) == {served["config"].runner.max_new_tokens}


def test_the_old_name_of_the_demo_warns_and_runs_the_demo(monkeypatch):
    """`python -m pipelines.demo` was the documented command before the drivers moved to demos/: it still runs."""
    import demos.demo
    from pipelines import demo as old_name

    calls = []
    monkeypatch.setattr(demos.demo, "main", lambda argv=None: calls.append(argv) or 0)
    with pytest.warns(DeprecationWarning, match="python -m demos.demo"):
        assert old_name.main(["--fast", "--weeks", "2"]) == 0
    assert calls == [["--fast", "--weeks", "2"]]


def test_a_round_of_the_ab_test_is_sized_to_what_the_step_still_needs():
    from demos.demo import round_requests

    # 10% of traffic, nothing served yet, 20 episodes a step and an arm: 200 requests give the challenger its 20.
    assert round_requests(0.1, 0, 0, per_step=20, per_arm=20) == 200
    assert round_requests(0.1, 14, 14, per_step=20, per_arm=20) == 60  # 6 short at 10%
    assert round_requests(0.5, 0, 22, per_step=20, per_arm=20) == 40  # a new step at 50%: 20 more each arm
    # Both minimums met, only the evidence is short: a small round, then the sensor looks again.
    assert round_requests(0.5, 30, 52, per_step=20, per_arm=20) == 40
    assert round_requests(0.1, 0, 0, per_step=500, per_arm=500) == 400  # never more than `most` before a look


def test_the_weeks_grpo_follows_the_profiles_demo_table_when_production_runs_ours(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setenv("AGENT_RL_PROFILE", "demo")
    from demos.demo import week_training
    from pipelines.profiles import demo_settings, resources_for

    assert demo_settings("demo").week_grpo is False  # 2 cores: SFT alone in the week (docs/experiments.md)
    defs = dg.Definitions(resources=resources_for())

    def run(ours: bool, grpo: bool):
        args = SimpleNamespace(week_sft_steps=48, week_grpo=grpo)
        return SimpleNamespace(plan=SimpleNamespace(ours=ours, args=args), defs=defs, max_steps={"sft_adapter": 96})

    changes, steps = week_training(run(ours=True, grpo=False))
    assert changes["training"]["grpo_enabled"] is False and changes["training"]["sft_overrides"]["max_steps"] == 48
    assert steps == {"sft_adapter": 48}
    changes, _ = week_training(run(ours=True, grpo=True))
    assert "grpo_enabled" not in changes["training"]  # the profile's GRPO as it is
    assert week_training(run(ours=False, grpo=False)) == ({}, None)  # the API model's story: the profile's training

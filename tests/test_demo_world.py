"""The demo's two worlds: production on a model of ours (v0) or on the API model (distillation, non-inferiority)."""

from __future__ import annotations

import dagster as dg
import pytest


def test_a_week_against_the_api_model_runs_the_non_inferiority_gate_and_keeps_the_rest_of_the_profile(monkeypatch):
    monkeypatch.setenv("AGENT_RL_PROFILE", "demo")
    from pipelines.demo import resource_config, week_changes
    from pipelines.profiles import resources_for

    defs = dg.Definitions(resources=resources_for())
    assert week_changes(ours=True, fast=False) == {} and week_changes(ours=False, fast=True) == {}
    config = resource_config(defs, week_changes(ours=False, fast=False))
    evaluation = config["evaluation"]["config"]
    assert evaluation["gate"] == "non_inferiority"
    assert evaluation["max_scenarios"] == 94 and evaluation["batch_size"] == 32  # the demo profile's, not defaults
    v0 = resource_config(defs, {"training": {"grpo_enabled": False, "start_from": "base"}})["training"]["config"]
    assert v0["base_model"] == "base" and v0["grpo_overrides"]["max_steps"] == 2 and not v0["grpo_enabled"]


def test_the_run_config_is_one_the_retraining_job_accepts():
    from pipelines.definitions import defs
    from pipelines.demo import resource_config

    job = defs.resolve_job_def("retraining_job")
    config = resource_config(defs, {"evaluation": {"gate": "non_inferiority"}, "training": {"grpo_enabled": False}})
    assert dg.validate_run_config(job, {"resources": config})


def test_an_incumbent_the_demo_does_not_simulate_is_refused_naming_the_one_it_does(capsys):
    from pipelines.demo import main

    with pytest.raises(SystemExit) as exited:
        main(["--fast", "--incumbent", "o3-sim", "--port", "1"])
    assert exited.value.code == 2
    assert "expected 'ours' or 'teacher'" in capsys.readouterr().err

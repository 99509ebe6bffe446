"""The Dagster code location honours the contract of docs/architecture.md: asset names, groups, blocking gates,
schedule, sensors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

from pipelines.definitions import defs

ROOT = Path(__file__).resolve().parents[1]

EXPECTED_GROUPS = {
    "world": "environment", "tasks": "environment",
    "pool_episodes": "pool",
    "validated_episodes": "curation", "anonymized_episodes": "curation", "anonymized_environment": "curation",
    "balanced_episodes": "curation", "sft_dataset": "curation", "grpo_dataset": "curation",
    "sft_adapter": "training", "grpo_adapter": "training",
    "evaluation_report": "validation", "registered_model": "validation",
    "loop_health": "monitoring",
}


def test_every_asset_of_the_design_exists_in_its_group():
    graph = defs.resolve_asset_graph()
    groups = {key.to_user_string(): graph.get(key).group_name for key in graph.get_all_asset_keys()}
    assert groups == EXPECTED_GROUPS


def test_lineage_follows_the_loop():
    graph = defs.resolve_asset_graph()

    def parents(name: str) -> set[str]:
        return {k.to_user_string() for k in graph.get(dg.AssetKey(name)).parent_keys}

    assert parents("validated_episodes") == {"pool_episodes"}
    assert parents("anonymized_environment") == {"world", "tasks"}
    assert parents("grpo_adapter") == {"sft_adapter", "grpo_dataset", "anonymized_environment"}
    assert parents("registered_model") == {"evaluation_report"}


def test_training_is_gated_by_blocking_checks():
    checks = {(c.asset_key.to_user_string(), c.name): c.blocking
              for c in defs.resolve_asset_graph().asset_check_keys and
              [defs.resolve_asset_graph().get_check_spec(k) for k in defs.resolve_asset_graph().asset_check_keys]}
    assert checks == {
        ("validated_episodes", "enough_points"): True,
        ("validated_episodes", "clean_ratio"): True,
        ("validated_episodes", "category_diversity"): True,
        ("validated_episodes", "labeler_agreement"): True,  # labels from a labeler below its bars never train
        ("validated_episodes", "tenant_ratings_agree"): False,  # warns; a disagreeing tenant never stops the week
        ("anonymized_episodes", "no_pii_leak"): True,
        ("grpo_adapter", "no_reward_hacking"): False,  # disqualifies GRPO at validation; SFT stays a candidate
        ("evaluation_report", "beats_champion"): True,
        ("evaluation_report", "no_forgetting"): True,
        ("evaluation_report", "reward_hacking_passed"): True,
    }


def test_schedule_and_sensors_close_the_loop():
    assert defs.resolve_schedule_def("weekly_retraining").cron_schedule == "0 3 * * 1"
    assert {s.name for s in defs.sensors} == {"challenger_sensor", "rollout_sensor", "mlflow_run_succeeded",
                                              "mlflow_run_failed", "mlflow_run_canceled"}
    job = defs.resolve_job_def("retraining_job")
    assert job.partitions_def is not None


def test_weekly_schedule_trains_on_the_week_that_just_ended():
    from datetime import datetime, timezone

    from pipelines.schedules import weekly_retraining

    context = dg.build_schedule_context(scheduled_execution_time=datetime(2026, 11, 23, 3, tzinfo=timezone.utc))
    request = weekly_retraining(context)
    assert request.partition_key == "2026-11-16"


def test_dagster_cli_validates_the_workspace(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_mlflow_parent_run_of_a_dagster_run_ends_with_it(tmp_path):
    """A Dagster run's stages nest under one MLflow parent run: when the run ends (success or a failed check), the
    parent ends too instead of staying RUNNING beside its finished stages."""
    from mlflow.tracking import MlflowClient

    from agent_rl.train.tracking import Tracker
    from pipelines.sensors import end_mlflow_parent_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for run_id, succeeded, status in (("run-ok", True, "FINISHED"), ("run-failed", False, "FAILED")):
        tracker = Tracker(uri, dagster_run_id=run_id)
        tracker.start_stage("sft").finish()
        parent = tracker.parent_run_id
        assert MlflowClient(uri).get_run(parent).info.status == "RUNNING"
        assert end_mlflow_parent_run(uri, run_id, succeeded)
        assert MlflowClient(uri).get_run(parent).info.status == status
    assert not end_mlflow_parent_run(uri, "a-run-that-tracked-nothing", True)

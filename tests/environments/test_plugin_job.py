"""The weekly retraining job on a plug-in environment (examples/timetable.py), through Dagster with the tiny model:
the pool's episodes are gated against the plug-in's categories and tools, anonymized with its tasks and world,
SFT trains with its tool schemas, GRPO rolls out in the saved anonymized world in a training subprocess and is
judged by the plug-in, validation plays its held-out tasks, and the model is registered under its name."""

from __future__ import annotations

import json
from collections import Counter

import dagster as dg
import pytest

from agent_rl import settings
from agent_rl.environments.runner import Play, play_episodes
from agent_rl.curation.datasets import load_jsonl
from agent_rl.environments import worlds
from agent_rl.pool.repository import PoolRepository
from agent_rl.records import Split
from assets import curation, environment, pool, training, validation
from assets.partitions import weekly
from agent_rl.environments.support import SupportEnvironment
from resources.compute import TrainingCompute
from resources.curation import CurationResource
from resources.environment import EnvironmentResource
from resources.evaluation import EvaluationResource
from resources.registry import MlflowResource
from resources.stores import PoolResource, WorldStoreResource
from resources.training import TrainingResource
from tests.environments.test_example_loop import TimetableTeacher

TIMETABLE = ("examples.timetable:TimetableEnvironment", '{"name": "reply", "arguments": {"answer": "I don\'t know", '
             '"trains": []}}')
SUPPORT = ("support", '{"name": "reply", "arguments": {"message": "I cannot find that order."}}')
# The retraining job's assets, environment to registry, as the weekly job materializes them.
JOB_ASSETS = [environment.world, environment.tasks, pool.pool_episodes, curation.validated_episodes,
              curation.anonymization, curation.balanced_episodes, curation.sft_dataset, curation.grpo_dataset,
              training.sft_adapter, training.grpo_adapter, validation.evaluation_report, validation.registered_model]


def _personal_values(env: SupportEnvironment) -> list[str]:
    db = env.database
    return [v for c in db.customers.values() for v in (c.name, c.email, c.phone, c.address.street) if v]


@pytest.mark.slow
@pytest.mark.parametrize("spec, forced_call", [TIMETABLE, SUPPORT], ids=["timetable", "support"])
def test_the_weekly_job_trains_validates_and_registers_a_plugin_environment(spec, forced_call, tmp_path):
    from tests.train.test_sft_grpo import _forced_tool_call_bias

    from agent_rl.agent.models import build_tiny_model
    from agent_rl.environments.registry import load_environment

    env = load_environment(spec)
    teacher = env.teacher() or TimetableTeacher()
    episodes = play_episodes(teacher, env, [Play(t, policy_version="teacher") for t in env.tasks(Split.TRAIN)])
    repo = PoolRepository(settings.pool_url())
    repo.insert_episodes(episodes)
    repo.close()
    tiny = str(build_tiny_model(tmp_path / "tiny"))
    grpo = {"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
            "max_completion_length": 400, "max_tool_calling_iterations": 2, "prompt_filter": {"mode": "none"},
            "generation_kwargs": {"sequence_bias": _forced_tool_call_bias(tiny, forced_call)}}
    resources = {
        "environment": EnvironmentResource(name=spec),
        "world_store": WorldStoreResource(), "pool": PoolResource(),
        "curation": CurationResource(min_points=10, min_categories=3, min_quality=0.8, cap_per_category=8),
        "training": TrainingResource(base_model=tiny, sft_overrides={"max_steps": 2, "save_steps": 2},
                                     grpo_overrides=grpo),
        "compute": TrainingCompute(),  # a subprocess: GRPO must find the saved anonymized world on its own
        "mlflow": MlflowResource(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", model_name=f"agent-rl-{env.name}"),
        "evaluation": EvaluationResource(max_tasks=6, gate="open", max_forgetting_drop=1.0),
    }
    checks = [curation.enough_points, curation.clean_ratio, curation.category_diversity, curation.no_pii_leak,
              training.no_reward_hacking, validation.beats_champion, validation.no_forgetting]
    partition = weekly.get_partition_keys()[-1]
    result = dg.materialize(JOB_ASSETS + checks, partition_key=partition, resources=resources, raise_on_error=False)
    failures = [e.step_key for e in result.get_step_failure_events()]
    assert result.success, failures

    scenarios = result.asset_materializations_for_node("tasks")[0].metadata
    assert scenarios["environment"].value == env.name and scenarios["test"].value == len(env.tasks(Split.TEST))
    validated = result.asset_materializations_for_node("validated_episodes")[0].metadata
    assert validated["clean"].value == len(episodes)
    sft_rows = load_jsonl(settings.artifact_dir("sft_dataset", partition) / "train.jsonl")
    assert sft_rows and all(row["tools"] == env.tool_schemas() for row in sft_rows)
    grpo_rows = load_jsonl(settings.artifact_dir("grpo_dataset", partition) / "train.jsonl")
    assert {row["environment"] for row in grpo_rows} == {env.name}
    assert len(grpo_rows) == len(env.tasks(Split.TRAIN))

    rollouts = load_jsonl(settings.artifact_dir("grpo_adapter", partition) / "rollouts.jsonl")
    assert rollouts and {r["environment"] for r in rollouts} == {env.name}
    assert all(r["turns"] == 1 and r["tool_calls"] >= 1 for r in rollouts)  # the forced reply, judged by the plug-in
    hacking = json.loads((settings.artifact_dir("grpo_adapter", partition) / "hacking.json").read_text())
    assert {f["kind"] for f in hacking} == {"same_answer", "tool_call_spam", "format_exploit"}

    report = json.loads((settings.artifact_dir("evaluation_report", partition) / "report.json").read_text())
    held_out = min(6, len(env.tasks(Split.TEST)))
    assert report["metrics"]["sft"]["n"] == report["metrics"]["incumbent"]["n"] == held_out
    assert set(report["metrics"]["sft"]["by_category"]) <= set(env.categories)
    for name in ("sft", "incumbent"):  # each model's held-out episodes, as played, beside the report
        played = load_jsonl(report["episodes"][name])
        assert len(played) == held_out and {e["policy_version"] for e in played} == {name}
        correct = sum(e["outcome"] == "correct" for e in played)
        assert correct / held_out == pytest.approx(report["metrics"][name]["accuracy"], abs=1e-3)
    registered = result.asset_materializations_for_node("registered_model")[0].metadata
    assert registered["model"].value == f"agent-rl-{env.name}"

    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["no_pii_leak"] is True
    if isinstance(env, SupportEnvironment):
        # No customer's name, email, phone or street reaches anything training or validation wrote.
        written = "\n".join(path.read_text(errors="replace") for stage in (
            "anonymized_episodes", "balanced_episodes", "sft_dataset", "grpo_dataset", "grpo_adapter",
            "evaluation_report") for path in settings.artifact_dir(stage, partition).rglob("*.json*"))
        assert written and not [v for v in _personal_values(env) if v in written]
        # GRPO and validation played in the anonymized store: its anonymized tasks still replay to the same outcome.
        anonymized_dir = settings.artifact_dir("anonymized_environment", partition)
        (anonymized,) = worlds.saved_environments(anonymized_dir)
        tasks = [t for t in worlds.saved_tasks(anonymized_dir) if t.split == Split.TEST]
        replayed = play_episodes(env.teacher(), anonymized, [Play(t) for t in tasks])
        assert all(e.outcome.value == "correct" for e in replayed)


@pytest.mark.slow
def test_one_run_trains_one_policy_on_several_environments(tmp_path):
    """`also` (or AGENT_RL_ENV=support,examples.timetable:TimetableEnvironment): one policy on both plug-ins,
    each curated against its own categories and tools, anonymized with its own world, balanced per environment,
    rolled out in its own world by GRPO, and validated per environment and together."""
    from tests.train.test_sft_grpo import _forced_tool_call_bias

    from agent_rl.agent.models import build_tiny_model
    from agent_rl.environments.registry import load_environment

    support, timetable = load_environment("support"), load_environment(TIMETABLE[0])
    repo = PoolRepository(settings.pool_url())
    for env, teacher in ((support, support.teacher()), (timetable, TimetableTeacher())):
        repo.insert_episodes(play_episodes(teacher, env, [Play(t, policy_version="teacher")
                                                          for t in env.tasks(Split.TRAIN)[:30]]))
    repo.close()
    tiny = str(build_tiny_model(tmp_path / "tiny"))
    grpo = {"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
            "max_completion_length": 400, "max_tool_calling_iterations": 2, "prompt_filter": {"mode": "none"},
            "generation_kwargs": {"sequence_bias": _forced_tool_call_bias(tiny, SUPPORT[1])}}
    resources = {
        "environment": EnvironmentResource(name="support", also=[TIMETABLE[0]]),
        "world_store": WorldStoreResource(), "pool": PoolResource(),
        "curation": CurationResource(min_points=20, min_categories=6, min_quality=0.8, cap_per_category=4),
        "training": TrainingResource(base_model=tiny, sft_overrides={"max_steps": 2, "save_steps": 2},
                                     grpo_overrides=grpo),
        "compute": TrainingCompute(),
        "mlflow": MlflowResource(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", model_name="agent-rl-two"),
        "evaluation": EvaluationResource(max_tasks=3, gate="open", max_forgetting_drop=1.0),
    }
    partition = weekly.get_partition_keys()[-1]
    result = dg.materialize(JOB_ASSETS + [curation.no_pii_leak], partition_key=partition, resources=resources,
                            raise_on_error=False)
    assert result.success, [e.step_key for e in result.get_step_failure_events()]

    names = {"support", "timetable"}
    validated = load_jsonl(settings.artifact_dir("validated_episodes", partition) / "episodes.jsonl")
    assert {row["environment"] for row in validated} == names
    # Balanced per environment: at most 4 per (environment, category).
    balanced = load_jsonl(settings.artifact_dir("balanced_episodes", partition) / "episodes.jsonl")
    per_group = Counter((row["environment"], row["task_category"]) for row in balanced)
    assert {e for e, _ in per_group} == names and max(per_group.values()) <= 4
    # Each SFT row carries its own environment's tools, in the order serving shows them (the prompt prints them verbatim).
    sft = load_jsonl(settings.artifact_dir("sft_dataset", partition) / "train.jsonl")
    assert {json.dumps(row["tools"]) for row in sft} == {
        json.dumps(env.tool_schemas()) for env in (support, timetable)}
    # GRPO rolled out in both anonymized worlds, each row in its own.
    grpo_rows = load_jsonl(settings.artifact_dir("grpo_dataset", partition) / "train.jsonl")
    assert {row["environment"] for row in grpo_rows} == names
    assert [env.name for env in worlds.saved_environments(
        settings.artifact_dir("anonymized_environment", partition))] == ["support", "timetable"]
    rollouts = load_jsonl(settings.artifact_dir("grpo_adapter", partition) / "rollouts.jsonl")
    assert rollouts and {r["environment"] for r in rollouts} <= names
    # Validated per environment and together; categories named with their environment.
    report = json.loads((settings.artifact_dir("evaluation_report", partition) / "report.json").read_text())
    assert set(report["per_environment"]["sft"]) == names
    assert report["metrics"]["sft"]["n"] == sum(m["n"] for m in report["per_environment"]["sft"].values()) == 6
    assert {c.split("/")[0] for c in report["metrics"]["sft"]["by_category"]} == names
    registered = result.asset_materializations_for_node("registered_model")[0].metadata
    assert registered["model"].value == "agent-rl-two"
    assert {e.check_name: e.passed for e in result.get_asset_check_evaluations()}["no_pii_leak"] is True


def test_several_environments_are_named_in_one_setting_and_refused_with_email_or_gateway(monkeypatch):
    from pipelines.profiles import resources_for

    monkeypatch.setenv("AGENT_RL_ENV", f"support, {TIMETABLE[0]}")
    env = resources_for("fast")["environment"]
    assert env.names == ["support", TIMETABLE[0]] and not any(e.world().trains_alone for e in env.loads())
    assert [e.name for e in env.loads()] == ["support", "timetable"]
    for bad in (dict(name="email", also=["support"]), dict(name="support", also=["gateway"]),
                dict(name="support", also=["support"])):
        with pytest.raises(Exception, match="train alone|named twice"):
            EnvironmentResource(**bad)

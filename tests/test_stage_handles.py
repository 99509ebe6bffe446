"""The stage handles (assets/stages.py) are the one place the code location names a stage's files: each path is
named once, the layout on disk is the one users' homes already have, and no other module spells a file name."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

from agent_rl import settings
from assets import stages

ROOT = Path(__file__).resolve().parents[1]
WEEK = "2026-01-05"

# The layout under $AGENT_RL_HOME/artifacts/, as every earlier version wrote it: a change here moves users' files.
LAYOUT = {
    "PoolExport.folder": "pool_episodes/W",
    "PoolExport.episodes": "pool_episodes/W/episodes.jsonl",
    "ValidatedEpisodes.folder": "validated_episodes/W",
    "ValidatedEpisodes.episodes": "validated_episodes/W/episodes.jsonl",
    "ValidatedEpisodes.report": "validated_episodes/W/report.json",
    "ValidatedEpisodes.labeler_copy": "ab_labeler/W",
    "AnonymizedEpisodes.folder": "anonymized_episodes/W",
    "AnonymizedEpisodes.episodes": "anonymized_episodes/W/episodes.jsonl",
    "AnonymizedEpisodes.privacy_report": "anonymized_episodes/W/privacy.json",
    "AnonymizedEnvironment.folder": "anonymized_environment/W",
    "AnonymizedEnvironment.tasks": "anonymized_environment/W/tasks.jsonl",
    "AnonymizedEnvironment.held_out": "anonymized_environment/W/held_out.jsonl",
    "BalancedEpisodes.folder": "balanced_episodes/W",
    "BalancedEpisodes.episodes": "balanced_episodes/W/episodes.jsonl",
    "SftDataset.folder": "sft_dataset/W",
    "SftDataset.rows": "sft_dataset/W/train.jsonl",
    "GrpoDataset.folder": "grpo_dataset/W",
    "GrpoDataset.rows": "grpo_dataset/W/train.jsonl",
    "SftAdapter.folder": "sft_adapter/W",
    "SftAdapter.adapter": "sft_adapter/W/adapter",
    "SftAdapter.manifest": "sft_adapter/W/adapter/agent_rl_adapter.json",
    "SftAdapter.started_from": "sft_adapter/W/started_from.json",
    "GrpoAdapter.folder": "grpo_adapter/W",
    "GrpoAdapter.adapter": "grpo_adapter/W/adapter",
    "GrpoAdapter.manifest": "grpo_adapter/W/adapter/agent_rl_adapter.json",
    "GrpoAdapter.rollouts": "grpo_adapter/W/rollouts.jsonl",
    "GrpoAdapter.skipped": "grpo_adapter/W/skipped.json",
    "GrpoAdapter.hacking": "grpo_adapter/W/hacking.json",
    "EvaluationReport.folder": "evaluation_report/W",
    "EvaluationReport.report": "evaluation_report/W/report.json",
    "EvaluationReport.chart": "evaluation_report/W/comparison.png",
    "EvaluationReport.cache": "evaluation_cache/all",
    "LoopHealth.folder": "loop_health/all",
    "LoopHealth.report": "loop_health/all/loop_health.json",
    "LoopHealth.chart": "loop_health/all/loop_health.png",
}
# The demo drivers still read a few stage files by name; the handles are for the code location's own modules.
DEMO_DRIVERS = ("demo*.py", "console.py", "stopping.py")


def handle_classes() -> list[type]:
    return [cls for name, cls in inspect.getmembers(stages, inspect.isclass)
            if cls.__module__ == stages.__name__ and not name.startswith("_") and dataclasses.is_dataclass(cls)]


def handle_paths() -> dict[str, Path]:
    """Every path a handle names, as `Class.property`, for partition WEEK."""
    paths = {}
    for cls in handle_classes():
        fields = {f.name for f in dataclasses.fields(cls)}
        handle = cls(WEEK) if "partition" in fields else cls()
        for name, attribute in inspect.getmembers(cls, lambda a: isinstance(a, property)):
            value = getattr(handle, name)
            if isinstance(value, Path):
                paths[f"{cls.__name__}.{name}"] = value
    return paths


def test_every_handle_is_frozen_and_built_from_the_partition_alone():
    for cls in handle_classes():
        assert cls.__dataclass_params__.frozen, cls
        assert [f.name for f in dataclasses.fields(cls)] in (["partition"], []), cls
        assert cls.__doc__ and cls.STAGE in cls.__doc__, f"{cls.__name__} says which stage hands what on"


def test_the_handles_keep_the_layout_and_name_each_path_once():
    paths = handle_paths()
    artifacts = settings.home() / "artifacts"
    shown = {key: path.relative_to(artifacts).as_posix().replace(WEEK, "W") for key, path in paths.items()}
    assert shown == LAYOUT
    assert len(set(paths.values())) == len(paths), "two handles name the same path"
    world = stages.AnonymizedEnvironment(WEEK).world("timetable")
    assert world.relative_to(artifacts).as_posix() == f"anonymized_environment/{WEEK}/worlds/timetable.pkl"
    assert world not in paths.values()


def spelled_names() -> set[str]:
    """The names the handles give inside a stage's folder (not the stage folders themselves: those are the assets'
    names, which assets and checks name as keys)."""
    artifacts = settings.home() / "artifacts"
    return {part for path in handle_paths().values() for part in path.relative_to(artifacts).parts[2:]}


def code_location_modules() -> list[Path]:
    modules = sorted((ROOT / "assets").glob("*.py")) + sorted((ROOT / "resources").glob("*.py"))
    modules += [path for path in sorted((ROOT / "pipelines").glob("*.py"))
                if not any(path.match(pattern) for pattern in DEMO_DRIVERS)]
    return [path for path in modules if path != ROOT / "assets" / "stages.py"]


def offences(source: str, names: set[str]) -> list[str]:
    """Where `source` spells one of `names` as a string (or a path ending in one) or builds a stage's folder."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                node.value in names or any(node.value.endswith("/" + name) for name in names)):
            found.append(f"{node.lineno}: {node.value!r}")
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in ("artifact_dir", "stage_dir"):
                found.append(f"{node.lineno}: {called}(...)")
    return found


def test_no_other_module_spells_a_stage_file_or_builds_a_stage_path():
    names = spelled_names()
    assert {"episodes.jsonl", "train.jsonl", "report.json", "started_from.json", "adapter"} <= names
    found = [f"{path.relative_to(ROOT)}:{where}" for path in code_location_modules()
             for where in offences(path.read_text(), names)]
    assert found == [], "name stage files through assets/stages.py:\n" + "\n".join(found)


def test_the_check_catches_a_file_name_spelled_again():
    names = spelled_names()
    assert sorted(offences('rows = stage_dir("sft_dataset", partition) / "train.jsonl"\n', names)) == [
        "1: 'train.jsonl'", "1: stage_dir(...)"]
    assert offences('path = settings.artifact_dir("grpo_adapter", partition)\n', names) == ["1: artifact_dir(...)"]
    assert offences('skipped = folder / "skipped.json"\n', names) == ["1: 'skipped.json'"]
    assert offences('out = SftDataset(partition).rows\n', names) == []

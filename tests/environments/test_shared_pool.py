"""Many agents, one home: a pool holding several environments' episodes, each environment's weekly run exports,
gates and curates its own and leaves the others' to their runs (they were counted as unclean before, and the
second agent's run stopped at the clean-ratio gate)."""

from __future__ import annotations

import dagster as dg
import pytest

from agent_rl import settings
from agent_rl.environments.runner import Play, play_episodes
from agent_rl.curation.datasets import load_jsonl
from agent_rl.environments.registry import load_environment
from agent_rl.pool.repository import PoolRepository
from agent_rl.records import Split
from assets import curation, environment, pool
from assets.partitions import weekly
from resources.curation import CurationResource
from resources.environment import EnvironmentResource
from resources.stores import PoolResource, WorldStoreResource
from tests.environments.test_example_loop import TimetableTeacher

TIMETABLE = "examples.timetable:TimetableEnvironment"
GATES = [curation.enough_points, curation.clean_ratio, curation.category_diversity]


@pytest.fixture
def shared_pool(store_url, monkeypatch) -> dict[str, int]:
    """The support agent's and the timetable agent's episodes of one week in one pool (SQLite or PostgreSQL)."""
    monkeypatch.setenv("AGENT_RL_POOL_URL", store_url)
    counts = {}
    repo = PoolRepository(store_url)
    for spec in ("support", TIMETABLE):
        env = load_environment(spec)
        teacher = env.teacher() or TimetableTeacher()
        episodes = play_episodes(teacher, env, [Play(t, policy_version="teacher") for t in env.tasks(Split.TRAIN)])
        repo.insert_episodes(episodes)
        counts[env.name] = len(episodes)
    repo.close()
    return counts


@pytest.mark.parametrize("spec, name", [("support", "support"), (TIMETABLE, "timetable")])
def test_each_environments_run_exports_and_gates_only_its_own_episodes(shared_pool, spec, name):
    resources = {"environment": EnvironmentResource(name=spec), "world_store": WorldStoreResource(),
                 "pool": PoolResource(), "curation": CurationResource(min_points=10, min_categories=3)}
    partition = weekly.get_partition_keys()[-1]
    result = dg.materialize([environment.world, environment.tasks, pool.pool_episodes,
                             curation.validated_episodes, *GATES],
                            partition_key=partition, resources=resources, raise_on_error=False)
    assert result.success, [e.step_key for e in result.get_step_failure_events()]
    exported = result.asset_materializations_for_node("pool_episodes")[0]
    assert exported.partition == partition  # the lineage names the week it covers
    assert exported.metadata["environment"].value == name
    assert exported.metadata["rows"].value == shared_pool[name]
    other = next(n for n in shared_pool if n != name)
    assert exported.metadata["other_environments"].value == {other: shared_pool[other]}
    rows = load_jsonl(settings.artifact_dir("validated_episodes", partition) / "episodes.jsonl")
    assert {row["environment"] for row in rows} == {name} and len(rows) == shared_pool[name]
    gates = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert gates == {"enough_points": True, "clean_ratio": True, "category_diversity": True}
    # The other agent's episodes were neither exported nor quarantined: they wait for their own run.
    repo = PoolRepository(settings.pool_url())
    try:
        assert repo.count_by_environment() == shared_pool
        assert sum(1 for page in repo.iter_export(environments=[other]) for _ in page.episodes) == shared_pool[other]
    finally:
        repo.close()


def test_the_diversity_gate_asks_an_environment_for_the_categories_it_declares(shared_pool):
    """The timetable example declares 4 categories: "at least 5" stopped every one of its runs, whatever the data."""
    resources = {"environment": EnvironmentResource(name=TIMETABLE), "world_store": WorldStoreResource(),
                 "pool": PoolResource(), "curation": CurationResource(min_points=10)}
    result = dg.materialize([environment.world, environment.tasks, pool.pool_episodes,
                             curation.validated_episodes, curation.category_diversity],
                            partition_key=weekly.get_partition_keys()[-1], resources=resources, raise_on_error=False)
    (check,) = result.get_asset_check_evaluations()
    assert check.passed and check.metadata["required"].value == 4 and check.metadata["declared_categories"].value == 4

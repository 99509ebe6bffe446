"""Integration: environment → pool export → quality gates → anonymization → datasets, through Dagster."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from agent_rl import settings
from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
from agent_rl.privacy.anonymize import build_directory, scan_for_leaks
from agent_rl.curation.datasets import load_jsonl
from agent_rl.environments.email.grpo_rows import grpo_rows
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.pool.repository import PoolRepository
from agent_rl.environments.email.scenarios.demo import build_demo_environment
from assets import curation, environment, pool
from assets.partitions import weekly
from resources.environment import EnvironmentResource
from resources.curation import CurationResource
from resources.stores import PoolResource, WorldStoreResource

CURATION_ASSETS = [environment.world, environment.tasks, pool.pool_episodes, curation.validated_episodes,
                   curation.anonymization, curation.balanced_episodes, curation.sft_dataset, curation.grpo_dataset]
CHECKS = [curation.enough_points, curation.clean_ratio, curation.category_diversity, curation.no_pii_leak]
SMALL = {"contexts": 3, "documents": 600}


@pytest.fixture
def seeded(tmp_path):
    """A small demo inbox and a pool holding heuristic-teacher episodes of this week."""
    store = open_inbox_store(settings.store_url())
    env = build_demo_environment(store, seed=0, n_inboxes=SMALL["contexts"], n_emails=SMALL["documents"])
    train = [s for s in env.scenarios if s.split.value == "train"]
    teacher = HeuristicPolicy(HeuristicConfig(scenarios=train, wrong_rate=0.1, idk_rate=0.05), store=store)
    episodes = run_episodes(teacher, [EpisodeTask.from_scenario(s) for s in train], store)
    repo = PoolRepository(settings.pool_url())
    repo.insert_episodes(episodes)
    return store, env, episodes


def _run(curation_resource: CurationResource):
    partition = weekly.get_partition_keys()[-1]
    config = {"ops": {"world": {"config": SMALL}, "tasks": {"config": SMALL}}}
    result = dg.materialize(
        CURATION_ASSETS + CHECKS, partition_key=partition, run_config=config, raise_on_error=False,
        resources={"world_store": WorldStoreResource(), "pool": PoolResource(), "curation": curation_resource,
                   "environment": EnvironmentResource()},
    )
    return result, partition


def test_curation_turns_pool_episodes_into_private_training_data(seeded):
    store, env, episodes = seeded
    result, partition = _run(CurationResource(min_points=50, canaries=["4111 1111 1111 1111"]))
    assert result.success
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"enough_points": True, "clean_ratio": True, "category_diversity": True, "no_pii_leak": True}

    validated = result.asset_materializations_for_node("validated_episodes")[0].metadata
    assert validated["count_in"].value == len(episodes) == validated["clean"].value + validated["quarantined"].value

    sft = load_jsonl(settings.artifact_dir("sft_dataset", partition) / "train.jsonl")
    assert sft and all(row["messages"][-1]["role"] in ("assistant", "tool") for row in sft)
    grpo = load_jsonl(settings.artifact_dir("grpo_dataset", partition) / "train.jsonl")
    assert {row["category"] for row in grpo} >= {"date", "amount", "person", "location", "status"}
    # The rows the email assistant's own rollouts read: its anonymized training scenarios, in the file's order.
    world = settings.artifact_dir("anonymized_environment", partition)
    assert grpo == grpo_rows(load_jsonl(world / "scenarios.jsonl"), split="train")

    # Nobody of the real directory survives in what training sees.
    directory = build_directory([e for a in store.inboxes() for e in store.iter_emails(a)])
    texts = [json.dumps(row) for row in sft] + [json.dumps(row) for row in grpo]
    assert scan_for_leaks(texts, directory.originals()) == []


def test_failed_gate_stops_everything_downstream(seeded):
    result, partition = _run(CurationResource(min_points=10**6))
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["enough_points"].passed is False
    assert "required" in (checks["enough_points"].description or "")
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "validated_episodes" in materialized
    assert "anonymized_episodes" not in materialized and "sft_dataset" not in materialized

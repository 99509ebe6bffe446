"""Run the curation assets through Dagster on a small demo pool (shared by the privacy and idempotency tests)."""

from __future__ import annotations

import dagster as dg

from agent_rl import settings
from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.records import Episode
from agent_rl.environments.email.scenarios.demo import build_demo_environment
from assets import curation, environment, pool
from assets.partitions import weekly
from resources.environment import EnvironmentResource
from resources.curation import CurationResource
from resources.stores import PoolResource, WorldStoreResource

CURATION_ASSETS = [environment.world, environment.tasks, pool.pool_episodes, curation.validated_episodes,
                   curation.anonymization, curation.balanced_episodes, curation.sft_dataset, curation.grpo_dataset]
CHECKS = [curation.enough_points, curation.clean_ratio, curation.category_diversity, curation.no_pii_leak]
SMALL = {"contexts": 2, "documents": 300}
# Downstream of the privacy boundary: everything here must be free of personal data.
ANONYMIZED_STAGES = ("anonymized_episodes", "anonymized_environment", "balanced_episodes", "sft_dataset", "grpo_dataset")


def seed_pool(wrong_rate: float = 0.1) -> tuple[object, list[Episode]]:
    """The demo inbox under AGENT_RL_HOME and heuristic-teacher episodes of this week in the default pool."""
    store = open_inbox_store(settings.store_url())
    env = build_demo_environment(store, seed=0, n_inboxes=SMALL["contexts"], n_emails=SMALL["documents"])
    train = [s for s in env.scenarios if s.split.value == "train"]
    teacher = HeuristicPolicy(HeuristicConfig(scenarios=train, wrong_rate=wrong_rate), store=store)
    episodes = run_episodes(teacher, [EpisodeTask.from_scenario(s) for s in train], store)
    return store, episodes


def materialize_curation(resource: CurationResource, instance: dg.DagsterInstance | None = None):
    partition = weekly.get_partition_keys()[-1]
    config = {"ops": {"world": {"config": SMALL}, "tasks": {"config": SMALL}}}
    result = dg.materialize(
        CURATION_ASSETS + CHECKS, partition_key=partition, run_config=config, raise_on_error=False, instance=instance,
        resources={"world_store": WorldStoreResource(), "pool": PoolResource(), "curation": resource,
                   "environment": EnvironmentResource()},
    )
    return result, partition

"""Idempotency: materializing the environment and curation assets again for the same partition gives the
same rows (equal content hashes, file for file) and adds nothing to the pool, the quarantine or the inbox."""

from __future__ import annotations

import hashlib

import dagster as dg

from agent_rl import settings
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.pool import PoolRepository
from curation_run import ANONYMIZED_STAGES, materialize_curation, seed_pool
from resources.curation import CurationResource

STAGES = ("pool_episodes", "validated_episodes", *ANONYMIZED_STAGES)


def _hashes(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, str]]:
    """The content hashes each materialization reported, by asset."""
    return {
        event.asset_key.to_user_string(): {
            key: value.value for key, value in event.materialization.metadata.items() if key.endswith("_hash")
        }
        for event in result.get_asset_materialization_events()
    }


def _files(partition: str) -> dict[str, str]:
    """sha256 of every row file (JSONL) of every stage, and of the anonymized inbox's rows.

    The run reports next to them (report.json, privacy.json) hold timings, so they differ by design.
    """
    digests = {}
    for stage in STAGES:
        for path in sorted(settings.artifact_dir(stage, partition).glob("*.jsonl")):
            digests[f"{stage}/{path.name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    store = open_inbox_store(f"sqlite:///{settings.artifact_dir('anonymized_environment', partition) / 'inbox.db'}")
    rows = [email.model_dump_json() for inbox in store.inboxes() for email in store.iter_emails(inbox)]
    store.close()
    digests["anonymized_environment/inbox.db rows"] = hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()
    return digests


def _counts(pool: PoolRepository, partition: str) -> dict[str, int]:
    store = open_inbox_store(settings.store_url())
    counts = {"pool": pool.count(), "quarantine": len(pool.quarantined()),
              "quarantine_this_partition": len(pool.quarantined(partition)),
              "emails": sum(store.count(inbox) for inbox in store.inboxes())}
    store.close()
    return counts


def test_rematerializing_a_partition_gives_the_same_rows_and_no_duplicates():
    _, episodes = seed_pool(wrong_rate=0.3)
    pool = PoolRepository(settings.pool_url())
    # Two episodes the quality suite rejects, so the quarantine has rows that could be duplicated.
    broken = [episodes[0].model_copy(update={"episode_id": f"broken-{i}", "turns": 10_000}) for i in range(2)]
    pool.insert_episodes(episodes + broken)
    resource = CurationResource(min_points=10, min_clean_ratio=0.5)

    first, partition = materialize_curation(resource)
    assert first.success
    first_hashes, first_files, first_counts = _hashes(first), _files(partition), _counts(pool, partition)
    assert first_counts["quarantine_this_partition"] == 2
    assert first_counts["pool"] == len(episodes) + 2
    assert {"pool_episodes", "validated_episodes", "sft_dataset", "grpo_dataset"} <= set(first_hashes)
    assert len(first_files) >= 8

    second, _ = materialize_curation(resource)
    assert second.success
    assert _hashes(second) == first_hashes
    assert _files(partition) == first_files
    assert _counts(pool, partition) == first_counts

    validated = second.asset_materializations_for_node("validated_episodes")[0].metadata
    assert validated["quarantined"].value == 2 and validated["count_in"].value == len(episodes) + 2

"""Export of one week of episodes from the benchmark pool (the start of curation)."""


from collections import Counter

import dagster as dg

from agent_rl import settings
from agent_rl.curation.datasets import save_jsonl
from assets.partitions import weekly
from resources.stores import PoolResource


def export_path(partition: str):
    return settings.artifact_dir("pool_episodes", partition) / "episodes.jsonl"


@dg.asset(group_name="pool", partitions_def=weekly,
          description="Episodes created in the partition's week, exported in cursor order (re-runs give the same rows).")
def pool_episodes(context: dg.AssetExecutionContext, pool: PoolResource):
    window = context.partition_time_window
    repo = pool.open()
    rows = [
        episode.model_dump(mode="json")
        for page in repo.iter_export(window.start, window.end)
        for episode in page.episodes
    ]
    digest = save_jsonl(rows, export_path(context.partition_key))
    versions = Counter(row["policy_version"] for row in rows)
    return dg.MaterializeResult(metadata={
        "rows": len(rows),
        "window": f"{window.start.isoformat()} .. {window.end.isoformat()}",
        "content_hash": digest,
        "per_version": dg.MetadataValue.json(dict(versions)),
        "path": str(export_path(context.partition_key)),
    })

"""Export of one week of episodes from the benchmark pool (the start of curation)."""


from collections import Counter

import dagster as dg

from agent_rl.curation.datasets import save_jsonl
from assets.partitions import weekly
from assets.stages import PoolExport
from resources.environment import EnvironmentResource
from resources.stores import PoolResource


def export_path(partition: str):
    """The week's export (`PoolExport(partition).episodes`; pipelines/demo_gateway.py reads it through this name)."""
    return PoolExport(partition).episodes


@dg.asset(group_name="pool", partitions_def=weekly,
          description="The run's environment's episodes created in the partition's week, exported in cursor order "
                      "(re-runs give the same rows); other agents' episodes in the same pool are left to their runs.")
def pool_episodes(context: dg.AssetExecutionContext, pool: PoolResource, environment: EnvironmentResource):
    window = context.partition_time_window
    repo = pool.open()
    mine = environment.episode_environments
    rows = [
        episode.model_dump(mode="json")
        for page in repo.iter_export(window.start, window.end, environments=mine)
        for episode in page.episodes
    ]
    others = {name: n for name, n in repo.count_by_environment(window.start, window.end).items() if name not in mine}
    export = PoolExport(context.partition_key)
    digest = save_jsonl(rows, export.episodes)
    versions = Counter(row["policy_version"] for row in rows)
    return dg.MaterializeResult(metadata={
        "rows": len(rows),
        "environment": ", ".join(mine),
        "other_environments": dg.MetadataValue.json(others),
        "window": f"{window.start.isoformat()} .. {window.end.isoformat()}",
        "content_hash": digest,
        "per_version": dg.MetadataValue.json(dict(versions)),
        "path": str(export.episodes),
    })

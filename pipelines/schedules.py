"""The weekly retraining schedule: Monday 03:00 UTC, on the week that just ended."""

import dagster as dg

from assets.partitions import weekly
from pipelines.jobs import retraining_job


@dg.schedule(job=retraining_job, cron_schedule="0 3 * * 1", execution_timezone="UTC",
             default_status=dg.DefaultScheduleStatus.RUNNING)
def weekly_retraining(context: dg.ScheduleEvaluationContext):
    # end_offset=1 exposes the running week too; the schedule trains on the last complete one.
    keys = weekly.get_partition_keys(current_time=context.scheduled_execution_time)
    complete = keys[-2] if len(keys) >= 2 else keys[-1]
    return dg.RunRequest(run_key=f"retrain-{complete}", partition_key=complete)

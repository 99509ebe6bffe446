"""The code location: every asset, check, resource, job, schedule and sensor of agent-rl in one place."""


import dagster as dg

from assets import curation, environment, monitoring, pool, training, validation
from pipelines.jobs import environment_job, retraining_job
from pipelines.schedules import weekly_retraining
from pipelines.sensors import (challenger_sensor, mlflow_run_canceled, mlflow_run_failed, mlflow_run_succeeded,
                               rollout_sensor)
from pipelines.profiles import resources_for

MODULES = [environment, pool, curation, training, validation, monitoring]

defs = dg.Definitions(
    assets=dg.load_assets_from_modules(MODULES),
    asset_checks=dg.load_asset_checks_from_modules(MODULES),
    jobs=[retraining_job, environment_job, monitoring.loop_health_job],
    schedules=[weekly_retraining],
    sensors=[challenger_sensor, rollout_sensor, mlflow_run_succeeded, mlflow_run_failed, mlflow_run_canceled],
    resources=resources_for(),
)

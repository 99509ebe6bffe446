"""The code location: every asset, check, resource, job, schedule and sensor of agent-rl in one place."""


import dagster as dg

from assets import curation, environment, pool, training, validation
from pipelines.jobs import environment_job, retraining_job
from pipelines.schedules import weekly_retraining
from pipelines.sensors import challenger_sensor, rollout_sensor
from resources.compute import TrainingCompute
from resources.curation import CurationResource
from resources.evaluation import EvaluationResource
from resources.registry import MlflowResource
from resources.rollout import RolloutResource
from resources.stores import InboxStoreResource, PoolResource
from resources.training import TrainingResource

MODULES = [environment, pool, curation, training, validation]

defs = dg.Definitions(
    assets=dg.load_assets_from_modules(MODULES),
    asset_checks=dg.load_asset_checks_from_modules(MODULES),
    jobs=[retraining_job, environment_job],
    schedules=[weekly_retraining],
    sensors=[challenger_sensor, rollout_sensor],
    resources={
        "inbox_store": InboxStoreResource(),
        "pool": PoolResource(),
        "curation": CurationResource(),
        "mlflow": MlflowResource(),
        "rollout": RolloutResource(),
        "compute": TrainingCompute(),
        "training": TrainingResource(),
        "evaluation": EvaluationResource(),
    },
)

"""A/B sensors: start a test when a challenger is registered; advance, promote or roll back on evidence.

The decisions live in agent_rl.ab.controller (state in the pool's routing history); these sensors
only call it on a timer and log what it did.
"""


import dagster as dg

from agent_rl.ab.controller import RolloutController
from resources.registry import MlflowResource
from resources.rollout import RolloutResource
from resources.stores import PoolResource


def _controller(context, pool: PoolResource, mlflow: MlflowResource, rollout: RolloutResource) -> RolloutController:
    return RolloutController(pool.open(), rollout.config(), tracking_uri=mlflow.uri(),
                             model_name=mlflow.model_name, log=context.log.info, base_spec=rollout.base_spec)


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Routes 10% of traffic to a newly registered `challenger`.")
def challenger_sensor(context: dg.SensorEvaluationContext, pool: PoolResource, mlflow: MlflowResource,
                      rollout: RolloutResource):
    state = _controller(context, pool, mlflow, rollout).start_if_new_challenger()
    if state is None:
        return dg.SkipReason("no new challenger")
    return dg.SkipReason(f"A/B test started: {state.challenger} at {state.step_share:.0%} against {state.champion}")


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Sequential test of challenger vs champion: 10% → 50% → 100%, or rollback.")
def rollout_sensor(context: dg.SensorEvaluationContext, pool: PoolResource, mlflow: MlflowResource,
                   rollout: RolloutResource):
    decision = _controller(context, pool, mlflow, rollout).evaluate()
    if decision is None:
        return dg.SkipReason("no A/B test running")
    message = decision.message()  # with the evidence it read: per arm rated and labeled, both lifts, the statistic
    if decision.action != "hold":
        context.log.info(message)
    return dg.SkipReason(message)


def end_mlflow_parent_run(tracking_uri: str, dagster_run_id: str, succeeded: bool) -> bool:
    """End the MLflow parent run of a finished Dagster run; a failed one also ends its stage runs a killed process
    left RUNNING, as FAILED (stages that ended themselves keep their status)."""
    from agent_rl.train.tracking import Tracker

    tracker = Tracker(tracking_uri, dagster_run_id=dagster_run_id)
    if succeeded:
        return tracker.end_parent("FINISHED")
    return tracker.end_unfinished("FAILED") > 0


def end_mlflow_runs_killed(tracking_uri: str, dagster_run_id: str) -> int:
    """A stopped (canceled, terminated) Dagster run: its MLflow runs still RUNNING end as KILLED."""
    from agent_rl.train.tracking import Tracker

    return Tracker(tracking_uri, dagster_run_id=dagster_run_id).end_unfinished("KILLED")


@dg.run_status_sensor(run_status=dg.DagsterRunStatus.SUCCESS, default_status=dg.DefaultSensorStatus.RUNNING,
                      description="Ends the MLflow parent run of a Dagster run that succeeded.")
def mlflow_run_succeeded(context: dg.RunStatusSensorContext, mlflow: MlflowResource):
    end_mlflow_parent_run(mlflow.uri(), context.dagster_run.run_id, succeeded=True)


@dg.run_status_sensor(run_status=dg.DagsterRunStatus.CANCELED, default_status=dg.DefaultSensorStatus.RUNNING,
                      description="Ends the MLflow runs of a Dagster run that was terminated as KILLED.")
def mlflow_run_canceled(context: dg.RunStatusSensorContext, mlflow: MlflowResource):
    end_mlflow_runs_killed(mlflow.uri(), context.dagster_run.run_id)


@dg.run_failure_sensor(default_status=dg.DefaultSensorStatus.RUNNING,
                       description="Ends the MLflow parent run of a Dagster run that failed (a blocking check, a crash).")
def mlflow_run_failed(context: dg.RunFailureSensorContext, mlflow: MlflowResource):
    end_mlflow_parent_run(mlflow.uri(), context.dagster_run.run_id, succeeded=False)

"""Monitoring: the loop's run-level success metrics over every weekly retraining run, as one asset with a plot.

Definitions of the metrics and their targets: agent_rl/evaluate/loop_health.py. This asset only reads Dagster's run
history (which runs were retraining runs, their status, failed steps and check results) and hands it to the library
with the MLflow tracking URI.
"""

import json

import dagster as dg

from agent_rl.evaluate.loop_health import loop_health as compute_loop_health
from agent_rl.evaluate.loop_health import plot
from assets.stages import LoopHealth
from resources.environment import EnvironmentResource
from resources.registry import MlflowResource

RETRAINING_JOB = "retraining_job"


def retraining_run_records(instance: dg.DagsterInstance, job_name: str = RETRAINING_JOB,
                           environments: list[str] | None = None) -> list[dict]:
    """Every run of `job_name` as the plain dicts loop_health takes (status, times, failed steps, check results);
    with `environments`, only the runs that exported those environments' episodes (several agents share one
    Dagster instance; a run that crashed before its export is counted with every agent's)."""
    records = instance.get_run_records(dg.RunsFilter(job_name=job_name))
    rows = []
    for record in records:
        run = record.dagster_run
        checks: dict[str, bool] = {}
        failed_steps: list[str] = []
        exported: str | None = None
        events = instance.all_logs(run.run_id, of_type={dg.DagsterEventType.ASSET_CHECK_EVALUATION,
                                                          dg.DagsterEventType.STEP_FAILURE,
                                                          dg.DagsterEventType.ASSET_MATERIALIZATION})
        for entry in events:  # in order: a re-evaluated check keeps its latest result
            event = entry.dagster_event
            if event is None:
                continue
            if event.event_type == dg.DagsterEventType.STEP_FAILURE and event.step_key:
                failed_steps.append(event.step_key)
            elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
                evaluation = event.event_specific_data
                checks[evaluation.check_name] = bool(evaluation.passed)
            elif event.asset_key == dg.AssetKey("pool_episodes"):
                shown = event.materialization.metadata.get("environment")
                exported = getattr(shown, "value", shown)
        if environments is not None and exported is not None and exported != ", ".join(environments):
            continue
        rows.append({"run_id": run.run_id, "partition": run.tags.get("dagster/partition"),
                     "status": run.status.value, "start_time": record.start_time or record.create_timestamp,
                     "end_time": record.end_time, "checks": checks, "failed_steps": failed_steps})
    return rows


@dg.asset(group_name="monitoring",
          description="Run-level success of the loop over the environment's retraining runs: training convergence rate (target "
                      ">= 90%), deployment success rate (target >= 95%) and rollbacks, validation pass rate and the "
                      "candidate's accuracy gain over the incumbent per run; from Dagster's run history, MLflow "
                      "tracking and the MLflow registry.")
def loop_health(context: dg.AssetExecutionContext, mlflow: MlflowResource, environment: EnvironmentResource):
    # This agent's runs and its registered model: another agent's weeks in the same home are not its history.
    runs = retraining_run_records(context.instance, environments=environment.episode_environments)
    health = compute_loop_health(mlflow.uri(), runs, model_name=mlflow.model_name)
    out = LoopHealth()
    out.report.write_text(json.dumps(health.as_dict(), indent=1, default=str))
    chart = plot(health, out.chart)
    context.log.info(f"{len(health.runs)} retraining runs, {len(health.versions)} registry versions")
    metadata = {
        "metrics": dg.MetadataValue.md(health.metrics_markdown()),
        "runs": dg.MetadataValue.md(health.runs_markdown()),
        "chart": dg.MetadataValue.path(str(chart)),
        "chart_preview": dg.MetadataValue.md(f"![loop health]({chart})"),
        "report": dg.MetadataValue.path(str(out.report)),
        "retraining_runs": len(health.runs),
        "rollbacks": health.rollbacks,
        "ab_tests_running": health.tests_running,
    }
    for rate in health.rates:
        # A float only when there is evidence: Dagster plots numeric metadata over materializations.
        metadata[rate.name] = dg.MetadataValue.float(rate.value) if rate.value is not None else "n/a"
        if rate.target is not None:
            meets = rate.meets_target
            metadata[f"{rate.name}_meets_target"] = dg.MetadataValue.bool(meets) if meets is not None else "n/a"
    if health.mean_improvement is not None:
        metadata["mean_validation_improvement"] = dg.MetadataValue.float(health.mean_improvement)
    return dg.MaterializeResult(metadata=metadata)


loop_health_job = dg.define_asset_job(
    "loop_health_job", selection=[loop_health],
    description="Recompute the loop's run-level success metrics from Dagster and MLflow history.",
)

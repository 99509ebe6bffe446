"""Run-level loop health: rates computed from real MLflow stage runs and registry versions, and the `loop_health`
asset reading real Dagster run records (status, failed steps, check results) of a `retraining_job`."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from agent_rl import registry, settings
from agent_rl.evaluate import loop_health as lh
from agent_rl.evaluate.loop_health import RunHealth, VersionOutcome, loop_health, plot, summarize
from agent_rl.train.tracking import Tracker


@pytest.fixture
def uri(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _train(uri: str, run_id: str, sft_losses: list[float] | None, sft_status: str = "FINISHED",
           grpo_status: str | None = "FINISHED") -> Tracker:
    tracker = Tracker(uri, dagster_run_id=run_id)
    if sft_losses is None:
        return tracker
    sft = tracker.start_stage("sft", params={"rows": 10})
    for step, loss in enumerate(sft_losses, start=1):
        sft.log_metrics({"loss": loss, "learning_rate": 1e-4}, step=step)
    if sft_status != "RUNNING":
        sft.finish(sft_status)
    if grpo_status is not None:
        grpo = tracker.start_stage("grpo")
        grpo.log_metrics({"reward": 0.4, "loss": 0.0}, step=1)
        if grpo_status != "RUNNING":
            grpo.finish(grpo_status)
    return tracker


def _validate(tracker: Tracker, candidate: str, accuracies: dict[str, float], gates_pass: bool = True,
              grpo_skipped: str = "") -> None:
    """What assets/validation.py logs: params, `<name>.accuracy` metrics (never `candidate.`), report.json."""
    stage = tracker.start_stage("validation", params={"incumbent": "v1", "incumbent_spec": "mlflow:v1",
                                                      "incumbent_simulated": False, "candidate": candidate,
                                                      "grpo_skipped": grpo_skipped})
    stage.log_metrics({f"{name}.accuracy": value for name, value in accuracies.items()}, step=0)
    gate = {"passed": gates_pass, "observed": 0.1, "required": 0.1, "message": "m"}
    stage.log_json({"gates": {"improvement": gate, "forgetting": {**gate, "passed": True}}}, "report.json")
    stage.finish()


def _register(uri: str, run_id: str | None, rollout: str | None, cause: str | None = None) -> str:
    tags = {"trained_with": "sft+grpo"}
    if run_id:
        tags.update(dagster_run_id=run_id, partition=f"week-{run_id}")
    if rollout:
        tags["rollout"] = rollout
    if cause:
        tags["rollout.cause"] = cause
    return registry.register_policy_spec("heuristic", tags=tags, tracking_uri=uri).version


def test_names_match_the_tracking_and_registry_modules():
    from agent_rl.train import tracking

    assert lh.TRAINING_EXPERIMENT == tracking.EXPERIMENT and lh.PARENT_TAG == tracking.PARENT_TAG
    assert lh.MODEL_NAME == registry.MODEL_NAME


def test_rates_from_mlflow_runs_and_registry_versions(uri, tmp_path):
    # good: loss falls, GRPO finished, validated (+0.2), promoted.
    _validate(_train(uri, "good", [2.0, 1.6, 1.1]), "grpo", {"sft": 0.7, "grpo": 0.8, "incumbent": 0.6})
    # flat: loss rises; validated but the gate failed; nothing registered.
    _validate(_train(uri, "flat", [1.0, 1.2]), "sft", {"sft": 0.55, "grpo": 0.5, "incumbent": 0.6}, gates_pass=False)
    _train(uri, "crashed", [2.0], sft_status="FAILED", grpo_status=None)  # SFT failed
    _train(uri, "nogrpo", [2.0, 1.0], grpo_status="FAILED")  # GRPO failed
    _validate(_train(uri, "back", [3.0, 2.0]), "sft", {"sft": 0.7, "grpo": 0.65, "incumbent": 0.65})
    _train(uri, "gated", None)  # stopped by a curation gate: never trained
    _train(uri, "busy", [2.0, 1.5], sft_status="RUNNING", grpo_status=None)  # still training
    _register(uri, "good", "promoted")
    _register(uri, "back", "rolled_back", "guardrail_breach")
    _register(uri, None, "promoted")  # a challenger registered outside a retraining run (an API model)
    _register(uri, None, "testing")

    runs = [{"run_id": rid, "partition": f"2026-11-{day:02d}", "status": status, "start_time": 1_700_000_000 + day}
            for day, (rid, status) in enumerate([("good", "SUCCESS"), ("flat", "FAILURE"), ("crashed", "FAILURE"),
                                                 ("nogrpo", "FAILURE"), ("back", "SUCCESS"),
                                                 ("gated", "FAILURE"), ("busy", "STARTED")], start=1)]
    health = loop_health(uri, runs)
    by_id = {r.dagster_run_id: r for r in health.runs}
    assert [r.dagster_run_id for r in health.runs] == [r["run_id"] for r in runs]  # oldest first

    assert {rid: r.converged for rid, r in by_id.items()} == {
        "good": True, "flat": False, "crashed": False, "nogrpo": False, "back": True, "gated": None, "busy": None}
    assert by_id["good"].sft_first_loss == 2.0 and by_id["good"].sft_final_loss == 1.1
    rate = health.training_convergence_rate
    assert (rate.numerator, rate.denominator, rate.target) == (2, 5, 0.9) and rate.meets_target is False

    good = by_id["good"]
    assert (good.candidate, good.incumbent, good.candidate_accuracy, good.incumbent_accuracy) == ("grpo", "v1", 0.8,
                                                                                                   0.6)
    assert good.improvement == pytest.approx(0.2) and good.relative_improvement == pytest.approx(1 / 3)
    assert (good.validation_passed, good.registered_version, good.rollout_outcome) == (True, "1", "promoted")
    assert by_id["flat"].improvement == pytest.approx(-0.05) and by_id["flat"].validation_passed is False
    assert by_id["back"].rollout_outcome == "rolled_back" and by_id["back"].rollout_cause == "guardrail_breach"
    assert by_id["gated"].validation_passed is None and by_id["gated"].improvement is None
    assert health.validation_pass_rate.numerator == 2 and health.validation_pass_rate.denominator == 3
    assert health.mean_improvement == pytest.approx((0.2 - 0.05 + 0.05) / 3)

    deployment = health.deployment_success_rate
    assert (deployment.numerator, deployment.denominator) == (2, 3) and deployment.meets_target is False
    assert health.rollbacks == 1 and health.rollback_causes == {"guardrail_breach": 1} and health.tests_running == 1

    png = plot(health, tmp_path / "out" / "loop_health.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    payload = json.loads(json.dumps(health.as_dict(), default=str))
    assert payload["metrics"]["training_convergence_rate"]["meets_target"] is False
    assert "| training convergence rate | 40.0% | 2/5 | >= 90% | **no** |" in health.metrics_markdown()


def test_without_dagster_records_the_runs_come_from_mlflow_parent_runs(uri):
    tracker = _train(uri, "alone", [1.0, 0.5])
    _validate(tracker, "grpo", {"grpo": 0.9, "sft": 0.8, "incumbent": 0.5})
    _register(uri, "alone", "promoted")
    tracker.end_parent("FINISHED")
    health = loop_health(uri)
    (run,) = health.runs
    assert (run.dagster_run_id, run.status, run.partition, run.converged) == ("alone", "SUCCESS", "week-alone", True)
    assert run.started_at is not None and run.improvement == pytest.approx(0.4)
    assert health.training_convergence_rate.meets_target is True and health.deployment_success_rate.value == 1.0


def test_a_run_that_trains_no_grpo_by_design_converges_on_its_sft(uri):
    # The demo's v0: GRPO turned off in the run's settings; validation names why, and SFT alone decides.
    off = "GRPO skipped: turned off in this run's training settings (training.grpo_enabled = false)"
    _validate(_train(uri, "v0", [0.64, 0.2, 0.04], grpo_status=None), "sft", {"sft": 0.36, "incumbent": 0.96},
              grpo_skipped=off)
    _validate(_train(uri, "v0-flat", [0.5, 0.6], grpo_status=None), "sft", {"sft": 0.1, "incumbent": 0.96},
              grpo_skipped=off)
    _validate(_train(uri, "lost", [0.64, 0.2], grpo_status=None), "sft", {"sft": 0.36, "incumbent": 0.96})
    runs = [{"run_id": rid, "status": "SUCCESS", "start_time": 1_700_000_000 + i}
            for i, rid in enumerate(["v0", "v0-flat", "lost"])]
    by_id = {r.dagster_run_id: r for r in loop_health(uri, runs).runs}
    assert by_id["v0"].converged is True and "no GRPO in this run by design" in by_id["v0"].convergence_note
    assert by_id["v0-flat"].converged is False  # SFT alone still has to converge
    assert by_id["lost"].converged is False and by_id["lost"].convergence_note == "GRPO never ran"


def test_a_stage_left_running_by_an_ended_run_did_not_converge(uri):
    _train(uri, "killed", [2.0, 1.0], grpo_status="RUNNING")
    (run,) = loop_health(uri, [{"run_id": "killed", "status": "FAILURE"}]).runs
    assert run.converged is False and "never finished" in run.convergence_note
    (run,) = loop_health(uri, [{"run_id": "killed", "status": "STARTED"}]).runs
    assert run.converged is None


def test_dagster_check_results_and_failed_steps_decide_before_mlflow(uri):
    _validate(_train(uri, "checked", [2.0, 1.0]), "grpo", {"grpo": 0.8, "sft": 0.7, "incumbent": 0.6})
    records = [{"run_id": "checked", "status": "FAILURE",
                "checks": {"beats_champion": True, "no_forgetting": True, "reward_hacking_passed": False}},
               {"run_id": "oom", "status": "FAILURE", "failed_steps": ["sft_adapter"]}]
    checked, oom = loop_health(uri, records).runs
    assert checked.validation_passed is False and "reward_hacking_passed" in checked.validation_note
    assert oom.converged is False and oom.validation_passed is None


def test_targets_are_inclusive_and_no_evidence_is_not_a_verdict():
    versions = [VersionOutcome(str(i), "promoted") for i in range(19)]
    versions.append(VersionOutcome("20", "rolled_back", "timeout"))
    runs = [RunHealth(f"r{i}", converged=i != 0) for i in range(10)]
    health = summarize(runs, versions)
    assert health.deployment_success_rate.value == 0.95 and health.deployment_success_rate.meets_target is True
    assert health.training_convergence_rate.value == 0.9 and health.training_convergence_rate.meets_target is True
    assert health.rollback_causes == {"timeout": 1}
    empty = summarize([], [])
    assert all(rate.value is None and rate.meets_target is None for rate in empty.rates)
    assert "n/a (no evidence)" in empty.metrics_markdown()


# -- the Dagster asset ----------------------------------------------------------------------------------------

PLAN = {  # partition -> what its stand-in retraining run does
    "2026-11-02": {"losses": [2.0, 1.0], "gates": True, "rollout": "promoted", "acc": 0.8},
    "2026-11-09": {"losses": [1.0, 1.5], "gates": False, "acc": 0.55},
    "2026-11-16": {"crash": True},
    "2026-11-23": {"losses": [2.0, 1.2], "gates": True, "rollout": "rolled_back", "acc": 0.7},
}


def _stand_in_retraining_job(uri: str):
    """A `retraining_job` with the real step and check names whose steps log what the real ones log to MLflow."""
    partitions = dg.StaticPartitionsDefinition(list(PLAN))

    @dg.asset(partitions_def=partitions, name="sft_adapter")
    def sft_adapter(context):
        plan = PLAN[context.partition_key]
        if plan.get("crash"):
            raise RuntimeError("CUDA out of memory")
        stage = Tracker(uri, dagster_run_id=context.run_id).start_stage("sft")
        for step, loss in enumerate(plan["losses"], start=1):
            stage.log_metrics({"loss": loss}, step=step)
        stage.finish()

    @dg.asset(partitions_def=partitions, deps=[sft_adapter], name="grpo_adapter")
    def grpo_adapter(context):
        Tracker(uri, dagster_run_id=context.run_id).start_stage("grpo").finish()

    @dg.asset(partitions_def=partitions, deps=[grpo_adapter], name="evaluation_report")
    def evaluation_report(context):
        plan = PLAN[context.partition_key]
        _validate(Tracker(uri, dagster_run_id=context.run_id), "grpo",
                  {"grpo": plan["acc"], "sft": 0.5, "incumbent": 0.6}, gates_pass=plan["gates"])

    def gate(name: str):
        @dg.asset_check(asset=evaluation_report, name=name, blocking=True)
        def check(context):
            return dg.AssetCheckResult(passed=PLAN[context.partition_key]["gates"] or name == "no_forgetting")
        return check

    @dg.asset(partitions_def=partitions, deps=[evaluation_report], name="registered_model")
    def registered_model(context):
        _register(uri, context.run_id, PLAN[context.partition_key]["rollout"])

    assets = [sft_adapter, grpo_adapter, evaluation_report, registered_model]
    checks = [gate(n) for n in ("beats_champion", "no_forgetting", "reward_hacking_passed")]
    job = dg.define_asset_job("retraining_job", selection=dg.AssetSelection.assets(*assets))
    return dg.Definitions(assets=assets, asset_checks=checks, jobs=[job]).resolve_job_def("retraining_job")


def test_loop_health_asset_reads_the_retraining_runs_of_the_instance(uri, tmp_path, monkeypatch):
    from assets.monitoring import loop_health as loop_health_asset
    from resources.environment import EnvironmentResource
    from resources.registry import MlflowResource

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    job = _stand_in_retraining_job(uri)
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster_home")) as instance:
        for partition in PLAN:
            job.execute_in_process(partition_key=partition, instance=instance, raise_on_error=False)
        result = dg.materialize([loop_health_asset], instance=instance,
                                resources={"mlflow": MlflowResource(tracking_uri=uri), "environment": EnvironmentResource()})
    assert result.success
    meta = result.asset_materializations_for_node("loop_health")[0].metadata
    assert meta["retraining_runs"].value == 4
    # Converged: weeks 1 and 4 (week 2's loss rose, week 3 crashed in sft_adapter before logging).
    assert meta["training_convergence_rate"].value == pytest.approx(0.5)
    assert meta["training_convergence_rate_meets_target"].value is False
    # Validation: weeks 1 and 4 passed their checks, week 2 failed them, week 3 never got there.
    assert meta["validation_pass_rate"].value == pytest.approx(2 / 3)
    assert meta["deployment_success_rate"].value == pytest.approx(0.5) and meta["rollbacks"].value == 1
    assert meta["mean_validation_improvement"].value == pytest.approx((0.2 - 0.05 + 0.1) / 3)
    assert "| deployment success rate | 50.0% | 1/2 | >= 95% | **no** |" in meta["metrics"].value
    chart = meta["chart"].value
    assert chart.endswith("loop_health.png") and f"]({chart})" in meta["chart_preview"].value
    out = settings.artifact_dir("loop_health")
    assert (out / "loop_health.png").stat().st_size > 10_000
    report = json.loads((out / "loop_health.json").read_text())
    assert [r["partition"] for r in report["runs"]] == list(PLAN)
    assert [r["converged"] for r in report["runs"]] == [True, False, False, True]
    assert [r["rollout_outcome"] for r in report["runs"]] == ["promoted", None, None, "rolled_back"]


def test_loop_health_is_registered_outside_the_retraining_job():
    from pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    assert graph.get(dg.AssetKey("loop_health")).group_name == "monitoring"
    retraining = defs.resolve_job_def("retraining_job")
    assert "loop_health" not in {node.name for node in retraining.graph.node_defs}
    assert defs.resolve_job_def("loop_health_job") is not None

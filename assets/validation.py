"""Validation: candidate vs champion vs base on held-out anonymized scenarios, then the MLflow registry.

The candidate is registered as `challenger` only after its blocking checks pass; the A/B sensors
take it from there.
"""

import json

import dagster as dg

from agent_rl import registry
from agent_rl.curation.datasets import load_jsonl
from agent_rl.evaluate.harness import evaluate_policy, forgetting_probe, torch_threads
from agent_rl.evaluate.metrics import EvalMetrics
from agent_rl.evaluate.report import (
    category_markdown,
    comparison_chart,
    comparison_markdown,
    forgetting_gate,
    improvement_gate,
)
from agent_rl.inbox.store import open_inbox_store
from agent_rl.policy_specs import load_policy, load_stacked
from agent_rl.records import Scenario
from assets.curation import stage_dir
from assets.partitions import weekly
from assets.training import grpo_adapter, trained_adapters
from resources.evaluation import EvaluationResource
from resources.registry import MlflowResource
from resources.training import TrainingResource


def report_path(partition: str):
    return stage_dir("evaluation_report", partition) / "report.json"


def _champion_spec(mlflow: MlflowResource) -> str:
    try:
        registry.get_version("champion", name=mlflow.model_name, tracking_uri=mlflow.uri())
        return "champion"
    except LookupError:
        return "base"


@dg.asset(group_name="validation", partitions_def=weekly, deps=[grpo_adapter, "anonymized_environment"],
          description="Candidate, champion and base model on the same held-out scenarios, with a forgetting probe.")
def evaluation_report(context: dg.AssetExecutionContext, evaluation: EvaluationResource,
                      training: TrainingResource, mlflow: MlflowResource):
    partition = context.partition_key
    env = stage_dir("anonymized_environment", partition)
    scenarios = [Scenario.model_validate(row) for row in load_jsonl(env / "scenarios.jsonl")]
    store = open_inbox_store(f"sqlite:///{env / 'inbox.db'}")
    adapters = trained_adapters(partition)
    champion_spec = _champion_spec(mlflow)
    specs = {"candidate": None, "base": training.base_model}
    if champion_spec != "base":
        specs["champion"] = champion_spec
    results: dict[str, EvalMetrics] = {}
    probes: dict[str, float] = {}
    for name, spec in specs.items():
        context.log.info(f"evaluating {name} ({spec or 'the trained adapters'})")
        with torch_threads(evaluation.torch_threads):
            policy = load_stacked(training.base_model, adapters, version=name) if spec is None else load_policy(spec)
            results[name] = evaluate_policy(policy, scenarios, store, evaluation.eval_config(), version=name).metrics
            probes[name] = forgetting_probe(policy)
            del policy
    if "champion" not in results:  # no champion registered yet: the prompted base model is what serves
        results["champion"], probes["champion"] = results["base"], probes["base"]
    store.close()
    improvement = improvement_gate(results["candidate"], results["champion"], evaluation.gates())
    forgetting = forgetting_gate(probes["candidate"], probes["base"], evaluation.gates())
    report = {
        "champion_spec": champion_spec,
        "metrics": {name: m.model_dump() for name, m in results.items()},
        "forgetting_probe": probes,
        "gates": {"improvement": improvement.__dict__, "forgetting": forgetting.__dict__},
    }
    report_path(partition).write_text(json.dumps(report, indent=1, default=str))
    chart = comparison_chart(results, stage_dir("evaluation_report", partition) / "comparison.png")
    candidate = results["candidate"]
    return dg.MaterializeResult(metadata={
        "comparison": dg.MetadataValue.md(comparison_markdown(results, probes)),
        "chart": dg.MetadataValue.path(str(chart)),
        "chart_preview": dg.MetadataValue.md(f"![comparison]({chart})"),
        "champion": champion_spec,
        "candidate_accuracy": candidate.accuracy,
        "champion_accuracy": results["champion"].accuracy,
        "candidate_hallucination_rate": candidate.hallucination_rate,
        "candidate_by_category": dg.MetadataValue.md(category_markdown(candidate)),
        "scenarios": candidate.n,
    })


def _gate(context: dg.AssetCheckExecutionContext, name: str) -> dg.AssetCheckResult:
    gate = json.loads(report_path(context.partition_key).read_text())["gates"][name]
    return dg.AssetCheckResult(passed=bool(gate["passed"]), description=gate["message"],
                               metadata={"observed": gate["observed"], "required": gate["required"]})


@dg.asset_check(asset=evaluation_report, blocking=True, description="Candidate beats the champion by the margin.")
def beats_champion(context: dg.AssetCheckExecutionContext):
    return _gate(context, "improvement")


@dg.asset_check(asset=evaluation_report, blocking=True, description="General knowledge did not drop beyond the limit.")
def no_forgetting(context: dg.AssetCheckExecutionContext):
    return _gate(context, "forgetting")


@dg.asset_check(asset=evaluation_report, blocking=True, description="The reward-hacking detectors found nothing.")
def reward_hacking_passed(context: dg.AssetCheckExecutionContext):
    path = stage_dir("grpo_adapter", context.partition_key) / "hacking.json"
    if not path.exists():
        return dg.AssetCheckResult(passed=False, description="the reward-hacking check of grpo_adapter has not run")
    triggered = [f["kind"] for f in json.loads(path.read_text()) if f.get("triggered")]
    return dg.AssetCheckResult(passed=not triggered,
                               description="no finding" if not triggered else f"findings: {', '.join(triggered)}")


@dg.asset(group_name="validation", partitions_def=weekly, deps=[evaluation_report],
          description="The validated candidate in the MLflow registry, alias `challenger`.")
def registered_model(context: dg.AssetExecutionContext, training: TrainingResource, mlflow: MlflowResource):
    partition = context.partition_key
    report = json.loads(report_path(partition).read_text())
    candidate = report["metrics"]["candidate"]
    hashes = {}
    for stage, file in (("sft_dataset", "train.jsonl"), ("grpo_dataset", "train.jsonl")):
        event = context.instance.get_latest_materialization_event(dg.AssetKey(stage))
        meta = event.asset_materialization.metadata if event and event.asset_materialization else {}
        hashes[f"{stage}_hash"] = getattr(meta.get("content_hash"), "value", "")
    version = registry.register_candidate(
        trained_adapters(partition),
        training.base_model,
        metrics={k: v for k, v in candidate.items() if isinstance(v, (int, float))},
        tags={"dagster_run_id": context.run_id, "partition": partition, **hashes,
              "champion_at_validation": report["champion_spec"]},
        alias="challenger", name=mlflow.model_name, tracking_uri=mlflow.uri(),
    )
    return dg.MaterializeResult(metadata={
        "model": version.name, "version": version.version, "aliases": ", ".join(version.aliases),
        "mlflow_run_id": version.run_id, "accuracy": candidate["accuracy"],
    })

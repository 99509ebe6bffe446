"""Validation: SFT alone and SFT + GRPO against the agent production runs now, on the same held-out tasks.

The better of the two trained models is the candidate (`choose_candidate`), and it must beat the incumbent of the
routing table, whatever that is (a registered model, a rule-based agent, a simulated API model), by the margin,
without forgetting what the base model knew. Only then is it registered as `challenger` for the A/B sensors.
"""

import json

import dagster as dg

from agent_rl import registry
from agent_rl.environments import worlds
from agent_rl.evaluate.cache import EvaluationCache, inputs_fingerprint, registered_fingerprint, weights_fingerprint
from agent_rl.evaluate.loop_health import VALIDATION_REPORT
from agent_rl.evaluate.report import category_markdown, comparison_chart, comparison_markdown
from agent_rl.evaluate.validation import Model, environment_table, held_out_measure, validate
from agent_rl.policy_specs import load_policy, load_stacked
from assets.curation import held_out_live
from assets.partitions import weekly
from assets.stages import AnonymizedEnvironment, EvaluationReport, GrpoAdapter, SftAdapter
from assets.training import grpo_adapter, grpo_hacking
from resources.curation import CurationResource
from resources.environment import EnvironmentResource
from resources.evaluation import EvaluationResource
from resources.registry import MlflowResource
from resources.stores import PoolResource
from resources.training import TrainingResource


@dg.asset(group_name="validation", partitions_def=weekly, deps=[grpo_adapter, "anonymized_environment"],
          description="SFT alone, SFT + GRPO and the production incumbent on the same held-out tasks; the better "
                      "trained model is the candidate; forgetting probe against the base model.")
def evaluation_report(context: dg.AssetExecutionContext, evaluation: EvaluationResource,
                      training: TrainingResource, mlflow: MlflowResource, pool: PoolResource,
                      environment: EnvironmentResource, curation: CurationResource):
    partition = context.partition_key
    env_dir, out = AnonymizedEnvironment(partition).folder, EvaluationReport(partition)
    sft, grpo = SftAdapter(partition), GrpoAdapter(partition)
    config, base_model = evaluation.eval_config(), training.base_model
    # The anonymized worlds as GRPO saw them, or the held-out episodes users rated good: the run's capabilities say.
    held_out = held_out_measure(environment.capabilities, config, rated_good=lambda: held_out_live(partition),
                                worlds=lambda: worlds.reopen(environment.loads(), env_dir),
                                answer_judge=evaluation.answer_judging(curation.labeler_judge))
    incumbent_version, incumbent_spec = pool.incumbent(base_model)
    _, hacked = grpo_hacking(partition, environment)
    skipped = grpo.skip_reason()
    models = {
        "sft": Model(lambda: load_stacked(base_model, sft.adapters(), version="sft"),
                     lambda: weights_fingerprint(base_model, sft.adapters())),
        "grpo": Model(lambda: load_stacked(base_model, grpo.adapters(), version="grpo"),
                      lambda: weights_fingerprint(base_model, grpo.adapters())),
        "incumbent": Model(lambda: load_policy(incumbent_spec),
                           lambda: registered_fingerprint(incumbent_spec, mlflow.model_name, mlflow.uri()),
                           label=f" ({incumbent_version}: {incumbent_spec})"),
    }
    # A model evaluated before on the same held-out world (the incumbent was v0 or last week's candidate) is not
    # played again: its result is keyed by its weights, every file of the world and the settings.
    cache = EvaluationCache(out.cache)
    result = validate(models, held_out, base=lambda: load_policy(base_model), gates=evaluation.gates(),
                      incumbent_version=incumbent_version, cache=cache, out_dir=out.folder,
                      inputs=inputs_fingerprint(env_dir, config.model_dump_json() + held_out.measure),
                      threads=evaluation.torch_threads, hacked=hacked, skipped=skipped, log=context.log,
                      base_weights=weights_fingerprint(base_model, []))
    report = result.report(context.run_id, (incumbent_version, incumbent_spec), held_out, hacked, skipped)
    out.report.write_text(json.dumps(report, indent=1, default=str))
    _log_to_mlflow(context, mlflow, report)
    results, probes, candidate = result.results, result.probes, result.candidate
    shown = {f"{n} ({incumbent_version})" if n == "incumbent" else n: m for n, m in results.items()}
    chart = comparison_chart(shown, out.chart)
    return dg.MaterializeResult(metadata={
        "comparison": dg.MetadataValue.md(comparison_markdown(
            shown, {**probes, f"incumbent ({incumbent_version})": probes["incumbent"]})),
        "chart": dg.MetadataValue.path(str(chart)),
        "chart_preview": dg.MetadataValue.md(f"![comparison]({chart})"),
        "incumbent": incumbent_version,
        "incumbent_spec": incumbent_spec,
        "incumbent_simulation": dg.MetadataValue.json(result.simulation) if result.simulation else "no (measured)",
        "candidate": result.choice.name,
        "choice": result.choice.reason,
        "measure": held_out.measure,
        "gate": result.improvement.message,
        "gate_passed": result.improvement.passed,
        **({"answers": result.answers.summary} if result.answers is not None else {}),
        "candidate_accuracy": candidate.accuracy,
        "incumbent_accuracy": results["incumbent"].accuracy,
        "candidate_hallucination_rate": candidate.hallucination_rate,
        "candidate_by_category": dg.MetadataValue.md(category_markdown(candidate)),
        "held_out_tasks": candidate.n,
        **({"episodes": dg.MetadataValue.json(result.episode_files)} if result.episode_files else {}),
        **({"per_environment": dg.MetadataValue.md(environment_table(held_out.per_environment))}
           if held_out.per_environment else {}),
    })


def _log_to_mlflow(context, mlflow: MlflowResource, report: dict) -> None:
    """Both trained models' figures, the incumbent's and the choice, as a `validation` stage of this Dagster run."""
    from agent_rl.train.tracking import Tracker

    stage = Tracker(mlflow.uri(), dagster_run_id=context.run_id).start_stage("validation", params={
        "incumbent": report["incumbent"]["version"], "incumbent_spec": report["incumbent"]["spec"],
        "incumbent_simulated": bool(report["incumbent"]["simulation"]), "candidate": report["choice"]["candidate"],
        "gate": report["gates"]["improvement"].get("kind", ""),
        # Why this run trained no GRPO by design (turned off, no world): loop health then judges SFT alone.
        "grpo_skipped": (report["choice"].get("grpo_skipped") or "")[:250]})
    metrics = {f"{name}.{key}": value for name, m in report["metrics"].items() if name != "candidate"
               for key, value in m.items() if isinstance(value, (int, float))}
    for name, gate in report["gates"].items():  # the decision, its estimate and interval, beside the figures
        metrics[f"gate.{name}.passed"] = float(bool(gate["passed"]))
        metrics[f"gate.{name}.observed"] = gate["observed"]
        for key, value in (gate.get("details") or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[f"gate.{name}.{key}"] = value
            elif isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
                metrics[f"gate.{name}.{key}.low"], metrics[f"gate.{name}.{key}.high"] = value
    stage.log_metrics(metrics, step=0)
    stage.log_json(report, VALIDATION_REPORT)
    stage.finish()


def _gate(context: dg.AssetCheckExecutionContext, name: str) -> dg.AssetCheckResult:
    gate = EvaluationReport(context.partition_key).read()["gates"][name]
    figures = gate.get("details") or {}
    details = {k: v for k, v in figures.items() if isinstance(v, (int, float, str))}
    interval = figures.get("error_reduction_interval") or figures.get("accuracy_difference_interval")
    return dg.AssetCheckResult(passed=bool(gate["passed"]), description=gate["message"],
                               metadata={"gate": gate.get("kind") or name, "observed": gate["observed"],
                                         "required": gate["required"], **details,
                                         **({"interval": dg.MetadataValue.json(interval)} if interval else {})})


@dg.asset_check(asset=evaluation_report, blocking=True,
                description="The candidate earns the place of the agent production runs now under the profile's "
                            "gate (superiority: fewer errors, paired test; non-inferiority at lower cost).")
def beats_champion(context: dg.AssetCheckExecutionContext):
    return _gate(context, "improvement")


@dg.asset_check(asset=evaluation_report, blocking=True, description="General knowledge did not drop beyond the limit.")
def no_forgetting(context: dg.AssetCheckExecutionContext):
    return _gate(context, "forgetting")


@dg.asset_check(asset=evaluation_report, blocking=True,
                description="The candidate is not a model whose training rollouts hacked the reward.")
def reward_hacking_passed(context: dg.AssetCheckExecutionContext):
    choice = EvaluationReport(context.partition_key).read()["choice"]
    hacked = choice.get("grpo_disqualified")
    if choice["candidate"] == "grpo":
        return dg.AssetCheckResult(passed=not hacked, description=hacked or "no finding in the GRPO rollouts")
    return dg.AssetCheckResult(passed=True, description="the candidate is SFT alone" + (
        f"; SFT + GRPO was disqualified ({hacked})" if hacked else ""))


@dg.asset(group_name="validation", partitions_def=weekly, deps=[evaluation_report],
          description="The validated candidate (SFT alone or SFT + GRPO, as chosen) in the MLflow registry, "
                      "alias `challenger`.")
def registered_model(context: dg.AssetExecutionContext, training: TrainingResource, mlflow: MlflowResource,
                     environment: EnvironmentResource):
    partition = context.partition_key
    report = EvaluationReport(partition).read()
    candidate = report["metrics"]["candidate"]
    chosen = report["choice"]["candidate"]
    hashes = {}
    for stage in ("sft_dataset", "grpo_dataset"):
        event = context.instance.get_latest_materialization_event(dg.AssetKey(stage))
        meta = event.asset_materialization.metadata if event and event.asset_materialization else {}
        hashes[f"{stage}_hash"] = getattr(meta.get("content_hash"), "value", "")
    adapters = (GrpoAdapter if chosen == "grpo" else SftAdapter)(partition).adapters()
    version = registry.register_candidate(
        adapters,
        training.base_model,
        metrics={k: v for k, v in candidate.items() if isinstance(v, (int, float))},
        tags={"dagster_run_id": context.run_id, "partition": partition, **hashes,
              "trained_with": "sft+grpo" if chosen == "grpo" else "sft",
              "incumbent_at_validation": report["incumbent"]["version"],
              "started_from": SftAdapter(partition).lineage()["version"] or "base",
              "environment": ", ".join(environment.names)},
        alias="challenger", name=mlflow.model_name, tracking_uri=mlflow.uri(),
    )
    return dg.MaterializeResult(metadata={
        "model": version.name, "version": version.version, "aliases": ", ".join(version.aliases),
        "trained_with": "SFT + GRPO" if chosen == "grpo" else "SFT alone", "choice": report["choice"]["reason"],
        "mlflow_run_id": version.run_id, "accuracy": candidate["accuracy"],
    })

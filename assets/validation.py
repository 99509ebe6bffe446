"""Validation: SFT alone and SFT + GRPO against the agent production runs now, on the same held-out tasks.

The better of the two trained models is the candidate (`choose_candidate`), and it must beat the incumbent of the
routing table, whatever that is (a registered model, a rule-based agent, a simulated API model), by the margin,
without forgetting what the base model knew. Only then is it registered as `challenger` for the A/B sensors.
"""

import json

import dagster as dg

from agent_rl import registry, settings
from agent_rl.curation.datasets import save_jsonl
from agent_rl.environments.registry import load_environment
from agent_rl.evaluate.harness import evaluate_environments, evaluate_tasks, forgetting_probe, torch_threads
from agent_rl.evaluate.cache import EvaluationCache, inputs_fingerprint, registered_fingerprint, weights_fingerprint
from agent_rl.evaluate.metrics import EvalMetrics
from agent_rl.evaluate.report import (
    category_markdown,
    choose_candidate,
    comparison_chart,
    comparison_markdown,
)
from agent_rl.evaluate.gates import forgetting_gate, promotion_gate
from agent_rl.policy_specs import load_policy, load_stacked
from agent_rl.evaluate.replay import evaluate_replay
from assets.curation import anonymized_plugins, anonymized_tasks, held_out_live, stage_dir
from assets.partitions import weekly
from assets.training import (
    grpo_adapter,
    grpo_hacking,
    grpo_skipped,
    sft_adapters,
    sft_started_from,
    trained_adapters,
)
from resources.environment import EnvironmentResource
from resources.evaluation import EvaluationResource
from resources.registry import MlflowResource
from resources.stores import PoolResource
from resources.training import TrainingResource


def report_path(partition: str):
    return stage_dir("evaluation_report", partition) / "report.json"


def _simulation_label(policy) -> dict | None:
    simulation = getattr(policy, "simulation", None)
    return simulation.label() if simulation is not None else None


@dg.asset(group_name="validation", partitions_def=weekly, deps=[grpo_adapter, "anonymized_environment"],
          description="SFT alone, SFT + GRPO and the production incumbent on the same held-out tasks; the better "
                      "trained model is the candidate; forgetting probe against the base model.")
def evaluation_report(context: dg.AssetExecutionContext, evaluation: EvaluationResource,
                      training: TrainingResource, mlflow: MlflowResource, pool: PoolResource,
                      environment: EnvironmentResource):
    partition = context.partition_key
    env = stage_dir("anonymized_environment", partition)
    email, probe_items = None, None
    per_environment: dict[str, dict] = {}  # model -> environment -> metrics, when the run trains on several
    measure = "held-out tasks played to the end and judged"
    if environment.is_live:  # the gateway's tools run in the client: replay the held-out steps users rated good
        held_out = held_out_live(partition)
        measure = (f"replay of {len(held_out)} held-out gateway episodes users rated good: accuracy is the share of "
                   "their steps where the model takes the approved action")

        def evaluate(policy, name):
            return evaluate_replay(policy, held_out, evaluation.eval_config()), []
    elif environment.is_email:  # the anonymized inbox and scenarios, as GRPO saw them
        email = load_environment("email", store_url=f"sqlite:///{env / 'inbox.db'}",
                                 scenarios_path=str(env / "scenarios.jsonl"))
        tasks = email.tasks(evaluation.eval_config().split)

        def evaluate(policy, name):
            result = evaluate_tasks(policy, email, tasks, evaluation.eval_config(), version=name)
            return result.metrics, result.episodes
    else:  # plug-ins: their anonymized held-out tasks in their anonymized worlds, as GRPO saw them
        plugins, tasks = anonymized_plugins(partition), anonymized_tasks(partition)
        pairs = [(p, [t for t in tasks if t.environment == p.name]) for p in plugins]
        probe_items = [item for p in plugins for item in p.probe()] or None

        def evaluate(policy, name):
            combined, each = evaluate_environments(policy, pairs, evaluation.eval_config(), version=name)
            if len(pairs) > 1:
                per_environment[name] = {env: m.model_dump() for env, m in each.items()}
            return combined.metrics, combined.episodes
    incumbent_version, incumbent_spec = pool.incumbent(training.base_model)
    _, hacked = grpo_hacking(partition, environment)
    skipped = grpo_skipped(partition)
    loaders = {
        "sft": lambda: load_stacked(training.base_model, sft_adapters(partition), version="sft"),
        "grpo": lambda: load_stacked(training.base_model, trained_adapters(partition), version="grpo"),
        "incumbent": lambda: load_policy(incumbent_spec),
    }
    if hacked:  # disqualified: evaluating it would decide nothing
        context.log.warning(f"SFT + GRPO disqualified, not evaluated: {hacked}")
        del loaders["grpo"]
    if skipped:
        context.log.warning(skipped)
        loaders.pop("grpo", None)
    results: dict[str, EvalMetrics] = {}
    episode_files: dict[str, str] = {}
    probes: dict[str, float | None] = {}
    simulation = None
    # A model evaluated before on the same held-out world (the incumbent was v0 or last week's candidate) is not
    # played again: its result is keyed by its weights, every file of the world and the settings.
    cache = EvaluationCache(settings.artifact_dir("evaluation_cache"))
    inputs = inputs_fingerprint(env, evaluation.eval_config().model_dump_json() + measure)
    weights = {"sft": weights_fingerprint(training.base_model, sft_adapters(partition)),
               "grpo": weights_fingerprint(training.base_model, trained_adapters(partition)) if "grpo" in loaders
               else None,
               "incumbent": registered_fingerprint(incumbent_spec, mlflow.model_name, mlflow.uri())}
    for name, load in loaders.items():
        label = f" ({incumbent_version}: {incumbent_spec})" if name == "incumbent" else ""
        hit = cache.get(weights[name], inputs) if weights[name] else None
        if hit is not None:
            results[name], episodes, probes[name] = hit
            for episode in episodes:
                episode.policy_version = name
            if episodes:
                episode_files[name] = save_held_out(episodes, stage_dir("evaluation_report", partition), name)
            context.log.info(f"{name}{label}: the same weights were evaluated on this held-out world before; "
                             f"reusing that result (accuracy {results[name].accuracy:.1%})")
            continue
        context.log.info(f"evaluating {name}{label}")
        with torch_threads(evaluation.torch_threads):
            policy = load()
            results[name], episodes = evaluate(policy, name)
            if episodes:  # each held-out episode as played, to see which tasks a model got wrong and how
                episode_files[name] = save_held_out(episodes, stage_dir("evaluation_report", partition), name)
            if name == "incumbent":
                simulation = _simulation_label(policy)
            # A rule-based or simulated incumbent has no general knowledge to lose: no probe.
            is_model = hasattr(policy, "model")
            probes[name] = forgetting_probe(policy, items=probe_items) if is_model else None
            del policy
        if weights[name]:
            cache.put(weights[name], inputs, results[name], episodes, probes[name])
    with torch_threads(evaluation.torch_threads):
        base = load_policy(training.base_model)
        probes["base"] = forgetting_probe(base, items=probe_items)
        del base
    if email is not None:
        email.close()
    choice = choose_candidate(results["sft"], results.get("grpo"), disqualified=hacked, skipped=skipped)
    context.log.info(choice.reason)
    candidate, candidate_probe = results[choice.name], probes[choice.name]
    improvement = promotion_gate(candidate, results["incumbent"], evaluation.gates(),
                                 incumbent_name=f"production's {incumbent_version}")
    forgetting = forgetting_gate(candidate_probe or 0.0, probes["base"] or 0.0, evaluation.gates())
    report = {
        "dagster_run_id": context.run_id,  # readers take the report of the run they ran, never a leftover
        "incumbent": {"version": incumbent_version, "spec": incumbent_spec, "simulation": simulation},
        "choice": {"candidate": choice.name, "reason": choice.reason, "grpo_disqualified": hacked,
                   "grpo_skipped": skipped},
        "measure": measure,
        "per_environment": per_environment,
        "metrics": {"candidate": candidate.model_dump(), **{n: m.model_dump() for n, m in results.items()}},
        "forgetting_probe": probes,
        "episodes": episode_files,
        "gates": {"improvement": improvement.as_dict(), "forgetting": forgetting.as_dict()},
    }
    report_path(partition).write_text(json.dumps(report, indent=1, default=str))
    _log_to_mlflow(context, mlflow, report)
    shown = {f"{n} ({incumbent_version})" if n == "incumbent" else n: m for n, m in results.items()}
    chart = comparison_chart(shown, stage_dir("evaluation_report", partition) / "comparison.png")
    return dg.MaterializeResult(metadata={
        "comparison": dg.MetadataValue.md(comparison_markdown(
            shown, {**probes, f"incumbent ({incumbent_version})": probes["incumbent"]})),
        "chart": dg.MetadataValue.path(str(chart)),
        "chart_preview": dg.MetadataValue.md(f"![comparison]({chart})"),
        "incumbent": incumbent_version,
        "incumbent_spec": incumbent_spec,
        "incumbent_simulation": dg.MetadataValue.json(simulation) if simulation else "no (measured)",
        "candidate": choice.name,
        "choice": choice.reason,
        "measure": measure,
        "gate": improvement.message,
        "gate_passed": improvement.passed,
        "candidate_accuracy": candidate.accuracy,
        "incumbent_accuracy": results["incumbent"].accuracy,
        "candidate_hallucination_rate": candidate.hallucination_rate,
        "candidate_by_category": dg.MetadataValue.md(category_markdown(candidate)),
        "scenarios": candidate.n,
        **({"episodes": dg.MetadataValue.json(episode_files)} if episode_files else {}),
        **({"per_environment": dg.MetadataValue.md(_environment_table(per_environment))} if per_environment else {}),
    })


def save_held_out(episodes, folder, name: str) -> str:
    """`episodes/<name>.jsonl`: one model's held-out episodes, played in the anonymized world (no personal data
    to keep out), replacing the file of an earlier run of the partition whole."""
    path = folder / "episodes" / f"{name}.jsonl"
    save_jsonl((episode.model_dump(mode="json") for episode in episodes), path)
    return str(path)


def _environment_table(per_environment: dict[str, dict]) -> str:
    """Accuracy and failures of each model on each environment of a run that trains on several."""
    lines = ["| model | environment | n | accuracy | failure_rate |", "|---|---|---|---|---|"]
    for model, environments in per_environment.items():
        for name, m in environments.items():
            lines.append(f"| {model} | {name} | {m['n']} | {m['accuracy']:.1%} | {m['failure_rate']:.1%} |")
    return "\n".join(lines)


def _log_to_mlflow(context, mlflow: MlflowResource, report: dict) -> None:
    """Both trained models' figures, the incumbent's and the choice, as a `validation` stage of this Dagster run."""
    from agent_rl.train.tracking import Tracker

    stage = Tracker(mlflow.uri(), dagster_run_id=context.run_id).start_stage("validation", params={
        "incumbent": report["incumbent"]["version"], "incumbent_spec": report["incumbent"]["spec"],
        "incumbent_simulated": bool(report["incumbent"]["simulation"]), "candidate": report["choice"]["candidate"],
        "gate": report["gates"]["improvement"].get("kind", "")})
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
    stage.log_json(report, "report.json")
    stage.finish()


def _gate(context: dg.AssetCheckExecutionContext, name: str) -> dg.AssetCheckResult:
    gate = json.loads(report_path(context.partition_key).read_text())["gates"][name]
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
    choice = json.loads(report_path(context.partition_key).read_text())["choice"]
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
    report = json.loads(report_path(partition).read_text())
    candidate = report["metrics"]["candidate"]
    chosen = report["choice"]["candidate"]
    hashes = {}
    for stage, file in (("sft_dataset", "train.jsonl"), ("grpo_dataset", "train.jsonl")):
        event = context.instance.get_latest_materialization_event(dg.AssetKey(stage))
        meta = event.asset_materialization.metadata if event and event.asset_materialization else {}
        hashes[f"{stage}_hash"] = getattr(meta.get("content_hash"), "value", "")
    adapters = trained_adapters(partition) if chosen == "grpo" else sft_adapters(partition)
    version = registry.register_candidate(
        adapters,
        training.base_model,
        metrics={k: v for k, v in candidate.items() if isinstance(v, (int, float))},
        tags={"dagster_run_id": context.run_id, "partition": partition, **hashes,
              "trained_with": "sft+grpo" if chosen == "grpo" else "sft",
              "incumbent_at_validation": report["incumbent"]["version"],
              "started_from": sft_started_from(partition)["version"] or "base",
              "environment": ", ".join(environment.names)},
        alias="challenger", name=mlflow.model_name, tracking_uri=mlflow.uri(),
    )
    return dg.MaterializeResult(metadata={
        "model": version.name, "version": version.version, "aliases": ", ".join(version.aliases),
        "trained_with": "SFT + GRPO" if chosen == "grpo" else "SFT alone", "choice": report["choice"]["reason"],
        "mlflow_run_id": version.run_id, "accuracy": candidate["accuracy"],
    })

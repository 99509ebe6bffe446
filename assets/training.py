"""Training: SFT warmup on the curated trajectories, then multi-turn GRPO in the anonymized environment.

Both run through the compute resource (in-process, Pipes subprocess or Kubernetes) with the same
entry point; each writes one MLflow run tagged with the Dagster run id.
"""

import json

import dagster as dg

from agent_rl.agent.models import resolve_model
from agent_rl.curation.datasets import load_jsonl
from agent_rl.curation.live import GRPO_SKIPPED
from agent_rl.train.environment import grpo_world
from agent_rl.train.starting_point import starting_point
from agent_rl.reward.hacking import HackingConfig, environment_detectors, mark_rewarded, measure_reward_hacking
from assets.curation import grpo_dataset, sft_dataset
from assets.partitions import weekly
from assets.stages import AnonymizedEnvironment, GrpoAdapter, GrpoDataset, SftAdapter, SftDataset
from resources.compute import TrainingCompute
from resources.environment import EnvironmentResource
from resources.registry import MlflowResource
from resources.stores import PoolResource
from resources.training import TrainingResource


def _tracking(context: dg.AssetExecutionContext, mlflow: MlflowResource) -> dict:
    return {"uri": mlflow.uri(), "dagster_run_id": context.run_id}


def _metadata(result: dict) -> dict:
    keep = ("steps", "final_loss", "tokens_per_second", "rows_used", "cut_rows", "rows_dropped", "seconds",
            "final_reward_mean", "groups", "zero_variance_groups", "replaced_groups", "mlflow_run_id", "resumed_from",
            "adapter_dir")
    meta = {k: result[k] for k in keep if result.get(k) is not None}
    if "adapter_path" in result and "adapter_dir" not in meta:
        meta["adapter_dir"] = result["adapter_path"]
    for key in ("losses", "reward_means"):
        if result.get(key):
            meta[f"final_{key[:-1]}"] = result[key][-1]
    return {k: (dg.MetadataValue.json(v) if isinstance(v, (dict, list)) else v) for k, v in meta.items()}


@dg.asset(group_name="training", partitions_def=weekly, deps=[sft_dataset],
          description="LoRA adapter from SFT on successful trajectories (assistant tokens only), continuing the "
                      "adapter production serves when it is ours (training.start_from).")
def sft_adapter(context: dg.AssetExecutionContext, compute: TrainingCompute, training: TrainingResource,
                mlflow: MlflowResource, pool: PoolResource):
    partition = context.partition_key
    incumbent, _ = pool.incumbent(training.base_model)
    start = starting_point(training.start_from, incumbent, training.base_model, model_name=mlflow.model_name,
                           tracking_uri=mlflow.uri())
    context.log.info(f"SFT starts from {start.description}")
    rows_jsonl, out = SftDataset(partition).rows, SftAdapter(partition)
    if not rows_jsonl.read_text().strip():  # curation allowed an empty dataset: the base model is "SFT alone"
        from agent_rl.train.sft import write_manifest

        out.adapter.mkdir(parents=True, exist_ok=True)
        write_manifest(out.adapter, resolve_model(training.base_model), [])
        out.started_from.write_text(json.dumps(
            {"version": None, "description": "the base model (SFT skipped: no rows)"}))
        return dg.MaterializeResult(metadata={"skipped": "no SFT rows: the base model goes on to GRPO"})
    config = {
        "model_path": str(resolve_model(training.base_model)),
        "rows_jsonl": str(rows_jsonl),
        "out_dir": str(out.folder),
        "settings": training.sft().model_dump(mode="json"),
        "tracking": _tracking(context, mlflow),
        **({"init_adapter": str(start.adapter)} if start.adapter is not None else {}),
    }
    result = compute.run(context, "sft", config)
    out.started_from.write_text(json.dumps({"version": start.version, "description": start.description}))
    return dg.MaterializeResult(metadata={**_metadata(result), "started_from": start.description,
                                          "started_from_version": start.lineage()})


@dg.asset(group_name="training", partitions_def=weekly, deps=[sft_adapter, grpo_dataset, "anonymized_environment"],
          description="GRPO on top of the SFT adapter with multi-turn tool rollouts and the rubric as rewards.")
def grpo_adapter(context: dg.AssetExecutionContext, compute: TrainingCompute, training: TrainingResource,
                 mlflow: MlflowResource, environment: EnvironmentResource):
    partition = context.partition_key
    out = GrpoAdapter(partition)
    skipped = out.skipped
    # Nothing to roll out in (the gateway's tools run in the client), or GRPO turned off for this run: SFT alone is
    # the candidate (validation reads the marker).
    reason = GRPO_SKIPPED if not environment.capabilities.world else None if training.grpo_enabled else GRPO_OFF
    if reason:
        context.log.warning(reason)
        skipped.parent.mkdir(parents=True, exist_ok=True)
        skipped.write_text(json.dumps({"reason": reason}))
        return dg.MaterializeResult(metadata={"skipped": reason})
    skipped.unlink(missing_ok=True)
    # Rolled out in the anonymized world curation left: the store an environment wrote itself, or the saved plug-ins.
    where = grpo_world(environment.loads(), AnonymizedEnvironment(partition).folder)
    sft = SftAdapter(partition)
    config = {
        "model_path": str(resolve_model(training.base_model)),
        **({"sft_adapter": str(sft.adapter)} if sft.adapters() else {}),
        "grpo_rows_jsonl": str(GrpoDataset(partition).rows),
        **where,
        "out_dir": str(out.folder),
        "settings": training.grpo().model_dump(mode="json"),
        "tracking": _tracking(context, mlflow),
    }
    result = compute.run(context, "grpo", config)
    return dg.MaterializeResult(metadata=_metadata(result))


GRPO_OFF = "GRPO skipped: turned off in this run's training settings (training.grpo_enabled = false); SFT alone " \
           "is the candidate"


def grpo_hacking(partition: str, environment: EnvironmentResource) -> tuple[list, str | None]:
    """The reward-hacking findings of a partition's GRPO rollouts, and what triggered (None: nothing did).
    Written beside the adapter (`GrpoAdapter.hacking`); validation reads the same function, so whichever runs first
    both see one verdict."""
    out = GrpoAdapter(partition)
    if out.skip_reason():
        return [], None  # no rollouts to judge: validation weighs SFT alone
    path = out.rollouts
    if not path.exists():
        return [], f"no rollouts recorded at {path}"
    envs = environment.loads()
    rollouts = mark_rewarded(load_jsonl(path), max(env.grading().rewarded_above for env in envs))
    findings = measure_reward_hacking(rollouts, HackingConfig(), environment_detectors(envs))
    out.hacking.write_text(json.dumps([f.as_dict() for f in findings], default=str))
    triggered = [f for f in findings if f.triggered]
    verdict = ("reward hacking: " + ", ".join(f"{f.kind} {f.rate:.0%} > {f.threshold:.0%}" for f in triggered)
               if triggered else None)
    return findings, verdict


# Not blocking: a GRPO run whose rollouts hacked the reward is disqualified at validation, where SFT alone stays a
# candidate; stopping the run here would throw away the SFT model with it.
@dg.asset_check(asset=grpo_adapter, blocking=False,
                description="No reward hacking in the training rollouts (same answer everywhere, unsupported "
                            "answers, tool-call spam, padded sources, format exploits); a failure disqualifies "
                            "SFT + GRPO at validation.")
def no_reward_hacking(context: dg.AssetCheckExecutionContext, environment: EnvironmentResource):
    skipped = GrpoAdapter(context.partition_key).skip_reason()
    if skipped:
        return dg.AssetCheckResult(passed=True, description=skipped)
    findings, verdict = grpo_hacking(context.partition_key, environment)
    return dg.AssetCheckResult(
        passed=verdict is None,
        description=verdict or "no reward hacking detected",
        metadata={f.kind: dg.MetadataValue.json(f.as_dict()) for f in findings},
    )

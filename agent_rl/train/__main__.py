"""`python -m agent_rl.train sft|grpo [--config FILE]`: a training stage as a process, plain or under Dagster Pipes.

The config comes from --config, else from $AGENT_RL_STAGE_CONFIG (the JSON itself, or the store URL of it): a pod
launched from another machine gets it in its environment, since it cannot read the host's files. A config naming
"stage_store" (an fsspec URL) has store URLs for inputs and no out_dir: the stage downloads them to scratch, trains,
uploads its output directory and reports store URLs (agent_rl/train/stage_store.py).

Config (JSON):
  sft:  {"model_path", "rows_jsonl", "out_dir", "settings": {...SFTSettings}, "tracking": {...}}, and
        "init_adapter" (optional): an adapter of the same base to keep training instead of a fresh one
  grpo: {"model_path", "sft_adapter", "grpo_rows_jsonl", "store_url", "out_dir",
         "settings": {...GRPOSettings}, "solve_rates": {task_id: rate} (optional), "tracking": {...}}
        a plug-in environment instead of the email assistant's world: "environment" (a name or import path) or "environment_file"
        (the anonymized environment curation saved, environments.worlds.load_saved) in place of "store_url" (the
        store of an environment that trains alone, the email assistant's mail store; its old name is also read);
        several plug-ins trained at once: "environment_files" (a list).
  tracking (optional): {"uri", "dagster_run_id", "parent_run_id"}; absent or null = no MLflow.
When DAGSTER_PIPES_CONTEXT is set, logs and per-step metrics stream to the Dagster run and the stage
reports its asset materialization (steps, loss, tokens/s, adapter path); otherwise it prints a JSON summary.
Under `accelerate launch` (several processes, RANK set) only rank 0 reports, uploads and writes the adapter.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

# Before torch is imported (it reads these once): on 2 shared cores more threads make training 40-350x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pipes_callback(pipes):
    """A TrainerCallback streaming each log line to Dagster as a log message and a custom 'metrics' message."""
    from transformers import TrainerCallback

    class PipesCallback(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs:
                return
            metrics = {k: float(v) for k, v in logs.items() if isinstance(v, int | float) and not isinstance(v, bool)}
            pipes.log.info(f"step {state.global_step}: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
            pipes.report_custom_message({"kind": "metrics", "step": state.global_step, "metrics": metrics})

    return PipesCallback()


def _tracker(spec: dict[str, Any] | None):
    if not spec:
        return None
    from agent_rl.train.tracking import Tracker

    return Tracker(tracking_uri=spec.get("uri"), dagster_run_id=spec.get("dagster_run_id"),
                   parent_run_id=spec.get("parent_run_id"))


def _require(config: dict[str, Any], keys: tuple[str, ...], stage: str, path: str) -> None:
    missing = [k for k in keys if k not in config]
    if missing:
        raise SystemExit(f"{path}: the {stage} config lacks {', '.join(missing)}")


def run_stage(stage: str, config: dict[str, Any], path: str = "config", extra_callbacks: list | None = None) -> dict[str, Any]:
    """Run one stage from its config dict; returns the JSON-able result summary."""
    from agent_rl.train import grpo as grpo_module
    from agent_rl.train import sft as sft_module
    from agent_rl.train.config import GRPOSettings, SFTSettings

    if stage not in ("sft", "grpo"):
        raise ValueError(f"stage {stage!r}: expected 'sft' or 'grpo'")
    tracker = _tracker(config.get("tracking"))
    if stage == "sft":
        _require(config, ("model_path", "rows_jsonl", "out_dir"), stage, path)
        result = sft_module.train_sft(config["model_path"], config["rows_jsonl"], config["out_dir"],
                                      SFTSettings(**config.get("settings", {})), tracker=tracker,
                                      callbacks=extra_callbacks, init_adapter=config.get("init_adapter"))
    else:
        environment = config.get("environment")
        files = config.get("environment_files") or ([config["environment_file"]] if config.get("environment_file")
                                                     else [])
        if files:
            from agent_rl.environments.worlds import load_saved

            environment = [load_saved(f) for f in files]
        if "store_url" not in config and "inbox_store_url" in config:  # its name in configs written before
            config = {**config, "store_url": config["inbox_store_url"]}
        _require(config, ("model_path", "grpo_rows_jsonl", "out_dir") + (() if environment else ("store_url",)),
                 stage, path)
        result = grpo_module.train_grpo(config["model_path"], config.get("sft_adapter"), config["grpo_rows_jsonl"],
                                        config.get("store_url"), config["out_dir"],
                                        GRPOSettings(**config.get("settings", {})), tracker=tracker,
                                        solve_rates=config.get("solve_rates"), callbacks=extra_callbacks,
                                        environment=environment)
    return result.summary()


def _materialization_metadata(stage: str, summary: dict[str, Any]) -> dict[str, Any]:
    losses = summary.get("losses") or []
    metadata: dict[str, Any] = {
        "steps": summary.get("steps"),
        "final_loss": losses[-1] if losses else None,
        "adapter_path": summary.get("adapter_dir"),
        "seconds": round(summary.get("seconds", 0.0), 2),
        "mlflow_run_id": summary.get("mlflow_run_id"),
        "resumed_from": summary.get("resumed_from"),
        "started_from": summary.get("started_from"),
    }
    if summary.get("stage_out"):  # where the host finds the output, and what the pod's paths stood for
        metadata.update(stage_out=summary["stage_out"], pod_paths=summary.get("pod_paths") or {})
    if stage == "sft":
        metadata.update(tokens_per_second=round(summary.get("tokens_per_second", 0.0), 1),
                        rows_used=summary.get("rows_used"), cut_rows=summary.get("cut_rows"),
                        rows_dropped=len(summary.get("dropped") or []))
    else:
        rewards = summary.get("reward_means") or []
        metadata.update(final_reward_mean=rewards[-1] if rewards else None, groups=summary.get("groups"),
                        zero_variance_groups=summary.get("zero_variance_groups"),
                        replaced_groups=summary.get("replaced_groups") or None,
                        rollouts_path=summary.get("rollouts_path"), outcomes=summary.get("outcomes"),
                        tool_calls=summary.get("tool_calls"), tool_failures=summary.get("tool_failures"))
    # Pipes takes raw scalars; structured values must say they are JSON.
    return {k: ({"raw_value": v, "type": "json"} if isinstance(v, dict | list) else v)
            for k, v in metadata.items() if v is not None}


def _load_config(config_file: str | None) -> tuple[dict[str, Any], str]:
    """(config, where it came from): --config FILE, else the JSON (or its store URL) in CONFIG_ENV."""
    from agent_rl.jsonl import json_object
    from agent_rl.train.stage_store import CONFIG_ENV, read_stage_config

    if config_file is None:
        if not os.environ.get(CONFIG_ENV):
            raise SystemExit(f"no stage config: give --config FILE or set {CONFIG_ENV}")
        try:
            return read_stage_config(os.environ[CONFIG_ENV]), f"${CONFIG_ENV}"
        except (ValueError, RuntimeError) as exc:
            raise SystemExit(str(exc)) from None
    path = Path(config_file)
    if not path.is_file():
        raise SystemExit(f"--config {path}: no such file")
    try:
        return json_object(path.read_text(encoding="utf-8"), f"--config {path}"), str(path)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def run_configured(stage: str, config: dict[str, Any], where: str, callbacks: list | None = None) -> dict[str, Any]:
    """run_stage, or, for a config naming a stage store, run_stage in scratch with its files moved through it."""
    from agent_rl.train.stage_store import STORE_KEY, run_in_scratch

    if STORE_KEY not in config:
        return run_stage(stage, config, where, extra_callbacks=callbacks)
    return run_in_scratch(config, lambda local, uploaders: run_stage(
        stage, local, where, extra_callbacks=[*(callbacks or []), *uploaders]))


def rank() -> int:
    """This process's rank in a multi-process stage (`accelerate launch` sets RANK); 0 when it runs alone."""
    try:
        return int(os.environ.get("RANK") or 0)
    except ValueError:
        raise SystemExit(f"RANK={os.environ['RANK']!r}: expected the process's rank, an integer") from None


def run_helper_rank(stage: str, config: dict[str, Any], where: str) -> None:
    """A rank other than 0 trains alongside rank 0 and reports nothing: no Pipes, no MLflow run, no upload, and its
    final save goes to a folder of its own (rank 0 writes the one adapter), which sees rank 0's checkpoints so both
    resume from the same step."""
    from agent_rl.train.stage_store import STORE_KEY, run_in_scratch

    print(f"agent_rl.train {stage}: rank {rank()} of {os.environ.get('WORLD_SIZE', '?')} trains alongside rank 0",
          file=sys.stderr, flush=True)
    config = {**config, "tracking": None}
    if STORE_KEY in config:  # its own scratch, inputs downloaded, nothing uploaded
        run_in_scratch(config, lambda local, _: run_stage(stage, local, where), upload=False)
        return
    import shutil
    import tempfile

    from agent_rl.train.sft import INPUTS_FILE

    shared = Path(config["out_dir"])
    with tempfile.TemporaryDirectory(prefix=f"agent-rl-rank{rank()}-") as private:
        for checkpoint in shared.glob("checkpoint-*"):  # read, never written, from here
            (Path(private) / checkpoint.name).symlink_to(checkpoint.resolve())
        if (shared / INPUTS_FILE).is_file():
            shutil.copyfile(shared / INPUTS_FILE, Path(private) / INPUTS_FILE)
        run_stage(stage, {**config, "out_dir": private}, where)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent_rl.train", description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["sft", "grpo"])
    parser.add_argument("--config", help="JSON file with the stage's inputs and settings (default: "
                        "$AGENT_RL_STAGE_CONFIG)")
    args = parser.parse_args(argv)
    config, where = _load_config(args.config)
    if rank() > 0:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s rank %(process)d %(name)s: %(message)s")
        run_helper_rank(args.stage, config, where)
        return 0
    if "DAGSTER_PIPES_CONTEXT" in os.environ:
        from dagster_pipes import open_dagster_pipes

        with open_dagster_pipes() as pipes:
            handler = _PipesLogHandler(pipes)
            logging.getLogger("agent_rl").addHandler(handler)
            logging.getLogger("agent_rl").setLevel(logging.INFO)
            pipes.log.info(f"agent_rl.train {args.stage} starting with {where}")
            summary = run_configured(args.stage, config, where, callbacks=[pipes_callback(pipes)])
            pipes.report_asset_materialization(metadata=_materialization_metadata(args.stage, summary))
            pipes.log.info(f"agent_rl.train {args.stage} done: {summary.get('steps')} steps")
        return 0

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    summary = run_configured(args.stage, config, where)
    print(json.dumps(summary, default=str))
    return 0


class _PipesLogHandler(logging.Handler):
    """Library warnings (dropped rows, filter fallbacks) show up in the Dagster run's logs."""

    def __init__(self, pipes) -> None:
        super().__init__(logging.INFO)
        self.pipes = pipes

    def emit(self, record: logging.LogRecord) -> None:
        level = "warning" if record.levelno >= logging.WARNING else "info"
        getattr(self.pipes.log, level)(f"{record.name}: {record.getMessage()}")


if __name__ == "__main__":
    sys.exit(main())

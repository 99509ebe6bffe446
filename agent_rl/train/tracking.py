"""MLflow tracking of training stages: one run per stage, nested under a parent run for the Dagster run.

Uses `MlflowClient` with explicit run ids (no fluent global state), so several stages and processes can
log side by side. Per-step metrics arrive through a transformers `TrainerCallback`; at the end a stage
logs a reward / loss curve PNG and a sample of rollouts (full conversations) as JSON. Training code
takes `tracker=None` to run with no MLflow at all.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from agent_rl import settings

EXPERIMENT = "agent-rl-training"
PARENT_TAG = "dagster_run_id"
# TRL metric names -> the names we chart (both are logged; these are the stable ones the UI and tests use).
METRIC_ALIASES = {
    "reward": "reward_mean",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "zero_variance_group_fraction",
    "tools/failure_frequency": "tool_call_failure_rate",
    "tools/call_frequency": "tool_calls_per_episode",
    "completions/mean_length": "completion_length",
}


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _metric_key(key: str) -> str:
    # MLflow keys allow [A-Za-z0-9_ -./]; TRL's names already fit, but be safe with odd ones.
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in key)


class StageRun:
    """One training stage's MLflow run; collects per-step values for the curve artifact."""

    def __init__(self, tracker: Tracker, run_id: str) -> None:
        self.tracker = tracker
        self.run_id = run_id
        self.history: dict[str, list[tuple[int, float]]] = defaultdict(list)

    @property
    def client(self):
        return self.tracker.client

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        flat = _flatten(params)
        items = [Param(k[:250], str(v)[:6000]) for k, v in flat.items()]
        for start in range(0, len(items), 100):  # MLflow caps a batch at 100 params
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = []
        for key, value in metrics.items():
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                continue
            batch.append(Metric(_metric_key(key), float(value), now, step))
            self.history[key].append((step, float(value)))
            if key in METRIC_ALIASES:
                batch.append(Metric(METRIC_ALIASES[key], float(value), now, step))
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def set_tags(self, tags: dict[str, Any]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value))

    def log_json(self, payload: Any, name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(payload, indent=1, default=str, ensure_ascii=False))
            self.client.log_artifact(self.run_id, str(path))

    def log_file(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_curves(self, keys: list[str], name: str = "reward_curve.png") -> bool:
        """A PNG with one panel per metric that was logged; False if none of them was."""
        series = [(key, self.history[key]) for key in keys if self.history.get(key)]
        if not series:
            return False
        import matplotlib

        matplotlib.use("Agg")  # no display on training machines
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(len(series), 1, figsize=(7, 2.6 * len(series)), squeeze=False)
        for axis, (key, points) in zip(axes[:, 0], series):
            steps, values = zip(*points)
            axis.plot(steps, values, marker="o", markersize=3)
            axis.set_title(key)
            axis.set_xlabel("step")
            axis.grid(alpha=0.3)
        figure.tight_layout()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            figure.savefig(path, dpi=90)
            plt.close(figure)
            self.client.log_artifact(self.run_id, str(path))
        return True

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


class Tracker:
    """Opens stage runs nested under the parent run of one Dagster run (created on first use, found again after)."""

    def __init__(
        self,
        tracking_uri: str | None = None,
        dagster_run_id: str | None = None,
        parent_run_id: str | None = None,
        experiment: str = EXPERIMENT,
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri or settings.mlflow_uri()
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.dagster_run_id = dagster_run_id
        self.experiment_id = self._experiment(experiment)
        self._parent_run_id = parent_run_id

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(
                name, artifact_location=settings.mlflow_artifact_location(self.tracking_uri))
        except Exception:  # another process created it in between
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    @property
    def parent_run_id(self) -> str | None:
        """The run all stages of this Dagster run nest under (None when no Dagster run id was given)."""
        if self._parent_run_id or not self.dagster_run_id:
            return self._parent_run_id
        existing = self._existing_parent()
        if existing is not None:
            self._parent_run_id = existing.info.run_id
        else:
            run = self.client.create_run(
                self.experiment_id,
                run_name=f"dagster-{self.dagster_run_id}",
                tags={PARENT_TAG: self.dagster_run_id, "stage": "parent"},
            )
            self._parent_run_id = run.info.run_id
        return self._parent_run_id

    def end_parent(self, status: str = "FINISHED") -> bool:
        """Close this Dagster run's parent run once the Dagster run ended (its stages close themselves); False
        when it has none. Otherwise the parent stays RUNNING forever beside its finished stages."""
        existing = self._existing_parent() if self.dagster_run_id else None
        if existing is None:
            return False
        if existing.info.status == "RUNNING":
            self.client.set_terminated(existing.info.run_id, status=status)
        return True

    def end_unfinished(self, status: str) -> int:
        """End every run of this Dagster run still RUNNING (the parent and stages whose process was killed) as
        `status` (KILLED for a stopped run, FAILED for a failed one); returns how many were ended. A stage that
        ended itself keeps its own status."""
        if not self.dagster_run_id:
            return 0
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.{PARENT_TAG} = '{self.dagster_run_id}' and "
                                                "attributes.status = 'RUNNING'", max_results=1000)
        for run in runs:
            self.client.set_terminated(run.info.run_id, status=status)
        return len(runs)

    def _existing_parent(self):
        """This Dagster run's parent run, if one was created (by this process or an earlier stage's)."""
        found = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.{PARENT_TAG} = '{self.dagster_run_id}' and tags.stage = 'parent'",
            max_results=1,
        )
        return found[0] if found else None

    def start_stage(self, stage: str, params: dict[str, Any] | None = None,
                    dataset_hashes: dict[str, str] | None = None) -> StageRun:
        tags = {"stage": stage}
        if self.dagster_run_id:
            tags[PARENT_TAG] = self.dagster_run_id
        parent = self.parent_run_id
        if parent:
            tags["mlflow.parentRunId"] = parent
        run = self.client.create_run(self.experiment_id, run_name=stage, tags=tags)
        stage_run = StageRun(self, run.info.run_id)
        if params:
            stage_run.log_params(params)
        if dataset_hashes:
            stage_run.log_params({f"dataset_sha256.{k}": v for k, v in dataset_hashes.items()})
        return stage_run


class MetricsCallback(TrainerCallback):
    """Forwards every Trainer log (loss, reward mean/std, each reward function, tool metrics...) to a stage run
    and keeps the history for the caller's result, with or without MLflow."""

    def __init__(self, stage_run: StageRun | None = None, extra: Any = None) -> None:
        self.stage_run = stage_run
        self.extra = extra  # callable(step) -> dict of our own per-step metrics, merged into each log
        self.history: list[dict[str, float]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        metrics = {k: float(v) for k, v in logs.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        if self.extra is not None:
            metrics.update(self.extra(state.global_step))
        self.history.append({"step": state.global_step, **metrics})
        if self.stage_run is not None:
            self.stage_run.log_metrics(metrics, step=state.global_step)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flatten(inner, f"{prefix}{key}."))
        return flat
    return {prefix.rstrip("."): value}

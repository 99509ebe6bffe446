"""Run-level health of the retraining loop over its history: did training converge, did validation pass and by
how much, and did the A/B tests of the registered challengers end in a promotion or a rollback.

Everything is read back from what the loop already records, nothing is recomputed:

* MLflow tracking (experiment `agent-rl-training`, see agent_rl/train/tracking.py): one parent run per Dagster run
  and, tagged with the same `dagster_run_id`, the stage runs `sft`, `grpo` and `validation`;
* the MLflow model registry (agent_rl/registry.py): versions tagged `dagster_run_id` by `registered_model` and
  `rollout` = testing | promoted | rolled_back (with `rollout.cause`) by the rollout controller;
* optionally Dagster's own run records, as plain dicts (this module does not import dagster):
  ``{"run_id", "partition", "status", "start_time", "end_time", "checks": {check name: passed},
  "failed_steps": [step keys]}`` (all but ``run_id`` optional; times as epoch seconds, datetimes or ISO strings).

Metrics (`LoopHealth`):

* **training convergence rate** (target >= 90%) = converged / runs that trained. A run *trained* when its SFT stage
  run exists in MLflow or Dagster reports a failed `sft_adapter` / `grpo_adapter` step; runs stopped earlier (a
  curation gate) or still in progress are left out. A run *converged* when (1) its latest `sft` stage run ended
  FINISHED with at least two logged `loss` points and the last one (highest step) below the first, and (2) its
  latest `grpo` stage run ended FINISHED, unless the run trains no GRPO by design (its validation stage's
  `grpo_skipped` names why: GRPO turned off, as for the demo's v0, or no world to roll out in). A stage still
  RUNNING after its Dagster run ended (a killed process) counts as not converged.
* **validation pass rate** = passed / runs that reached validation. Passed: every blocking check on
  `evaluation_report` (beats_champion, no_forgetting, reward_hacking_passed) passed when Dagster's check results
  are given; otherwise a version registered for the run (registration only follows passed checks); otherwise the
  `improvement` and `forgetting` gates of the `validation` stage run's report.json.
* **validation improvement** per run = candidate accuracy − incumbent accuracy (absolute, held-out tasks), from the
  `validation` stage run: metric `candidate.accuracy` when logged, else `<param candidate>.accuracy` (sft or grpo),
  against `incumbent.accuracy`; also relative, as the improvement gate measures it.
* **deployment success rate** (target >= 95%) = promoted / (promoted + rolled back) over every registry version
  whose A/B test finished (tag `rollout`); tests still running (`testing`) and versions never tested are left out.
  Rollbacks are also counted on their own, with their `rollout.cause`.

A rate with an empty denominator is None and so is its `meets_target`: no evidence either way.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agent_rl.registry import MODEL_NAME

# The same names as agent_rl/train/tracking.py (not imported: tracking pulls in transformers, which a monitoring
# job has no use for; a test keeps them equal).
TRAINING_EXPERIMENT = "agent-rl-training"
PARENT_TAG = "dagster_run_id"
VALIDATION_CHECKS = ("beats_champion", "no_forgetting", "reward_hacking_passed")
TRAINING_STEPS = ("sft_adapter", "grpo_adapter")
VALIDATION_REPORT = "report.json"  # the validation stage run's copy of the evaluation report (assets/validation.py)
TARGETS = {"training_convergence_rate": 0.90, "deployment_success_rate": 0.95}
IN_PROGRESS = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "MANAGED", "CANCELING"}
_MLFLOW_TO_DAGSTER = {"RUNNING": "STARTED", "SCHEDULED": "QUEUED", "FINISHED": "SUCCESS", "FAILED": "FAILURE",
                      "KILLED": "CANCELED"}


@dataclass
class RunHealth:
    """One retraining run: what its training, validation, registration and A/B test came to."""

    dagster_run_id: str
    partition: str | None = None
    started_at: datetime | None = None
    status: str | None = None  # Dagster's run status (or the MLflow parent run's, mapped) when known
    converged: bool | None = None  # None: never trained, or still training
    convergence_note: str = ""
    sft_first_loss: float | None = None
    sft_final_loss: float | None = None
    validation_passed: bool | None = None  # None: never reached validation
    validation_note: str = ""
    candidate: str | None = None  # sft | grpo
    incumbent: str | None = None  # the version production served at validation
    candidate_accuracy: float | None = None
    incumbent_accuracy: float | None = None
    improvement: float | None = None  # candidate − incumbent accuracy
    relative_improvement: float | None = None
    registered_version: str | None = None
    rollout_outcome: str | None = None  # promoted | rolled_back | testing | not_tested; None: nothing registered
    rollout_cause: str | None = None

    @property
    def label(self) -> str:
        return self.partition or self.dagster_run_id[:8]

    def as_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["started_at"] = self.started_at.isoformat() if self.started_at else None
        return row


@dataclass
class Rate:
    """A success rate with its evidence and target; `value` and `meets_target` are None with no evidence."""

    name: str
    numerator: int
    denominator: int
    target: float | None
    definition: str

    @property
    def value(self) -> float | None:
        return self.numerator / self.denominator if self.denominator else None

    @property
    def meets_target(self) -> bool | None:
        if self.target is None or self.value is None:
            return None
        return self.value >= self.target

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "numerator": self.numerator, "denominator": self.denominator,
                "target": self.target, "meets_target": self.meets_target, "definition": self.definition}


@dataclass
class VersionOutcome:
    """A registry version and how its A/B test ended."""

    version: str
    outcome: str  # promoted | rolled_back | testing | not_tested
    cause: str | None = None
    dagster_run_id: str | None = None


@dataclass
class LoopHealth:
    runs: list[RunHealth]
    versions: list[VersionOutcome]
    training_convergence_rate: Rate
    validation_pass_rate: Rate
    deployment_success_rate: Rate
    rollbacks: int
    rollback_causes: dict[str, int]
    tests_running: int
    mean_improvement: float | None
    generated_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def rates(self) -> list[Rate]:
        return [self.training_convergence_rate, self.deployment_success_rate, self.validation_pass_rate]

    def as_dict(self) -> dict[str, Any]:
        return {
            "generated_at": self.generated_at.isoformat(),
            "metrics": {rate.name: rate.as_dict() for rate in self.rates},
            "rollbacks": self.rollbacks, "rollback_causes": self.rollback_causes,
            "tests_running": self.tests_running, "mean_improvement": self.mean_improvement,
            "runs": [run.as_dict() for run in self.runs],
            "versions": [asdict(v) for v in self.versions],
        }

    def metrics_markdown(self) -> str:
        lines = ["| metric | value | evidence | target | meets target |", "|---|---|---|---|---|"]
        for rate in self.rates:
            target = f">= {rate.target:.0%}" if rate.target is not None else "-"
            meets = {True: "yes", False: "**no**", None: "n/a (no evidence)"}[rate.meets_target]
            lines.append(f"| {rate.name.replace('_', ' ')} | {_pct(rate.value)} | {rate.numerator}/{rate.denominator}"
                         f" | {target} | {meets if rate.target is not None else '-'} |")
        causes = ", ".join(f"{cause}: {n}" for cause, n in sorted(self.rollback_causes.items())) or "-"
        lines.append(f"| rollbacks | {self.rollbacks} | causes: {causes} | - | - |")
        lines.append(f"| A/B tests running | {self.tests_running} | - | - | - |")
        mean = "n/a" if self.mean_improvement is None else f"{self.mean_improvement:+.3f}"
        lines.append(f"| mean validation improvement (accuracy) | {mean} | "
                     f"{sum(r.improvement is not None for r in self.runs)} runs | - | - |")
        return "\n".join(lines)

    def runs_markdown(self) -> str:
        lines = ["| partition | run | started | status | converged | validation | improvement | version | rollout |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for run in self.runs:
            started = run.started_at.strftime("%Y-%m-%d %H:%M") if run.started_at else "-"
            improvement = "-" if run.improvement is None else f"{run.improvement:+.3f}"
            lines.append(f"| {run.partition or '-'} | {run.dagster_run_id[:8]} | {started} | {run.status or '-'} | "
                         f"{_yes_no(run.converged)} | {_yes_no(run.validation_passed)} | {improvement} | "
                         f"{run.registered_version or '-'} | {run.rollout_outcome or '-'} |")
        return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _yes_no(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "-"}[value]


def _when(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), tz=timezone.utc)
    return _when(datetime.fromisoformat(str(value)))


# -- gathering ------------------------------------------------------------------------------------------------


def _client(tracking_uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def _all_runs(client, experiment_id: str) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token, order_by=["start_time ASC"])
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _registry_versions(client, model_name: str) -> list[VersionOutcome]:
    try:
        found = client.search_model_versions(f"name = '{model_name}'")
    except Exception:  # no such registered model yet
        return []
    versions = []
    for mv in sorted(found, key=lambda mv: int(mv.version)):
        tags = dict(mv.tags or {})
        outcome = tags.get("rollout") or "not_tested"
        versions.append(VersionOutcome(str(mv.version), outcome, tags.get("rollout.cause"), tags.get(PARENT_TAG)))
    return versions


def _report_gates(client, run_id: str) -> dict | None:
    """The gates of the validation stage's report.json artifact, None when it cannot be read."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(run_id, VALIDATION_REPORT, tmp)
            return json.loads(Path(path).read_text()).get("gates")
    except Exception:
        return None


def _convergence(sft, grpo, losses: list[tuple[int, int, float]], status: str | None,
                 failed_steps: set[str], grpo_skipped: str = "") -> tuple[bool | None, str]:
    """(converged, why) of one run, as the module docstring defines it. `grpo_skipped`: the validation stage's
    reason when the run trains no GRPO by design (turned off in its settings, no world to roll out in); such a run
    is judged on its SFT alone, as the run it was configured to be."""
    running = status is None or status in IN_PROGRESS  # unknown: a RUNNING stage may still finish

    def unfinished(stage, name: str) -> tuple[bool | None, str] | None:
        if stage.info.status == "RUNNING":
            return (None, f"{name} still running") if running else (False, f"{name} never finished")
        if stage.info.status != "FINISHED":
            return False, f"{name} {stage.info.status.lower()}"
        return None

    if sft is None:
        if failed_steps & set(TRAINING_STEPS):
            return False, f"{', '.join(sorted(failed_steps & set(TRAINING_STEPS)))} failed before logging"
        return None, "no training"
    verdict = unfinished(sft, "SFT")
    if verdict is not None:
        return verdict
    if len(losses) < 2:
        return False, f"SFT logged {len(losses)} loss point(s), convergence not shown"
    first, final = losses[0][2], losses[-1][2]
    if not final < first:
        return False, f"SFT loss did not fall ({first:.4g} -> {final:.4g})"
    if grpo is None:
        if "grpo_adapter" in failed_steps:
            return False, "GRPO failed before logging"
        if grpo_skipped:
            return True, f"SFT loss {first:.4g} -> {final:.4g}; no GRPO in this run by design ({grpo_skipped})"
        return (None, "GRPO not started yet") if running else (False, "GRPO never ran")
    verdict = unfinished(grpo, "GRPO")
    if verdict is not None:
        return verdict
    return True, f"SFT loss {first:.4g} -> {final:.4g}; GRPO finished"


def _validation(stage, client, checks: dict[str, bool], registered: bool) -> tuple[bool | None, str]:
    present = {name: bool(checks[name]) for name in VALIDATION_CHECKS if name in checks}
    failed = sorted(name for name, ok in present.items() if not ok)
    if failed:
        return False, f"failed: {', '.join(failed)}"
    if len(present) == len(VALIDATION_CHECKS):
        return True, "all validation checks passed"
    if registered:
        return True, "candidate registered"
    if stage is None or stage.info.status != "FINISHED":
        return None, "not validated"
    gates = _report_gates(client, stage.info.run_id)
    if not gates:
        return None, "validation report unreadable"
    failed = sorted(name for name, gate in gates.items() if not gate.get("passed"))
    return (False, f"failed: {', '.join(failed)}") if failed else (True, "report gates passed")


def _accuracies(stage) -> tuple[str | None, str | None, float | None, float | None]:
    if stage is None:
        return None, None, None, None
    params, metrics = stage.data.params, stage.data.metrics
    candidate = params.get("candidate")
    candidate_accuracy = metrics.get("candidate.accuracy")
    if candidate_accuracy is None and candidate:
        candidate_accuracy = metrics.get(f"{candidate}.accuracy")
    return candidate, params.get("incumbent"), candidate_accuracy, metrics.get("incumbent.accuracy")


def gather_runs(tracking_uri: str, dagster_runs: list[dict[str, Any]] | None = None,
                model_name: str = MODEL_NAME, experiment: str = TRAINING_EXPERIMENT,
                ) -> tuple[list[RunHealth], list[VersionOutcome]]:
    """One RunHealth per retraining run (oldest first) and every registry version's A/B outcome.

    With `dagster_runs` these are exactly the runs (Dagster knows which runs were retraining runs); without, every
    Dagster run id the MLflow experiment has seen, its status taken from the parent run.
    """
    from agent_rl.evaluate.report import relative_improvement

    client = _client(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    mlflow_runs = _all_runs(client, found.experiment_id) if found is not None else []
    stages: dict[str, dict[str, Any]] = {}
    for run in mlflow_runs:  # oldest first: the latest stage run of a kind wins (a retried step)
        run_id = run.data.tags.get(PARENT_TAG)
        if run_id:
            stages.setdefault(run_id, {})[run.data.tags.get("stage", "")] = run
    versions = _registry_versions(client, model_name)
    by_run = {v.dagster_run_id: v for v in versions if v.dagster_run_id}

    if dagster_runs is None:
        dagster_runs = []
        for run_id, kinds in stages.items():
            first = min(kinds.values(), key=lambda r: r.info.start_time)
            parent = kinds.get("parent")
            status = _MLFLOW_TO_DAGSTER.get(parent.info.status) if parent is not None else None
            registered = by_run.get(run_id)
            partition = None
            if registered is not None:
                partition = client.get_model_version(model_name, registered.version).tags.get("partition")
            dagster_runs.append({"run_id": run_id, "status": status, "start_time": first.info.start_time / 1000,
                                 "partition": partition})

    results = []
    for record in dagster_runs:
        run_id = str(record["run_id"])
        kinds = stages.get(run_id, {})
        status = record.get("status")
        status = str(getattr(status, "value", status)).upper() if status else None
        sft, grpo, validation = kinds.get("sft"), kinds.get("grpo"), kinds.get("validation")
        losses = []
        if sft is not None:
            losses = sorted((m.step, m.timestamp, m.value) for m in client.get_metric_history(sft.info.run_id, "loss"))
        skipped = str(validation.data.params.get("grpo_skipped") or "") if validation is not None else ""
        converged, note = _convergence(sft, grpo, losses, status, set(record.get("failed_steps") or ()), skipped)
        version = by_run.get(run_id)
        passed, why = _validation(validation, client, dict(record.get("checks") or {}), version is not None)
        candidate, incumbent, cand_acc, inc_acc = _accuracies(validation)
        improvement = cand_acc - inc_acc if cand_acc is not None and inc_acc is not None else None
        relative = relative_improvement(cand_acc, inc_acc) if improvement is not None else None
        results.append(RunHealth(
            dagster_run_id=run_id, partition=record.get("partition"), started_at=_when(record.get("start_time")),
            status=status, converged=converged, convergence_note=note,
            sft_first_loss=losses[0][2] if losses else None, sft_final_loss=losses[-1][2] if losses else None,
            validation_passed=passed, validation_note=why, candidate=candidate, incumbent=incumbent,
            candidate_accuracy=cand_acc, incumbent_accuracy=inc_acc, improvement=improvement,
            relative_improvement=relative,
            registered_version=version.version if version else None,
            rollout_outcome=version.outcome if version else None,
            rollout_cause=version.cause if version else None,
        ))
    epoch = datetime.min.replace(tzinfo=timezone.utc)
    results.sort(key=lambda r: (r.started_at or epoch, r.dagster_run_id))
    return results, versions


# -- aggregating ----------------------------------------------------------------------------------------------


def summarize(runs: list[RunHealth], versions: list[VersionOutcome]) -> LoopHealth:
    """The rates over the history, with their targets (definitions in the module docstring)."""
    trained = [r for r in runs if r.converged is not None]
    validated = [r for r in runs if r.validation_passed is not None]
    outcomes = Counter(v.outcome for v in versions)
    finished = outcomes["promoted"] + outcomes["rolled_back"]
    improvements = [r.improvement for r in runs if r.improvement is not None]
    return LoopHealth(
        runs=runs, versions=versions,
        training_convergence_rate=Rate(
            "training_convergence_rate", sum(bool(r.converged) for r in trained), len(trained),
            TARGETS["training_convergence_rate"],
            "runs whose SFT finished with its last logged loss below its first and whose GRPO finished (where the "
            "run trains GRPO), over runs that trained (in-progress runs and runs stopped before training left out)"),
        deployment_success_rate=Rate(
            "deployment_success_rate", outcomes["promoted"], finished, TARGETS["deployment_success_rate"],
            "registered challengers promoted over those whose A/B test finished (promoted + rolled back)"),
        validation_pass_rate=Rate(
            "validation_pass_rate", sum(bool(r.validation_passed) for r in validated), len(validated), None,
            "runs whose candidate passed every blocking validation check, over runs that reached validation"),
        rollbacks=outcomes["rolled_back"],
        rollback_causes=dict(Counter(v.cause or "unknown" for v in versions if v.outcome == "rolled_back")),
        tests_running=outcomes["testing"],
        mean_improvement=sum(improvements) / len(improvements) if improvements else None,
    )


def loop_health(tracking_uri: str, dagster_runs: list[dict[str, Any]] | None = None,
                model_name: str = MODEL_NAME, experiment: str = TRAINING_EXPERIMENT) -> LoopHealth:
    """Gather the runs from MLflow (and Dagster's records when given) and compute the rates."""
    runs, versions = gather_runs(tracking_uri, dagster_runs, model_name=model_name, experiment=experiment)
    return summarize(runs, versions)


# -- the picture ----------------------------------------------------------------------------------------------


def plot(health: LoopHealth, path: str | Path) -> Path:
    """Top: validation improvement per run (bars: green passed, red failed, grey not validated) with convergence
    and rollout markers. Bottom: the running convergence and deployment success rates against their targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agent_rl.evaluate.report import save_figure

    runs = health.runs
    xs = list(range(len(runs)))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(7.0, 0.55 * len(runs) + 3), 6.4), dpi=110, sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    colors = {True: "tab:green", False: "tab:red", None: "lightgrey"}
    heights = [r.improvement or 0.0 for r in runs]
    top.bar(xs, heights, color=[colors[r.validation_passed] for r in runs], edgecolor="black", linewidth=0.4)
    top.axhline(0, color="black", linewidth=0.8)
    span = max([abs(h) for h in heights] + [0.05])
    marker_y = {"converged": span * 1.25, "rollout": span * 1.55}
    for x, run in zip(xs, runs):
        if run.improvement is None:
            top.text(x, 0, "n/a", ha="center", va="bottom", fontsize=7, color="grey")
        style = {True: ("o", "tab:green"), False: ("X", "tab:red"), None: ("o", "none")}[run.converged]
        top.scatter([x], [marker_y["converged"]], marker=style[0], c=style[1],
                    edgecolors="tab:grey" if run.converged is None else style[1], s=40, zorder=3)
        rollout = {"promoted": ("^", "tab:green"), "rolled_back": ("v", "tab:red"), "testing": ("D", "tab:orange"),
                   "not_tested": ("D", "lightgrey")}.get(run.rollout_outcome or "")
        if rollout:
            top.scatter([x], [marker_y["rollout"]], marker=rollout[0], c=rollout[1], s=45, zorder=3)
    top.set_yticks([-span, 0, span, marker_y["converged"], marker_y["rollout"]],
                   [f"{-span:+.2f}", "0", f"{span:+.2f}", "converged", "rollout"], fontsize=7)
    top.set_ylim(-span * 1.15 if any(h < 0 for h in heights) else -span * 0.15, span * 1.8)
    top.set_ylabel("accuracy: candidate − incumbent", fontsize=8)
    top.set_title(
        f"Loop health: convergence {_pct(health.training_convergence_rate.value)} "
        f"(target {health.training_convergence_rate.target:.0%}), deployment "
        f"{_pct(health.deployment_success_rate.value)} (target {health.deployment_success_rate.target:.0%}), "
        f"{health.rollbacks} rollback(s)", fontsize=9)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    top.legend(handles=[Patch(color="tab:green", label="validation passed"),
                        Patch(color="tab:red", label="validation failed"),
                        Line2D([], [], marker="o", color="tab:green", linestyle="", label="converged"),
                        Line2D([], [], marker="X", color="tab:red", linestyle="", label="not converged"),
                        Line2D([], [], marker="^", color="tab:green", linestyle="", label="promoted"),
                        Line2D([], [], marker="v", color="tab:red", linestyle="", label="rolled back")],
               fontsize=6, ncol=3, loc="best")

    def running(values: list[bool | None]) -> list[float | None]:
        hits = total = 0
        out = []
        for value in values:
            if value is not None:
                hits, total = hits + bool(value), total + 1
            out.append(hits / total if total else None)
        return out

    deployed = [{"promoted": True, "rolled_back": False}.get(r.rollout_outcome or "") for r in runs]
    for series, label, color, target in (
            (running([r.converged for r in runs]), "training convergence rate", "tab:blue",
             health.training_convergence_rate.target),
            (running(deployed), "deployment success rate", "tab:purple", health.deployment_success_rate.target)):
        points = [(x, v) for x, v in zip(xs, series) if v is not None]
        if points:
            bottom.plot(*zip(*points), marker="o", markersize=3, color=color, label=f"{label} (running)")
        bottom.axhline(target, color=color, linestyle="--", linewidth=0.9, label=f"target {target:.0%}")
    bottom.set_ylim(-0.05, 1.05)
    bottom.set_ylabel("rate", fontsize=8)
    bottom.legend(fontsize=6, loc="best", ncol=2)
    bottom.set_xticks(xs, [r.label for r in runs], rotation=45, ha="right", fontsize=7)
    if not runs:
        bottom.text(0.5, 0.5, "no retraining runs yet", transform=bottom.transAxes, ha="center", va="center")
    for axis in (top, bottom):
        axis.grid(alpha=0.3, axis="y")
    return save_figure(fig, path)

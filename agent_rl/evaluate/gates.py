"""The promotion gates: when a candidate has earned the incumbent's place, decided on the same held-out tasks.

Two gates a team would set, chosen in the profile (`GateSettings.kind`):

* **superiority** (default): the candidate makes at least `min_error_reduction` fewer errors than the incumbent
  (an error: a task not judged correct), and a paired exact McNemar test on the same tasks says it is better at
  level `alpha`. "10% better" is defined on errors, not accuracy, so it can be reached near the ceiling: against an
  incumbent at 95.7% it means at most 3.87% errors (96.1% accuracy), where 1.10 x 95.7% would be 105.3%.
* **non-inferiority at lower cost** (replacing an API model with ours): the upper confidence bound of the
  incumbent's accuracy advantage is at most `margin` (points), and the candidate is at least `min_cost_ratio`
  times cheaper per 1,000 requests.
* **open**: no quality bar (the fast profile and tests that exercise the mechanics, not the models).

Intervals come from a seeded paired bootstrap over tasks, so a report is reproducible; every outcome says the
gate, the point estimate, the interval, the test and the decision. Tasks that are not independent (the replayed
steps of one episode: an evaluation's `outcome_groups`) are drawn and tested together: the bootstrap resamples
whole groups and the paired test is an exact sign test over groups (a group counts for the model that got more of
its tasks right), which is McNemar's test when every group is one task.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

GateKind = Literal["superiority", "non_inferiority", "open"]


class GateSettings(BaseModel):
    kind: GateKind = Field("superiority", description="which promotion gate decides (module docstring)")
    min_error_reduction: float = Field(0.10, le=1, description="superiority: share of the incumbent's errors the "
                                                               "candidate must avoid (0.10: 10% fewer errors)")
    alpha: float = Field(0.05, gt=0, le=1, description="level of the paired test and of the one-sided bounds")
    margin: float = Field(0.05, ge=0, le=1, description="non-inferiority: accuracy points the candidate may trail by")
    min_cost_ratio: float = Field(5.0, ge=1, description="non-inferiority: incumbent cost / candidate cost, at least")
    max_forgetting_drop: float = Field(0.10, ge=0, le=1, description="allowed drop of the general-knowledge probe")
    bootstrap: int = Field(2000, ge=100, description="paired bootstrap resamples for the intervals")
    seed: int = 0


@dataclass
class GateOutcome:
    passed: bool
    observed: float
    required: float
    message: str
    kind: str = ""
    details: dict[str, Any] = field(default_factory=dict)  # estimates, interval, test, counts

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Paired:
    """Per-task correctness of both models on the tasks both were judged on; `groups`, per task, the unit it is
    drawn with (None: every task its own)."""

    candidate: list[bool]
    incumbent: list[bool]
    groups: list[str] | None = None

    @property
    def n(self) -> int:
        return len(self.candidate)

    def units(self) -> list[list[int]]:
        """The tasks' indices by the unit they are drawn and tested with, in a stable order."""
        if self.groups is None:
            return [[k] for k in range(self.n)]
        by_group: dict[str, list[int]] = {}
        for k, group in enumerate(self.groups):
            by_group.setdefault(group, []).append(k)
        return [by_group[g] for g in sorted(by_group)]

    @property
    def discordant(self) -> tuple[int, int]:
        """(units where the candidate got more tasks right, units where the incumbent did): with one task a unit,
        tasks only the candidate got right and tasks only the incumbent got right."""
        margins = [sum(int(self.candidate[k]) - int(self.incumbent[k]) for k in unit) for unit in self.units()]
        return sum(1 for m in margins if m > 0), sum(1 for m in margins if m < 0)

    def describe(self) -> str:
        """How many tasks were paired, and in how many units when they are drawn together."""
        if self.groups is None:
            return f"{self.n} paired tasks"
        return f"{self.n} paired tasks in {len(self.units())} groups drawn and tested together"


def paired(candidate: dict[str, bool], incumbent: dict[str, bool], groups: dict[str, str] | None = None) -> Paired:
    """The tasks both evaluations judged, in a stable order; ValueError when they share none (nothing to compare).
    `groups` maps a task to the unit it belongs to (a task it leaves out is a unit of its own)."""
    common = sorted(set(candidate) & set(incumbent))
    if not common:
        raise ValueError("the candidate and the incumbent were judged on no common held-out task: the gate needs "
                         "both evaluated on the same tasks")
    units = [str(groups.get(k, f"task:{k}")) for k in common] if groups else None
    return Paired([bool(candidate[k]) for k in common], [bool(incumbent[k]) for k in common], units)


def mcnemar_p(only_candidate: int, only_incumbent: int) -> float:
    """One-sided exact McNemar p-value for 'the candidate is better': P(X >= only_candidate), X ~ Bin(b + c, 1/2)."""
    from scipy.stats import binom

    total = only_candidate + only_incumbent
    if total == 0:
        return 1.0
    return float(binom.sf(only_candidate - 1, total, 0.5))


def error_reduction(candidate_errors: float, incumbent_errors: float) -> float:
    """Share of the incumbent's errors the candidate avoids; -inf when the incumbent made none and the candidate
    some, 0 when neither did (nothing to reduce)."""
    if incumbent_errors <= 0:
        return 0.0 if candidate_errors <= 0 else -math.inf
    return (incumbent_errors - candidate_errors) / incumbent_errors


def _bootstrap(pairs: Paired, settings: GateSettings) -> list[tuple[float, float]]:
    """Resampled (candidate accuracy, incumbent accuracy) over units (tasks, or groups of them), pairs kept
    together."""
    import numpy as np

    rng = np.random.default_rng(settings.seed)
    units = pairs.units()
    cand = np.array([sum(pairs.candidate[k] for k in unit) for unit in units], dtype=float)
    inc = np.array([sum(pairs.incumbent[k] for k in unit) for unit in units], dtype=float)
    size = np.array([len(unit) for unit in units], dtype=float)
    index = rng.integers(0, len(units), size=(settings.bootstrap, len(units)))
    drawn = size[index].sum(axis=1)
    return list(zip((cand[index].sum(axis=1) / drawn).tolist(), (inc[index].sum(axis=1) / drawn).tolist()))


def _quantile(ordered: list[float], q: float) -> float:
    index = min(len(ordered) - 1, max(0, int(math.floor(q * (len(ordered) - 1)))))
    return ordered[index]


def _pct(value: float) -> str:
    return "-inf" if value == -math.inf else f"{value:+.1%}"


def superiority_gate(pairs: Paired, settings: GateSettings, incumbent_name: str = "incumbent") -> GateOutcome:
    cand_acc, inc_acc = sum(pairs.candidate) / pairs.n, sum(pairs.incumbent) / pairs.n
    reduction = error_reduction(1 - cand_acc, 1 - inc_acc)
    only_c, only_i = pairs.discordant
    p = mcnemar_p(only_c, only_i)
    resampled = _bootstrap(pairs, settings)
    diffs = sorted(c - i for c, i in resampled)
    reductions = sorted(error_reduction(1 - c, 1 - i) for c, i in resampled)
    level = 1 - 2 * settings.alpha  # two-sided interval whose lower end is the one-sided bound at alpha
    low, high = _quantile(reductions, settings.alpha), _quantile(reductions, 1 - settings.alpha)
    d_low, d_high = _quantile(diffs, settings.alpha), _quantile(diffs, 1 - settings.alpha)
    significant = p <= settings.alpha
    large = reduction >= settings.min_error_reduction
    passed = significant and large
    if passed:
        why = "passed"
    elif 1 - inc_acc <= 0:
        why = f"not passed: {incumbent_name} made no error on these tasks, so no candidate can make fewer"
    elif not large:
        why = f"not passed: {_pct(reduction)} fewer errors, {settings.min_error_reduction:.0%} required"
    else:
        why = f"not passed: not significant (p = {p:.3g} > alpha {settings.alpha:g})"
    if pairs.groups is None:
        test, counted = "exact McNemar, one-sided", f"McNemar {only_c} vs {only_i} discordant"
    else:
        test, counted = "exact sign test over groups, one-sided", f"sign test {only_c} vs {only_i} discordant groups"
    message = (f"superiority on {pairs.describe()}: accuracy {cand_acc:.1%} vs {incumbent_name} {inc_acc:.1%} "
               f"({d_low:+.1%} to {d_high:+.1%} at {level:.0%}); errors {1 - cand_acc:.1%} vs {1 - inc_acc:.1%}, "
               f"{_pct(reduction)} fewer ({_pct(low)} to {_pct(high)}); {counted}, one-sided p = {p:.3g}; {why}")
    return GateOutcome(passed, round(reduction, 6) if math.isfinite(reduction) else -1e9, settings.min_error_reduction,
                       message, "superiority", {
                           "n": pairs.n, "candidate_accuracy": cand_acc, "incumbent_accuracy": inc_acc,
                           "error_reduction": reduction if math.isfinite(reduction) else None,
                           "error_reduction_interval": [low if math.isfinite(low) else None,
                                                        high if math.isfinite(high) else None],
                           "accuracy_difference": cand_acc - inc_acc, "accuracy_difference_interval": [d_low, d_high],
                           "interval_level": level, "test": test, "p_value": p,
                           "alpha": settings.alpha, "discordant": [only_c, only_i]})


def non_inferiority_gate(pairs: Paired, settings: GateSettings, candidate_cost: float, incumbent_cost: float,
                         incumbent_name: str = "incumbent") -> GateOutcome:
    cand_acc, inc_acc = sum(pairs.candidate) / pairs.n, sum(pairs.incumbent) / pairs.n
    diffs = sorted(c - i for c, i in _bootstrap(pairs, settings))
    lower = _quantile(diffs, settings.alpha)  # one-sided (1 - alpha) lower bound of candidate - incumbent
    worst = -lower  # the incumbent's advantage at its upper confidence bound
    if candidate_cost > 0:
        ratio = incumbent_cost / candidate_cost
    else:
        ratio = math.inf if incumbent_cost > 0 else 0.0
    close = worst <= settings.margin
    cheap = ratio >= settings.min_cost_ratio
    if close and cheap:
        why = "passed"
    elif not close:
        why = f"not passed: {incumbent_name} may be up to {worst:.1%} better, at most {settings.margin:.1%} allowed"
    else:
        why = f"not passed: {ratio:.1f}x cheaper, at least {settings.min_cost_ratio:g}x required"
    shown_ratio = "no per-request price" if ratio == math.inf else f"{ratio:.1f}x"
    message = (f"non-inferiority at lower cost on {pairs.describe()}: accuracy {cand_acc:.1%} vs "
               f"{incumbent_name} {inc_acc:.1%}; {incumbent_name}'s advantage at most {worst:+.1%} at "
               f"{1 - settings.alpha:.0%} (margin {settings.margin:.1%}); cost per 1k requests ${candidate_cost:.2f} "
               f"vs ${incumbent_cost:.2f} ({shown_ratio} cheaper, {settings.min_cost_ratio:g}x required); {why}")
    return GateOutcome(close and cheap, round(worst, 6), settings.margin, message, "non_inferiority", {
        "n": pairs.n, "candidate_accuracy": cand_acc, "incumbent_accuracy": inc_acc,
        "accuracy_difference": cand_acc - inc_acc, "accuracy_difference_lower_bound": lower,
        "interval_level": 1 - settings.alpha, "alpha": settings.alpha, "margin": settings.margin,
        "cost_ratio": ratio if math.isfinite(ratio) else None, "min_cost_ratio": settings.min_cost_ratio})


def promotion_gate(candidate: Any, incumbent: Any, settings: GateSettings,
                   incumbent_name: str = "incumbent") -> GateOutcome:
    """The profile's gate over two evaluations (EvalMetrics with per-task `outcomes`) of the same tasks."""
    if settings.kind == "open":
        return GateOutcome(True, candidate.accuracy - incumbent.accuracy, -1.0,
                           f"open gate (no quality bar): accuracy {candidate.accuracy:.1%} vs {incumbent_name} "
                           f"{incumbent.accuracy:.1%}", "open", {})
    pairs = paired(candidate.outcomes, incumbent.outcomes,
                   {**incumbent.outcome_groups, **candidate.outcome_groups} or None)
    if settings.kind == "non_inferiority":
        return non_inferiority_gate(pairs, settings, candidate.cost_per_1k_usd, incumbent.cost_per_1k_usd,
                                    incumbent_name)
    return superiority_gate(pairs, settings, incumbent_name)


def forgetting_gate(candidate_probe: float, base_probe: float, settings: GateSettings) -> GateOutcome:
    drop = base_probe - candidate_probe
    return GateOutcome(drop <= settings.max_forgetting_drop, round(drop, 4), settings.max_forgetting_drop,
                       f"general probe {candidate_probe:.0%} vs base {base_probe:.0%} (drop {drop:+.0%}); "
                       f"at most {settings.max_forgetting_drop:.0%} drop allowed", "forgetting")

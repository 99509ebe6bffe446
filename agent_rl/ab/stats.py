"""Sequential A/B statistics that stay valid however often the sensor looks at the data.

The success-rate test is the mixture sequential probability ratio test (mSPRT) of Johari,
Pekelis and Walsh ("Always valid inference: bringing sequential analysis to A/B testing",
the "peeking" paper), on the difference of two proportions with a normal mixture
N(0, tau^2) over the difference. Why this one: under the null the mixture likelihood ratio
is a (normal-approximation) martingale, so by Ville's inequality P(it ever reaches 1/alpha)
<= alpha: the p-value 1/Lambda may be checked after every episode, the allocation may change
between checks (10% -> 50%), and the rejection is still an alpha-level event. It needs only
counts, is two-sided (it catches improvement and degradation with one alpha budget) and
inverts into an always-valid confidence sequence for the lift.

Caveat: validity rests on the normal approximation of the proportions, which is why every
decision waits for a minimum sample per arm; the simulations in `simulate.py` measure the
false-positive rate actually reached.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from statistics import NormalDist
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

Verdict = Literal["better", "worse", "continue"]

# The latency guardrail is about the 95th percentile: 5% of requests are above it.
P95_EXCEEDANCE = 0.05
# The champion latencies a step needs before its p95 sets the challenger's limit there: with fewer than 20, no
# request lies above the 95th percentile and the "percentile" is the slowest request.
MIN_LATENCIES_FOR_P95 = 20


@dataclass(frozen=True)
class ArmStats:
    """Outcome counts of one policy version since the test began (successes, hallucinations
    and errors are disjoint subsets of the trials)."""

    successes: int
    trials: int
    hallucinations: int = 0
    errors: int = 0
    latencies_ms: tuple[float, ...] = field(default=(), repr=False)
    # The rollout step (0 = the first share) each latency was served in, parallel to `latencies_ms`; empty: one
    # step. Latency depends on the load and the load moves with the shares, so the guardrail compares step by step.
    latency_steps: tuple[int, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.trials < 0:
            raise ValueError(f"ArmStats.trials must be >= 0, got {self.trials}")
        for name in ("successes", "hallucinations", "errors"):
            value = getattr(self, name)
            if not 0 <= value <= self.trials:
                raise ValueError(f"ArmStats.{name} must be between 0 and trials ({self.trials}), got {value}")
        if self.successes + self.hallucinations + self.errors > self.trials:
            raise ValueError(
                "ArmStats: successes + hallucinations + errors "
                f"({self.successes}+{self.hallucinations}+{self.errors}) exceed trials ({self.trials})"
            )
        if not isinstance(self.latencies_ms, tuple):
            object.__setattr__(self, "latencies_ms", tuple(float(x) for x in self.latencies_ms))
        if any(not math.isfinite(x) or x < 0 for x in self.latencies_ms):
            raise ValueError("ArmStats.latencies_ms must be finite and >= 0")
        if not isinstance(self.latency_steps, tuple):
            object.__setattr__(self, "latency_steps", tuple(int(x) for x in self.latency_steps))
        if self.latency_steps and len(self.latency_steps) != len(self.latencies_ms):
            raise ValueError(f"ArmStats.latency_steps has {len(self.latency_steps)} entries for "
                             f"{len(self.latencies_ms)} latencies: give one step per latency, or none")
        if any(x < 0 for x in self.latency_steps):
            raise ValueError("ArmStats.latency_steps must be >= 0")

    def latencies_by_step(self) -> dict[int, np.ndarray]:
        """This arm's latencies grouped by the step they were served in (all in step 0 without steps)."""
        values = np.asarray(self.latencies_ms, dtype=float)
        if not self.latency_steps:
            return {0: values} if values.size else {}
        steps = np.asarray(self.latency_steps)
        return {int(step): values[steps == step] for step in np.unique(steps)}

    @property
    def success_rate(self) -> float:
        return self.successes / self.trials if self.trials else 0.0

    @property
    def hallucination_rate(self) -> float:
        return self.hallucinations / self.trials if self.trials else 0.0

    @property
    def error_rate(self) -> float:
        return self.errors / self.trials if self.trials else 0.0

    @property
    def failures(self) -> int:
        """What a user feels as a failure: a wrong answer, a broken reply or none in time."""
        return self.hallucinations + self.errors

    @property
    def failure_rate(self) -> float:
        return self.failures / self.trials if self.trials else 0.0

    @property
    def latency_p95_ms(self) -> float | None:
        return float(np.percentile(self.latencies_ms, 95)) if self.latencies_ms else None

    def summary(self) -> dict[str, float | int | None]:
        """The figures worth logging next to a decision (no raw latencies)."""
        return {
            "trials": self.trials,
            "successes": self.successes,
            "success_rate": self.success_rate,
            "hallucination_rate": self.hallucination_rate,
            "error_rate": self.error_rate,
            "failure_rate": self.failure_rate,
            "latency_p95_ms": self.latency_p95_ms,
        }


def check_alpha(value: float, name: str) -> float:
    """`value` if it is a usable significance level (strictly between 0 and 1), else a ValueError naming the
    setting `name`: every config holding an alpha (this test's, the rollout's guardrails and labels) checks here."""
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value}")
    return value


def check_tau_squared(value: float) -> float:
    """`value` if it is a usable mSPRT mixture variance (positive and finite), else a ValueError: the test's
    config and the rollout's, which passes its own on to the test, check it the same way."""
    if not (value > 0.0 and math.isfinite(value)):
        raise ValueError(f"tau_squared must be a positive number, got {value}")
    return value


# The field types of a config's `alpha` and `tau_squared`, checked as above (this test's and the rollout's).
Alpha = Annotated[float, AfterValidator(partial(check_alpha, name="alpha"))]
TauSquared = Annotated[float, AfterValidator(check_tau_squared)]


class SequentialTestConfig(BaseModel):
    """Knobs of the always-valid test."""

    model_config = ConfigDict(frozen=True)

    alpha: Alpha = Field(0.05, description="Type-I error over the whole (continuously monitored) test.")
    tau_squared: TauSquared = Field(
        0.01,
        description="Variance of the normal mixture over the difference of success rates; "
        "tau ~ the lift you expect (0.1 = ten points) gives the most power there.",
    )
    min_samples_per_arm: int = Field(100, ge=1, description="No verdict before both arms have this many trials.")



@dataclass(frozen=True)
class TestResult:
    """One look at the success-rate comparison; lift = challenger rate - champion rate."""

    __test__ = False  # not a pytest class

    p_value: float
    lift: float
    ci_low: float
    ci_high: float
    decision: Verdict
    n: int
    n_champion: int
    n_challenger: int
    relative_lift: float | None
    method: str

    def to_dict(self) -> dict[str, float | int | str | None]:
        return dict(vars(self))


# --- vectorized cores (the simulator calls these on arrays of many runs at once) -------------


def mixture_log_lr(diff: np.ndarray | float, variance: np.ndarray | float, tau_squared: float) -> np.ndarray:
    """log of the normal-mixture likelihood ratio for an estimate `diff` with variance `variance`:
    Lambda = sqrt(V / (V + tau^2)) * exp(tau^2 diff^2 / (2 V (V + tau^2)))."""
    diff = np.asarray(diff, dtype=float)
    variance = np.asarray(variance, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_lr = 0.5 * np.log(variance / (variance + tau_squared)) + tau_squared * diff**2 / (
            2.0 * variance * (variance + tau_squared)
        )
    # Zero variance only happens when both arms are all-success or all-failure: no evidence.
    return np.where(variance > 0, log_lr, 0.0)


def confidence_radius(variance: np.ndarray | float, tau_squared: float, alpha: float) -> np.ndarray:
    """Half-width of the always-valid confidence sequence obtained by inverting the mSPRT."""
    variance = np.maximum(np.asarray(variance, dtype=float), 1e-12)
    return np.sqrt(
        variance * (variance + tau_squared) / tau_squared
        * (np.log((variance + tau_squared) / variance) - 2.0 * math.log(alpha))
    )


def pooled_variance(x_a, n_a, x_b, n_b) -> np.ndarray:
    """Variance of the difference of rates under the null (one common rate); used for p-values
    because it is the variance the null hypothesis implies and is stable when an arm is small."""
    x_a, n_a, x_b, n_b = (np.asarray(v, dtype=float) for v in (x_a, n_a, x_b, n_b))
    with np.errstate(divide="ignore", invalid="ignore"):
        pooled = (x_a + x_b) / (n_a + n_b)
        return np.where((n_a > 0) & (n_b > 0), pooled * (1 - pooled) * (1 / n_a + 1 / n_b), 0.0)


def unpooled_variance(x_a, n_a, x_b, n_b) -> np.ndarray:
    """Variance of the difference of rates without assuming equality (for confidence bounds);
    rates are shrunk by half a success so an arm at 0% or 100% still has positive variance."""
    x_a, n_a, x_b, n_b = (np.asarray(v, dtype=float) for v in (x_a, n_a, x_b, n_b))
    p_a = (x_a + 0.5) / (n_a + 1)
    p_b = (x_b + 0.5) / (n_b + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return p_a * (1 - p_a) / n_a + p_b * (1 - p_b) / n_b


def msprt_p_value(x_a, n_a, x_b, n_b, tau_squared: float) -> np.ndarray:
    """Always-valid p-value min(1, 1/Lambda) of 'rate B == rate A' at the current counts."""
    x_a, n_a, x_b, n_b = (np.asarray(v, dtype=float) for v in (x_a, n_a, x_b, n_b))
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = np.where((n_a > 0) & (n_b > 0), x_b / n_b - x_a / n_a, 0.0)
    log_lr = mixture_log_lr(diff, pooled_variance(x_a, n_a, x_b, n_b), tau_squared)
    return np.minimum(1.0, np.exp(-log_lr))


def z_test_p_value(x_a, n_a, x_b, n_b) -> np.ndarray:
    """Two-sided p-value of the classic pooled two-proportion z-test (valid only at one fixed n)."""
    x_a, n_a, x_b, n_b = (np.asarray(v, dtype=float) for v in (x_a, n_a, x_b, n_b))
    variance = pooled_variance(x_a, n_a, x_b, n_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = np.where((n_a > 0) & (n_b > 0), x_b / n_b - x_a / n_a, 0.0)
        z = np.where(variance > 0, np.abs(diff) / np.sqrt(variance), 0.0)
    # erfc keeps precision in the tail: p = 2 * (1 - Phi(|z|)) = erfc(|z| / sqrt 2).
    return np.vectorize(math.erfc, otypes=[float])(z / math.sqrt(2.0))


# --- scalar versions of the same formulas (the rollout calls these once per look; numpy's
# per-call overhead on scalars would dominate the simulations) --------------------------------


def _scalar_log_lr(diff: float, variance: float, tau_squared: float) -> float:
    if variance <= 0:
        return 0.0
    return 0.5 * math.log(variance / (variance + tau_squared)) + tau_squared * diff * diff / (
        2.0 * variance * (variance + tau_squared)
    )


def _scalar_radius(variance: float, tau_squared: float, alpha: float) -> float:
    variance = max(variance, 1e-12)
    return math.sqrt(
        variance * (variance + tau_squared) / tau_squared
        * (math.log((variance + tau_squared) / variance) - 2.0 * math.log(alpha))
    )


def _scalar_pooled_variance(x_a: int, n_a: int, x_b: int, n_b: int) -> float:
    if n_a <= 0 or n_b <= 0:
        return 0.0
    pooled = (x_a + x_b) / (n_a + n_b)
    return pooled * (1 - pooled) * (1 / n_a + 1 / n_b)


def _scalar_unpooled_variance(x_a: int, n_a: int, x_b: int, n_b: int) -> float:
    p_a = (x_a + 0.5) / (n_a + 1)
    p_b = (x_b + 0.5) / (n_b + 1)
    return p_a * (1 - p_a) / n_a + p_b * (1 - p_b) / n_b


# --- the tests the rollout calls ------------------------------------------------------------


def _verdict(p_value: float, lift: float, alpha: float, enough: bool) -> Verdict:
    if not enough or p_value > alpha:
        return "continue"
    return "better" if lift > 0 else "worse"


def _relative(lift: float, base: float) -> float | None:
    return lift / base if base > 0 else None


def always_valid_test(
    champion: ArmStats, challenger: ArmStats, config: SequentialTestConfig | None = None
) -> TestResult:
    """mSPRT on challenger vs champion success rate; safe to call after every episode."""
    config = config or SequentialTestConfig()
    x_a, n_a, x_b, n_b = champion.successes, champion.trials, challenger.successes, challenger.trials
    lift = challenger.success_rate - champion.success_rate if n_a and n_b else 0.0
    log_lr = _scalar_log_lr(lift, _scalar_pooled_variance(x_a, n_a, x_b, n_b), config.tau_squared)
    p_value = min(1.0, math.exp(-log_lr))
    radius = (_scalar_radius(_scalar_unpooled_variance(x_a, n_a, x_b, n_b), config.tau_squared, config.alpha)
              if n_a and n_b else None)
    return _result(champion, challenger, config, p_value, lift, radius, "msprt")


def always_valid_test_of_estimate(lift: float | None, variance: float, n_champion: int, n_challenger: int,
                                  champion_rate: float, config: SequentialTestConfig, method: str) -> TestResult:
    """The same mSPRT on any estimate of the lift with its (plug-in) variance, for estimators other than two
    proportions (evidence.py: ratings and labels). `lift` None (not estimable yet): p = 1, the interval all of
    [-1, 1]; verdicts wait for `config.min_samples_per_arm` per arm, counted as the caller counts them."""
    if lift is None or not math.isfinite(variance):
        lift, p_value, half_width = 0.0, 1.0, None
    else:
        p_value = min(1.0, math.exp(-_scalar_log_lr(lift, variance, config.tau_squared)))
        half_width = _scalar_radius(variance, config.tau_squared, config.alpha)
    ci_low, ci_high = (-1.0, 1.0) if half_width is None else (max(-1.0, lift - half_width), min(1.0, lift + half_width))
    enough = min(n_champion, n_challenger) >= config.min_samples_per_arm
    return TestResult(p_value=p_value, lift=lift, ci_low=ci_low, ci_high=ci_high,
                      decision=_verdict(p_value, lift, config.alpha, enough), n=n_champion + n_challenger,
                      n_champion=n_champion, n_challenger=n_challenger,
                      relative_lift=_relative(lift, champion_rate), method=method)


def fixed_horizon_z_test(
    champion: ArmStats, challenger: ArmStats, config: SequentialTestConfig | None = None
) -> TestResult:
    """The naive two-proportion z-test. NOT valid under continuous monitoring: it exists so the
    simulator can show how much peeking inflates its false positives. Never use it to decide."""
    config = config or SequentialTestConfig()
    x_a, n_a, x_b, n_b = champion.successes, champion.trials, challenger.successes, challenger.trials
    lift = challenger.success_rate - champion.success_rate if n_a and n_b else 0.0
    variance = _scalar_pooled_variance(x_a, n_a, x_b, n_b)
    p_value = math.erfc(abs(lift) / math.sqrt(2.0 * variance)) if variance > 0 else 1.0
    half = (NormalDist().inv_cdf(1 - config.alpha / 2) * math.sqrt(_scalar_unpooled_variance(x_a, n_a, x_b, n_b))
            if n_a and n_b else None)
    return _result(champion, challenger, config, p_value, lift, half, "z_test_peeking")


def _result(champion: ArmStats, challenger: ArmStats, config: SequentialTestConfig, p_value: float, lift: float,
            half_width: float | None, method: str) -> TestResult:
    """A test's result from its p-value and the half-width of its interval (None: an arm is empty, so the
    interval is all of [-1, 1])."""
    n_a, n_b = champion.trials, challenger.trials
    ci_low, ci_high = (-1.0, 1.0) if half_width is None else (max(-1.0, lift - half_width), min(1.0, lift + half_width))
    return TestResult(
        p_value=p_value,
        lift=lift,
        ci_low=ci_low,
        ci_high=ci_high,
        decision=_verdict(p_value, lift, config.alpha, min(n_a, n_b) >= config.min_samples_per_arm),
        n=n_a + n_b,
        n_champion=n_a,
        n_challenger=n_b,
        relative_lift=_relative(lift, champion.success_rate),
        method=method,
    )


@dataclass(frozen=True)
class GuardrailResult:
    """One guardrail at one look. `breached` means the degradation beyond the allowed margin is
    significant (always-valid); `within_margin` only compares point estimates."""

    name: str
    champion_value: float | None
    challenger_value: float | None
    limit: float | None
    breached: bool
    within_margin: bool
    degradation_lower_bound: float | None
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        return dict(vars(self))


def rate_guardrail(
    name: str,
    champion_count: int,
    champion_trials: int,
    challenger_count: int,
    challenger_trials: int,
    allowed_increase: float,
    *,
    alpha: float,
    tau_squared: float,
) -> GuardrailResult:
    """Is the challenger's rate of something bad (hallucinations, errors) higher than the
    champion's by more than `allowed_increase`? Breach when the always-valid lower confidence
    bound of (challenger - champion) exceeds the allowance: testing H0 'diff <= allowance'."""
    if not champion_trials or not challenger_trials:
        return GuardrailResult(name, None, None, None, False, True, None, "no trials yet")
    champion_rate = champion_count / champion_trials
    challenger_rate = challenger_count / challenger_trials
    diff = challenger_rate - champion_rate
    variance = _scalar_unpooled_variance(champion_count, champion_trials, challenger_count, challenger_trials)
    lower = diff - _scalar_radius(variance, tau_squared, alpha)
    return GuardrailResult(
        name=name,
        champion_value=champion_rate,
        challenger_value=challenger_rate,
        limit=champion_rate + allowed_increase,
        breached=lower > allowed_increase,
        within_margin=diff <= allowed_increase,
        degradation_lower_bound=lower,
    )


def latency_guardrail(
    champion: ArmStats,
    challenger: ArmStats,
    limit_ms_for: Callable[[float], float],
    *,
    alpha: float,
    tau_squared: float,
) -> GuardrailResult:
    """Is the challenger's p95 latency above the allowed limit (derived from the champion's p95)?

    A p95 above the limit means more than 5% of the challenger's requests are slower than the limit, so the breach
    test is an always-valid one-sample test of 'exceedance rate <= 5%'. Compared step by step: a request's latency
    depends on the load it met, and the load moves with the shares (at 10% the champion's requests fill the
    machine's batches; at 50% two versions share it), so each challenger request is held against the limit from
    the champion's p95 in the same step, never against a p95 measured under another load. A step where the
    champion served fewer than MIN_LATENCIES_FOR_P95 requests sets no limit; its challenger requests wait, and
    until the latest step is compared the guardrail is not within its margin (promotion waits; no breach either).
    The champion's p95 in a step is taken as known (it has at least as much traffic until the last step). Reported
    values are the latest compared step's."""
    champion_steps, challenger_steps = champion.latencies_by_step(), challenger.latencies_by_step()
    compared: list[tuple[int, float, float, float, int]] = []  # step, champion p95, challenger p95, limit, over
    for step, latencies in sorted(challenger_steps.items()):
        reference = champion_steps.get(step)
        if reference is None or reference.size < MIN_LATENCIES_FOR_P95:
            continue
        champion_p95 = float(np.percentile(reference, 95))
        limit = float(limit_ms_for(champion_p95))
        compared.append((step, champion_p95, float(np.percentile(latencies, 95)), limit, int(np.sum(latencies > limit))))
    if not compared:
        why = ("no latencies recorded" if not champion.latencies_ms or not challenger.latencies_ms else
               f"no step yet where the champion served {MIN_LATENCIES_FOR_P95} requests beside the challenger's")
        return GuardrailResult("latency_p95_ms", None, None, None, False, True, None, why)
    n = sum(challenger_steps[step].size for step, *_ in compared)
    excess = sum(over for *_, over in compared) / n - P95_EXCEEDANCE
    lower = excess - _scalar_radius(P95_EXCEEDANCE * (1 - P95_EXCEEDANCE) / n, tau_squared, alpha)
    _, champion_p95, challenger_p95, limit, _ = compared[-1]
    per_step = "; ".join(f"step {step}: {mine:.0f} vs champion {theirs:.0f} ms (limit {cap:.0f}), {over} of "
                         f"{challenger_steps[step].size} over" for step, theirs, mine, cap, over in compared)
    latest = max(challenger_steps)
    if compared[-1][0] != latest:
        per_step += (f"; step {latest} not compared yet (the champion served fewer than {MIN_LATENCIES_FOR_P95} "
                     "requests in it)")
    return GuardrailResult(
        name="latency_p95_ms",
        champion_value=champion_p95,
        challenger_value=challenger_p95,
        limit=limit,
        breached=lower > 0,
        within_margin=excess <= 0 and compared[-1][0] == latest,
        degradation_lower_bound=lower,
        note=f"lower bound is on the share of challenger requests above their step's limit, minus 5%; {per_step}",
    )

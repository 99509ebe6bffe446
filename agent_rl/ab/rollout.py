"""The gradual-rollout policy as a pure state machine: given the state and the per-arm counts,
decide hold / advance / promote / rollback and the routing weights that follow.

Which data the test sees: ONE always-valid test on cumulative data since the A/B test began,
never restarted per step. The mSPRT bounds P(the test *ever* rejects) <= alpha over the whole
stream, whatever the allocation at each moment (the share only changes the information per
episode, and the share is chosen from past data only), so every 'advance' and the final
'promote' are subsets of one alpha-level event: P(false promotion) <= alpha for the whole
rollout. Restarting on each step's fresh data would also be valid but throws away evidence
and needs three separate significant results. What each step adds is a fresh minimum sample:
before leaving a step the challenger must have served `min_samples_per_step` episodes at that
share with the evidence still significant, so guardrails get to see it under the larger load.

Rollback is on the first significant degradation of the success rate, on a significant guardrail
breach (always-valid tests of "worse than the champion by more than the margin"), or when a step
runs past `max_step_duration` without being won. Promotion, the irreversible step, additionally
wants every guardrail's point estimate inside its margin.

Typical use from a sensor (state kept as JSON in the cursor):
    state = RolloutState.start(champion, challenger, config)            # weights 90/10
    stats = arm_stats_from_episodes(rows, since=state.test_started_at)
    empty = ArmStats(successes=0, trials=0)                              # a version with no rows yet
    decision = decide(state, stats.get(champion, empty), stats.get(challenger, empty), config)
    state = apply_decision(state, decision)                              # set decision.new_weights
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent_rl.ab.stats import (
    ArmStats,
    GuardrailResult,
    SequentialTestConfig,
    TestResult,
    always_valid_test,
    latency_guardrail,
    rate_guardrail,
)
from agent_rl.utc import as_utc

Action = Literal["hold", "advance", "promote", "rollback"]
# Machine-readable why, for logs and dashboards; `reason` is the human sentence.
Cause = Literal[
    "collecting",
    "no_difference_yet",
    "better_waiting_for_step_samples",
    "better_but_guardrail_outside_margin",
    "significantly_better",
    "significantly_worse",
    "guardrail_breach",
    "timeout",
]
SignificanceTest = Callable[[ArmStats, ArmStats, SequentialTestConfig], TestResult]


def _check_alpha(value: float, name: str) -> float:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value}")
    return value


class Margin(BaseModel):
    """How much a guardrail metric may degrade: an absolute amount (rate points, or ms for
    latency) or a fraction of the champion's value (0.2 = 20% worse)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["absolute", "relative"]
    value: float = Field(ge=0.0)

    def limit(self, champion_value: float) -> float:
        """The worst acceptable challenger value given the champion's."""
        return champion_value + self.value if self.kind == "absolute" else champion_value * (1.0 + self.value)


class Guardrails(BaseModel):
    """Metrics that may not get worse beyond a margin, whatever the success rate does.

    The rate guardrail is on the failures a user feels, all together: a wrong answer, a broken reply (format
    error) or no answer in time. Separate guardrails would hold a challenger back on a rate the incumbent only
    keeps low by failing another way: an agent that never answers never answers wrong (docs/architecture.md)."""

    model_config = ConfigDict(frozen=True)

    failure_rate: Margin = Margin(kind="absolute", value=0.02)
    latency_p95: Margin = Margin(kind="relative", value=0.20)
    alpha: float = Field(0.05, description="Per-guardrail always-valid level of the breach tests.")

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, value: float) -> float:
        return _check_alpha(value, "guardrails.alpha")


class RolloutConfig(BaseModel):
    """Every knob of the A/B test and the gradual rollout."""

    model_config = ConfigDict(frozen=True)

    steps: tuple[float, ...] = Field(
        (0.10, 0.50, 1.00), description="Challenger traffic shares, increasing, ending at 1.0 (= promotion)."
    )
    alpha: float = Field(0.05, description="Bound on the false-promotion (and false-rollback) probability.")
    tau_squared: float = Field(0.01, description="mSPRT mixture variance over the lift; tau ~ expected lift.")
    min_samples_per_arm: int = Field(100, ge=1, description="No decision at all before both arms have this many.")
    min_samples_per_step: int = Field(
        200, ge=1, description="Episodes each arm must serve in a step before leaving it."
    )
    max_step_duration: timedelta = Field(
        timedelta(days=7), description="A step not won by then (no significant win, or too little traffic) rolls back."
    )
    guardrails: Guardrails = Guardrails()

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, value: float) -> float:
        return _check_alpha(value, "alpha")

    @field_validator("tau_squared")
    @classmethod
    def _tau(cls, value: float) -> float:
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"tau_squared must be a positive number, got {value}")
        return value

    @field_validator("steps")
    @classmethod
    def _steps(cls, steps: tuple[float, ...]) -> tuple[float, ...]:
        if len(steps) < 2:
            raise ValueError(f"steps needs at least two shares (a test share and 1.0), got {list(steps)}")
        if any(not 0.0 < s <= 1.0 for s in steps):
            raise ValueError(f"steps must be shares in (0, 1], got {list(steps)}")
        if any(b <= a for a, b in zip(steps, steps[1:])):
            raise ValueError(f"steps must be strictly increasing, got {list(steps)}")
        if steps[-1] != 1.0:
            raise ValueError(f"the last step must be 1.0 (full traffic = promotion), got {steps[-1]}")
        return steps

    @field_validator("max_step_duration")
    @classmethod
    def _duration(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError(f"max_step_duration must be positive, got {value}")
        return value

    def test_config(self) -> SequentialTestConfig:
        return SequentialTestConfig(
            alpha=self.alpha, tau_squared=self.tau_squared, min_samples_per_arm=self.min_samples_per_arm
        )

    def step_index(self, share: float) -> int:
        for index, step in enumerate(self.steps):
            if math.isclose(step, share, abs_tol=1e-9):
                return index
        raise ValueError(f"step share {share} is not one of the configured steps {list(self.steps)}")


def _utc_or_now(value: datetime | None) -> datetime:
    return datetime.now(timezone.utc) if value is None else as_utc(value)


class RolloutEvent(BaseModel):
    """One state change (start, advance, promote, rollback) kept in the state's history."""

    model_config = ConfigDict(frozen=True)

    at: datetime
    action: Literal["start", "advance", "promote", "rollback"]
    step_share: float
    weights: dict[str, float]
    reason: str
    p_value: float | None = None
    lift: float | None = None


class RolloutState(BaseModel):
    """Where one champion-vs-challenger rollout stands; JSON-serializable (a sensor cursor)."""

    model_config = ConfigDict(frozen=True)

    champion: str
    challenger: str
    step_share: float
    test_started_at: datetime
    step_started_at: datetime
    step_start_trials: dict[str, int] = Field(
        default_factory=dict, description="Cumulative trials per version when the current step began."
    )
    status: Literal["running", "promoted", "rolled_back"] = "running"
    history: tuple[RolloutEvent, ...] = ()
    baseline_weights: dict[str, float] = Field(
        default_factory=dict,
        description="The routing before the test (the champion and any other version routed then). During the "
        "test they keep their shares scaled by 1 - the challenger's share; a rollback restores exactly this.")
    model_name: str | None = Field(
        None, description="The registered model the challenger is a version of: agents sharing one pool number "
        "their versions alike (v1 of the email model is not v1 of the support model).")

    @model_validator(mode="after")
    def _distinct_versions(self) -> RolloutState:
        if self.champion == self.challenger:
            raise ValueError(f"champion and challenger must be different versions, both are {self.champion!r}")
        if self.baseline_weights:
            if self.challenger in self.baseline_weights:
                raise ValueError(f"the challenger {self.challenger!r} is already routed: it cannot be tested anew")
            if self.champion not in self.baseline_weights:
                raise ValueError(f"the champion {self.champion!r} is not in the routing before the test "
                                 f"({sorted(self.baseline_weights)})")
        return self

    @classmethod
    def start(
        cls,
        champion: str,
        challenger: str,
        config: RolloutConfig,
        now: datetime | None = None,
        baseline_weights: dict[str, float] | None = None,
        model_name: str | None = None,
    ) -> RolloutState:
        """A new A/B test at the first step (10% by default). `baseline_weights` is the routing the challenger
        arrives in (default: the champion alone)."""
        now = _utc_or_now(now)
        share = config.steps[0]
        baseline = _normalized(baseline_weights or {champion: 1.0})
        state = cls(
            champion=champion,
            challenger=challenger,
            step_share=share,
            test_started_at=now,
            step_started_at=now,
            step_start_trials={champion: 0, challenger: 0},
            baseline_weights=baseline,
            model_name=model_name,
        )
        event = RolloutEvent(
            at=now, action="start", step_share=share, weights=state.weights(), reason="A/B test started"
        )
        return state.model_copy(update={"history": (event,)})

    @property
    def finished(self) -> bool:
        return self.status != "running"

    def baseline(self) -> dict[str, float]:
        """The routing before the test (states saved before it was recorded: the champion alone)."""
        return dict(self.baseline_weights) if self.baseline_weights else {self.champion: 1.0}

    def weights_at(self, share: float) -> dict[str, float]:
        """The challenger at `share`, every version routed before the test at its share scaled by 1 - `share`."""
        if share <= 0:
            return self.baseline()
        if share >= 1.0:
            return {self.challenger: 1.0}
        scaled = {version: weight * (1.0 - share) for version, weight in self.baseline().items()}
        return {**{v: w for v, w in scaled.items() if w > 0}, self.challenger: share}

    def weights(self) -> dict[str, float]:
        """Routing weights for the current state (they always sum to 1)."""
        if self.status == "promoted":
            return {self.challenger: 1.0}
        if self.status == "rolled_back":
            return self.baseline()
        return self.weights_at(self.step_share)


class Decision(BaseModel):
    """What to do now, the routing that follows, and the statistics behind it (for the logs)."""

    model_config = ConfigDict(frozen=True)

    action: Action
    cause: Cause
    new_weights: dict[str, float]
    reason: str
    stats: dict[str, Any]
    decided_at: datetime
    new_champion: str | None = None
    previous_champion: str | None = None


def _normalized(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    if total <= 0 or any(w < 0 for w in weights.values()):
        raise ValueError(f"routing weights must be >= 0 with a positive sum, got {weights}")
    if math.isclose(total, 1.0, abs_tol=1e-9):  # kept as given, so a rollback restores them to the decimal
        return {version: weight for version, weight in weights.items() if weight > 0}
    return {version: weight / total for version, weight in weights.items() if weight > 0}


def _guardrails(champion: ArmStats, challenger: ArmStats, config: RolloutConfig) -> list[GuardrailResult]:
    g = config.guardrails
    common = {"alpha": g.alpha, "tau_squared": config.tau_squared}
    return [
        rate_guardrail(
            "failure_rate",
            champion.failures,
            champion.trials,
            challenger.failures,
            challenger.trials,
            g.failure_rate.limit(champion.failure_rate) - champion.failure_rate,
            **common,
        ),
        latency_guardrail(champion.latencies_ms, challenger.latencies_ms, g.latency_p95.limit, **common),
    ]


def decide(
    state: RolloutState,
    champion_stats: ArmStats,
    challenger_stats: ArmStats,
    config: RolloutConfig,
    now: datetime | None = None,
    significance_test: SignificanceTest = always_valid_test,
) -> Decision:
    """One look at the data. Stats must be cumulative since `state.test_started_at`.

    `significance_test` exists so the simulator can swap in the naive z-test for contrast."""
    if state.finished:
        raise ValueError(f"rollout of {state.challenger!r} already finished ({state.status}); start a new one")
    now = _utc_or_now(now)
    step = config.step_index(state.step_share)
    step_trials = {}
    for version, stats in ((state.champion, champion_stats), (state.challenger, challenger_stats)):
        at_start = state.step_start_trials.get(version, 0)
        if stats.trials < at_start:
            raise ValueError(
                f"stats for {version!r} have {stats.trials} trials, fewer than the {at_start} recorded when the step "
                "began: pass counts cumulative since state.test_started_at"
            )
        step_trials[version] = stats.trials - at_start

    test = significance_test(champion_stats, challenger_stats, config.test_config())
    enough = min(champion_stats.trials, challenger_stats.trials) >= config.min_samples_per_arm
    guardrails = _guardrails(champion_stats, challenger_stats, config) if enough else []
    elapsed = now - _utc_or_now(state.step_started_at)
    stats: dict[str, Any] = {
        "test": test.to_dict(),
        "guardrails": {g.name: g.to_dict() for g in guardrails},
        "champion": {"version": state.champion, **champion_stats.summary()},
        "challenger": {"version": state.challenger, **challenger_stats.summary()},
        "step_share": state.step_share,
        "step_trials": step_trials,
        "step_elapsed_s": elapsed.total_seconds(),
        "alpha": config.alpha,
    }

    def out(action: Action, cause: Cause, weights: dict[str, float], reason: str, **extra: Any) -> Decision:
        return Decision(
            action=action, cause=cause, new_weights=weights, reason=reason, stats=stats, decided_at=now, **extra
        )

    rollback_weights = state.baseline()
    if not enough:
        if elapsed >= config.max_step_duration:
            reason = f"fewer than {config.min_samples_per_arm} episodes per arm after {elapsed}"
            return out("rollback", "timeout", rollback_weights, reason)
        reason = f"collecting: need {config.min_samples_per_arm} episodes per arm first"
        return out("hold", "collecting", state.weights(), reason)

    breached = [g for g in guardrails if g.breached]
    if breached:
        detail = "; ".join(
            f"{g.name} {g.challenger_value:.4g} vs champion {g.champion_value:.4g} (limit {g.limit:.4g})" for g in breached
        )
        return out("rollback", "guardrail_breach", rollback_weights, f"guardrail breach: {detail}")
    if test.decision == "worse":
        reason = f"significantly worse: lift {test.lift:+.3f} (CI {test.ci_low:+.3f}..{test.ci_high:+.3f}), p={test.p_value:.4f}"
        return out("rollback", "significantly_worse", rollback_weights, reason)

    next_share = config.steps[step + 1]
    short = min(step_trials.values())
    # Promotion is the irreversible step, so it also wants every guardrail's point estimate inside
    # its margin (not merely "no significant breach"). Earlier steps don't: with a few hundred
    # episodes the point estimates wander over the margin by chance and would stall good
    # challengers, while the always-valid breach tests keep watching at every step.
    outside = [g.name for g in guardrails if not g.within_margin] if next_share >= 1.0 else []
    if test.decision == "better" and short >= config.min_samples_per_step and not outside:
        if next_share >= 1.0:
            return out(
                "promote",
                "significantly_better",
                {state.challenger: 1.0},
                f"promoted: lift {test.lift:+.3f} (CI {test.ci_low:+.3f}..{test.ci_high:+.3f}), p={test.p_value:.4f}",
                new_champion=state.challenger,
                previous_champion=state.champion,
            )
        return out(
            "advance",
            "significantly_better",
            state.weights_at(next_share),
            f"advance to {next_share:.0%}: lift {test.lift:+.3f}, p={test.p_value:.4f}",
        )

    if elapsed >= config.max_step_duration:
        # Whatever kept the step from finishing (no win, thin traffic, a guardrail over its margin),
        # a step may not run forever: the champion keeps the traffic.
        return out(
            "rollback",
            "timeout",
            rollback_weights,
            f"step at {state.step_share:.0%} not won within {config.max_step_duration} (p={test.p_value:.4f})",
        )
    if test.decision == "better" and short < config.min_samples_per_step:
        return out(
            "hold",
            "better_waiting_for_step_samples",
            state.weights(),
            f"better (p={test.p_value:.4f}); {short}/{config.min_samples_per_step} episodes at this step",
        )
    if test.decision == "better":
        return out(
            "hold",
            "better_but_guardrail_outside_margin",
            state.weights(),
            f"better, but {', '.join(outside)} beyond margin (not yet significant)",
        )
    reason = f"no significant difference yet (p={test.p_value:.4f}, lift {test.lift:+.3f})"
    return out("hold", "no_difference_yet", state.weights(), reason)


def apply_decision(state: RolloutState, decision: Decision) -> RolloutState:
    """The state after acting on `decision` (hold leaves it unchanged)."""
    if decision.action == "hold":
        return state
    if state.finished:
        raise ValueError(f"rollout of {state.challenger!r} already finished ({state.status})")
    test = decision.stats.get("test", {})
    trials = {
        state.champion: int(decision.stats["champion"]["trials"]),
        state.challenger: int(decision.stats["challenger"]["trials"]),
    }
    update: dict[str, Any] = {}
    if decision.action == "advance":
        update = {
            "step_share": decision.new_weights[state.challenger],
            "step_started_at": decision.decided_at,
            "step_start_trials": trials,
        }
    elif decision.action == "promote":
        update = {"step_share": 1.0, "status": "promoted", "step_started_at": decision.decided_at}
    elif decision.action == "rollback":
        update = {"status": "rolled_back"}
    event = RolloutEvent(
        at=decision.decided_at,
        action=decision.action,
        step_share=update.get("step_share", state.step_share),
        weights=decision.new_weights,
        reason=decision.reason,
        p_value=test.get("p_value"),
        lift=test.get("lift"),
    )
    return state.model_copy(update={**update, "history": (*state.history, event)})

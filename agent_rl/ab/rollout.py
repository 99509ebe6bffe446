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

Where users rate only a few episodes (the gateway), the test may read the week's labels beside the ratings
(evidence.py: prediction-powered inference, with the labeler frozen before the test, only when it passed its check
and `RolloutConfig.labels.use` is on): each arm's estimate is its labels corrected by its ratings, the same
always-valid test runs on it, the minimum samples count episodes (rated or labeled) and each arm also needs
`labels.min_rated_per_arm` rated ones. Where the ratings' lift and the labels' lift disagree in sign beyond their
noise, the rollout holds and says why; a labeler that failed its check leaves the test on ratings alone.

`ramp_on = "safety"` relaxes the steps short of the last: the challenger moves up once the step's minimum samples
show no harm, and only promotion wants the significant win. The bound on false promotion is the same (promotion is
still the always-valid test rejecting); what changes is exposure: a challenger no better than the champion reaches
the larger share before the test knows, where the rollback tests and the guardrails watch it as before.

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
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent_rl.ab.evidence import (
    Disagreement,
    LabeledArm,
    disagreement,
    evidence_line,
    ppi_estimate,
    ppi_test,
)
from agent_rl.ab.stats import (
    Alpha,
    ArmStats,
    GuardrailResult,
    SequentialTestConfig,
    TauSquared,
    TestResult,
    always_valid_test,
    check_alpha,
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
    "safe_at_step",
    "significantly_worse",
    "guardrail_breach",
    "labels_disagree_with_ratings",
    "serving_unavailable",
    "timeout",
]
SignificanceTest = Callable[[ArmStats, ArmStats, SequentialTestConfig], TestResult]


class Margin(BaseModel):
    """How much a guardrail metric may degrade: an absolute amount (rate points, or ms for
    latency) or a fraction of the champion's value (0.2 = 20% worse)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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

    model_config = ConfigDict(frozen=True, extra="forbid")

    failure_rate: Margin = Margin(kind="absolute", value=0.02)
    latency_p95: Margin = Margin(kind="relative", value=0.20)
    alpha: float = Field(0.05, description="Per-guardrail always-valid level of the breach tests.")

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, value: float) -> float:
        return check_alpha(value, "guardrails.alpha")


class LabelSettings(BaseModel):
    """Whether and how the test reads the week's labels beside the ratings (evidence.py). Labels count only when
    the labeler frozen for the test passed its check; ratings stay the ground truth."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    use: bool = Field(True, description="Read the frozen labeler's labels beside the ratings (prediction-powered).")
    min_rated_per_arm: int = Field(
        10, ge=2, description="With labels: rated episodes each arm needs before its ratings may correct its labels.")
    disagreement_alpha: float = Field(
        0.05, description="Two-sided level, per look, at which the ratings' lift contradicting the labels' holds the "
        "test.")

    @field_validator("disagreement_alpha")
    @classmethod
    def _alpha(cls, value: float) -> float:
        return check_alpha(value, "labels.disagreement_alpha")


class RolloutConfig(BaseModel):
    """Every knob of the A/B test and the gradual rollout. A deployment sets each one in its profile's [rollout]
    table (resources/rollout.py wraps this model: its defaults are these)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: tuple[float, ...] = Field(
        (0.10, 0.50, 1.00), description="Challenger traffic shares, increasing, ending at 1.0 (= promotion)."
    )
    alpha: Alpha = Field(0.05, description="Bound on the false-promotion (and false-rollback) probability.")
    tau_squared: TauSquared = Field(0.01, description="mSPRT mixture variance over the lift; tau ~ expected lift.")
    min_samples_per_arm: int = Field(100, ge=1, description="No decision at all before both arms have this many.")
    min_samples_per_step: int = Field(
        200, ge=1, description="Episodes each arm must serve in a step before leaving it."
    )
    max_step_duration: timedelta = Field(
        timedelta(hours=72), description="A step not won by then (no significant win, or too little traffic) rolls "
        "back. 72 hours: the two steps a test runs (10% and 50%; the last share is the promotion) end within six "
        "days, before the weekly retraining registers the next challenger, which waits while a test runs."
    )
    ramp_on: Literal["significance", "safety"] = Field(
        "significance", description="What moves the challenger up a step short of the last: 'significance', the "
        "win that promotes (every advance and the promotion then one alpha-level event); 'safety', the step's "
        "minimum samples with no sign of harm (no guardrail breach, not significantly worse), so the test reaches "
        "the larger share, where it learns fastest, sooner. Promotion wants the significant win either way.")
    outage_hold: timedelta = Field(
        timedelta(minutes=10), description="A version in the test that could not serve requests this recently (its "
        "engine down: the arbiter answered 503 and counted them) holds the step: an outage is no evidence about the "
        "model, and no share moves onto a version that cannot serve. Rollbacks the evidence calls for still happen.")
    guardrails: Guardrails = Guardrails()
    labels: LabelSettings = LabelSettings()

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

    @field_validator("max_step_duration", "outage_hold")
    @classmethod
    def _duration(cls, value: timedelta, info: Any) -> timedelta:
        if value <= timedelta(0):
            raise ValueError(f"{info.field_name} must be positive, got {value}")
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
    step_start_episodes: dict[str, int] = Field(
        default_factory=dict, description="Cumulative episodes per version (rated or not) when the current step "
        "began: what a step's samples count when the test reads labels.")
    labeler: str | None = Field(
        None, description="Where the labeler frozen for this test lies, relative to AGENT_RL_HOME (saved when the "
        "test started); None: none was, `labeler_note` says why.")
    labeler_note: str = ""

    def step_starts(self) -> tuple[datetime, ...]:
        """When each step of this test began, oldest first (the test's start, then each advance)."""
        starts = tuple(event.at for event in self.history if event.action in ("start", "advance"))
        return starts or (self.test_started_at,)

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
        labeler: str | None = None,
        labeler_note: str = "",
    ) -> RolloutState:
        """A new A/B test at the first step (10% by default). `baseline_weights` is the routing the challenger
        arrives in (default: the champion alone); `labeler` the labeler frozen for it (relative to AGENT_RL_HOME),
        or None with `labeler_note` saying why."""
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
            step_start_episodes={champion: 0, challenger: 0},
            baseline_weights=baseline,
            model_name=model_name,
            labeler=labeler,
            labeler_note=labeler_note,
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

    def message(self) -> str:
        """The decision in one line for logs: action, cause, reason, and the evidence it read."""
        summary = (self.stats.get("evidence") or {}).get("summary") if isinstance(self.stats, dict) else None
        return f"{self.action} ({self.cause}): {self.reason}" + (f" | {summary}" if summary else "")


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
        latency_guardrail(champion, challenger, g.latency_p95.limit, **common),
    ]


@dataclass(frozen=True)
class Labels:
    """What the controller hands `decide` about labels: each arm's episodes as the label-aware test sees them
    (evidence.py `LabeledArm`), the frozen labeler's record (week, passed, reason, AUC, ECE, fitted_through), and,
    when there is nothing to read, why (`note`). `served`: every episode per version since the test began, rated
    or not, for the record of what ratings alone leave unused."""

    champion: LabeledArm | None = None
    challenger: LabeledArm | None = None
    labeler: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    served: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Evidence:
    """What one look reads: the test it decides on, what the minimum samples count per version (episodes with
    labels, rated trials without), the rated episodes per version, the ratings-vs-labels check, and the record."""

    used_labels: bool
    test: TestResult
    counts: dict[str, int]
    rated: dict[str, int]
    disagreement: Disagreement | None
    record: dict[str, Any]


def _ratings_alone_because(labels: Labels | None, config: RolloutConfig) -> str:
    """Why this look reads ratings alone ("" when it reads labels too)."""
    if not config.labels.use:
        return "labels are off (use_labels false)"
    if labels is None or labels.champion is None or labels.challenger is None:
        return (labels.note if labels is not None and labels.note else "no labeler was frozen for this test")
    if not labels.labeler.get("passed"):
        return f"the labeler failed its check ({labels.labeler.get('reason') or 'no reason given'})"
    if not labels.champion.labels and not labels.challenger.labels:
        return "no episode awaits a rating: every one was judged"
    return ""


def _lift(champion: float | None, challenger: float | None) -> float | None:
    return None if champion is None or challenger is None else challenger - champion


def _evidence(state: RolloutState, champion_stats: ArmStats, challenger_stats: ArmStats, ratings_test: TestResult,
              config: RolloutConfig, labels: Labels | None) -> _Evidence:
    why = _ratings_alone_because(labels, config)
    if why:
        arms = {}
        for role, version, stats in (("champion", state.champion, champion_stats),
                                     ("challenger", state.challenger, challenger_stats)):
            labeled = getattr(labels, role, None) if labels is not None else None
            served = labels.served.get(version, 0) if labels is not None else 0
            # Every episode served, where the controller counted them (the unrated ones too), else the rated ones.
            episodes = max(stats.trials, served, labeled.episodes if labeled is not None else 0)
            arms[role] = {"version": version, "episodes": episodes, "rated": stats.trials, "labeled": 0,
                          "unrated": episodes - stats.trials, "judged": 0,
                          "ratings_rate": stats.success_rate if stats.trials else None}
        record = {"source": "ratings", "note": f"ratings alone: {why}", **arms,
                  "ratings_lift": _lift(arms["champion"]["ratings_rate"], arms["challenger"]["ratings_rate"]),
                  "labels_lift": None, "test": ratings_test.to_dict(),
                  "labeler": dict(labels.labeler) if labels is not None else {}}
        record["summary"] = evidence_line(record)
        counts = {state.champion: champion_stats.trials, state.challenger: challenger_stats.trials}
        return _Evidence(False, ratings_test, counts, dict(counts), None, record)
    assert labels is not None and labels.champion is not None and labels.challenger is not None
    champion, challenger = ppi_estimate(labels.champion), ppi_estimate(labels.challenger)
    test = ppi_test(champion, challenger, config.test_config())
    check = disagreement(labels.champion, labels.challenger, config.labels.disagreement_alpha)
    record = {
        "source": "ratings+labels", "note": "",
        "champion": {"version": state.champion, **champion.to_dict()},
        "challenger": {"version": state.challenger, **challenger.to_dict()},
        "ratings_lift": _lift(champion.ratings_rate, challenger.ratings_rate),
        "labels_lift": _lift(champion.labels_rate, challenger.labels_rate),
        "test": test.to_dict(), "ratings_test": ratings_test.to_dict(),
        "disagreement": check.to_dict() if check is not None else None,
        "labeler": dict(labels.labeler),
    }
    record["summary"] = evidence_line(record)
    return _Evidence(True, test, {state.champion: champion.episodes, state.challenger: challenger.episodes},
                     {state.champion: champion.rated, state.challenger: challenger.rated}, check, record)


def decide(
    state: RolloutState,
    champion_stats: ArmStats,
    challenger_stats: ArmStats,
    config: RolloutConfig,
    now: datetime | None = None,
    significance_test: SignificanceTest = always_valid_test,
    labels: Labels | None = None,
    unserved: dict[str, int] | None = None,
) -> Decision:
    """One look at the data. Stats must be cumulative since `state.test_started_at`, and so must `labels`.

    `unserved`: requests each version could not serve within the last `config.outage_hold` (pool
    `serving_failures`); while either arm has any, the step holds (or runs out) instead of moving.

    `labels`: each arm's episodes with the frozen labeler's probabilities, when the controller has them; the look
    reads them beside the ratings when the labeler passed its check and `config.labels.use` is on, else ratings
    alone (`stats["evidence"]` says which, and why). `significance_test` (of the ratings) exists so the simulator
    can swap in the naive z-test for contrast."""
    if state.finished:
        raise ValueError(f"rollout of {state.challenger!r} already finished ({state.status}); start a new one")
    now = _utc_or_now(now)
    step = config.step_index(state.step_share)
    ratings_test = significance_test(champion_stats, challenger_stats, config.test_config())
    evidence = _evidence(state, champion_stats, challenger_stats, ratings_test, config, labels)
    test = evidence.test
    unit = "episodes" if evidence.used_labels else "trials"
    started = state.step_start_episodes if evidence.used_labels else state.step_start_trials
    step_trials = {}
    for version, count in evidence.counts.items():
        at_start = started.get(version, 0)
        if count < at_start:
            raise ValueError(
                f"stats for {version!r} have {count} {unit}, fewer than the {at_start} recorded when the step "
                "began: pass counts cumulative since state.test_started_at"
            )
        step_trials[version] = count - at_start

    enough = min(evidence.counts.values()) >= config.min_samples_per_arm
    if evidence.used_labels:
        enough = enough and min(evidence.rated.values()) >= config.labels.min_rated_per_arm
    guardrails = _guardrails(champion_stats, challenger_stats, config) if enough else []
    elapsed = now - _utc_or_now(state.step_started_at)
    stats: dict[str, Any] = {
        "test": test.to_dict(),
        "guardrails": {g.name: g.to_dict() for g in guardrails},
        "champion": {"version": state.champion, **champion_stats.summary()},
        "challenger": {"version": state.challenger, **challenger_stats.summary()},
        "evidence": evidence.record,
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

    def hold_or_timeout(cause: Cause, why: str, holding: str) -> Decision:
        """A look that may not move the step holds, until the step runs out: then the champion keeps the traffic."""
        if elapsed >= config.max_step_duration:
            return out("rollback", "timeout", rollback_weights,
                       f"step at {state.step_share:.0%} not won within {config.max_step_duration}: {why}")
        return out("hold", cause, state.weights(), holding)
    if not enough:
        need = (f"{config.min_samples_per_arm} episodes and {config.labels.min_rated_per_arm} rated per arm"
                if evidence.used_labels else f"{config.min_samples_per_arm} episodes per arm")
        have = "; ".join(f"{v}: {evidence.counts[v]} episodes, {evidence.rated[v]} rated" if evidence.used_labels
                         else f"{v}: {evidence.counts[v]}" for v in (state.champion, state.challenger))
        if elapsed >= config.max_step_duration:
            return out("rollback", "timeout", rollback_weights, f"fewer than {need} after {elapsed} ({have})")
        return out("hold", "collecting", state.weights(), f"collecting: need {need} first ({have})")

    breached = [g for g in guardrails if g.breached]
    if breached:
        detail = "; ".join(
            f"{g.name} {g.challenger_value:.4g} vs champion {g.champion_value:.4g} (limit {g.limit:.4g})" for g in breached
        )
        return out("rollback", "guardrail_breach", rollback_weights, f"guardrail breach: {detail}")
    if evidence.disagreement is not None and evidence.disagreement.disagree:
        # Ratings are the ground truth: labels they contradict move nothing, in either direction.
        why = evidence.disagreement.sentence()
        return hold_or_timeout("labels_disagree_with_ratings", why, f"holding: {why}; the ratings are the ground "
                               "truth, so nothing moves until they agree or the step runs out")
    if test.decision == "worse":
        reason = f"significantly worse: lift {test.lift:+.3f} (CI {test.ci_low:+.3f}..{test.ci_high:+.3f}), p={test.p_value:.4f}"
        return out("rollback", "significantly_worse", rollback_weights, reason)

    down = {v: n for v in (state.champion, state.challenger) if (n := (unserved or {}).get(v, 0)) > 0}
    if down:
        stats["unserved"] = down
        what = ", ".join(f"{v}: {n}" for v, n in down.items())
        return hold_or_timeout("serving_unavailable", f"requests unserved lately ({what})",
                               f"holding: requests unserved in the last {config.outage_hold} ({what}): an outage is "
                               "no evidence about the model, and no share moves onto a version that cannot serve")

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

    if config.ramp_on == "safety" and next_share < 1.0 and short >= config.min_samples_per_step:
        # Short of promotion a step only has to show no harm: the rollback tests keep watching at the larger share,
        # and promotion still wants the always-valid win, so P(false promotion) <= alpha holds as before.
        return out(
            "advance",
            "safe_at_step",
            state.weights_at(next_share),
            f"advance to {next_share:.0%}: {short} {unit} at {state.step_share:.0%} and no sign of harm (lift "
            f"{test.lift:+.3f}, p={test.p_value:.4f}); promotion still wants a significant win",
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
            f"better (p={test.p_value:.4f}); {short}/{config.min_samples_per_step} {unit} at this step",
        )
    if test.decision == "better":
        return out(
            "hold",
            "better_but_guardrail_outside_margin",
            state.weights(),
            f"better, but {', '.join(outside)} not yet shown within margin (over it, not significantly; or not yet "
            "compared at this step)",
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
    evidence = decision.stats.get("evidence") or {}
    episodes = {version: int(evidence[role]["episodes"]) for role, version in
                (("champion", state.champion), ("challenger", state.challenger)) if role in evidence}
    update: dict[str, Any] = {}
    if decision.action == "advance":
        update = {
            "step_share": decision.new_weights[state.challenger],
            "step_started_at": decision.decided_at,
            "step_start_trials": trials,
            "step_start_episodes": episodes,
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

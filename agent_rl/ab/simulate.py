"""Monte-Carlo checks of the rollout procedure on simulated Bernoulli traffic, monitored after every
batch of episodes: false-promotion rate in A/A tests, power in A/B tests, and the naive peeking
z-test for contrast. Seeded, so every figure is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import numpy as np

from agent_rl.ab.rollout import RolloutConfig, RolloutState, SignificanceTest, apply_decision, decide
from agent_rl.ab.stats import ArmStats, always_valid_test, msprt_p_value, z_test_p_value

T0 = datetime(2025, 1, 6, tzinfo=timezone.utc)
CHAMPION, CHALLENGER = "champion", "challenger"


@dataclass(frozen=True)
class Arm:
    """Per-episode outcome probabilities of one simulated policy; the rest is 'I don't know'."""

    success: float
    hallucination: float = 0.10
    error: float = 0.02
    latency_median_ms: float | None = None  # lognormal latencies when set (sigma 0.5)

    def __post_init__(self) -> None:
        probs = (self.success, self.hallucination, self.error)
        if any(not 0 <= p <= 1 for p in probs) or sum(probs) > 1 + 1e-12:
            raise ValueError(f"Arm probabilities must be in [0, 1] and sum to <= 1, got {probs}")


@dataclass(frozen=True)
class RolloutSimulation:
    """Per-run results: final action ('promote' / 'rollback' / 'undecided'), episodes served until
    the decision, and the highest challenger share reached."""

    final_actions: tuple[str, ...]
    final_causes: tuple[str, ...]
    episodes_to_decision: tuple[int, ...]
    max_share: tuple[float, ...]

    @property
    def n_runs(self) -> int:
        return len(self.final_actions)

    def rate(self, action: str) -> float:
        return sum(a == action for a in self.final_actions) / self.n_runs

    def cause_rate(self, cause: str) -> float:
        return sum(c == cause for c in self.final_causes) / self.n_runs

    @property
    def significant_decision_rate(self) -> float:
        """Runs ended by the success test itself (promotion or 'significantly worse'); in an A/A
        test every one of them is a false positive."""
        return self.cause_rate("significantly_better") + self.cause_rate("significantly_worse")

    @property
    def promotion_rate(self) -> float:
        return self.rate("promote")

    @property
    def rollback_rate(self) -> float:
        return self.rate("rollback")

    def median_episodes_to(self, action: str) -> float | None:
        values = [n for a, n in zip(self.final_actions, self.episodes_to_decision) if a == action]
        return float(np.median(values)) if values else None


class _Tally:
    """Cumulative counts of one simulated arm."""

    def __init__(self) -> None:
        self.counts = np.zeros(4, dtype=np.int64)  # success, hallucination, error, idk
        self.latencies: list[np.ndarray] = []
        self.steps: list[np.ndarray] = []

    def add(self, rng: np.random.Generator, arm: Arm, n: int, step: int = 0, load: float = 1.0) -> None:
        """`n` more episodes served at rollout step `step`, their latencies `load` times the arm's own (the load
        the step's shares put on the machine slows both arms alike)."""
        if n == 0:
            return
        probs = [arm.success, arm.hallucination, arm.error]
        self.counts += rng.multinomial(n, [*probs, max(0.0, 1.0 - sum(probs))])
        if arm.latency_median_ms is not None:
            self.latencies.append(rng.lognormal(np.log(arm.latency_median_ms * load), 0.5, size=n))
            self.steps.append(np.full(n, step))

    def stats(self) -> ArmStats:
        latencies = tuple(np.concatenate(self.latencies).tolist()) if self.latencies else ()
        steps = tuple(int(x) for x in np.concatenate(self.steps)) if self.steps else ()
        s, h, e, _ = (int(c) for c in self.counts)
        return ArmStats(successes=s, trials=int(self.counts.sum()), hallucinations=h, errors=e, latencies_ms=latencies,
                        latency_steps=steps)


def simulate_rollouts(
    champion: Arm,
    challenger: Arm,
    *,
    n_runs: int = 200,
    config: RolloutConfig | None = None,
    batch_size: int = 50,
    batch_interval: timedelta = timedelta(hours=1),
    seed: int = 0,
    significance_test: SignificanceTest = always_valid_test,
) -> RolloutSimulation:
    """Run the real `decide` after every batch of `batch_size` episodes (each routed to the
    challenger with the current share) until promotion or rollback; every run ends because each
    step times out after `config.max_step_duration`."""
    if n_runs < 1 or batch_size < 1:
        raise ValueError(f"n_runs and batch_size must be >= 1, got {n_runs} and {batch_size}")
    config = config or RolloutConfig()
    rng = np.random.default_rng(seed)
    batches_per_step = int(np.ceil(config.max_step_duration / batch_interval))
    max_batches = batches_per_step * (len(config.steps) - 1) + len(config.steps)
    actions, causes, episodes, shares = [], [], [], []
    for _ in range(n_runs):
        state = RolloutState.start(CHAMPION, CHALLENGER, config, now=T0)
        tallies = {CHAMPION: _Tally(), CHALLENGER: _Tally()}
        final, cause, served, top = "undecided", "undecided", 0, state.step_share
        for batch in range(1, max_batches + 1):
            to_challenger = int(rng.binomial(batch_size, state.step_share))
            tallies[CHALLENGER].add(rng, challenger, to_challenger)
            tallies[CHAMPION].add(rng, champion, batch_size - to_challenger)
            served += batch_size
            decision = decide(
                state,
                tallies[CHAMPION].stats(),
                tallies[CHALLENGER].stats(),
                config,
                now=T0 + batch * batch_interval,
                significance_test=significance_test,
            )
            state = apply_decision(state, decision)
            top = max(top, state.step_share)
            if state.finished:
                final, cause = decision.action, decision.cause
                break
        actions.append(final)
        causes.append(cause)
        episodes.append(served)
        shares.append(top)
    return RolloutSimulation(tuple(actions), tuple(causes), tuple(episodes), tuple(shares))


def false_promotion_rate(
    p: float, n_runs: int = 200, *, config: RolloutConfig | None = None, seed: int = 0, **kwargs
) -> float:
    """A/A: both arms succeed with probability `p`; the share of runs that end in promotion."""
    arm = Arm(success=p)
    return simulate_rollouts(arm, arm, n_runs=n_runs, config=config, seed=seed, **kwargs).promotion_rate


def power(
    p_champion: float, lift: float, n_runs: int = 200, *, config: RolloutConfig | None = None, seed: int = 0, **kwargs
) -> float:
    """A/B: the challenger succeeds `lift` more often (absolute); the share of runs promoted."""
    return simulate_rollouts(
        Arm(success=p_champion), Arm(success=p_champion + lift), n_runs=n_runs, config=config, seed=seed, **kwargs
    ).promotion_rate


def peeking_false_positive_rates(
    p: float,
    *,
    n_runs: int = 2000,
    n_checks: int = 100,
    batch_size: int = 50,
    share: float = 0.5,
    alpha: float = 0.05,
    tau_squared: float = 0.01,
    min_samples_per_arm: int = 100,
    seed: int = 0,
) -> dict[str, float]:
    """The test alone (no rollout steps), vectorized over runs: the share of A/A runs in which the
    test rejects at ANY of `n_checks` looks, for the mSPRT and the naive z-test, plus the z-test
    at the final look only (its one valid use)."""
    rng = np.random.default_rng(seed)
    to_challenger = rng.binomial(batch_size, share, size=(n_runs, n_checks))
    n_b = np.cumsum(to_challenger, axis=1)
    n_a = np.cumsum(batch_size - to_challenger, axis=1)
    x_b = np.cumsum(rng.binomial(to_challenger, p), axis=1)
    x_a = np.cumsum(rng.binomial(batch_size - to_challenger, p), axis=1)
    looked = np.minimum(n_a, n_b) >= min_samples_per_arm
    msprt = (msprt_p_value(x_a, n_a, x_b, n_b, tau_squared) <= alpha) & looked
    z = (z_test_p_value(x_a, n_a, x_b, n_b) <= alpha) & looked
    return {
        "msprt_any_look": float(msprt.any(axis=1).mean()),
        "z_test_any_look": float(z.any(axis=1).mean()),
        "z_test_final_look_only": float(z[:, -1].mean()),
    }

"""The always-valid success-rate test, its guardrail tests, and why peeking needs them."""

from __future__ import annotations

import numpy as np
import pytest

from agent_rl.ab.simulate import peeking_false_positive_rates
from agent_rl.ab.stats import (
    ArmStats,
    SequentialTestConfig,
    always_valid_test,
    fixed_horizon_z_test,
    latency_guardrail,
    rate_guardrail,
)


def arm(successes: int, trials: int, **kw) -> ArmStats:
    return ArmStats(successes=successes, trials=trials, **kw)


def test_identical_rates_give_no_verdict():
    result = always_valid_test(arm(550, 1000), arm(55, 100))
    assert result.decision == "continue"
    assert result.p_value == pytest.approx(1.0)
    assert result.lift == pytest.approx(0.0)
    assert result.ci_low < 0 < result.ci_high
    assert (result.n, result.n_champion, result.n_challenger) == (1100, 1000, 100)


def test_large_improvement_and_degradation_are_detected_two_sided():
    better = always_valid_test(arm(550, 1000), arm(750, 1000))
    worse = always_valid_test(arm(550, 1000), arm(350, 1000))
    assert better.decision == "better" and better.p_value < 0.05 and better.ci_low > 0
    assert worse.decision == "worse" and worse.p_value < 0.05 and worse.ci_high < 0
    assert better.lift == pytest.approx(0.2) and better.relative_lift == pytest.approx(0.2 / 0.55)


def test_no_verdict_before_the_minimum_sample_however_strong_the_evidence():
    config = SequentialTestConfig(min_samples_per_arm=100)
    tiny = always_valid_test(arm(0, 99), arm(99, 99), config)
    assert tiny.p_value < 1e-6
    assert tiny.decision == "continue"


def test_msprt_needs_more_evidence_than_a_single_z_test():
    # The price of being allowed to peek: a borderline fixed-horizon result is not enough.
    champion, challenger = arm(500, 1000), arm(545, 1000)
    assert fixed_horizon_z_test(champion, challenger).decision == "better"
    assert always_valid_test(champion, challenger).decision == "continue"


def test_confidence_sequence_covers_the_true_lift():
    result = always_valid_test(arm(5500, 10000), arm(6000, 10000))
    assert result.ci_low < 0.05 < result.ci_high
    assert result.ci_high - result.ci_low < 0.06


def test_bad_arm_counts_and_config_are_rejected_with_the_field_named():
    with pytest.raises(ValueError, match="successes"):
        arm(11, 10)
    with pytest.raises(ValueError, match="exceed trials"):
        ArmStats(successes=6, trials=10, hallucinations=5)
    with pytest.raises(ValueError, match="latencies_ms"):
        ArmStats(successes=1, trials=2, latencies_ms=(1.0, -3.0))
    with pytest.raises(ValueError, match="alpha must be strictly between 0 and 1"):
        SequentialTestConfig(alpha=1.2)
    with pytest.raises(ValueError, match="tau_squared"):
        SequentialTestConfig(tau_squared=0)


def test_rate_guardrail_flags_only_a_significant_excess_over_the_margin():
    clear = rate_guardrail("hallucination_rate", 80, 1000, 60, 200, 0.02, alpha=0.05, tau_squared=0.01)
    assert clear.breached and not clear.within_margin
    noisy = rate_guardrail("hallucination_rate", 80, 1000, 23, 200, 0.02, alpha=0.05, tau_squared=0.01)
    assert not noisy.breached and not noisy.within_margin  # 11.5% vs 8%: over the margin, not yet significant
    fine = rate_guardrail("hallucination_rate", 80, 1000, 16, 200, 0.02, alpha=0.05, tau_squared=0.01)
    assert not fine.breached and fine.within_margin


def test_latency_guardrail_compares_p95_against_the_allowed_limit():
    champion = tuple(float(x) for x in range(1, 1001))  # p95 ~ 950 ms
    slower = tuple(x * 1.6 for x in champion)
    same = champion[::5]
    limit = lambda p95: p95 * 1.2  # noqa: E731 - the relative margin of 20%
    breach = latency_guardrail(ArmStats(0, 1000, latencies_ms=champion), ArmStats(0, 1000, latencies_ms=slower), limit,
                               alpha=0.05, tau_squared=0.01)
    assert breach.breached and breach.challenger_value > breach.limit
    ok = latency_guardrail(ArmStats(0, 1000, latencies_ms=champion), ArmStats(0, 200, latencies_ms=same), limit,
                           alpha=0.05, tau_squared=0.01)
    assert not ok.breached and ok.within_margin
    assert not latency_guardrail(ArmStats(0, 0), ArmStats(0, 200, latencies_ms=same), limit, alpha=0.05,
                                 tau_squared=0.01).breached


def _served(steps: dict[int, tuple[float, int]], seed: int) -> ArmStats:
    """An arm's latencies: per step, (mean ms, requests), spread +-10%."""
    rng = np.random.default_rng(seed)
    latencies = [(step, x) for step, (mean, n) in steps.items() for x in rng.uniform(0.9 * mean, 1.1 * mean, n)]
    return ArmStats(0, len(latencies), latencies_ms=tuple(x for _, x in latencies),
                    latency_steps=tuple(step for step, _ in latencies))


def test_latency_guardrail_holds_each_request_against_its_own_steps_champion():
    """The load moves with the shares: at 50% both versions are slower than at 10%. A challenger as fast as the
    champion in every step is within the margin, though its pooled p95 (mostly from the slower step) is 40% above
    the champion's (mostly from the faster one); one slower within a step is caught."""
    limit = lambda p95: p95 * 1.2  # noqa: E731
    champion = _served({0: (40_000.0, 900), 1: (56_000.0, 40)}, seed=1)
    as_fast = _served({0: (40_000.0, 100), 1: (56_000.0, 100)}, seed=2)
    pooled = latency_guardrail(ArmStats(0, 940, latencies_ms=champion.latencies_ms),
                               ArmStats(0, 200, latencies_ms=as_fast.latencies_ms), limit, alpha=0.05, tau_squared=0.01)
    assert pooled.breached  # what comparing across loads concludes
    fair = latency_guardrail(champion, as_fast, limit, alpha=0.05, tau_squared=0.01)
    assert not fair.breached and fair.within_margin
    assert "step 0" in fair.note and "step 1" in fair.note
    slower = _served({0: (40_000.0, 100), 1: (80_000.0, 100)}, seed=3)
    caught = latency_guardrail(champion, slower, limit, alpha=0.05, tau_squared=0.01)
    assert caught.breached and caught.challenger_value > caught.limit


def test_latency_guardrail_waits_for_a_step_with_enough_champion_requests():
    limit = lambda p95: p95 * 1.2  # noqa: E731
    champion = _served({0: (40_000.0, 19)}, seed=4)
    slower = _served({0: (90_000.0, 50)}, seed=5)
    waiting = latency_guardrail(champion, slower, limit, alpha=0.05, tau_squared=0.01)
    assert not waiting.breached and waiting.limit is None and "20 requests" in waiting.note
    # A step compared, the next one not yet: no promotion on the earlier step's figures alone.
    champion = _served({0: (40_000.0, 180), 1: (56_000.0, 12)}, seed=6)
    as_fast = _served({0: (40_000.0, 20), 1: (56_000.0, 12)}, seed=7)
    partial = latency_guardrail(champion, as_fast, limit, alpha=0.05, tau_squared=0.01)
    assert not partial.breached and not partial.within_margin and "step 1 not compared yet" in partial.note


def test_arm_stats_rejects_latency_steps_that_do_not_match_the_latencies():
    with pytest.raises(ValueError, match="latency_steps has 1 entries for 2 latencies"):
        ArmStats(0, 2, latencies_ms=(1.0, 2.0), latency_steps=(0,))


def test_peeking_inflates_the_z_test_but_not_the_msprt():
    rates = peeking_false_positive_rates(0.5, n_runs=2000, n_checks=100, batch_size=50, seed=11)
    assert rates["msprt_any_look"] <= 0.05
    assert rates["z_test_any_look"] > 0.15  # checked 100 times, the naive test cries wolf far beyond alpha
    assert rates["z_test_final_look_only"] == pytest.approx(0.05, abs=0.015)
    assert rates == peeking_false_positive_rates(0.5, n_runs=2000, n_checks=100, batch_size=50, seed=11)


def test_vectorized_simulator_core_agrees_with_the_test_the_rollout_uses():
    import numpy as np

    from agent_rl.ab.stats import msprt_p_value, z_test_p_value

    cases = [(550, 1000, 80, 100), (500, 1000, 545, 1000), (10, 900, 0, 100), (0, 100, 0, 100)]
    x_a, n_a, x_b, n_b = (np.array(column) for column in zip(*cases))
    vector_msprt = msprt_p_value(x_a, n_a, x_b, n_b, 0.01)
    vector_z = z_test_p_value(x_a, n_a, x_b, n_b)
    for i, (xa, na, xb, nb) in enumerate(cases):
        assert always_valid_test(arm(xa, na), arm(xb, nb)).p_value == pytest.approx(vector_msprt[i])
        assert fixed_horizon_z_test(arm(xa, na), arm(xb, nb)).p_value == pytest.approx(vector_z[i])

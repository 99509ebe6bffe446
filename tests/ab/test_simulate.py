"""The rollout procedure under continuous monitoring, over many simulated runs (seeded)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_rl.ab.rollout import RolloutConfig
from agent_rl.ab.simulate import Arm, false_promotion_rate, power, simulate_rollouts
from agent_rl.ab.stats import fixed_horizon_z_test

# Two days per step, 100 episodes an hour: every A/A run is looked at 48 times in its first step
# (4,800 episodes) before it times out; only a false verdict can end it earlier.
CONFIG = RolloutConfig(max_step_duration=timedelta(days=2), alpha=0.05)
FAST = {"config": CONFIG, "batch_size": 100}


@pytest.fixture(scope="module")
def aa_runs():
    """240 seeded A/A rollouts with the always-valid test, shared by the tests below."""
    return simulate_rollouts(Arm(0.55), Arm(0.55), n_runs=240, seed=2024, **FAST)


def test_aa_false_promotion_rate_stays_below_alpha_over_240_runs(aa_runs):
    assert aa_runs.n_runs == 240
    assert aa_runs.promotion_rate <= CONFIG.alpha


def test_aa_runs_end_in_rollback_and_rarely_on_a_false_significant_verdict(aa_runs):
    assert aa_runs.promotion_rate + aa_runs.rollback_rate == 1.0  # every run ends
    assert aa_runs.significant_decision_rate <= CONFIG.alpha
    assert aa_runs.cause_rate("timeout") >= 1 - CONFIG.alpha


def test_simulation_is_deterministic_for_a_seed():
    assert false_promotion_rate(0.3, n_runs=20, seed=9, **FAST) == false_promotion_rate(0.3, n_runs=20, seed=9, **FAST)
    first = simulate_rollouts(Arm(0.3), Arm(0.4), n_runs=10, seed=9, **FAST)
    assert first == simulate_rollouts(Arm(0.3), Arm(0.4), n_runs=10, seed=9, **FAST)


def test_naive_z_test_under_the_same_peeking_makes_false_verdicts_beyond_alpha(aa_runs):
    naive = simulate_rollouts(Arm(0.55), Arm(0.55), n_runs=240, seed=2024, significance_test=fixed_horizon_z_test, **FAST)
    assert naive.significant_decision_rate > 1.5 * CONFIG.alpha
    assert aa_runs.significant_decision_rate <= CONFIG.alpha < naive.significant_decision_rate


def test_clearly_better_challenger_is_promoted_in_nearly_every_run():
    result = simulate_rollouts(Arm(0.55), Arm(0.75), n_runs=100, seed=1, **FAST)
    assert result.promotion_rate >= 0.95
    assert all(share == 1.0 for action, share in zip(result.final_actions, result.max_share) if action == "promote")
    assert result.median_episodes_to("promote") <= 4000


def test_clearly_worse_challenger_is_rolled_back_in_every_run():
    result = simulate_rollouts(Arm(0.55), Arm(0.35), n_runs=100, seed=1, **FAST)
    assert result.rollback_rate == 1.0
    assert result.cause_rate("significantly_worse") >= 0.95
    assert result.median_episodes_to("rollback") <= 2000


def test_power_grows_with_the_lift():
    small = power(0.55, 0.04, n_runs=100, seed=3, **FAST)
    large = power(0.55, 0.15, n_runs=100, seed=3, **FAST)
    assert small < 0.5 < 0.9 <= large


def test_impossible_arm_probabilities_are_rejected():
    with pytest.raises(ValueError, match="sum to <= 1"):
        Arm(success=0.8, hallucination=0.3)

"""The promotion gates on constructed evaluations: what a team's bar lets through, near the ceiling and on a small
held-out set, with the paired test and the interval in the decision."""

from __future__ import annotations

import pytest

from agent_rl.evaluate.gates import (
    GateSettings,
    error_reduction,
    forgetting_gate,
    mcnemar_p,
    non_inferiority_gate,
    paired,
    promotion_gate,
    superiority_gate,
)
from agent_rl.evaluate.metrics import compute_metrics


def evaluation(outcomes: list[bool], cost: float = 0.0):
    """EvalMetrics of a model judged on tasks t0..tN with these per-task outcomes."""
    return compute_metrics([]).model_copy(update={
        "n": len(outcomes), "accuracy": sum(outcomes) / len(outcomes), "cost_per_1k_usd": cost,
        "outcomes": {f"t{i:04d}": ok for i, ok in enumerate(outcomes)}})


def incumbent_and_candidate(n: int, incumbent_right: int, fixed: int, broken: int = 0):
    """The incumbent right on the first `incumbent_right` tasks; the candidate fixes `fixed` of its errors and
    breaks `broken` of its right answers."""
    incumbent = [i < incumbent_right for i in range(n)]
    candidate = list(incumbent)
    for i in range(incumbent_right, incumbent_right + fixed):
        candidate[i] = True
    for i in range(broken):
        candidate[i] = False
    return evaluation(candidate), evaluation(incumbent)


def test_a_model_failing_a_third_as_often_as_a_957_incumbent_passes_superiority():
    candidate, incumbent = incumbent_and_candidate(1000, 957, fixed=29)  # 43 errors -> 14
    gate = promotion_gate(candidate, incumbent, GateSettings(), incumbent_name="production's o3-sim")
    assert gate.passed and gate.kind == "superiority"
    assert gate.details["error_reduction"] == pytest.approx(29 / 43)
    low, high = gate.details["error_reduction_interval"]
    assert 0.10 < low < 29 / 43 < high
    assert gate.details["p_value"] < 1e-6
    assert "production's o3-sim 95.7%" in gate.message and "p = " in gate.message and "passed" in gate.message


def test_the_old_relative_accuracy_bar_is_gone_a_perfect_model_passes_near_the_ceiling():
    candidate, incumbent = incumbent_and_candidate(1000, 957, fixed=43)
    assert promotion_gate(candidate, incumbent, GateSettings()).passed  # 1.10 x 95.7% = 105.3% was unreachable


def test_a_three_point_gain_on_94_tasks_is_not_significant():
    candidate, incumbent = incumbent_and_candidate(94, 66, fixed=3)
    gate = promotion_gate(candidate, incumbent, GateSettings())
    assert gate.details["error_reduction"] == pytest.approx(3 / 28)  # large enough on its face ...
    assert not gate.passed and gate.details["p_value"] > 0.05  # ... but 3 discordant tasks prove nothing
    assert "not significant" in gate.message


def test_a_significant_gain_below_the_margin_does_not_pass():
    candidate, incumbent = incumbent_and_candidate(5000, 2000, fixed=150)  # 3,000 errors -> 2,850: 5% fewer
    gate = promotion_gate(candidate, incumbent, GateSettings())
    assert gate.details["p_value"] < 0.001 and not gate.passed and "10% required" in gate.message


def test_losses_count_against_the_candidate_in_the_paired_test():
    candidate, incumbent = incumbent_and_candidate(200, 120, fixed=20, broken=15)
    gate = promotion_gate(candidate, incumbent, GateSettings())
    assert gate.details["discordant"] == [20, 15] and not gate.passed


def test_an_incumbent_without_errors_cannot_be_beaten_and_says_so():
    candidate, incumbent = incumbent_and_candidate(50, 50, fixed=0)
    gate = promotion_gate(candidate, incumbent, GateSettings())
    assert not gate.passed and "made no error" in gate.message


def test_a_cheaper_model_within_the_margin_passes_non_inferiority_and_one_outside_does_not():
    settings = GateSettings(kind="non_inferiority", margin=0.05, min_cost_ratio=5)
    incumbent = [i < 900 for i in range(1000)]
    close = list(incumbent)
    for i in range(0, 40):  # loses 40, wins 30: 89% vs 90%
        close[i] = False
    for i in range(900, 930):
        close[i] = True
    gate = promotion_gate(evaluation(close, cost=1.0), evaluation(incumbent, cost=55.19), settings)
    assert gate.passed and gate.kind == "non_inferiority"
    assert -0.05 < gate.details["accuracy_difference_lower_bound"] < -0.01
    far = [i < 800 for i in range(1000)]  # 80% vs 90%
    gate = promotion_gate(evaluation(far, cost=1.0), evaluation(incumbent, cost=55.19), settings)
    assert not gate.passed and "at most 5.0% allowed" in gate.message
    # Within the margin but not cheaper enough.
    gate = promotion_gate(evaluation(close, cost=20.0), evaluation(incumbent, cost=55.19), settings)
    assert not gate.passed and "2.8x cheaper" in gate.message


def grouped(outcomes: list[bool], steps: int, cost: float = 0.0):
    """`evaluation`, its tasks the replayed steps of episodes of `steps` steps each (drawn together)."""
    metrics = evaluation(outcomes, cost)
    return metrics.model_copy(update={"outcome_groups": {k: f"ep{int(k[1:]) // steps}" for k in metrics.outcomes}})


def test_steps_of_one_episode_are_drawn_and_tested_together():
    # 20 episodes of 5 replayed steps: the candidate gets every step of 4 episodes the incumbent failed, the
    # incumbent every step of 1 the candidate failed. Counted by step that is 20 vs 5 discordant tasks
    # (significant); counted by episode, where a user and a conversation are shared, 4 vs 1 (not).
    incumbent = [i >= 20 for i in range(100)]
    candidate = [i < 95 for i in range(100)]
    by_step = promotion_gate(evaluation(candidate), evaluation(incumbent), GateSettings())
    assert by_step.details["discordant"] == [20, 5] and by_step.details["p_value"] < 0.01
    by_episode = promotion_gate(grouped(candidate, 5), grouped(incumbent, 5), GateSettings())
    assert by_episode.details["discordant"] == [4, 1] and by_episode.details["p_value"] == pytest.approx(6 / 32)
    assert not by_episode.passed and "not significant" in by_episode.message
    assert "100 paired tasks in 20 groups" in by_episode.message and "sign test" in by_episode.message
    assert by_episode.details["accuracy_difference"] == by_step.details["accuracy_difference"]
    # The interval is wider when whole episodes are resampled.
    step_low, step_high = by_step.details["accuracy_difference_interval"]
    episode_low, episode_high = by_episode.details["accuracy_difference_interval"]
    assert episode_high - episode_low > step_high - step_low
    non_inferiority = GateSettings(kind="non_inferiority")
    assert "in 20 groups" in promotion_gate(grouped(candidate, 5, 1.0), grouped(incumbent, 5, 55.0),
                                            non_inferiority).message


def test_the_decision_is_reproducible_and_needs_common_tasks():
    candidate, incumbent = incumbent_and_candidate(300, 200, fixed=30)
    first = superiority_gate(paired(candidate.outcomes, incumbent.outcomes), GateSettings())
    again = superiority_gate(paired(candidate.outcomes, incumbent.outcomes), GateSettings())
    assert first.as_dict() == again.as_dict()
    other = compute_metrics([]).model_copy(update={"outcomes": {"elsewhere": True}})
    with pytest.raises(ValueError, match="no common held-out task"):
        promotion_gate(candidate, other, GateSettings())


def test_the_open_gate_lets_anything_through_and_says_it_has_no_bar():
    candidate, incumbent = incumbent_and_candidate(20, 15, fixed=0, broken=10)
    gate = promotion_gate(candidate, incumbent, GateSettings(kind="open"))
    assert gate.passed and "no quality bar" in gate.message


def test_building_blocks():
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(3, 0) == pytest.approx(0.125)
    assert error_reduction(0.03, 0.043) == pytest.approx(0.3023, abs=1e-4)
    assert error_reduction(0.01, 0.0) == float("-inf") and error_reduction(0.0, 0.0) == 0.0
    assert forgetting_gate(0.5, 0.55, GateSettings(max_forgetting_drop=0.1)).passed
    assert not forgetting_gate(0.2, 0.55, GateSettings(max_forgetting_drop=0.1)).passed
    with pytest.raises(ValueError):
        non_inferiority_gate(paired({}, {}), GateSettings(), 0.0, 1.0)

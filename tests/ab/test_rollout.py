"""The rollout state machine: 10% -> 50% -> 100%, rollback on degradation or guardrail breach."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl.ab.rollout import Guardrails, Margin, RolloutConfig, RolloutState, apply_decision, decide
from agent_rl.ab.simulate import Arm, _Tally
from agent_rl.ab.stats import ArmStats

T0 = datetime(2025, 3, 3, tzinfo=timezone.utc)
CONFIG = RolloutConfig(max_step_duration=timedelta(days=2))


def drive(champion: Arm, challenger: Arm, config: RolloutConfig = CONFIG, seed: int = 0, batch: int = 100,
          load: tuple[float, ...] = (1.0, 1.0)):
    """Serve simulated traffic hour by hour, deciding after every batch, until the rollout ends; `load`: how much
    slower every request is at each step short of the last (the shares change the machine's load).
    Returns the final state, every decision, and the episodes served per arm."""
    rng = np.random.default_rng(seed)
    state = RolloutState.start("v1", "v2", config, now=T0)
    tallies = {"v1": _Tally(), "v2": _Tally()}
    decisions = []
    for hour in range(1, 24 * 30):
        to_challenger = int(rng.binomial(batch, state.step_share))
        step = config.step_index(state.step_share)
        tallies["v2"].add(rng, challenger, to_challenger, step=step, load=load[step])
        tallies["v1"].add(rng, champion, batch - to_challenger, step=step, load=load[step])
        decision = decide(state, tallies["v1"].stats(), tallies["v2"].stats(), config, now=T0 + timedelta(hours=hour))
        decisions.append(decision)
        state = apply_decision(state, decision)
        if state.finished:
            break
    return state, decisions, {v: t.stats().trials for v, t in tallies.items()}


def assert_valid_weights(weights: dict[str, float]) -> None:
    assert set(weights) <= {"v1", "v2"}
    assert all(0.0 <= w <= 1.0 for w in weights.values())
    assert math.isclose(sum(weights.values()), 1.0)


def test_clearly_better_challenger_is_promoted_through_all_three_steps():
    state, decisions, served = drive(Arm(0.55), Arm(0.75))
    assert state.status == "promoted"
    assert [e.action for e in state.history] == ["start", "advance", "promote"]
    assert [e.step_share for e in state.history] == [0.10, 0.50, 1.00]
    assert [e.weights for e in state.history] == [{"v1": 0.9, "v2": 0.1}, {"v1": 0.5, "v2": 0.5}, {"v2": 1.0}]
    final = decisions[-1]
    assert (final.new_champion, final.previous_champion) == ("v2", "v1")
    assert final.stats["test"]["p_value"] <= CONFIG.alpha and final.stats["test"]["ci_low"] > 0
    assert sum(served.values()) < 5000  # a 20-point lift needs a few thousand episodes, not weeks
    for decision in decisions:
        assert_valid_weights(decision.new_weights)


def test_clearly_worse_challenger_is_rolled_back_at_the_first_step():
    state, decisions, served = drive(Arm(0.55), Arm(0.35))
    assert state.status == "rolled_back"
    assert decisions[-1].cause == "significantly_worse"
    assert decisions[-1].new_weights == {"v1": 1.0}
    assert max(e.step_share for e in state.history) == 0.10
    assert served["v2"] < 400


def test_more_hallucinations_roll_back_even_when_success_is_better():
    state, decisions, _ = drive(Arm(0.55, hallucination=0.08), Arm(0.75, hallucination=0.22))
    assert state.status == "rolled_back"
    assert decisions[-1].cause == "guardrail_breach"
    assert "failure_rate" in decisions[-1].reason
    assert decisions[-1].stats["test"]["lift"] > 0.1


def test_a_challenger_that_answers_where_the_champion_breaks_is_not_held_back_by_its_few_wrong_answers():
    """The incumbent never answers wrong because it rarely answers at all (format errors, timeouts): the failures
    a user feels are counted together, so trading many broken replies for a few wrong answers is a win."""
    broken_incumbent = Arm(0.30, hallucination=0.0, error=0.60)
    answers = Arm(0.75, hallucination=0.08, error=0.02)
    state, decisions, _ = drive(broken_incumbent, answers)
    assert state.status == "promoted", decisions[-1].reason


def test_the_incumbent_keeps_the_other_routed_versions_and_a_rollback_restores_the_routing_exactly():
    """A challenger arrives in a table where the incumbent serves 70% and two others 20% and 10%: they keep their
    shares scaled by what the test takes, and a rollback puts back the table as it was, to the decimal."""
    before = {"teacher": 0.7, "v3": 0.2, "api": 0.1}
    state = RolloutState.start("teacher", "v4", CONFIG, now=T0, baseline_weights=before)
    assert state.weights() == pytest.approx({"teacher": 0.63, "v3": 0.18, "api": 0.09, "v4": 0.10})
    worse = decide(state, ArmStats(500, 1000), ArmStats(20, 200), CONFIG, now=T0 + timedelta(hours=1))
    assert worse.action == "rollback" and worse.new_weights == before
    assert apply_decision(state, worse).weights() == before
    better = decide(state, ArmStats(500, 1000), ArmStats(180, 200), CONFIG, now=T0 + timedelta(hours=1))
    assert better.action == "advance"
    assert better.new_weights == pytest.approx({"teacher": 0.35, "v3": 0.10, "api": 0.05, "v4": 0.5})
    advanced = apply_decision(state, better)
    back = decide(advanced, ArmStats(500, 1000), ArmStats(40, 400), CONFIG, now=T0 + timedelta(hours=2))
    assert back.action == "rollback" and back.new_weights == before
    with pytest.raises(ValueError, match="not in the routing"):
        RolloutState.start("v9", "v4", CONFIG, now=T0, baseline_weights=before)


def test_slower_p95_latency_rolls_back_even_when_success_is_better():
    state, decisions, _ = drive(Arm(0.55, latency_median_ms=1000), Arm(0.75, latency_median_ms=1600))
    assert state.status == "rolled_back"
    assert decisions[-1].cause == "guardrail_breach"
    assert "latency_p95_ms" in decisions[-1].reason
    # The same challenger with unchanged latency goes all the way.
    assert drive(Arm(0.55, latency_median_ms=1000), Arm(0.75, latency_median_ms=1000))[0].status == "promoted"


def test_latency_is_compared_within_each_step_so_a_heavier_load_at_50_percent_does_not_roll_back():
    """At 50% both versions are twice as slow as at 10% (two engines share the machine): the challenger's pooled
    p95, half served at 50%, is far above the champion's, nine tenths served at 10% (a pooled comparison rolls it
    back), yet it is no slower than the champion beside it, and it is promoted; one slower beside the champion is
    still rolled back."""
    heavier = (1.0, 2.0)
    as_fast = drive(Arm(0.55, latency_median_ms=1000), Arm(0.75, latency_median_ms=1000), load=heavier)
    assert as_fast[0].status == "promoted"
    slower = drive(Arm(0.55, latency_median_ms=1000), Arm(0.75, latency_median_ms=1600), load=heavier)
    assert slower[0].status == "rolled_back" and slower[1][-1].cause == "guardrail_breach"


def test_guardrail_margins_are_configurable():
    lenient = CONFIG.model_copy(update={"guardrails": Guardrails(failure_rate=Margin(kind="absolute", value=0.5))})
    assert drive(Arm(0.55, hallucination=0.08), Arm(0.75, hallucination=0.22), lenient)[0].status == "promoted"


def test_minimum_samples_per_arm_and_per_step_are_respected():
    state = RolloutState.start("v1", "v2", CONFIG, now=T0)
    early = decide(state, ArmStats(400, 900), ArmStats(99, 99), CONFIG, now=T0 + timedelta(hours=1))
    assert early.action == "hold" and early.cause == "collecting"

    ready = decide(state, ArmStats(990, 1800), ArmStats(160, 200), CONFIG, now=T0 + timedelta(hours=2))
    assert ready.action == "advance" and ready.new_weights == {"v1": 0.5, "v2": 0.5}
    state = apply_decision(state, ready)
    assert state.step_start_trials == {"v1": 1800, "v2": 200}

    # Overwhelming evidence, but only 150 episodes per arm at the 50% step: keep going.
    wait = decide(state, ArmStats(1072, 1950), ArmStats(280, 350), CONFIG, now=T0 + timedelta(hours=3))
    assert wait.action == "hold" and wait.cause == "better_waiting_for_step_samples"
    assert wait.new_weights == {"v1": 0.5, "v2": 0.5}
    done = decide(state, ArmStats(1100, 2000), ArmStats(320, 400), CONFIG, now=T0 + timedelta(hours=4))
    assert done.action == "promote" and done.new_weights == {"v2": 1.0}


def test_a_step_without_a_significant_win_times_out_into_rollback():
    state = RolloutState.start("v1", "v2", CONFIG, now=T0)
    stats = (ArmStats(990, 1800), ArmStats(110, 200))
    assert decide(state, *stats, CONFIG, now=T0 + timedelta(days=1)).action == "hold"
    late = decide(state, *stats, CONFIG, now=T0 + timedelta(days=2))
    assert (late.action, late.cause, late.new_weights) == ("rollback", "timeout", {"v1": 1.0})


def test_requests_a_version_could_not_serve_hold_the_step_instead_of_moving_it():
    """An outage (the challenger's engine down, its requests answered 503) is no evidence about the model: a look
    that would advance holds while either arm has unserved requests, and the step still runs out as before."""
    state = RolloutState.start("v1", "v2", CONFIG, now=T0)
    better = (ArmStats(990, 1800), ArmStats(160, 200))  # advances when nothing is unserved (the test above)
    assert decide(state, *better, CONFIG, now=T0 + timedelta(hours=2), unserved={}).action == "advance"
    for down in ({"v2": 7}, {"v1": 1}):
        held = decide(state, *better, CONFIG, now=T0 + timedelta(hours=2), unserved={**down, "v9": 3})
        assert (held.action, held.cause, held.new_weights) == ("hold", "serving_unavailable", {"v1": 0.9, "v2": 0.1})
        assert held.stats["unserved"] == down and "no evidence" in held.reason
    worse = decide(state, ArmStats(1100, 1800), ArmStats(60, 200), CONFIG, now=T0 + timedelta(hours=2),
                   unserved={"v2": 7})
    assert worse.action == "rollback" and worse.cause == "significantly_worse"  # what the evidence says still holds
    late = decide(state, *better, CONFIG, now=T0 + timedelta(days=2), unserved={"v2": 7})
    assert (late.action, late.cause) == ("rollback", "timeout")


SAFETY = RolloutConfig(max_step_duration=timedelta(days=2), ramp_on="safety")


def test_ramping_on_safety_moves_up_on_no_harm_but_promotes_only_on_a_significant_win():
    state = RolloutState.start("v1", "v2", SAFETY, now=T0)
    # 200 episodes at 10%, the same rate as the champion's: no win, no harm.
    flat = (ArmStats(990, 1800), ArmStats(110, 200))
    assert decide(state, *flat, CONFIG, now=T0 + timedelta(hours=1)).cause == "no_difference_yet"
    up = decide(state, *flat, SAFETY, now=T0 + timedelta(hours=1))
    assert (up.action, up.cause, up.new_weights) == ("advance", "safe_at_step", {"v1": 0.5, "v2": 0.5})
    assert "promotion still wants a significant win" in up.reason
    state = apply_decision(state, up)
    # At the last step short of promotion no significance means no promotion, however many episodes.
    still = decide(state, ArmStats(1540, 2800), ArmStats(660, 1200), SAFETY, now=T0 + timedelta(hours=2))
    assert (still.action, still.cause, still.new_weights) == ("hold", "no_difference_yet", {"v1": 0.5, "v2": 0.5})
    won = decide(state, ArmStats(1540, 2800), ArmStats(780, 1200), SAFETY, now=T0 + timedelta(hours=3))
    assert won.action == "promote" and won.stats["test"]["p_value"] <= SAFETY.alpha


def test_ramping_on_safety_waits_for_the_steps_samples_and_still_rolls_back_on_harm():
    state = RolloutState.start("v1", "v2", SAFETY, now=T0)
    short = decide(state, ArmStats(990, 1800), ArmStats(100, 180), SAFETY, now=T0 + timedelta(hours=1))
    assert short.action == "hold"  # 180 episodes at 10%: below min_samples_per_step
    worse = decide(state, ArmStats(990, 1800), ArmStats(60, 200), SAFETY, now=T0 + timedelta(hours=1))
    assert (worse.action, worse.cause) == ("rollback", "significantly_worse")


@pytest.mark.parametrize("seed", range(3))
def test_ramping_on_safety_promotes_a_clearly_better_challenger_with_fewer_episodes_and_never_a_worse_one(seed):
    _, _, served_significance = drive(Arm(0.55), Arm(0.75), seed=seed)
    state, _, served_safety = drive(Arm(0.55), Arm(0.75), SAFETY, seed=seed)
    assert state.status == "promoted" and [e.step_share for e in state.history] == [0.10, 0.50, 1.00]
    assert sum(served_safety.values()) <= sum(served_significance.values())
    worse, _, _ = drive(Arm(0.55), Arm(0.45), SAFETY, seed=seed)
    assert worse.status == "rolled_back"


def test_state_round_trips_through_json_and_refuses_misuse():
    state = RolloutState.start("v1", "v2", CONFIG, now=T0)
    assert RolloutState.model_validate_json(state.model_dump_json()) == state
    with pytest.raises(ValueError, match="different versions"):
        RolloutState.start("v1", "v1", CONFIG)
    advanced = apply_decision(state, decide(state, ArmStats(990, 1800), ArmStats(160, 200), CONFIG, now=T0))
    with pytest.raises(ValueError, match="cumulative"):
        decide(advanced, ArmStats(10, 20), ArmStats(10, 20), CONFIG, now=T0)
    finished = apply_decision(advanced, decide(advanced, ArmStats(1100, 2000), ArmStats(100, 400), CONFIG, now=T0))
    assert finished.status == "rolled_back" and finished.weights() == {"v1": 1.0}
    with pytest.raises(ValueError, match="already finished"):
        decide(finished, ArmStats(1100, 2000), ArmStats(100, 400), CONFIG)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("steps", (0.5, 0.1, 1.0), "strictly increasing"),
        ("steps", (0.1, 0.5), "last step must be 1.0"),
        ("steps", (1.0,), "at least two"),
        ("steps", (0.0, 1.0), r"in \(0, 1\]"),
        ("alpha", 1.5, "alpha must be strictly between 0 and 1"),
        ("alpha", 0.0, "alpha must be strictly between 0 and 1"),
        ("tau_squared", -1.0, "tau_squared"),
        ("max_step_duration", timedelta(0), "max_step_duration"),
        ("min_samples_per_step", 0, "min_samples_per_step"),
    ],
)
def test_bad_config_is_a_clear_value_error(field, value, message):
    with pytest.raises(ValueError, match=message):
        RolloutConfig(**{field: value})


def test_bad_margin_and_guardrail_alpha_are_rejected():
    with pytest.raises(ValueError, match="value"):
        Margin(kind="absolute", value=-0.1)
    with pytest.raises(ValueError, match="guardrails.alpha"):
        Guardrails(alpha=1.0)


counts = st.integers(min_value=0, max_value=3000)


@settings(max_examples=150, deadline=None)
@given(
    champion=st.tuples(counts, counts, counts),
    challenger=st.tuples(counts, counts, counts),
    step=st.sampled_from([0.10, 0.50]),
    hours=st.integers(min_value=0, max_value=24 * 10),
)
def test_weights_always_sum_to_one_and_name_only_the_two_versions(champion, challenger, step, hours):
    def stats(triple):
        s, h, e = triple
        return ArmStats(successes=s, trials=s + h + e, hallucinations=h, errors=e)

    state = RolloutState.start("v1", "v2", CONFIG, now=T0).model_copy(
        update={"step_share": step, "step_start_trials": {"v1": 0, "v2": 0}}
    )
    decision = decide(state, stats(champion), stats(challenger), CONFIG, now=T0 + timedelta(hours=hours))
    assert_valid_weights(decision.new_weights)
    assert_valid_weights(apply_decision(state, decision).weights())

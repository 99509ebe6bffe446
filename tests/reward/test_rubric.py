"""The rubric's tiers, their ordering, the extra credit inside them and the documented bounds."""

from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from agent_rl.records import Outcome
from agent_rl.reward.rubric import FormatErrorKind, RubricObservation, RubricWeights, reward_bounds, score

GOLD = ["<gold@x>"]


def obs(outcome: Outcome, **kwargs) -> RubricObservation:
    defaults = dict(gold_source_ids=GOLD, turns=3, max_turns=8)
    return RubricObservation(outcome=outcome, **{**defaults, **kwargs})


def total(observation: RubricObservation, weights: RubricWeights | None = None) -> float:
    return score(observation, weights).total


def test_tiers_follow_art_e():
    assert total(obs(Outcome.FORMAT_ERROR, format_error=FormatErrorKind.UNPARSABLE)) == pytest.approx(-2.0)
    assert -2.0 <= total(obs(Outcome.FORMAT_ERROR, format_error=FormatErrorKind.NO_TOOL_CALL)) <= -1.0
    assert total(obs(Outcome.WRONG)) == pytest.approx(-1.0)
    assert total(obs(Outcome.IDK)) == pytest.approx(0.0)
    assert total(obs(Outcome.RAN_OUT)) == pytest.approx(0.0)
    assert 1.0 <= total(obs(Outcome.CORRECT)) <= 1.5


def test_correct_beats_idk_beats_wrong_beats_format_error_whatever_the_partial_credit():
    best_partial = dict(found_gold=True, read_gold=True, sources=GOLD)
    worst_partial = dict(found_gold=False, read_gold=False, sources=[], turns=8)
    format_error = total(obs(Outcome.FORMAT_ERROR, format_error=FormatErrorKind.NO_TOOL_CALL, **best_partial))
    wrong = (total(obs(Outcome.WRONG, **worst_partial)), total(obs(Outcome.WRONG, **best_partial)))
    idk = (total(obs(Outcome.IDK, **worst_partial)), total(obs(Outcome.IDK, **best_partial)))
    correct = total(obs(Outcome.CORRECT, **worst_partial))
    assert format_error < wrong[0] <= wrong[1] < idk[0] <= idk[1] < correct


def test_partial_credit_rewards_finding_and_reading_the_right_email_but_stays_below_half():
    nothing = total(obs(Outcome.IDK))
    found = total(obs(Outcome.IDK, found_gold=True))
    read = total(obs(Outcome.IDK, found_gold=True, read_gold=True))
    everything = total(obs(Outcome.IDK, found_gold=True, read_gold=True, sources=GOLD))
    assert nothing < found < read < everything < 0.5
    assert total(obs(Outcome.WRONG, found_gold=True, read_gold=True, sources=GOLD)) < -0.5


def test_correct_with_right_sources_beats_correct_without():
    right = total(obs(Outcome.CORRECT, sources=GOLD))
    none = total(obs(Outcome.CORRECT, sources=[]))
    wrong_source = total(obs(Outcome.CORRECT, sources=["<other@x>"]))
    shotgun = total(obs(Outcome.CORRECT, sources=GOLD + [f"<other{i}@x>" for i in range(9)]))
    assert right > shotgun > none
    assert right > wrong_source


def test_fewer_turns_score_higher():
    rewards = [total(obs(Outcome.CORRECT, sources=GOLD, turns=t)) for t in range(1, 9)]
    assert rewards == sorted(rewards, reverse=True) and rewards[0] > rewards[-1]


def test_unanswerable_question_correctly_declined_is_rewarded_like_a_correct_answer_without_sources():
    # The runner turns "I don't know" on an unanswerable question into a correct outcome.
    declined = total(RubricObservation(outcome=Outcome.CORRECT, sources=[], gold_source_ids=[], turns=2, max_turns=8))
    cited_noise = total(RubricObservation(outcome=Outcome.CORRECT, sources=["<x@x>"], gold_source_ids=[], turns=2, max_turns=8))
    assert declined > cited_noise >= 1.0


def test_components_name_every_term_and_sum_to_total():
    reward = score(obs(Outcome.CORRECT, sources=GOLD, found_gold=True, read_gold=True, turns=4))
    assert set(reward.components) == {"correct", "sources_correct", "source_precision", "turn_efficiency"}
    assert sum(reward.components.values()) == pytest.approx(reward.total)
    error = score(obs(Outcome.FORMAT_ERROR, format_error=FormatErrorKind.UNKNOWN_TOOL, found_gold=True))
    assert error.components["format_error.unknown_tool"] == pytest.approx(-1.9)
    assert error.components["found_gold"] == pytest.approx(0.1)
    assert sum(error.components.values()) == pytest.approx(error.total)


def test_every_reward_falls_inside_the_documented_bounds():
    low, high = reward_bounds()
    assert (low, high) == (pytest.approx(-2.0), pytest.approx(1.5))
    seen = []
    for outcome, kind, found, read, sources, turns in itertools.product(
        Outcome, [None, *FormatErrorKind], [False, True], [False, True], [[], GOLD, ["<o@x>"]], [0, 1, 8, 20]
    ):
        value = total(obs(outcome, format_error=kind, found_gold=found, read_gold=read, sources=sources, turns=turns))
        assert low <= value <= high
        seen.append(value)
    assert min(seen) == pytest.approx(low)


def test_weights_are_configurable_and_tiers_stay_ordered():
    generous = RubricWeights(correct=2.0, sources_correct=0.5)
    assert total(obs(Outcome.CORRECT, sources=GOLD), generous) > total(obs(Outcome.CORRECT, sources=GOLD))
    assert reward_bounds(generous)[1] == pytest.approx(2.7)
    with pytest.raises(ValidationError, match="below 0.5"):
        RubricWeights(read_gold=0.4)
    with pytest.raises(ValidationError, match="tiers out of order"):
        RubricWeights(wrong=0.1)
    with pytest.raises(ValidationError, match="tiers out of order"):
        RubricWeights(no_tool_call=-0.9)

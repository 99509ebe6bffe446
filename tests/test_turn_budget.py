"""One turn budget: serving, evaluation and GRPO default to the same max_turns, so the rubric's turn efficiency
means the same thing in training as in the evaluation that gates it."""

import pytest

from agent_rl.environments.runner import RunnerConfig
from agent_rl.evaluate.harness import EvalConfig
from agent_rl.reward.rubric import RubricObservation
from agent_rl.records import Outcome
from agent_rl.train.config import GRPOSettings
from agent_rl.environments.email.rollouts import InboxEnvironment
from agent_rl.turn_budget import DEFAULT_MAX_TURNS, DEFAULT_TURN_TOKENS
from resources.evaluation import EvaluationResource
from resources.training import TrainingResource


def test_runner_evaluation_and_grpo_share_one_default():
    budgets = {
        "runner": RunnerConfig().max_turns,
        "evaluation": EvalConfig().max_turns,
        "evaluation resource": EvaluationResource().eval_config().max_turns,
        "grpo": GRPOSettings().max_turns,
        "grpo resource": TrainingResource().grpo().max_turns,
        "grpo gpu preset": TrainingResource(profile="gpu").grpo().max_turns,
        "rubric": RubricObservation(outcome=Outcome.CORRECT).max_turns,
        "environment": InboxEnvironment.__init__.__defaults__[-1],
    }
    assert budgets == dict.fromkeys(budgets, DEFAULT_MAX_TURNS)


def test_a_turn_is_cut_at_the_same_length_in_serving_evaluation_and_grpo():
    """A turn cut short is a truncated call, a format error: where serving cuts it, validation and GRPO must too (a
    demo arbiter at 128 tokens served 10 format errors in 48 held-out requests that the evaluation at 256 never saw)."""
    limits = {
        "runner": RunnerConfig().max_new_tokens,
        "grpo": GRPOSettings().max_turn_tokens,
        "grpo resource": TrainingResource().grpo().max_turn_tokens,
        "grpo gpu preset": TrainingResource(profile="gpu").grpo().max_turn_tokens,
    }
    assert limits == dict.fromkeys(limits, DEFAULT_TURN_TOKENS)


def test_grpo_turns_are_its_tool_rounds_plus_the_answer():
    settings = GRPOSettings(max_turns=5)
    assert settings.max_tool_calling_iterations == 4
    # TRL's name is still read (older configs), as the same budget.
    assert GRPOSettings(max_tool_calling_iterations=4) == settings
    assert GRPOSettings.model_validate({"max_tool_calling_iterations": 4, "max_turns": 5}) == settings
    assert "max_tool_calling_iterations" not in settings.model_dump()
    with pytest.raises(ValueError, match="disagree"):
        GRPOSettings(max_tool_calling_iterations=4, max_turns=8)
    with pytest.raises(ValueError, match="max_tool_calling_iterations must be a positive integer"):
        GRPOSettings(max_tool_calling_iterations=0)
    with pytest.raises(ValueError, match="max_turns"):
        GRPOSettings(max_turns=1)  # no room for a tool round


def test_a_user_can_set_them_apart():
    assert EvaluationResource(max_turns=5).eval_config().max_turns == 5
    assert TrainingResource(grpo_overrides={"max_turns": 6}).grpo().max_turns == 6

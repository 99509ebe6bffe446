"""The reward rubric lives on the ground floor (agent_rl/environments/rubric.py: environments score with it and their
rollouts carry its observation); importable here under its old name."""

from agent_rl.environments.rubric import (
    FormatErrorKind,
    Reward,
    RubricObservation,
    RubricWeights,
    reward_bounds,
    score,
)

__all__ = ["FormatErrorKind", "Reward", "RubricObservation", "RubricWeights", "reward_bounds", "score"]

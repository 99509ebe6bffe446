"""The rubric as separate GRPO reward functions, so TRL logs each signal and weighs it with `reward_weights`.

Each function returns a slice of `agent_rl.reward.rubric.score` for every rollout; with all weights
at 1.0 their weighted sum is exactly the rubric's total (the same reward the evaluation reports):
  outcome   correctness tiers: correct +1, "I don't know" / ran out 0, wrong -1 (so IDK beats a wrong answer)
  format    format errors (unparsable call, unknown tool, plain-text answer): -2 .. -1.8
  sources   right sources cited, their precision, partial credit for citing a gold email
  turns     turn efficiency of a correct answer (fewer turns, more reward)
  partial   partial credit: a gold email showed up in search results / was read
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_rl.reward.rubric import Reward, RubricWeights, score
from agent_rl.train.environment import InboxEnvironment, RolloutObservation, observe

REWARD_GROUPS: dict[str, tuple[str, ...]] = {
    "outcome": ("correct", "wrong", "idk", "ran_out"),
    "format": ("format_error.",),  # prefix: one component per kind
    "sources": ("sources_correct", "source_precision", "cited_gold"),
    "turns": ("turn_efficiency",),
    "partial": ("found_gold", "read_gold"),
}


def group_of(component: str) -> str:
    for group, names in REWARD_GROUPS.items():
        if any(component == name or (name.endswith(".") and component.startswith(name)) for name in names):
            return group
    raise KeyError(f"rubric component {component!r} belongs to no reward group; add it to REWARD_GROUPS")


def grouped(reward: Reward) -> dict[str, float]:
    """The rubric's components summed per reward group (every group present, 0.0 when unused)."""
    totals = dict.fromkeys(REWARD_GROUPS, 0.0)
    for component, value in reward.components.items():
        totals[group_of(component)] += value
    return totals


def rollout_reward(environment: InboxEnvironment, completion: list[dict[str, Any]], weights: RubricWeights) -> Reward:
    return score(observe(environment, completion).rubric, weights)


def make_reward_funcs(weights: RubricWeights | None = None) -> list[Callable[..., list[float]]]:
    """One TRL reward function per group, named `reward_<group>` (TRL logs `rewards/<name>/mean`)."""
    weights = weights or RubricWeights()

    def make(group: str) -> Callable[..., list[float]]:
        def reward_func(completions: list[list[dict[str, Any]]], environments: list[InboxEnvironment] | None = None,
                        **_: Any) -> list[float]:
            if environments is None:
                raise ValueError("reward functions need TRL's environment instances (use environment_factory)")
            return [
                grouped(rollout_reward(env, completion, weights))[group]
                for env, completion in zip(environments, completions, strict=True)
            ]

        reward_func.__name__ = f"reward_{group}"
        return reward_func

    return [make(group) for group in REWARD_GROUPS]


def observations(environments: list[InboxEnvironment], completions: list[list[dict[str, Any]]]) -> list[RolloutObservation]:
    return [observe(env, c) for env, c in zip(environments, completions, strict=True)]

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

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent_rl.environments.rollouts import JudgedRollout
from agent_rl.reward.rubric import Reward, RubricWeights, score
from agent_rl.train.plugin_rollouts import rollout_groups

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


def observe(rollout: Any, completion: list[dict[str, Any]]) -> JudgedRollout:
    """The judged rollout of a TRL environment instance whose conversation after the prompt is `completion`."""
    return rollout._observe(completion)


def rollout_reward(rollout: Any, completion: list[dict[str, Any]], weights: RubricWeights) -> Reward:
    """The rubric's reward of a rollout that observes the rubric's inputs (its `rubric` hook)."""
    observation = observe(rollout, completion)
    if observation.rubric is None:
        raise ValueError(f"{type(rollout).__name__} rollouts are judged by their environment, not by the rubric")
    return score(observation.rubric, weights)


def rollout_scores(rollout: Any, completion: list[dict[str, Any]],
                   weights: RubricWeights) -> tuple[dict[str, float], dict[str, float]]:
    """(reward per group, components) of a finished rollout: the rubric under `weights` when its observation
    carries the rubric's inputs (the email assistant's), else its environment's judge (train/plugin_rollouts.py)."""
    observation = observe(rollout, completion)
    if observation.rubric is None:
        groups, components = rollout_groups(observation)
        return {**dict.fromkeys(REWARD_GROUPS, 0.0), **groups}, components
    reward = score(observation.rubric, weights)
    return grouped(reward), dict(reward.components)


def make_reward_funcs(weights: RubricWeights | None = None) -> list[Callable[..., list[float]]]:
    """One TRL reward function per group, named `reward_<group>` (TRL logs `rewards/<name>/mean`)."""
    weights = weights or RubricWeights()

    def make(group: str) -> Callable[..., list[float]]:
        def reward_func(completions: list[list[dict[str, Any]]], environments: list[Any] | None = None,
                        **_: Any) -> list[float]:
            if environments is None:
                raise ValueError("reward functions need TRL's environment instances (use environment_factory)")
            return [
                rollout_scores(env, completion, weights)[0][group]
                for env, completion in zip(environments, completions, strict=True)
            ]

        reward_func.__name__ = f"reward_{group}"
        return reward_func

    return [make(group) for group in REWARD_GROUPS]


@dataclass(frozen=True)
class ExtraReward:
    """A reward function of your own next to the rubric's (a cost or latency reward, a judge model, ...).

    `func` has TRL's reward-function signature: keyword arguments `completions`, `environments`, `prompts` and the
    dataset columns; it returns one float per completion (None where it has no opinion). Its weighted value is
    added to the rubric's total, in TRL's advantages and in the rollout records alike."""

    func: Callable[..., list[float | None]]
    weight: float = 1.0

    @property
    def name(self) -> str:
        return getattr(self.func, "__name__", type(self.func).__name__)


def check_extra_rewards(extras: Sequence[ExtraReward]) -> list[ExtraReward]:
    """The extras, or a ValueError naming the one that is unusable (names key TRL's logs, so they must differ)."""
    taken = {f"reward_{group}" for group in REWARD_GROUPS}
    for extra in extras:
        if not isinstance(extra, ExtraReward) or not callable(extra.func):
            raise ValueError(f"extra reward {extra!r} is not an ExtraReward(func=callable, weight=float)")
        if not math.isfinite(extra.weight):
            raise ValueError(f"extra reward {extra.name!r}: weight {extra.weight!r} is not a finite number")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", extra.name):
            raise ValueError(f"extra reward {extra.name!r}: name the function with letters, digits, '_', '.' or "
                             "'-' (TRL and MLflow log each reward under its function's name; a lambda has none)")
        if extra.name in taken:
            raise ValueError(f"extra reward {extra.name!r}: the name is taken (by {', '.join(sorted(taken))}); "
                             "TRL logs every reward function under its name")
        taken.add(extra.name)
    return list(extras)


def observations(environments: list[Any], completions: list[list[dict[str, Any]]]) -> list[JudgedRollout]:
    return [observe(env, c) for env, c in zip(environments, completions, strict=True)]

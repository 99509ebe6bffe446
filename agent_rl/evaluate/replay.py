"""Validation on live episodes that users rated good, for agents whose tools we cannot run (the gateway's).

Without the agent's tools an episode cannot be played again, but each of its steps can be: the policy gets the
conversation exactly as it stood before a recorded assistant turn (the user's words, the earlier calls and the
tool results the client returned) and must take the same kind of action the approved episode took there, a
call to the same tool(s) or a reply in words. The share of steps it matches is the primary metric (reported as
`accuracy`, next to the usual columns), so SFT, the base model and production's incumbent are measured the same
way on the same held-out steps. It says whether a model acts like the agent users liked; whether its answers
are better than production's is for the A/B test and its feedback to decide.

Cost per 1,000 requests is priced as the runner prices a played episode: each replayed step sends the recorded
conversation before it, as serving the episode would, so an episode costs the tokens of all its steps at the
config's prices; a simulated API model (`policy.simulation`) costs its published figure per episode. The
non-inferiority-at-cost gate compares these, so they are measured, never left at zero.
"""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_rl.agent.policy import Policy, PolicyTurn
from agent_rl.agent.tool_calls import call_name
from agent_rl.curation.datasets import conversation
from agent_rl.evaluate.harness import EvalConfig
from agent_rl.evaluate.metrics import EvalMetrics, _percentile, _share


@dataclass
class Step:
    """One recorded assistant turn of an approved episode, with the conversation before it."""

    episode_id: str
    category: str
    prefix: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    expected: tuple[str, ...]  # tool names called, in order; () for a reply in words


def _action(message: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(call_name(call) or "") for call in message.get("tool_calls") or [])


def replay_steps(episodes: list[Mapping[str, Any]]) -> list[Step]:
    """Every assistant turn of `episodes` as a step to replay (messages parsed as the SFT rows have them)."""
    steps = []
    for episode in episodes:
        messages = episode.get("messages") or []
        if isinstance(messages, str):
            messages = json.loads(messages)
        tools = list(episode.get("tools") or [])
        messages = conversation(messages, tools)
        for k, message in enumerate(messages):
            if message.get("role") == "assistant" and k > 0:
                steps.append(Step(str(episode.get("episode_id")), str(episode.get("task_category") or "-"),
                                  messages[:k], tools, _action(message)))
    return steps


def _taken(turn: PolicyTurn) -> tuple[str, ...]:
    return tuple(call.name for call in turn.tool_calls)


def evaluate_replay(policy: Policy, episodes: list[Mapping[str, Any]], config: EvalConfig | None = None,
                    max_new_tokens: int = 256) -> EvalMetrics:
    """How often `policy` takes the approved action at each step of a seeded sample of `episodes`."""
    config = config or EvalConfig()
    pool = sorted(episodes, key=lambda e: str(e.get("episode_id")))
    if config.max_scenarios is not None and len(pool) > config.max_scenarios:
        pool = random.Random(config.seed).sample(pool, config.max_scenarios)
    steps = replay_steps(pool)
    if not steps:
        raise ValueError("no held-out live episode rated good has an assistant turn to replay: collect feedback "
                         "on more gateway episodes (POST /v1/feedback)")
    groups: dict[str, list[int]] = defaultdict(list)  # one act() per tool set: policies take one tools list
    for i, step in enumerate(steps):
        groups[json.dumps(step.tools, sort_keys=True)].append(i)
    turns: list[PolicyTurn | None] = [None] * len(steps)
    latencies: list[float] = []
    for indices in groups.values():
        for start in range(0, len(indices), config.batch_size):
            batch = indices[start:start + config.batch_size]
            began = time.perf_counter()
            produced = policy.act([steps[i].prefix for i in batch], steps[batch[0]].tools, max_new_tokens)
            latencies += [(time.perf_counter() - began) * 1000 / len(batch)] * len(batch)
            for i, turn in zip(batch, produced):
                turns[i] = turn
    done = [t or PolicyTurn(parse_error="no turn") for t in turns]
    return _metrics(steps, done, latencies, len(pool), _cost_per_1k(policy, steps, done, config))


def _cost_per_1k(policy: Policy, steps: list[Step], turns: list[PolicyTurn], config: EvalConfig) -> float:
    """USD per 1,000 episodes: the simulated API model's published figure, else the mean over the replayed
    episodes of their steps' prompt and completion tokens at the config's prices."""
    simulation = getattr(policy, "simulation", None)  # a rule-based agent playing an API model (api_models.py)
    if simulation is not None:
        return round(simulation.cost_per_1k_runs_usd, 6)
    per_episode: dict[str, float] = defaultdict(float)
    for step, turn in zip(steps, turns):
        per_episode[step.episode_id] += (turn.prompt_tokens * config.prompt_price_per_m
                                         + turn.completion_tokens * config.completion_price_per_m) / 1e6
    return round(1000 * sum(per_episode.values()) / len(per_episode), 6) if per_episode else 0.0


def _metrics(steps: list[Step], turns: list[PolicyTurn], latencies: list[float], n_episodes: int,
             cost_per_1k_usd: float) -> EvalMetrics:
    matched = [_taken(turn) == step.expected and turn.parse_error is None for step, turn in zip(steps, turns)]
    broken = sum(1 for turn in turns if turn.parse_error is not None)
    valid = sum(1 for step, turn in zip(steps, turns)
                if turn.parse_error is None and set(_taken(turn)) <= {call_name(t) for t in step.tools})
    by_category: dict[str, list[bool]] = defaultdict(list)
    for step, ok in zip(steps, matched):
        by_category[step.category].append(ok)
    return EvalMetrics(
        n=n_episodes, accuracy=_share(sum(matched), len(steps)), source_accuracy=0.0, hallucination_rate=0.0,
        idk_rate=0.0, format_error_rate=_share(broken, len(steps)), valid_tool_call_rate=_share(valid, len(steps)),
        avg_turns=round(len(steps) / max(1, n_episodes), 2),
        avg_tokens=round(sum(t.completion_tokens for t in turns) / len(turns), 1),
        latency_ms_p50=_percentile(latencies, 0.50), latency_ms_p95=_percentile(latencies, 0.95),
        cost_per_1k_usd=cost_per_1k_usd, failure_rate=_share(len(steps) - sum(matched), len(steps)),
        by_category={c: {"n": len(v), "accuracy": _share(sum(v), len(v))} for c, v in sorted(by_category.items())},
        outcomes={f"{step.episode_id}:{i}": ok for i, (step, ok) in enumerate(zip(steps, matched))},
        # One episode's steps share its user and its conversation: the gates draw and test them together.
        outcome_groups={f"{step.episode_id}:{i}": step.episode_id for i, step in enumerate(steps)},
    )

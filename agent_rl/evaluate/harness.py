"""Held-out evaluation: play a policy on an environment's test tasks with a fixed seed and score it, plus a
forgetting probe.

The same function backs the `evaluation_report` asset and `agent-rl eval`, so a number in the
Dagster UI and a number on the command line mean the same thing.
"""

from __future__ import annotations

import random
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, PositiveFloat, PositiveInt, model_validator

from agent_rl.agent.policy import Policy
from agent_rl.environments.runner import Play, RunnerConfig, play_episodes
from agent_rl.environments.core import Environment, Task
from agent_rl.environments.policy import PolicyUnavailable
from agent_rl.evaluate.metrics import EvalMetrics, compute_metrics
from agent_rl.records import Episode, Split
from agent_rl.turn_budget import DEFAULT_MAX_TURNS


class EvalConfig(BaseModel):
    """Which tasks and how: a fixed seed makes every model see the same questions."""

    split: Split = Split.TEST
    max_tasks: PositiveInt | None = Field(60, description="sample size (None: every task of the split)")
    seed: int = 0
    # A self-hosted small model's price; set your provider's when evaluating an API model.
    prompt_price_per_m: float = Field(0.10, ge=0, description="USD per million prompt tokens")
    completion_price_per_m: float = Field(0.30, ge=0, description="USD per million completion tokens")
    max_turns: PositiveInt = Field(DEFAULT_MAX_TURNS, description="the runner's turn budget, as GRPO trains with")
    batch_size: PositiveInt = 16
    # No wall clock by default: on a busy machine the runner's 300 s per batch ended right answers as "ran out"
    # (docs/experiments.md, 2026-11-28 noon), so a gate compared how loaded the machine was, not the models. The turn,
    # token and repeated-call budgets still bound every episode.
    timeout_s: PositiveFloat | None = Field(None, description="wall clock per batch of episodes (None: none)")
    in_flight: bool = Field(True, description="an engine-served policy plays batch_size episodes in flight instead "
                            "of in waves (environments/runner.py)")

    @model_validator(mode="before")
    @classmethod
    def _old_name(cls, values: Any) -> Any:
        if isinstance(values, dict) and "max_scenarios" in values:  # its name before environments: one release
            warnings.warn("EvalConfig(max_scenarios=...) is now max_tasks; the old name goes in the next release",
                          DeprecationWarning, stacklevel=2)
            values = {"max_tasks": values["max_scenarios"], **{k: v for k, v in values.items() if k != "max_scenarios"}}
        return values


@dataclass
class EvalResult:
    policy_version: str
    metrics: EvalMetrics
    episodes: list[Episode]


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with `n` torch CPU threads, then put the previous count back (the caller's process goes on)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def select_tasks(tasks: list[Task], config: EvalConfig) -> list[Task]:
    """The held-out sample: the tasks of the split sorted by id, then a seeded sample; same seed, same tasks,
    whatever the policy."""
    pool = sorted((t for t in tasks if t.split == config.split), key=lambda t: t.id)
    if config.max_tasks is not None and len(pool) > config.max_tasks:
        pool = random.Random(config.seed).sample(pool, config.max_tasks)
    return pool


def evaluate_tasks(policy: Policy, environment: Environment, tasks: list[Task], config: EvalConfig | None = None,
                   version: str | None = None) -> EvalResult:
    """The held-out evaluation of any environment: a seeded sample of its tasks, played by the one runner, judged
    by the environment, measured with its tools (and its tasks' expected citations, where they give any)."""
    config = config or EvalConfig()
    chosen = select_tasks(tasks, config)
    if not chosen:
        raise ValueError(f"environment {environment.name!r} has no tasks in split {config.split.value!r} to evaluate on")
    runner = RunnerConfig(max_turns=config.max_turns, batch_size=config.batch_size, timeout_s=config.timeout_s,
                          in_flight=config.in_flight,
                          prompt_price_per_m=config.prompt_price_per_m,
                          completion_price_per_m=config.completion_price_per_m)
    version = version or str(getattr(policy, "version", "unknown"))
    episodes = play_episodes(policy, environment, [Play(t, policy_version=version) for t in chosen], runner)
    unserved = [e.unserved for e in episodes if e.unserved is not None]
    if unserved:  # an outage is not the model's error: no figure rather than a wrong one (the asset may be retried)
        raise PolicyUnavailable(f"{len(unserved)} of {len(episodes)} held-out episodes of {version} could not be "
                                f"served, so no figure is given: {unserved[0]}", unserved[0].retry_after_s)
    return EvalResult(version, compute_metrics(episodes, expected_citations(chosen), environment.tool_names()),
                      episodes)


def expected_citations(tasks: list[Task]) -> dict[str, list[str]]:
    """By task id, the citations a right answer gives (`metadata["source_ids"]`), for the tasks that expect any."""
    return {t.id: [str(s) for s in cited] for t in tasks if (cited := t.metadata.get("source_ids"))}


def evaluate_environments(policy: Policy, pairs: list[tuple[Any, list[Any]]], config: EvalConfig | None = None,
                          version: str | None = None) -> tuple[EvalResult, dict[str, EvalMetrics]]:
    """One policy on the held-out tasks of several plug-ins (a run that trains on all of them): each environment
    plays its own sample (`evaluate_tasks`), and the figures are given together and per environment. Together,
    categories are named with their environment (`support/cancel_order`): two environments may name them alike."""
    if len(pairs) == 1:
        environment, tasks = pairs[0]
        result = evaluate_tasks(policy, environment, tasks, config, version)
        return result, {environment.name: result.metrics}
    results = {environment.name: evaluate_tasks(policy, environment, tasks, config, version)
               for environment, tasks in pairs}
    episodes = [episode for result in results.values() for episode in result.episodes]
    tools = {tool for environment, _ in pairs for tool in environment.tool_names()}
    expected = {k: v for environment, tasks in pairs for k, v in expected_citations(tasks).items()}
    combined = compute_metrics(episodes, expected, tools)
    by_category = {f"{name}/{category}": row for name, result in results.items()
                   for category, row in result.metrics.by_category.items()}
    combined = combined.model_copy(update={"by_category": by_category})
    return (EvalResult(version or str(getattr(policy, "version", "unknown")), combined, episodes),
            {n: r.metrics for n, r in results.items()})


# General questions with checkable answers: a drop here means training made the model forget. Forty-eight
# of them, because the gate allows a 10-point drop: with the first twelve, two questions flipping by
# chance (17 points) failed a candidate. Never used in training (train/retain.py rehearses other prompts).
FORGETTING_PROBE: tuple[tuple[str, str], ...] = (
    ("What is the capital of France? Answer in one word.", r"\bparis\b"),
    ("What is 2 + 3? Answer with a number.", r"\b5\b|\bfive\b"),
    ("What color is the sky on a clear day? One word.", r"\bblue\b"),
    ("How many days are in a week? Answer with a number.", r"\b7\b|\bseven\b"),
    ("What is the opposite of hot? One word.", r"\bcold\b"),
    ("Which planet do we live on? One word.", r"\bearth\b"),
    ("What is 10 minus 4? Answer with a number.", r"\b6\b|\bsix\b"),
    ("What language is spoken in Spain? One word.", r"\bspanish\b"),
    ("How many legs does a dog have? Answer with a number.", r"\b4\b|\bfour\b"),
    ("What do bees make? One word.", r"\bhoney\b"),
    ("What is the largest ocean on Earth?", r"\bpacific\b"),
    ("What is frozen water called? One word.", r"\bice\b"),
    ("What is the capital of Italy?", r"\brome\b"),
    ("What is the capital of Japan?", r"\btokyo\b"),
    ("What is the capital of Germany?", r"\bberlin\b"),
    ("What is the capital of the United Kingdom?", r"\blondon\b"),
    ("How many hours are in a day?", r"\b24\b|twenty-four"),
    ("How many months are in a year?", r"\b12\b|\btwelve\b"),
    ("How many minutes are in an hour?", r"\b60\b|\bsixty\b"),
    ("What is 3 times 4?", r"\b12\b|\btwelve\b"),
    ("What is 5 times 5?", r"\b25\b|twenty-five"),
    ("What is 9 plus 1?", r"\b10\b|\bten\b"),
    ("What is 100 divided by 10?", r"\b10\b|\bten\b"),
    ("What color is grass?", r"\bgreen\b"),
    ("What color is a banana?", r"\byellow\b"),
    ("What color is snow?", r"\bwhite\b"),
    ("Which animal says meow?", r"\bcats?\b|\bkitten"),
    ("Which animal is called the king of the jungle?", r"\blions?\b"),
    ("What is the tallest animal in the world?", r"\bgiraffes?\b"),
    ("At what temperature in degrees Celsius does water boil?", r"\b100\b"),
    ("At what temperature in degrees Celsius does water freeze?", r"\b0\b|\bzero\b"),
    ("What is the opposite of up?", r"\bdown\b"),
    ("What is the opposite of day?", r"\bnight\b"),
    ("What is the opposite of big?", r"\bsmall\b|\blittle\b|\btiny\b"),
    ("Which star is closest to the Earth?", r"\bsun\b"),
    ("What gas do people need to breathe?", r"\boxygen\b"),
    ("How many sides does a triangle have?", r"\b3\b|\bthree\b"),
    ("How many wheels does a bicycle have?", r"\b2\b|\btwo\b"),
    ("Who wrote Romeo and Juliet?", r"shakespeare"),
    ("What is the largest planet in our solar system?", r"\bjupiter\b"),
    ("What is the chemical formula of water?", r"\bh2o\b|h₂o"),
    ("What language is spoken in France?", r"\bfrench\b"),
    ("Which season comes after winter?", r"\bspring\b"),
    ("Which month comes after January?", r"\bfebruary\b"),
    ("How many continents are there on Earth?", r"\b7\b|\bseven\b"),
    ("What is the currency of the United States?", r"\bdollars?\b"),
    ("What do plants need from the sun to grow?", r"\blight\b|\bsunlight\b|\benergy\b"),
    ("What is the opposite of wet?", r"\bdry\b"),
)


def forgetting_probe(policy: Policy, max_new_tokens: int = 24, items: list[Any] | None = None) -> float:
    """Share of the general questions answered right, asked without tools in one batch. `items` (an environment's
    ProbeItems: right when the reply contains one of `expected`) replace the built-in questions."""
    if items:
        probe = [(item.question, "|".join(re.escape(e.lower()) for e in item.expected)) for item in items]
    else:
        probe = list(FORGETTING_PROBE)
    conversations = [[{"role": "user", "content": question}] for question, _ in probe]
    try:
        turns = policy.act(conversations, tools=[], max_new_tokens=max_new_tokens)
    except Exception:  # a policy that cannot chat without tools scores nothing rather than failing the report
        return 0.0
    right = sum(1 for turn, (_, pattern) in zip(turns, probe) if re.search(pattern, (turn.content or "").lower()))
    return round(right / len(probe), 4)

"""Validation on held-out live episodes judged good, for agents whose tools we cannot run (the gateway's).

Without the agent's tools an episode cannot be played again, but each of its steps can be: the policy gets the
conversation exactly as it stood before a recorded assistant turn (the user's words, the earlier calls and the
tool results the client returned) and must take the same kind of action the approved episode took there, a
call to the same tool(s) or a reply in words. The kind is the set of tools a turn calls, not how many calls it
makes to each: reading two of the search hits at once where the approved agent read three is the same kind of
action; searching or answering instead of reading is not (until 2026-11-30 the exact sequence was compared, and 13
of the 27 steps a gateway candidate missed of 444 were the right tools called more or fewer times:
docs/experiments.md). The share of steps it matches is the primary metric (reported as `accuracy`, next to the
usual columns), so SFT, the base model and production's incumbent are measured the same way on the same held-out
steps. It says whether a model acts like the agent users liked, not whether its answers are good. The held-out
episodes are those users rated good and, when the week's labeler passed its check, those it labeled good
(`held_out_sample`: rated first); whether a model takes the approved kind of action hardly depends on a label being
right, and ratings alone leave a week a few dozen episodes, too few for the gates' bounds.

Where a model judge is configured (`AnswerJudging`: any OpenAI-compatible endpoint, the `JudgeConfig` labeling
uses), the candidate's answers are also compared with the approved ones (`judge_answers`): at every held-out step
where the approved episode replied in words and the candidate did too, the judge is shown both conversations, the
same recorded conversation ending in each answer, in a seeded random order and unnamed, and scores them against
each other (the relative judgement of feedback/judge.py). Without a judge, answer quality is left to the A/B test
and its feedback, and the check says so.

Cost per 1,000 requests is priced as the runner prices a played episode: each replayed step sends the recorded
conversation before it, as serving the episode would, so an episode costs the tokens of all its steps at the
config's prices; a simulated API model (`policy.simulation`) costs its published figure per episode. The
non-inferiority-at-cost gate compares these, so they are measured, never left at zero.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent_rl.agent.policy import Policy, PolicyTurn
from agent_rl.agent.tool_calls import call_name
from agent_rl.curation.datasets import conversation
from agent_rl.curation.live import is_labeled_good
from agent_rl.environments.gateway import GatewayEnvironment
from agent_rl.evaluate.harness import EvalConfig
from agent_rl.evaluate.metrics import EvalMetrics, _percentile, _share
from agent_rl.feedback.judge import JudgeConfig, ModelJudge, ModelJudgeError

LEFT_TO_AB = "answer quality is left to the A/B test"


@dataclass
class Step:
    """One recorded assistant turn of an approved episode, with the conversation before it."""

    episode_id: str
    category: str
    prefix: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    expected: tuple[str, ...]  # tool names called, in order; () for a reply in words
    answer: str | None = None  # the approved reply in words (None where it called tools)
    rated: bool = True  # approved by its users' rating (False: by the week's labeler)


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
                action = _action(message)
                steps.append(Step(str(episode.get("episode_id")), str(episode.get("task_category") or "-"),
                                  messages[:k], tools, action, None if action else str(message.get("content") or ""),
                                  rated=not is_labeled_good(episode)))
    return steps


def held_out_sample(episodes: list[Mapping[str, Any]], cap: int | None, seed: int = 0) -> list[Mapping[str, Any]]:
    """The episodes to replay, at most `cap` (None: all): every rated one first (a seeded sample if they alone
    exceed it), then a seeded sample of the labeled ones to fill it. Ratings are the users' own word; labels, from
    a labeler that passed its check, add the volume that narrows the gates' bounds (curation/live.py `split_live`)."""
    ordered = sorted(episodes, key=lambda e: str(e.get("episode_id")))
    rated = [e for e in ordered if not is_labeled_good(e)]
    labeled = [e for e in ordered if is_labeled_good(e)]
    if cap is None or len(ordered) <= cap:
        return rated + labeled
    rng = random.Random(seed)
    if len(rated) >= cap:
        return rng.sample(rated, cap)
    return rated + rng.sample(labeled, cap - len(rated))


def _taken(turn: PolicyTurn) -> tuple[str, ...]:
    return tuple(call.name for call in turn.tool_calls)


def evaluate_replay(policy: Policy, episodes: list[Mapping[str, Any]], config: EvalConfig | None = None,
                    max_new_tokens: int = 256) -> EvalMetrics:
    """How often `policy` takes the approved action at each step of a seeded sample of `episodes`."""
    return replay(policy, episodes, config, max_new_tokens).metrics


@dataclass
class Replayed:
    """A model's replay: its metrics, and each step with the turn it took there (what `judge_answers` reads)."""

    metrics: EvalMetrics
    steps: list[Step]
    turns: list[PolicyTurn]


def replay(policy: Policy, episodes: list[Mapping[str, Any]], config: EvalConfig | None = None,
           max_new_tokens: int = 256) -> Replayed:
    """`evaluate_replay`, keeping the steps and the turns `policy` took at them."""
    config = config or EvalConfig()
    pool = held_out_sample(episodes, config.max_tasks, config.seed)
    steps = replay_steps(pool)
    if not steps:
        raise ValueError("no held-out live episode judged good has an assistant turn to replay: collect feedback "
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
    return Replayed(_metrics(steps, done, latencies, len(pool), _cost_per_1k(policy, steps, done, config)), steps, done)


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
    matched = [set(_taken(turn)) == set(step.expected) and turn.parse_error is None for step, turn in zip(steps, turns)]
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


# -- the candidate's answers against the approved ones -----------------------------------------------------------


class AnswerJudging(BaseModel):
    """Replay validation's answer check: which judge, and the bar the candidate's answers must not fall below.

    `judge`: the `JudgeConfig` labeling uses (an OpenAI-compatible endpoint naming the variable of its key); its
    `mode` does not matter here, since a pair of answers is always judged relatively, in one call.
    `min_share`: the share of its answers a candidate is judged at least as good as the approved agent in. A tie
    counts for the candidate, so one exactly as good as the approved agent is judged at least as good at least half
    the time whatever the judge's noise: hence 0.5 by default. 0: report only, never a gate.

    Why it gates at all: without it, the A/B test is the only check of answer quality, and it serves the candidate
    to real users for hours before it can say anything. A candidate that a judge, shown the same conversation, finds
    worse than the answers users approved should not reach them. Why the bar is a test and not the share itself:
    the judge is a model, not the users; its verdicts are noisy and it may prefer a position (the pair's order is
    shuffled, seeded). The check fails only when a one-sided exact binomial test over episodes (an episode's
    answers share its user: it counts once, for the candidate when at least half of them were judged at least as
    good) puts the candidate's share below `min_share` at the gates' level `alpha`, so a candidate as good as the
    approved agent fails it at most `alpha` of the time, and a handful of answers can never fail it. A judge that
    cannot be reached or keeps replying with unusable JSON does not fail the week: the check is recorded as "judge
    unavailable" and answer quality is left to the A/B test, as with no judge, so an outside endpoint's outage
    never blocks a week the other gates passed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    judge: JudgeConfig
    min_share: float = Field(0.5, ge=0, le=1)
    seed: int = 0


AnswerStatus = Literal["judged", "no judge", "nothing to judge", "judge unavailable"]


@dataclass
class AnswerCheck:
    """What the answer check found (`status`), in one line for people (`summary`) and in figures for the report
    and MLflow. `passed` is False only when a gating check found the answers worse beyond chance. `verdicts`: per
    judged step (the key of `EvalMetrics.outcomes`), whether the candidate's answer was judged at least as good;
    no text of either answer is kept."""

    status: AnswerStatus
    summary: str
    passed: bool = True
    gating: bool = False
    judge_model: str | None = None
    answers_judged: int = 0
    answers_at_least_as_good: int = 0
    answers_not_judged: int = 0  # the approved episode answered in words, the candidate did not
    episodes_judged: int = 0
    episodes_at_least_as_good: int = 0
    min_share: float | None = None
    alpha: float | None = None
    p_value: float | None = None
    verdicts: dict[str, bool] = field(default_factory=dict)

    @property
    def share(self) -> float | None:
        """The share of judged answers at least as good as the approved ones (None: none judged)."""
        return round(self.answers_at_least_as_good / self.answers_judged, 4) if self.answers_judged else None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share": self.share}


_FAILURE = re.compile(r"HTTP \d{3}|timed out after [\d.]+ ?s|unusable reply|\b[A-Z][A-Za-z]*(?:Error|Timeout)\b")


def failure_kind(error: Exception) -> str:
    """What went wrong with the judge in words that carry no reply text, no request and no credential: the HTTP
    statuses, timeouts, unusable replies and connection errors of its attempts (the error itself quotes bodies)."""
    text = str(error)
    kinds = ", ".join(dict.fromkeys(_FAILURE.findall(text))) or type(error).__name__
    attempts = re.search(r"failed after (\d+) attempt", text)
    return f"{kinds} after {attempts.group(1)} attempt(s)" if attempts else kinds


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p): the one-sided exact test's p-value of k successes against share p."""
    return min(1.0, sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k + 1)))


def _ending_in(step: Step, key: str, text: str) -> dict[str, Any]:
    """The recorded conversation before `step`, ending in the answer `text`, as the judge reads an episode."""
    return {"episode_id": key, "environment": GatewayEnvironment.name,
            "messages": [*step.prefix, {"role": "assistant", "content": text}]}


def judge_answers(judging: AnswerJudging | None, steps: list[Step], turns: list[PolicyTurn], *, alpha: float = 0.05,
                  gating: bool = True) -> AnswerCheck:
    """The candidate's answers (`turns`, taken at `steps`) against the approved ones, where both answered in words.

    One judge call per such step, the two conversations shown together (order shuffled, seeded) and scored
    against each other; the candidate's answer counts as at least as good when its score is not below the
    approved one's. `gating`: whether a result below the bar fails (False: the profile sets no quality bar). See
    `AnswerJudging` for the bar and why; a judge that fails is recorded, never raised."""
    if judging is None:
        return AnswerCheck("no judge", f"{LEFT_TO_AB}: no answer judge is configured")
    model = judging.judge.endpoint.model
    gating = gating and judging.min_share > 0
    # Answers users approved by their rating only: a label says an episode went well, not that each reply did.
    both = [(i, step, turn.content) for i, (step, turn) in enumerate(zip(steps, turns))
            if step.rated and step.answer and step.answer.strip() and turn.parse_error is None
            and not turn.tool_calls and turn.content.strip()]
    not_judged = sum(1 for step in steps if step.rated and step.answer and step.answer.strip()) - len(both)
    base = dict(judge_model=model, answers_not_judged=not_judged, min_share=judging.min_share, alpha=alpha,
                gating=gating)
    if not both:
        return AnswerCheck("nothing to judge", f"no held-out step where the approved episode and the candidate both "
                           f"answered in words ({not_judged} approved answers met a tool call or no reply): "
                           f"{LEFT_TO_AB}", **base)
    rng = random.Random(judging.seed)
    verdicts: dict[str, bool] = {}
    episode_of: dict[str, str] = {}
    with ModelJudge(judging.judge) as judge:
        for i, step, answer in both:
            key = f"{step.episode_id}:{i}"
            approved, candidate = _ending_in(step, f"{key}/a", step.answer or ""), _ending_in(step, f"{key}/b", answer)
            swapped = rng.random() < 0.5
            try:
                scores = judge.score_group([candidate, approved] if swapped else [approved, candidate])
            except ModelJudgeError as error:
                return AnswerCheck(
                    "judge unavailable", f"the answer judge (model {model!r}) was unavailable ({failure_kind(error)}) "
                    f"after judging {len(verdicts)} of {len(both)} answers: {LEFT_TO_AB}", **{**base, "gating": False})
            ours, theirs = (scores[0], scores[1]) if swapped else (scores[1], scores[0])
            verdicts[key], episode_of[key] = ours >= theirs, step.episode_id
    by_episode: dict[str, list[bool]] = defaultdict(list)
    for key, ok in verdicts.items():
        by_episode[episode_of[key]].append(ok)
    good = sum(verdicts.values())
    episodes_good = sum(1 for oks in by_episode.values() if 2 * sum(oks) >= len(oks))
    p_value = _binomial_cdf(episodes_good, len(by_episode), judging.min_share)
    passed = not (gating and p_value < alpha)
    share = good / len(verdicts)
    bar = (f"below the bar of {judging.min_share:.0%} beyond chance (p = {p_value:.3g} < {alpha})" if not passed
           else f"not below the bar of {judging.min_share:.0%} beyond chance (p = {p_value:.3g})" if gating
           else "reported only, no bar")
    summary = (f"answers judged by {model!r} against the approved ones: {good} of {len(verdicts)} at least as good "
               f"({share:.0%}; episodes {episodes_good} of {len(by_episode)}), {bar}"
               + (f"; {not_judged} approved answers met a tool call or no reply, not judged" if not_judged else ""))
    return AnswerCheck("judged", summary, passed=passed, answers_judged=len(verdicts), answers_at_least_as_good=good,
                       episodes_judged=len(by_episode), episodes_at_least_as_good=episodes_good, p_value=p_value,
                       verdicts=verdicts, **base)

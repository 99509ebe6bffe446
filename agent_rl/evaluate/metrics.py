"""Evaluation metrics over episodes: what users compare between model versions.

Definitions (all shares are over the evaluated episodes unless said otherwise):
- accuracy: outcome "correct" ("I don't know" on an unanswerable question counts as correct);
- source_accuracy: over answerable questions, the cited sources include a golden source (the email assistant's);
- hallucination_rate: a wrong answer given where "I don't know" would have been right or safe;
- idk_rate: the final answer says "I don't know";
- valid_tool_call_rate: over assistant turns, turns that made a well-formed call to a known tool;
- avg_turns, avg_tokens (prompt + completion per episode), latency_ms_p50, latency_ms_p95;
- cost_per_1k_usd: estimated cost of 1,000 such queries;
- failure_rate: wrong answers, format errors and episodes that ran out, together (what a user feels);
- outcomes: per held-out task, correct or not (the promotion gates pair models on them);
- outcome_groups: per task, the unit tasks are drawn together in (the replayed steps of one episode);
- by_category: per task category (when the tasks are given), n and the share of each outcome, to see
  whether a model fails on unanswerable questions or on one kind of fact.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from agent_rl.records import Episode, Outcome
from agent_rl.reward.judge import is_idk


class EvalMetrics(BaseModel):
    n: int
    accuracy: float
    source_accuracy: float
    hallucination_rate: float
    idk_rate: float
    format_error_rate: float
    valid_tool_call_rate: float
    avg_turns: float
    avg_tokens: float
    latency_ms_p50: float
    latency_ms_p95: float
    cost_per_1k_usd: float
    # The failures a user feels, together: a wrong answer, a broken reply, no answer within the budgets.
    failure_rate: float = 0.0
    by_category: dict[str, dict[str, float]] = {}
    # Per held-out task (its id): judged correct or not. The promotion gates pair two models on these.
    outcomes: dict[str, bool] = {}
    # Per task, the unit it is drawn with when tasks are not independent (a replayed step's episode); empty: each
    # task its own. The gates resample and test by these units.
    outcome_groups: dict[str, str] = {}


def _share(count: int, total: int) -> float:
    return round(count / total, 4) if total else 0.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return round(ordered[index], 2)


def _turn_validity(messages: Iterable[Mapping[str, Any]], tool_names: Collection[str] | None) -> tuple[int, int]:
    """(valid, total) assistant turns: valid means every tool call names a known tool (None: any named tool)."""
    valid = total = 0
    for message in messages:
        if message.get("role") != "assistant":
            continue
        total += 1
        calls = message.get("tool_calls") or []
        names = [(c.get("function") or {}).get("name") for c in calls if isinstance(c, Mapping)]
        if names and all(name and (tool_names is None or name in tool_names) for name in names):
            valid += 1
    return valid, total


def compute_metrics(episodes: list[Episode], expected_citations: Mapping[str, Collection[str]] | None = None,
                    tool_names: Collection[str] | None = None) -> EvalMetrics:
    """Metrics of a set of episodes. `expected_citations`: by task id, the citations a right answer gives (a task's
    `metadata["source_ids"]`; tasks without any are left out of source accuracy); `tool_names`: the environment's
    tools (a call to any other is an invalid turn; None: no list to check)."""
    expected_citations = expected_citations or {}
    n = len(episodes)
    cited = [e for e in episodes if expected_citations.get(e.task_id or "")]
    cited_gold = sum(1 for e in cited if set(e.citations) & set(expected_citations[e.task_id]))
    valid_turns = total_turns = 0
    for episode in episodes:
        valid, total = _turn_validity(episode.messages, tool_names)
        valid_turns, total_turns = valid_turns + valid, total_turns + total
    outcomes = [e.outcome for e in episodes]
    return EvalMetrics(
        n=n,
        accuracy=_share(outcomes.count(Outcome.CORRECT), n),
        source_accuracy=_share(cited_gold, len(cited)),
        hallucination_rate=_share(outcomes.count(Outcome.WRONG), n),
        idk_rate=_share(sum(1 for e in episodes if e.final_answer is not None and is_idk(e.final_answer)), n),
        format_error_rate=_share(outcomes.count(Outcome.FORMAT_ERROR), n),
        valid_tool_call_rate=_share(valid_turns, total_turns),
        avg_turns=round(statistics.fmean(e.turns for e in episodes), 3) if n else 0.0,
        avg_tokens=round(statistics.fmean(e.prompt_tokens + e.completion_tokens for e in episodes), 1) if n else 0.0,
        latency_ms_p50=_percentile([e.latency_ms for e in episodes], 0.50),
        latency_ms_p95=_percentile([e.latency_ms for e in episodes], 0.95),
        cost_per_1k_usd=round(1000 * statistics.fmean(e.cost_usd for e in episodes), 6) if n else 0.0,
        failure_rate=_share(sum(1 for o in outcomes if o in (Outcome.WRONG, Outcome.FORMAT_ERROR, Outcome.RAN_OUT)), n),
        by_category=_by_category(episodes),
        outcomes={task_key(e): e.outcome == Outcome.CORRECT for e in episodes},
    )


def task_key(episode: Episode) -> str:
    """Which held-out task an episode played: its environment and task id, else its own id."""
    return f"{episode.environment}:{episode.task_id or episode.episode_id}"


def _by_category(episodes: list[Episode]) -> dict[str, dict[str, float]]:
    """{category: {"n": count, outcome: share}} over the episodes whose task category is known."""
    groups: dict[str, list[Outcome]] = {}
    for episode in episodes:
        category = episode.task_category
        if category:
            groups.setdefault(category, []).append(episode.outcome)
    return {category: {"n": len(outcomes), **{o.value: _share(outcomes.count(o), len(outcomes)) for o in Outcome}}
            for category, outcomes in sorted(groups.items())}

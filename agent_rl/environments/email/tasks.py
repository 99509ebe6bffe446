"""The email assistant's task record and its judging: a scenario or a live question as the loop's `Task`, and the
outcome and rubric inputs of an answer to one.

Judging lives here and only here: the episode runner (`EmailEnvironment.judge`, environment.py), GRPO's rollouts
(rollouts.py) and the arbiter's live episodes all call `judge_outcome` and `rubric_observation`. A module of its own
so that the rollouts do not import environment.py, which imports them.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from agent_rl.environments.answers import DeterministicJudge, Judge, is_idk
from agent_rl.environments.core import Task
from agent_rl.environments.email.tools import EpisodeTrace
from agent_rl.environments.rubric import FormatErrorKind, RubricObservation
from agent_rl.records import Outcome
from agent_rl.environments.email.records import Category, Scenario
from agent_rl.utc import as_utc

log = logging.getLogger(__name__)

NAME = "email"


def scenario_task(scenario: Scenario) -> Task:
    """An email scenario as the loop's generic task record."""
    return Task(
        id=scenario.id, environment=NAME, context=scenario.inbox_id, prompt=scenario.question,
        reference=scenario.answer, category=str(scenario.category), split=scenario.split,
        metadata={"source_ids": list(scenario.source_ids), "query_date": as_utc(scenario.query_date).isoformat()},
    )


def live_task(inbox: str, question: str, query_date: datetime | None = None) -> Task:
    """A question from live traffic: no reference answer, no category."""
    metadata = {"query_date": as_utc(query_date).isoformat()} if query_date else {}
    return Task(id=f"live-{uuid.uuid4().hex[:12]}", environment=NAME, context=inbox, prompt=question,
                reference=None, category=None, metadata=metadata)


def query_date_of(task: Task) -> datetime | None:
    value = task.metadata.get("query_date")
    if isinstance(value, datetime):
        return as_utc(value)
    return as_utc(datetime.fromisoformat(str(value).replace("Z", "+00:00"))) if value else None


def judge_outcome(task: Task, answer: str, judge: Judge) -> Outcome:
    """Correct / wrong / "I don't know" for an answer; "I don't know" on an unanswerable question is correct.
    Without a reference (live traffic) nothing is judged correct."""
    says_idk = is_idk(answer)
    if task.reference is None:
        return Outcome.IDK if says_idk else Outcome.WRONG
    if task.category == Category.UNANSWERABLE.value:
        return Outcome.CORRECT if says_idk else Outcome.WRONG
    if says_idk:
        return Outcome.IDK
    try:
        verdict = judge.judge(task.prompt, task.reference, answer)
    except Exception as exc:  # an LLM judge that fails falls back to the deterministic rules
        log.warning("judge failed (%s), using the deterministic judge", exc)
        verdict = DeterministicJudge().judge(task.prompt, task.reference, answer)
    return Outcome.CORRECT if verdict.correct else Outcome.WRONG


def rubric_observation(task: Task, trace: EpisodeTrace, outcome: Outcome, turns: int, max_turns: int,
                       format_error: str | None) -> RubricObservation:
    """What the rubric scores: the outcome, and what the tools saw of the gold emails."""
    gold = [str(s) for s in task.metadata.get("source_ids") or []] if task.category != Category.UNANSWERABLE else []
    return RubricObservation(
        outcome=outcome,
        sources=list(trace.sources),
        gold_source_ids=gold,
        found_gold=bool(trace.seen_ids & set(gold)),
        read_gold=bool(set(trace.reads) & set(gold)),
        turns=turns,
        max_turns=max_turns,
        format_error=FormatErrorKind(format_error) if format_error else None,
    )

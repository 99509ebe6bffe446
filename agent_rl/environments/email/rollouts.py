"""The email assistant's GRPO rollouts: its inbox tools bound to one training row, judged by the rubric.

`EmailWorld.rollout_factory` hands TRL `InboxEnvironment`s: `reset(**row)` binds one to a row of
`grpo_rows.py` (inbox, query date, golden answer...), its public methods are the three tools,
inherited unchanged so their schemas match SFT and serving, and the observation carries the rubric's inputs, so
the trainer scores it by the rubric's separate reward groups (train/rewards.py) where a plug-in's rollouts get its
judge's one number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_rl.environments.answers import DeterministicJudge, Judge
from agent_rl.environments.core import Task
from agent_rl.environments.email.inbox.store_interface import InboxStore
from agent_rl.environments.email.tasks import NAME, judge_outcome, rubric_observation
from agent_rl.environments.email.tools import TOOL_NAMES, EpisodeTrace, InboxTools, ToolConfig
from agent_rl.environments.rollouts import (
    JudgedRollout,
    accepted_answer,
    calls_left_unanswered,
    parse_query_date,
    scan_turns,
)
from agent_rl.environments.rubric import RubricObservation
from agent_rl.records import Outcome
from agent_rl.environments.email.records import Category
from agent_rl.turn_budget import DEFAULT_MAX_TURNS


@dataclass
class RolloutObservation(JudgedRollout):
    """A finished rollout as the rubric and the hacking detectors see it."""

    trace: EpisodeTrace
    rubric: RubricObservation = field(kw_only=True)


class InboxEnvironment(InboxTools):
    """One rollout's tools; `reset(**row)` rebinds it to a GRPO row (the instance is pooled and reused by TRL)."""

    def __init__(self, store: InboxStore, config: ToolConfig | None = None, judge: Judge | None = None,
                 max_turns: int = DEFAULT_MAX_TURNS) -> None:
        super().__init__(store, inbox="", query_date=None, config=config)
        self._judge = judge or DeterministicJudge()
        self._max_turns = max_turns
        self._row: dict[str, Any] = {}
        self._observation: RolloutObservation | None = None

    def reset(self, **row: Any) -> None:
        """Bind to one row: the inbox and query date scope the tools; the golden answer stays for the judge."""
        for key in ("inbox", "answer", "prompt"):
            if key not in row:
                raise ValueError(f"GRPO row {row.get('task_id', '?')!r} lacks field {key!r}")
        self._inbox = str(row["inbox"])
        self._query_date = parse_query_date(row.get("query_date"))
        self.trace = EpisodeTrace()
        self._row = row
        self._observation = None
        return None  # the prompt already holds the question

    @property
    def row(self) -> dict[str, Any]:
        return self._row

    @property
    def question(self) -> str:
        prompt = self._row.get("prompt") or []
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else ""

    @property
    def answerable(self) -> bool:
        return str(self._row.get("category", "")) != Category.UNANSWERABLE.value

    # Private on purpose: TRL offers every public method of the environment to the model as a tool.
    def _observe(self, completion: list[dict[str, Any]]) -> RolloutObservation:
        """Judge the finished rollout (cached: every reward function asks for the same one)."""
        if self._observation is None:
            self._observation = self._judge_rollout(completion)
        return self._observation

    def _judge_rollout(self, completion: list[dict[str, Any]]) -> RolloutObservation:
        turns, tool_calls, format_error = scan_turns(
            completion, TOOL_NAMES, lambda index, _calls: accepted_answer(completion, index))
        task = self._task()
        if format_error is not None:
            outcome = Outcome.FORMAT_ERROR
        elif self.trace.answered:
            outcome = judge_outcome(task, self.trace.final_answer or "", self._judge)
        else:
            outcome = Outcome.RAN_OUT
        # The email environment's one judging path (tasks.py), as the episode runner uses.
        rubric = rubric_observation(task, self.trace, outcome, turns, self._max_turns,
                                    format_error.value if format_error else None)
        return RolloutObservation(
            question=self.question,
            outcome=outcome,
            format_error=format_error,
            turns=turns,
            rubric=rubric,
            trace=self.trace,
            messages=list(self._row.get("prompt") or []) + list(completion),
            tool_calls=tool_calls,
            tool_failures=len(self.trace.errors),
            # Calls left unanswered before the last turn: the token budget, not the turn budget, ended it.
            budget_cut=(outcome == Outcome.RAN_OUT and turns < self._max_turns
                        and calls_left_unanswered(completion)),
        )

    def _task(self) -> Task:
        """The bound row as the email environment's task record."""
        row = self._row
        return Task(id=str(row.get("task_id") or ""), environment=NAME, context=self._inbox,
                    prompt=self.question, reference=str(row["answer"]), category=str(row.get("category") or ""),
                    metadata={"source_ids": [str(s) for s in (row.get("source_ids") or [])]})


def observe(environment: InboxEnvironment, completion: list[dict[str, Any]]) -> RolloutObservation:
    """The judged rollout of `environment` whose conversation after the prompt is `completion`."""
    return environment._observe(completion)

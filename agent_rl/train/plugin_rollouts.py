"""GRPO rollouts in any plug-in environment: TRL's `environment_factory` wants one object per rollout whose public
methods are the tools and whose `reset(**row)` binds it to a dataset row. `rollout_class(env)` builds that class
from the environment's session type: each tool delegates to a fresh session `env.open(task)` per row (so writes
never leak between rollouts), and the finished rollout is judged by the environment's own judge, the same one the
episode runner uses. This is the default of `World.rollout_factory`: an environment whose world offers its own
(the email assistant, scored by the rubric's groups) is rolled out in that instead.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from agent_rl.environments.core import Environment, FinalAnswer, Judgement, Task, Trajectory
from agent_rl.environments.rollouts import JudgedRollout, calls_left_unanswered, scan_turns
from agent_rl.environments.sessions import judge_episode
from agent_rl.records import Outcome, Split


def task_rows(environment: Environment, tasks: list[Task]) -> list[dict[str, Any]]:
    """GRPO rows for plug-in tasks: the opening messages as the prompt, the task itself for the judge, and the
    columns the trainer's bookkeeping reads (task_id, category, answer)."""
    return [{
        "prompt": environment.opening_messages(task),
        "task_id": task.id,
        "environment": environment.name,
        "category": str(task.category or ""),
        "answer": str(task.reference or ""),
        "task": task.model_dump_json(),
    } for task in tasks]


def training_rows(environment: Environment, tasks: list[Task]) -> list[dict[str, Any]]:
    """GRPO rows of the training tasks among `tasks`: the rows the environment's own rollouts read
    (`World.grpo_rows`), else the loop's task rows."""
    train = [task for task in tasks if task.split == Split.TRAIN]
    own = environment.world().grpo_rows(train)
    return task_rows(environment, train) if own is None else own


@dataclass
class PluginTrace:
    """What the hacking detectors and rollout records read of a plug-in rollout (the email trace's shape)."""

    final_answer: str | None = None
    sources: list[str] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return self.final_answer is not None


@dataclass
class PluginObservation(JudgedRollout):
    """A judged plug-in rollout, with the fields the trainer and rollout records use."""

    trace: PluginTrace
    judgement: Judgement = field(kw_only=True)


class PluginRollout:
    """Base of the generated rollout classes; the subclass adds one delegating method per tool."""

    _environment: Environment
    _max_turns: int

    def __init__(self) -> None:
        self._row: dict[str, Any] = {}
        self._task: Task | None = None
        self._session: Any = None
        self._calls = 0
        self._answered_at: int | None = None  # tool calls made when the session first recorded its final answer
        self._errors: list[str] = []
        self._observation: PluginObservation | None = None

    def reset(self, **row: Any) -> None:
        """Bind to one row: a fresh session of the row's task (the prompt already holds the request)."""
        if "task" not in row:
            raise ValueError(f"GRPO row {row.get('task_id', '?')!r} lacks field 'task' (plug-in rows carry it)")
        task = Task.model_validate_json(row["task"]) if isinstance(row["task"], str) else Task.model_validate(row["task"])
        # TRL keeps the routing column to itself when it picks among several environments: name ours again.
        self._row, self._task = {**row, "environment": row.get("environment") or self._environment.name}, task
        self._session = self._environment.open(task)
        self._calls, self._answered_at, self._errors, self._observation = 0, None, [], None
        return None

    @property
    def row(self) -> dict[str, Any]:
        return self._row

    def _after_call(self, name: str, result: Any) -> None:
        self._calls += 1
        text = result if isinstance(result, str) else ""
        if text.startswith('{"error"'):
            self._errors.append(name)
        if self._answered_at is None and self._environment.final_answer(self._session) is not None:
            self._answered_at = self._calls

    def _observe(self, completion: list[dict[str, Any]]) -> PluginObservation:
        """Judge the finished rollout once (every reward function asks for the same one)."""
        if self._observation is None:
            self._observation = self._judge_rollout(completion)
        return self._observation

    def _judge_rollout(self, completion: list[dict[str, Any]]) -> PluginObservation:
        answered_at = self._answered_at
        turns, calls, format_error = scan_turns(
            completion, self._environment.tool_names(),
            lambda _index, calls: answered_at is not None and calls >= answered_at,
            words_answer=self._environment.capabilities.answers_in_words)
        answer: FinalAnswer | None = self._environment.final_answer(self._session)
        if answer is None and self._environment.capabilities.answers_in_words and format_error is None:
            answer = words_answer(completion)
        trajectory = Trajectory(messages=list(self._row.get("prompt") or []) + list(completion), turns=turns,
                                max_turns=self._max_turns, format_error=format_error.value if format_error else None,
                                answer=answer)
        judgement = judge_episode(self._environment, self._task, self._session, trajectory)
        if judgement.reward is None:
            judgement = Judgement(judgement.outcome, 0.0, judgement.components)
        budget_cut = (judgement.outcome == Outcome.RAN_OUT and turns < self._max_turns
                      and calls_left_unanswered(completion))
        return PluginObservation(
            question=self._task.prompt if self._task else "",
            outcome=Outcome(judgement.outcome),
            format_error=format_error,
            turns=turns,
            judgement=judgement,
            trace=PluginTrace(final_answer=answer.text if answer else None,
                              sources=list(answer.citations) if answer else [], errors=list(self._errors)),
            messages=json.loads(json.dumps(trajectory.messages, default=str)),
            tool_calls=calls,
            tool_failures=len(self._errors),
            budget_cut=budget_cut,
        )


def words_answer(completion: list[dict[str, Any]]) -> FinalAnswer | None:
    """The first assistant turn of words (no tool call) of a rollout: the answer of an environment that answers
    in words (the episode runner ends an episode there too)."""
    for message in completion:
        if message.get("role") == "assistant" and not message.get("tool_calls"):
            return FinalAnswer(str(message.get("content") or ""))
    return None


def _delegate(name: str, original: Any) -> Any:
    @functools.wraps(original)  # keeps the signature, type hints and docstring TRL turns into the tool schema
    def tool(self: PluginRollout, *args: Any, **kwargs: Any) -> Any:
        if self._session is None:
            raise RuntimeError("rollout used before reset()")
        result = getattr(self._session, name)(*args, **kwargs)
        self._after_call(name, result)
        return result

    return tool


def rollout_factory(environment: Environment, max_turns: int) -> Any:
    """TRL's environment_factory for `environment`: its world's own (`World.rollout_factory`), else its rollout
    class built here."""
    return environment.world().rollout_factory(max_turns) or rollout_class(environment, max_turns)


def rollout_class(environment: Environment, max_turns: int) -> type[PluginRollout]:
    """A PluginRollout subclass whose public methods are `environment`'s tools, in the environment's order."""
    session_type = environment.session_type()
    methods: dict[str, Any] = {name: _delegate(name, getattr(session_type, name)) for name in environment.tool_names()}
    methods.update(_environment=environment, _max_turns=max_turns)
    return type(f"{session_type.__name__}Rollout", (PluginRollout,), methods)


def rollout_groups(observation: PluginObservation) -> tuple[dict[str, float], dict[str, float]]:
    """(reward per trainer group, the judge's components): a plug-in's reward is one number, the judge's total,
    so it goes to the outcome group whole (its weight scales it); format errors go to the format group."""
    total = float(observation.judgement.reward or 0.0)
    group = "format" if observation.format_error is not None else "outcome"
    return {group: total}, dict(observation.judgement.components)

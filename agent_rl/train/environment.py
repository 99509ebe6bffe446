"""The GRPO environment: the agent's inbox tools bound to one training row, and how a finished rollout is judged.

TRL 1.16 `GRPOTrainer(environment_factory=...)` makes one `InboxEnvironment` per rollout, calls
`reset(**row)` with the dataset row (inbox, query date, golden answer...), offers the public
methods (the three tools, inherited unchanged so their schemas match SFT and serving) to the
model, and hands the instances to the reward functions, which read `observe()`.

This is the one training module that knows the email assistant: its rollouts are scored by the rubric's separate
reward groups (train/rewards.py), where every other environment's rollouts (train/plugin_rollouts.py) get its
judge's one number.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent_rl.agent.tool_calls import call_name
from agent_rl.environments.email.tools import TOOL_NAMES, EpisodeTrace, InboxTools, ToolConfig
from agent_rl.environments.email.inbox.store import InboxStore, open_inbox_store
from agent_rl.environments.core import Task
from agent_rl.environments.email.environment import judge_outcome, rubric_observation
from agent_rl.records import Category, Outcome
from agent_rl.reward.judge import DeterministicJudge, Judge
from agent_rl.reward.rubric import FormatErrorKind, RubricObservation
from agent_rl.turn_budget import DEFAULT_MAX_TURNS
from agent_rl.utc import as_utc

ANSWER_ACK = "Answer recorded."  # what return_final_answer says back (see tools.InboxTools._answer)
# The environment whose GRPO rollouts are InboxEnvironments (scored by the rubric's groups); it trains alone.
RUBRIC_ENVIRONMENT = "email"


def parse_query_date(value: Any) -> datetime | None:
    """Rows carry the query date as a datetime (datasets) or an ISO string (JSONL)."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return as_utc(value)
    if hasattr(value, "to_pydatetime"):  # pandas Timestamp from a datasets round trip
        return as_utc(value.to_pydatetime())
    text = str(value).strip().replace("Z", "+00:00")
    try:
        return as_utc(datetime.fromisoformat(text))
    except ValueError:
        raise ValueError(f"GRPO row field 'query_date': {value!r} is not an ISO date") from None


@dataclass
class JudgedRollout:
    """A finished, judged rollout: what the trainer's bookkeeping and the rollout records read of it, in the email
    environment (RolloutObservation) and in a plug-in (plugin_rollouts.PluginObservation) alike."""

    question: str
    outcome: Outcome
    format_error: FormatErrorKind | None
    turns: int
    trace: Any  # the environment's trace: final_answer, sources, reads, errors
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: int = 0
    tool_failures: int = 0
    budget_cut: bool = False  # ended by max_completion_length (tool results dropped), not by the policy


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
                raise ValueError(f"GRPO row {row.get('scenario_id', '?')!r} lacks field {key!r}")
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
            completion, TOOL_NAMES, lambda index, _calls: _accepted_answer(completion, index))
        task = self._task()
        if format_error is not None:
            outcome = Outcome.FORMAT_ERROR
        elif self.trace.answered:
            outcome = judge_outcome(task, self.trace.final_answer or "", self._judge)
        else:
            outcome = Outcome.RAN_OUT
        # The email environment's one judging path (agent_rl/environments/email/environment.py), as the episode runner uses.
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
        return Task(id=str(row.get("scenario_id") or ""), environment=RUBRIC_ENVIRONMENT, context=self._inbox,
                    prompt=self.question, reference=str(row["answer"]), category=str(row.get("category") or ""),
                    metadata={"source_ids": [str(s) for s in (row.get("source_ids") or [])]})


def scan_turns(completion: list[dict[str, Any]], tool_names: Collection[str],
               answered: Callable[[int, int], bool]) -> tuple[int, int, FormatErrorKind | None]:
    """(turns, tool calls, format error) of a rollout by the episode runner's rules: the first plain-text turn or
    unknown tool ends it as a format error; turns after the answer was recorded (TRL generates once more) do not
    count. `answered(index, calls)`: whether the answer was recorded by the assistant turn at `index`, with
    `calls` tool calls made so far."""
    names = set(tool_names)
    turns = calls = 0
    for index, message in enumerate(completion):
        if message.get("role") != "assistant":
            continue
        turns += 1
        made = message.get("tool_calls") or []
        if not made:
            content = str(message.get("content") or "")
            # TRL's parser falls back to plain text when a tool call is malformed.
            kind = FormatErrorKind.UNPARSABLE if "<tool_call>" in content else FormatErrorKind.NO_TOOL_CALL
            return turns, calls, kind
        if any(call_name(call) not in names for call in made):
            return turns, calls, FormatErrorKind.UNKNOWN_TOOL
        calls += len(made)
        if answered(index, calls):
            break
    return turns, calls, None


def _accepted_answer(completion: list[dict[str, Any]], index: int) -> bool:
    """Whether the tool results right after assistant turn `index` include the answer's acknowledgement."""
    for message in completion[index + 1 :]:
        if message.get("role") != "tool":
            return False
        if message.get("name") == "return_final_answer" and message.get("content") == ANSWER_ACK:
            return True
    return False


def calls_left_unanswered(completion: list[dict[str, Any]]) -> bool:
    """Whether the rollout ends on tool calls without their results: TRL drops results that would overflow
    max_completion_length and stops the rollout there, a cut the policy did not choose (so does the turn budget,
    after its last round)."""
    return bool(completion) and completion[-1].get("role") == "assistant" and bool(completion[-1].get("tool_calls"))


def observe(environment: InboxEnvironment, completion: list[dict[str, Any]]) -> RolloutObservation:
    """The judged rollout of `environment` whose conversation after the prompt is `completion`."""
    return environment._observe(completion)


def inbox_rollouts(store_url: str, max_turns: int) -> tuple[Callable[[], InboxEnvironment], InboxStore]:
    """TRL's environment_factory for the email assistant's rollouts on the inbox store at `store_url`, and that store
    (the caller closes it when training ends)."""
    store = open_inbox_store(store_url)
    return (lambda: InboxEnvironment(store, max_turns=max_turns)), store

"""What any environment's GRPO rollouts share, outside the trainer so a plug-in may use it: how a TRL completion
is read by the episode runner's rules (turns, tool calls, format errors), the judged rollout the trainer's
bookkeeping reads, and the dataset row's query date.

TRL 1.16 `GRPOTrainer(environment_factory=...)` makes one rollout object per generation, calls `reset(**row)` with
the dataset row, offers its public methods as tools and hands the objects to the reward functions, which call
`_observe(completion)` for a `JudgedRollout`. An environment offers its own factory through
`World.rollout_factory`; without one the loop builds it from the session type (train/plugin_rollouts.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent_rl.environments.rubric import FormatErrorKind, RubricObservation
from agent_rl.environments.tool_calls import call_name
from agent_rl.records import Outcome
from agent_rl.utc import as_utc

# What a final-answer tool says back: the trainer recognizes it to end a rollout once the answer is recorded.
ANSWER_ACK = "Answer recorded."


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
    """A finished, judged rollout: what the trainer's bookkeeping and the rollout records read of it.

    `rubric` is the reward hook: a rollout that sets it is scored by the rubric under the trainer's weights, one
    reward per rubric group (train/rewards.py); one that leaves it None carries its judge's one number instead
    (train/plugin_rollouts.PluginObservation)."""

    question: str
    outcome: Outcome
    format_error: FormatErrorKind | None
    turns: int
    trace: Any  # the environment's trace: final_answer, sources, reads, errors
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: int = 0
    tool_failures: int = 0
    budget_cut: bool = False  # ended by max_completion_length (tool results dropped), not by the policy
    rubric: RubricObservation | None = field(default=None, kw_only=True)


def scan_turns(completion: list[dict[str, Any]], tool_names: Collection[str],
               answered: Callable[[int, int], bool],
               words_answer: bool = False) -> tuple[int, int, FormatErrorKind | None]:
    """(turns, tool calls, format error) of a rollout by the episode runner's rules: the first plain-text turn or
    unknown tool ends it as a format error; turns after the answer was recorded (TRL generates once more) do not
    count. `answered(index, calls)`: whether the answer was recorded by the assistant turn at `index`, with
    `calls` tool calls made so far. `words_answer`: a plain-text turn is the answer (it ends the rollout, no error)."""
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
            if "<tool_call>" in content:
                return turns, calls, FormatErrorKind.UNPARSABLE
            return turns, calls, None if words_answer else FormatErrorKind.NO_TOOL_CALL
        if any(call_name(call) not in names for call in made):
            return turns, calls, FormatErrorKind.UNKNOWN_TOOL
        calls += len(made)
        if answered(index, calls):
            break
    return turns, calls, None


def accepted_answer(completion: list[dict[str, Any]], index: int, tool: str = "return_final_answer") -> bool:
    """Whether the tool results right after assistant turn `index` include `tool`'s acknowledgement (ANSWER_ACK)."""
    for message in completion[index + 1 :]:
        if message.get("role") != "tool":
            return False
        if message.get("name") == tool and message.get("content") == ANSWER_ACK:
            return True
    return False


def calls_left_unanswered(completion: list[dict[str, Any]]) -> bool:
    """Whether the rollout ends on tool calls without their results: TRL drops results that would overflow
    max_completion_length and stops the rollout there, a cut the policy did not choose (so does the turn budget,
    after its last round)."""
    return bool(completion) and completion[-1].get("role") == "assistant" and bool(completion[-1].get("tool_calls"))

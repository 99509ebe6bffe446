"""The policy interface: given several conversations, produce each one's next assistant turn.

Batched by design: the local transformers policy generates all turns of a batch at once
(left padding), the HTTP policy sends them concurrently, the heuristic answers instantly.

On the ground floor (docs/architecture.md, the layers): the contract names a `Policy` (an environment's teacher) and
plug-ins write teachers with these types, so they live beside the contract. The agent layer builds its policies on
them (agent/policy.py re-exports them under their old names, with the row-routed variant the runner serves).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

# A chat message in the OpenAI / transformers layout, a conversation of them, a tool's JSON schema.
Message = dict[str, Any]
Conversation = list[Message]
ToolSchema = dict[str, Any]


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass
class PolicyTurn:
    """One assistant turn. `parse_error` is set when the model's output held a malformed tool call."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_message(self) -> dict[str, Any]:
        """The chat message (OpenAI / transformers layout) recorded in the episode."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return message


class PolicyUnavailable(RuntimeError):
    """The serving stack could not answer at all (an engine down past its restarts, an upstream unreachable): no
    turn of the model's, so no evidence about it. The runner marks such an episode unserved (`Episode.unserved`)
    instead of scoring it, the arbiter answers 503 with `retry_after_s` and stores nothing, and an evaluation
    stops instead of counting it as the model's error. Its message is for operators' logs."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def retry_after(self) -> dict[str, str]:
        """The Retry-After header for the 503 it becomes: whole seconds, at least 1 (30 when unknown)."""
        seconds = 30.0 if self.retry_after_s is None else self.retry_after_s
        return {"Retry-After": str(max(1, int(seconds + 0.999)))}


class Policy(abc.ABC):
    """Something that answers a conversation with the next assistant turn."""

    version: str = "unknown"
    # True for a policy whose act() may be called from several threads at once and that batches those calls itself
    # (an engine server with continuous batching): the runner then keeps episodes in flight (environments/runner.py).
    concurrent_turns: bool = False

    @abc.abstractmethod
    def act(self, conversations: list[Conversation], tools: list[ToolSchema],
            max_new_tokens: int = 256) -> list[PolicyTurn]:
        """Next turn for each conversation, in order. Must not raise on odd conversations."""


class RowRoutedPolicy(Policy):
    """A policy that can answer each conversation with a different version (per-row adapters on one shared
    base, agent/shared_base.py): the runner passes every row's routed version to `act_rows`."""

    @abc.abstractmethod
    def act_rows(
        self,
        rows: list[str | None],
        conversations: list[Conversation],
        tools: list[ToolSchema],
        max_new_tokens: int = 256,
    ) -> list[PolicyTurn]:
        """Next turn for each conversation, conversation i answered by version rows[i]."""

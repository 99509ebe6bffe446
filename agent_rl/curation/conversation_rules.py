"""What makes a list of messages a valid tool-call conversation, one rule per role.

Valid: a system/user opening (a user message before any assistant turn), assistant tool calls to known tools with
object arguments, each call answered by a tool result (matched by id when ids are given, else by order) before
the next assistant turn; a final tool (`final_tools`, e.g. return_final_answer) may end the conversation
unanswered. Curation's validation suite quarantines a row for each error found here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent_rl.agent.tool_calls import call_function, decode_arguments

ROLES = ("system", "user", "assistant", "tool")


class KnownTools(Protocol):
    """What the rules need of the validation settings."""

    tools: Collection[str]
    final_tools: Collection[str]


def call_problem(call: Any, known: KnownTools) -> tuple[str | None, str, str]:
    """(problem or None, call id, tool name) of one assistant tool call."""
    if not isinstance(call, Mapping):
        return f"is {type(call).__name__}, not an object", "", ""
    function = call_function(call)
    if function is None:
        return "function is not an object", "", ""
    call_id = call.get("id") or ""
    call_id = call_id if isinstance(call_id, str) else str(call_id)
    name = function.get("name")
    if not isinstance(name, str):
        return "has no tool name", call_id, ""
    if name not in known.tools:
        return f"unknown tool {name[:40]!r}", call_id, name
    try:
        decode_arguments(function.get("arguments", {}))
    except ValueError as exc:
        return f"{name} {exc}", call_id, name
    return None, call_id, name


@dataclass
class _Reader:
    """Reads a conversation message by message, keeping the calls that await a result."""

    known: KnownTools
    errors: list[str] = field(default_factory=list)
    pending: list[tuple[str, str]] = field(default_factory=list)  # (call id, tool name) awaiting a tool result
    seen_user: bool = False

    def read(self, i: int, message: Any) -> None:
        where = f"message {i}"
        if not isinstance(message, Mapping):
            self.errors.append(f"{where} is {type(message).__name__}, not an object")
            return
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            self.errors.append(f"{where} has unknown role {str(role)[:30]!r}")
            return
        self._opening(i, where, role, content)
        if role == "assistant":
            self._assistant(where, message)
        elif role == "tool":
            self._tool(where, message)

    def _opening(self, i: int, where: str, role: str, content: Any) -> None:
        if i == 0 and role not in ("system", "user"):
            self.errors.append(f"conversation opens with {role!r}, expected system or user")
        if role == "system" and self.seen_user:  # system messages open the conversation (instructions, then context)
            self.errors.append(f"{where}: system message after the opening")
        if content is not None and not isinstance(content, str):
            self.errors.append(f"{where} ({role}) content is {type(content).__name__}, not text")
        if role in ("system", "user") and content is None:
            self.errors.append(f"{where} ({role}) has no content")
        self.seen_user = self.seen_user or role == "user"
        if role in ("system", "user") and self.pending:
            self.errors.append(f"{where}: {len(self.pending)} tool call(s) got no result before a {role} message")
            self.pending = []

    def _assistant(self, where: str, message: Mapping[str, Any]) -> None:
        if not self.seen_user:
            self.errors.append(f"{where}: assistant turn before any user message")
        if self.pending:
            names = ", ".join(name for _, name in self.pending)
            self.errors.append(f"{where}: tool call(s) {names} got no result before the next assistant turn")
            self.pending = []
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            self.errors.append(f"{where}: tool_calls is {type(calls).__name__}, not a list")
            return
        for j, call in enumerate(calls):
            problem, call_id, name = call_problem(call, self.known)
            if problem:
                self.errors.append(f"{where} tool call {j}: {problem}")
            self.pending.append((call_id, name))

    def _tool(self, where: str, message: Mapping[str, Any]) -> None:
        if not self.pending:
            self.errors.append(f"{where}: tool result without a pending tool call")
            return
        index = self._answered_index(where, message.get("tool_call_id"))
        name, expected = message.get("name"), self.pending[index][1]
        if name and expected and name != expected:
            self.errors.append(f"{where}: tool result named {str(name)[:40]!r} answers a {expected!r} call")
        self.pending.pop(index)

    def _answered_index(self, where: str, result_id: Any) -> int:
        """Which pending call a tool result answers: by id when it names a known one, else the first."""
        if not result_id:
            return 0
        ids = [call_id for call_id, _ in self.pending]
        if result_id in ids:
            return ids.index(result_id)
        if any(ids):
            self.errors.append(f"{where}: tool result for unknown call id {str(result_id)[:40]!r}")
        return 0


def conversation_errors(messages: Any, known: KnownTools) -> list[str]:
    """What makes `messages` not a valid tool-call conversation (empty list when it is one)."""
    if not isinstance(messages, list):
        return ["messages is not a list"]
    if not messages:
        return ["conversation is empty"]
    reader = _Reader(known)
    for i, message in enumerate(messages):
        reader.read(i, message)
    unanswered = [name for _, name in reader.pending if name not in known.final_tools]
    if unanswered:
        reader.errors.append(f"conversation ends with unanswered tool call(s): {', '.join(unanswered)}")
    return reader.errors

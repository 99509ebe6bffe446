"""The rows of an OpenAI fine-tuning file, read line by line: what a job brings is checked before anything runs.

OpenAI's chat fine-tuning JSONL has two row shapes we take: supervised (`messages` ending with the assistant reply
to learn, `tools` optional) and reinforcement (`messages` ending with the user's request, plus any top-level fields
the grader reads as `{{ item.<field> }}`). A bad line is a JobFileError naming its line number and the field, never
its content: a job's data is production data and may hold personal values.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_LINE_BYTES = 4 * 1024 * 1024  # OpenAI's per-example limit is far below this; a longer line is not a chat row


class Method(str, Enum):
    """A job's training method, as OpenAI names it (`method.type`)."""

    SUPERVISED = "supervised"
    REINFORCEMENT = "reinforcement"


class JobFileError(ValueError):
    """A fine-tuning file that cannot be used; `line` is 1-based (0: the file as a whole)."""

    def __init__(self, line: int, problem: str, param: str | None = None) -> None:
        where = f"line {line}: " if line else ""
        super().__init__(f"{where}{problem}")
        self.line, self.problem, self.param = line, problem, param


@dataclass(frozen=True)
class JobRow:
    """One usable row: the conversation the model sees, and what judges its reply.

    `prompt` is every message before the reply to produce; `reference` the supervised row's target reply (None
    for reinforcement rows, which the grader judges); `item` the fields a grader's `{{ item.* }}` reads (a
    supervised row's target is `item.reference_reply`)."""

    line: int
    prompt: tuple[dict[str, Any], ...]
    reference: str | None
    item: dict[str, Any] = field(default_factory=dict)
    tools: tuple[dict[str, Any], ...] = ()

    @property
    def id(self) -> str:
        """Stable across re-uploads of the same row (content, not position, names it)."""
        text = json.dumps([self.prompt, self.reference, self.item], sort_keys=True, ensure_ascii=False)
        return "row-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]

    @property
    def request(self) -> str:
        """The text of the last user (or developer) message: what the task asks."""
        return content_text(self.prompt[-1].get("content"))


def content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of OpenAI's content-part list joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content
                       if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"))
    return ""


def read_rows(lines: Iterable[str | bytes], method: Method) -> list[JobRow]:
    """Every row of a fine-tuning file for `method`; the first bad line raises a JobFileError naming it."""
    rows = list(_rows(lines, method))
    if not rows:
        raise JobFileError(0, "the file holds no rows")
    return rows


def _rows(lines: Iterable[str | bytes], method: Method) -> Iterator[JobRow]:
    for number, raw in enumerate(lines, start=1):
        if isinstance(raw, bytes):
            if len(raw) > MAX_LINE_BYTES:
                raise JobFileError(number, f"longer than {MAX_LINE_BYTES} bytes")
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise JobFileError(number, "not UTF-8 text") from None
        if not raw.strip():
            continue
        if len(raw) > MAX_LINE_BYTES:
            raise JobFileError(number, f"longer than {MAX_LINE_BYTES} bytes")
        try:
            value = json.loads(raw)
        except ValueError:
            raise JobFileError(number, "not valid JSON") from None
        yield parse_row(value, number, method)


def parse_row(value: Any, line: int, method: Method) -> JobRow:
    """One decoded line as a row of `method`, or a JobFileError naming the field that is wrong."""
    if not isinstance(value, dict):
        raise JobFileError(line, "a row must be a JSON object")
    if "input" in value and "preferred_output" in value:
        raise JobFileError(line, "preference (DPO) rows are not supported: use supervised or reinforcement rows")
    messages = value.get("messages")
    if not isinstance(messages, list) or not messages:
        raise JobFileError(line, "'messages' must be a non-empty list", "messages")
    for index, message in enumerate(messages):
        _check_message(message, line, f"messages[{index}]")
    tools = value.get("tools", [])
    if not isinstance(tools, list) or not all(_is_function_schema(t) for t in tools):
        raise JobFileError(line, "'tools' must be a list of function schemas ({\"type\": \"function\", "
                                 "\"function\": {\"name\": ...}})", "tools")
    if tools:
        raise JobFileError(line, "rows declaring 'tools' are not supported yet: a job's model answers in words", "tools")
    if method is Method.SUPERVISED:
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        if last is None:
            raise JobFileError(line, "a supervised row needs an assistant message to learn from", "messages")
        if messages[last].get("tool_calls"):
            raise JobFileError(line, f"messages[{last}]: the reply to learn must be words, not tool calls", "messages")
        prompt, reference = messages[:last], content_text(messages[last].get("content"))
        if not any(m["role"] in ("user", "developer") for m in prompt):
            raise JobFileError(line, "the assistant reply has no user message before it", "messages")
        extra = {k: v for k, v in value.items() if k not in ("messages", "tools", "parallel_tool_calls")}
        return JobRow(line, tuple(prompt), reference, {**extra, "reference_reply": reference})
    if messages[-1]["role"] not in ("user", "developer"):
        raise JobFileError(line, "a reinforcement row's last message must be from the user (or developer)",
                           "messages")
    item = {k: v for k, v in value.items() if k not in ("tools", "parallel_tool_calls")}
    return JobRow(line, tuple(messages), None, item)


def _check_message(message: Any, line: int, where: str) -> None:
    if not isinstance(message, dict):
        raise JobFileError(line, f"{where} must be an object", "messages")
    role = message.get("role")
    if role not in ROLES:
        raise JobFileError(line, f"{where}.role must be one of {', '.join(ROLES)}", "messages")
    content = message.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise JobFileError(line, f"{where}.content must be text or a list of content parts", "messages")
    if "weight" in message and message["weight"] not in (0, 1):
        raise JobFileError(line, f"{where}.weight must be 0 or 1", "messages")
    calls = message.get("tool_calls")
    if calls is None:
        return
    if role != "assistant" or not isinstance(calls, list):
        raise JobFileError(line, f"{where}.tool_calls must be a list on an assistant message", "messages")
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise JobFileError(line, f"{where}.tool_calls[{index}] needs a function with a name", "messages")
        arguments = function.get("arguments")
        try:
            ok = isinstance(arguments, str) and isinstance(json.loads(arguments), dict)
        except ValueError:
            ok = False
        if not ok:
            raise JobFileError(line, f"{where}.tool_calls[{index}].function.arguments must be a JSON object "
                                     "encoded as a string", "messages")


def _is_function_schema(tool: Any) -> bool:
    return (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("function"), dict)
            and isinstance(tool["function"].get("name"), str))

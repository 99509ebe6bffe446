"""The rows of an OpenAI fine-tuning file, read line by line: what a job brings is checked before anything runs.

OpenAI's chat fine-tuning JSONL has two row shapes we take: supervised (`messages` ending with the assistant reply
to learn, `tools` optional) and reinforcement (`messages` ending with the user's request, plus any top-level fields
the grader reads as `{{ item.<field> }}`). A bad line is a JobFileError naming its line number and the field, never
its content: a job's data is production data and may hold personal values.

`row_kind` is OpenAI's row shape, the one definition of a valid row: the Files API checks uploads with it
(agent_rl/arbiter/file_checks.py) and `parse_row` starts with it, then adds what a job's environment needs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NoReturn

ROLES = ("system", "developer", "user", "assistant", "tool")
_PROMPT_ENDS = ("user", "developer")
_PREFERENCE_FIELDS = ("preferred_output", "non_preferred_output")
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
    rows = list(iter_rows(lines, method))
    if not rows:
        raise JobFileError(0, "the file holds no rows")
    return rows


def iter_rows(lines: Iterable[str | bytes], method: Method) -> Iterator[JobRow]:
    """The rows of a fine-tuning file for `method` one at a time (a large file is never held whole); the first bad
    line raises a JobFileError naming it. An empty file yields nothing (read_rows refuses it)."""
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
        except (ValueError, RecursionError):
            raise JobFileError(number, "not valid JSON") from None
        yield parse_row(value, number, method)


def parse_row(value: Any, line: int, method: Method) -> JobRow:
    """One decoded line as a row of `method` the loop can train on, or a JobFileError naming the field that is wrong.

    First OpenAI's row shape (`row_kind`, the same check the Files API makes at upload), then what a job's
    environment needs beyond it: rows of the job's method, no `tools` (a job's model answers in words), and a
    supervised reply in words after a user message."""
    kind = row_kind(value, line)
    if value.get("tools"):
        raise JobFileError(line, "rows declaring 'tools' are not supported yet: a job's model answers in words", "tools")
    messages = value["messages"]
    if method is Method.SUPERVISED:
        if kind is not Method.SUPERVISED:
            raise JobFileError(line, "a supervised row needs an assistant message to learn from after the last user "
                                     "message (this row ends with a user or developer message, as reinforcement "
                                     "rows do)", "messages")
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        if messages[last].get("tool_calls"):
            raise JobFileError(line, f"messages[{last}]: the reply to learn must be words, not tool calls", "messages")
        prompt, reference = messages[:last], content_text(messages[last].get("content"))
        if not any(m["role"] in _PROMPT_ENDS for m in prompt):
            raise JobFileError(line, "the assistant reply has no user message before it", "messages")
        extra = {k: v for k, v in value.items() if k not in ("messages", "tools", "parallel_tool_calls")}
        return JobRow(line, tuple(prompt), reference, {**extra, "reference_reply": reference})
    if kind is not Method.REINFORCEMENT:
        raise JobFileError(line, "a reinforcement row's last message must be from the user (or developer), the "
                                 "request the model learns to answer", "messages")
    item = {k: v for k, v in value.items() if k not in ("tools", "parallel_tool_calls")}
    return JobRow(line, tuple(messages), None, item)


# -- OpenAI's row shape: the one definition of a valid row ----------------------------------------


def row_kind(value: Any, line: int = 0) -> Method:
    """The kind of one decoded row in OpenAI's chat fine-tuning shape, or a JobFileError naming the first field at
    fault (its `problem` reads after the line number: `line 7: messages[2].role is missing ...`).

    The one definition of a valid row: the Files API checks uploads with it (arbiter/file_checks.py, which adds
    what only a stored file needs: JSON without NaN, bounded depth, storable strings, one kind per file) and
    `parse_row` starts with it. A row whose messages end with a user or developer message is a reinforcement row
    (the model answers it); any other needs an assistant message to learn from (one whose `weight` is not 0) and
    is a supervised row. Preference rows are refused as not supported."""
    if not isinstance(value, dict):
        raise JobFileError(line, "is not a JSON object")
    if any(name in value for name in _PREFERENCE_FIELDS):
        raise JobFileError(line, "is a preference row (preferred_output / non_preferred_output): preference "
                                 "fine-tuning is not supported; send supervised or reinforcement rows")
    messages = value.get("messages")
    if not isinstance(messages, list):
        raise JobFileError(line, "has no `messages` list" if "messages" not in value else "`messages` is not a list",
                           "messages")
    if not messages:
        raise JobFileError(line, "`messages` is empty", "messages")
    for index, message in enumerate(messages):
        _check_message(message, line, f"messages[{index}]")
    if "tools" in value:
        _check_tools(value["tools"], line)
    if "parallel_tool_calls" in value and not isinstance(value["parallel_tool_calls"], bool):
        raise JobFileError(line, "`parallel_tool_calls` is not true or false", "parallel_tool_calls")
    if messages[-1]["role"] in _PROMPT_ENDS:
        return Method.REINFORCEMENT
    if not any(m["role"] == "assistant" and m.get("weight", 1) != 0 for m in messages):
        raise JobFileError(line, "has no assistant message to learn from (a supervised row needs one whose weight "
                                 "is not 0; a reinforcement row ends with a user or developer message)", "messages")
    return Method.SUPERVISED


def _check_message(message: Any, line: int, where: str) -> None:
    def refuse(problem: str) -> NoReturn:
        raise JobFileError(line, f"{where}{problem}", "messages")

    if not isinstance(message, dict):
        refuse(" is not an object")
    role = message.get("role")
    if role not in ROLES:
        refuse(f".role is missing or not one of {', '.join(ROLES)}")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant":
            refuse(" has tool_calls but only assistant messages make tool calls")
        _check_tool_calls(tool_calls, line, f"{where}.tool_calls")
    content = message.get("content")
    if content is None:
        if role != "assistant" or not tool_calls:
            refuse(".content is missing (only an assistant message with tool_calls may leave it out)")
    elif isinstance(content, list):
        for index, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                refuse(f".content[{index}] is not a content part (an object with a `type`)")
    elif not isinstance(content, str):
        refuse(".content is not a string or a list of content parts")
    if "weight" in message:
        if role != "assistant":
            refuse(".weight is set but only assistant messages have a weight")
        if message["weight"] not in (0, 1) or isinstance(message["weight"], bool):
            refuse(".weight is not 0 or 1")
    for name in ("name", "tool_call_id"):
        if name in message and not isinstance(message[name], str):
            refuse(f".{name} is not a string")


def _check_tool_calls(tool_calls: Any, line: int, where: str) -> None:
    if not isinstance(tool_calls, list):
        raise JobFileError(line, f"`{where}` is not a list", "messages")
    for index, call in enumerate(tool_calls):
        at = f"{where}[{index}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise JobFileError(line, f"{at} is not a tool call (an object with a `function`)", "messages")
        if call.get("type", "function") != "function":
            raise JobFileError(line, f"{at}.type is not \"function\"", "messages")
        function = call["function"]
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise JobFileError(line, f"{at}.function.name is missing or empty", "messages")
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            raise JobFileError(line, f"{at}.function.arguments is not a JSON string (the arguments must be a JSON "
                                     "object written as a string)", "messages")
        try:
            parsed = json.loads(arguments, parse_constant=_not_json)
        except (ValueError, RecursionError):
            parsed = None
        if not isinstance(parsed, dict):
            raise JobFileError(line, f"{at}.function.arguments is not a JSON string of an object (the arguments must "
                                     "be a JSON object written as a string)", "messages")


def _check_tools(tools: Any, line: int) -> None:
    if not isinstance(tools, list):
        raise JobFileError(line, "`tools` is not a list of function schemas", "tools")
    for index, tool in enumerate(tools):
        at = f"tools[{index}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function":
            raise JobFileError(line, f"{at} is not a function schema ({{\"type\": \"function\", \"function\": "
                                     "{\"name\", ...}})", "tools")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise JobFileError(line, f"{at}.function.name is missing or empty", "tools")
        if "description" in function and not isinstance(function["description"], str):
            raise JobFileError(line, f"{at}.function.description is not a string", "tools")
        if "parameters" in function and not isinstance(function["parameters"], dict):
            raise JobFileError(line, f"{at}.function.parameters is not a JSON schema object", "tools")


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Python's parser takes NaN and Infinity; no other JSON reader does

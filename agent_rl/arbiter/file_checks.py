"""Checks on an uploaded fine-tuning file (purpose "fine-tune"), line by line, before it is stored.

A training file is JSONL: one JSON object per line, in one of OpenAI's two row shapes.

* supervised: `{"messages": [...], "tools": [...]?, "parallel_tool_calls": bool?}` with at least one assistant
  message to learn from (one whose `weight` is not 0);
* reinforcement: `{"messages": [...], ...}` whose messages end with a user or developer message (the model
  answers it while training), plus any top-level fields the grader reads (`reference_answer`, say).

A row whose last message is a user or developer message is a reinforcement row, any other a supervised row;
one file holds rows of one kind (a job trains with one method). Preference rows (`input`, `preferred_output`,
`non_preferred_output`) are refused as not supported. Blank lines are skipped but counted, so a line number is
the one an editor shows.

The first problem stops the check and is reported as `line N: <field> <what is wrong>`. A message names the
line and the field, never a value from the file: training data holds customers' messages (personal data),
and these errors are logged and shown to whoever uploads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

from agent_rl.json_walk import MAX_JSON_DEPTH, too_deep, walk

RowKind = Literal["supervised", "reinforcement"]
ROLES = ("system", "developer", "user", "assistant", "tool")
_PROMPT_ENDS = ("user", "developer")
_ROLE_LIST = ", ".join(ROLES)
_PREFERENCE_FIELDS = ("preferred_output", "non_preferred_output")


class BadTrainingFile(ValueError):
    """The file cannot be trained on; `str()` is the message for the uploader (line and field, no content)."""


@dataclass(frozen=True)
class TrainingFileSummary:
    """What the check learned: how many rows (non-blank lines) and of which kind."""

    rows: int
    kind: RowKind


class _RowProblem(ValueError):
    """One row's problem, without the line number (added by the file check)."""


def _refuse(problem: str) -> None:
    raise _RowProblem(problem)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Python's parser takes NaN and Infinity; no other JSON reader does


def check_training_file(stream: BinaryIO, max_line_bytes: int) -> TrainingFileSummary:
    """Read `stream` (bytes) to its end and check every line; BadTrainingFile names the first bad one."""
    rows = 0
    first_kind: tuple[int, RowKind] | None = None
    number = 0
    while True:
        raw = stream.readline(max_line_bytes + 1)
        if not raw:
            break
        number += 1
        if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
            raise BadTrainingFile(f"line {number} is longer than the limit of {max_line_bytes} bytes")
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raise BadTrainingFile("line 1 starts with a byte order mark; save the file as UTF-8 without one")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadTrainingFile(f"line {number} is not valid UTF-8 text") from None
        if not text.strip():
            continue
        try:
            row = json.loads(text, parse_constant=_no_constants)
        except RecursionError:
            raise BadTrainingFile(f"line {number} is nested more than {MAX_JSON_DEPTH} levels deep") from None
        except ValueError:  # malformed JSON, NaN/Infinity, an integer past the digit limit
            raise BadTrainingFile(f"line {number} is not valid JSON") from None
        try:
            kind = check_row(row)
        except _RowProblem as exc:
            raise BadTrainingFile(f"line {number}: {exc}") from None
        if first_kind is None:
            first_kind = (number, kind)
        elif kind != first_kind[1]:
            raise BadTrainingFile(
                f"line {number} is a {kind} row ({_KIND_HINT[kind]}) but line {first_kind[0]} is a {first_kind[1]} "
                "row; one file holds rows of one kind")
        rows += 1
    if first_kind is None:
        raise BadTrainingFile("the file has no rows (it is empty or only blank lines)")
    return TrainingFileSummary(rows=rows, kind=first_kind[1])


_KIND_HINT: Mapping[RowKind, str] = {
    "supervised": "its messages end with an assistant or tool message",
    "reinforcement": "its messages end with a user or developer message",
}


def check_row(row: Any) -> RowKind:
    """The kind of one decoded row; _RowProblem names the first field at fault."""
    if not isinstance(row, dict):
        _refuse("is not a JSON object")
    if any(name in row for name in _PREFERENCE_FIELDS):
        _refuse("is a preference row (preferred_output / non_preferred_output): preference fine-tuning "
                "is not supported; send supervised or reinforcement rows")
    deep = too_deep(row)
    if deep:
        _refuse(f"{deep} is nested more than {MAX_JSON_DEPTH} levels deep")
    _check_strings(row)
    messages = row.get("messages")
    if not isinstance(messages, list):
        _refuse("has no `messages` list" if "messages" not in row else "`messages` is not a list")
    if not messages:
        _refuse("`messages` is empty")
    for index, message in enumerate(messages):
        _check_message(message, f"messages[{index}]")
    if "tools" in row:
        _check_tools(row["tools"])
    if "parallel_tool_calls" in row and not isinstance(row["parallel_tool_calls"], bool):
        _refuse("`parallel_tool_calls` is not true or false")
    if messages[-1]["role"] in _PROMPT_ENDS:
        return "reinforcement"
    if not any(m["role"] == "assistant" and m.get("weight", 1) != 0 for m in messages):
        _refuse("has no assistant message to learn from (a supervised row needs one whose weight is not 0; a "
                "reinforcement row ends with a user or developer message)")
    return "supervised"


def _check_strings(row: dict[str, Any]) -> None:
    """Every key and string storable by both pool backends (episodes trained on are written there)."""
    for path, parent, key, node in walk(row):
        for text, where in ((key, f"a key in {_shown(parent)}"), (node, _shown(path))):
            if not isinstance(text, str):
                continue
            if "\x00" in text:
                _refuse(f"{where} holds a NUL character (\\u0000)")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                _refuse(f"{where} holds invalid unicode (a lone surrogate escape)")


def _shown(path: str) -> str:
    return f"`{path}`" if path else "the row"


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        _refuse(f"{where} is not an object")
    role = message.get("role")
    if role not in ROLES:
        _refuse(f"{where}.role is missing or not one of {_ROLE_LIST}")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant":
            _refuse(f"{where} has tool_calls but only assistant messages make tool calls")
        _check_tool_calls(tool_calls, f"{where}.tool_calls")
    content = message.get("content")
    if content is None:
        if role != "assistant" or not tool_calls:
            _refuse(f"{where}.content is missing (only an assistant message with tool_calls may leave it out)")
    elif isinstance(content, list):
        for index, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                _refuse(f"{where}.content[{index}] is not a content part (an object with a `type`)")
    elif not isinstance(content, str):
        _refuse(f"{where}.content is not a string or a list of content parts")
    if "weight" in message:
        if role != "assistant":
            _refuse(f"{where}.weight is set but only assistant messages have a weight")
        if message["weight"] not in (0, 1) or isinstance(message["weight"], bool):
            _refuse(f"{where}.weight is not 0 or 1")
    for name in ("name", "tool_call_id"):
        if name in message and not isinstance(message[name], str):
            _refuse(f"{where}.{name} is not a string")


def _check_tool_calls(tool_calls: Any, where: str) -> None:
    if not isinstance(tool_calls, list):
        _refuse(f"`{where}` is not a list")
    for index, call in enumerate(tool_calls):
        at = f"{where}[{index}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            _refuse(f"{at} is not a tool call (an object with a `function`)")
        if call.get("type", "function") != "function":
            _refuse(f"{at}.type is not \"function\"")
        function = call["function"]
        if not isinstance(function.get("name"), str) or not function["name"]:
            _refuse(f"{at}.function.name is missing or empty")
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            _refuse(f"{at}.function.arguments is not a JSON string (write the arguments object as a string of JSON)")
        try:
            json.loads(arguments, parse_constant=_no_constants)
        except (ValueError, RecursionError):
            _refuse(f"{at}.function.arguments is not a JSON string (the string does not parse as JSON)")


def _check_tools(tools: Any) -> None:
    if not isinstance(tools, list):
        _refuse("`tools` is not a list of function schemas")
    for index, tool in enumerate(tools):
        at = f"tools[{index}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function":
            _refuse(f"{at} is not a function schema ({{\"type\": \"function\", \"function\": {{\"name\", ...}}}})")
        if not isinstance(function.get("name"), str) or not function["name"]:
            _refuse(f"{at}.function.name is missing or empty")
        if "description" in function and not isinstance(function["description"], str):
            _refuse(f"{at}.function.description is not a string")
        if "parameters" in function and not isinstance(function["parameters"], dict):
            _refuse(f"{at}.function.parameters is not a JSON schema object")


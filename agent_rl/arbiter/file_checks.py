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

A row's shape is `agent_rl.environments.openai_jobs.rows.row_kind`: one definition of a valid row, shared with the
environment a fine-tuning job trains in. This module adds what a stored file needs beyond it: UTF-8 JSON without
NaN or Infinity, nesting at most `MAX_JSON_DEPTH` deep, no NUL or lone surrogate in any string, one kind per file.

The first problem stops the check and is reported as `line N: <field> <what is wrong>`. A message names the
line and the field, never a value from the file: training data holds customers' messages (personal data),
and these errors are logged and shown to whoever uploads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal, NoReturn

from agent_rl.environments.openai_jobs.rows import JobFileError, row_kind
from agent_rl.json_walk import MAX_JSON_DEPTH, too_deep, walk

RowKind = Literal["supervised", "reinforcement"]


class BadTrainingFile(ValueError):
    """The file cannot be trained on; `str()` is the message for the uploader (line and field, no content)."""


@dataclass(frozen=True)
class TrainingFileSummary:
    """What the check learned: how many rows (non-blank lines) and of which kind."""

    rows: int
    kind: RowKind


class _RowProblem(ValueError):
    """One row's problem, without the line number (added by the file check)."""


def _refuse(problem: str) -> NoReturn:
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
    """The kind of one decoded row; _RowProblem names the first field at fault.

    The row's shape is `rows.row_kind`'s, the one definition of a valid row (the environment a job trains in
    reads rows with it too); checked here beyond it: depth and strings every pool backend can store."""
    deep = too_deep(row)
    if deep:
        _refuse(f"{deep} is nested more than {MAX_JSON_DEPTH} levels deep")
    if isinstance(row, dict):
        _check_strings(row)
    try:
        return row_kind(row).value  # type: ignore[return-value]
    except JobFileError as exc:
        raise _RowProblem(exc.problem) from None


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

"""JSONL files of records (episodes, tasks, dataset rows, rollouts): one object per line, read with its line
number in every error and written atomically with the hash of what was written."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every object of the file, blank lines skipped; a bad line fails naming the file and its line number."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            rows.append(json_object(line, f"{path}:{number}"))
    return rows


def json_object(text: str, where: str) -> dict[str, Any]:
    """`text` parsed as one JSON object, else a ValueError naming `where` (a file and line, a variable)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{where}: not a JSON object ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def canonical_line(row: Mapping[str, Any]) -> str:
    """One row as one compact JSON line, its keys in the order the row has them.

    Never sorted: the chat template prints tool schemas (and tool-call arguments) verbatim, so a file that
    reorders their keys would train a model on prompts production never shows. Rows are built
    deterministically, so the same rows still give the same bytes (and hash)."""
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"), default=str)


def save_jsonl(rows: Iterable[Mapping[str, Any]], path: str | Path) -> str:
    """Write rows as canonical JSONL atomically (temp file + rename); returns the sha256 of the content.

    The hash is of the bytes written, so the same rows always give the same hash (lineage), and
    a run killed mid-write leaves the previous file (or none), never half of one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            for row in rows:
                data = (canonical_line(row) + "\n").encode("utf-8")
                digest.update(data)
                handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return digest.hexdigest()

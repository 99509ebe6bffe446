"""Reading JSONL files of records (episodes, scenarios, dataset rows, rollouts): one object per line."""

from __future__ import annotations

import json
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

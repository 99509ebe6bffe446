"""One rule for dates without a zone: they are UTC. Stored, task, model-given and filter dates then compare."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def as_utc(value: datetime) -> datetime:
    """The same instant in UTC; a naive datetime is taken as UTC already."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def parse_utc(value: Any, where: str) -> datetime:
    """`value`, a datetime or an ISO 8601 string (as JSON and SQLite hold them), as UTC; anything else is a
    ValueError naming `where` (a row and its field, a cursor)."""
    try:
        parsed = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {value!r} is not an ISO datetime") from None
    return as_utc(parsed)

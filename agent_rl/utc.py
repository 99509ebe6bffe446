"""One rule for dates without a zone: they are UTC. Stored, scenario, model-given and filter dates then compare."""

from __future__ import annotations

from datetime import datetime, timezone


def as_utc(value: datetime) -> datetime:
    """The same instant in UTC; a naive datetime is taken as UTC already."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)

"""Checks on the text fields of request bodies: storable by both pool backends, and not blank to a reader.

"Blank" is decided by what is left to read, not by `str.isspace`: no-break spaces, zero-width
characters and lone combining marks pass `strip()` tests yet show nothing, and a question made of
them would be stored, answered and trained on as if it asked something.
"""

from __future__ import annotations

import unicodedata
from typing import Any

# Letters and symbols that render as empty space (Hangul fillers, the blank Braille pattern, ...).
_BLANK_GLYPHS = frozenset("\u115f\u1160\u17b4\u17b5\u2800\u3164\uffa0")


def storable_text(value: str | None) -> str | None:
    """Refuse text neither pool backend can store: lone surrogates (from JSON escapes) and NUL."""
    # Refused up front, else the failed write would also fail the rest of its batch.
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError("contains invalid unicode (a lone surrogate escape)") from exc
        if "\x00" in value:
            raise ValueError("contains a NUL character (\\u0000)")
    return value


def storable_keys_and_values(value: dict[str, Any] | None) -> dict[str, Any] | None:
    for key, item in (value or {}).items():
        storable_text(key)
        if isinstance(item, str):
            storable_text(item)
    return value


def has_visible_text(value: str) -> bool:
    """True when some character is a letter, digit, punctuation or symbol that actually shows."""
    return any(unicodedata.category(ch)[0] in "LNPS" and ch not in _BLANK_GLYPHS for ch in value)


def visible_text(value: str | None) -> str | None:
    """A field validator: refuse text that is only whitespace, invisible or formatting characters."""
    if value is not None and not has_visible_text(value):
        raise ValueError("has no visible characters (only whitespace, zero-width or formatting characters)")
    return value

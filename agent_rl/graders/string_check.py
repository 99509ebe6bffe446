"""OpenAI's string_check: exact or containment comparisons that score 1.0 or 0.0."""

from __future__ import annotations

from collections.abc import Callable

# input, reference -> passes
OPERATIONS: dict[str, Callable[[str, str], bool]] = {
    "eq": lambda text, reference: text == reference,
    "ne": lambda text, reference: text != reference,
    "like": lambda text, reference: reference in text,  # case-sensitive: the input contains the reference
    "ilike": lambda text, reference: reference.casefold() in text.casefold(),  # the same, ignoring case
}


def string_check(operation: str, text: str, reference: str) -> float:
    """1.0 when `operation` holds between the rendered input and reference, else 0.0."""
    return 1.0 if OPERATIONS[operation](text, reference) else 0.0

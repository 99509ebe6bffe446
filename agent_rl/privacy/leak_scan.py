"""Leak scanning, the blocking privacy check's first pass: every original value (the header directory's people,
planted canaries) found again in anonymized text, and every string of an episode to scan."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_rl.privacy.directory import CAPITALIZED, EMAILISH, bare_word, usable_name_part
from agent_rl.json_walk import strings


@dataclass
class Leak:
    """An original value found in anonymized output."""

    text_index: int
    value: str
    context: str


def scan_for_leaks(texts: Iterable[str], originals: Iterable[str]) -> list[Leak]:
    """Every occurrence of an original value (directory entries, planted canaries) in `texts`.

    Single names match as capitalized words ("Sherry", "SHERRY", not the wine "sherry"), addresses
    and anything else (full names, canary strings) case-insensitively.
    """
    words, addresses, phrases = set(), set(), set()
    for value in originals:
        value = value.strip()
        if not value:
            continue
        if "@" in value and " " not in value:
            addresses.add(value.lower())
        elif re.fullmatch(r"[^\W\d_][\w'\-]*", value):
            if usable_name_part(value):
                words.add(value.lower())
        else:
            phrases.add(value.lower())
    leaks: list[Leak] = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            continue
        lower = text.lower()
        if addresses and "@" in text:
            for m in EMAILISH.finditer(text):
                if m.group().lower().strip(".") in addresses:
                    leaks.append(Leak(i, m.group(), _context(text, m.start(), m.end())))
        for m in CAPITALIZED.finditer(text):
            word = bare_word(m.group())
            if word.lower() in words:
                leaks.append(Leak(i, word, _context(text, m.start(), m.end())))
        for phrase in phrases:
            at = lower.find(phrase)
            if at >= 0:
                leaks.append(Leak(i, text[at:at + len(phrase)], _context(text, at, at + len(phrase))))
    return leaks


def _context(text: str, start: int, end: int) -> str:
    return text[max(0, start - 30):end + 30].replace("\n", " ")


def episode_texts(episode: Mapping[str, Any]) -> list[str]:
    """Every string inside an episode (for leak scans): fields, messages, arguments, tool results, keys too;
    without recursion, so no nesting can stop the scan."""
    return list(strings(episode.model_dump(mode="json") if hasattr(episode, "model_dump") else episode))

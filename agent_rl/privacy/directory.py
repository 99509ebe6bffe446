"""Who the people of a world are, from its email headers: addresses, full names and their parts (the
anonymizer's dictionary pass and the leak scan read it), and what a name or an address looks like in text."""

from __future__ import annotations

import email.utils
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_rl.privacy.patterns import AddressPattern
from agent_rl.surrogates import TITLES


def _stop_words() -> frozenset[str]:
    from spacy.lang.en.stop_words import STOP_WORDS

    return frozenset(STOP_WORDS)


STOP_WORDS = _stop_words()


def usable_name_part(token: str) -> bool:
    """Whether a word may stand alone as a name: "Sherry" yes; "Will", "Mr", "J" no (too ambiguous)."""
    lower = token.lower()
    if _CONTRACTION.match(lower):  # "I'd", "I'm": a sentence's subject, never a name
        return False
    return len(lower) >= 2 and lower not in STOP_WORDS and lower.rstrip(".") not in TITLES and token[0].isalpha()


_CONTRACTION = re.compile(r"^i['’](?:d|m|ll|ve)$")


# A capitalised word, not inside an address ("sherry@enron.com"), yet Lotus Notes' "Taylor@ECT" counts.
CAPITALIZED = re.compile(r"(?<![\w@.])[^\W\d_a-z][\w'\-]*(?!\w|@(?![A-Z]{2,}\b))")
# An address, or what is left of one (U+FFFD: a mis-decoded byte in it); linear in the text (patterns.py).
EMAILISH = AddressPattern(r"[\w.+\-'\ufffd]", dotted=False)


def bare_word(token: str) -> str:
    """"Wendy's" -> "Wendy": possessives and trailing hyphens are not part of the name."""
    token = token[:-2] if token.endswith(("'s", "'S")) else token
    return token.rstrip("'-")


@dataclass
class Directory:
    """People known from email headers: addresses, full names and their first/last name parts."""

    addresses: set[str] = field(default_factory=set)  # lowercase
    full_names: set[str] = field(default_factory=set)
    first_names: set[str] = field(default_factory=set)  # lowercase
    last_names: set[str] = field(default_factory=set)  # lowercase

    def add_name(self, name: str) -> None:
        name = " ".join(name.replace('"', " ").split())
        if "," in name:  # "Ortiz, Sherry" -> "Sherry Ortiz"
            last, _, first = name.partition(",")
            name = f"{first.strip()} {last.strip()}".strip()
        words = [w for w in name.split() if w.lower().rstrip(".") not in TITLES]
        words = [w for w in words if re.fullmatch(r"[^\W\d_][\w'\-]*\.?", w)]
        if not words or "@" in name:
            return
        self.full_names.add(" ".join(words))
        parts = [w for w in words if usable_name_part(w.rstrip("."))]
        if len(words) == 1 and parts:
            self.first_names.add(parts[0].lower())
            return
        if usable_name_part(words[0]):
            self.first_names.add(words[0].lower())
        if usable_name_part(words[-1]):
            self.last_names.add(words[-1].lower())
        for middle in words[1:-1]:
            if usable_name_part(middle.rstrip(".")) and len(middle.rstrip(".")) > 1:
                self.first_names.add(middle.rstrip(".").lower())

    def add_address(self, display: str, address: str) -> None:
        address = address.strip().lower()
        if "@" not in address:
            return
        self.addresses.add(address)
        if display.strip():
            self.add_name(display)
            return
        local = address.split("@", 1)[0]
        pieces = [p for p in re.split(r"[._\-]", local) if p]
        # Only "first.last" style local parts are names; "vkamins" is not worth guessing.
        if len(pieces) >= 2 and all(p.isalpha() for p in pieces):
            self.add_name(" ".join(p.capitalize() for p in pieces))

    def merge(self, other: Directory) -> Directory:
        return Directory(
            self.addresses | other.addresses,
            self.full_names | other.full_names,
            self.first_names | other.first_names,
            self.last_names | other.last_names,
        )

    @property
    def name_parts(self) -> set[str]:
        return self.first_names | self.last_names

    def originals(self) -> list[str]:
        """Every original value that must not survive anonymization (for `scan_for_leaks`)."""
        parts = {p.capitalize() for p in self.name_parts}
        return sorted(self.addresses | self.full_names | parts)


# The fields of a message record that hold people: its From, To, Cc and Bcc, and the mailbox it was found in.
HEADER_FIELDS = ("sender", "to", "cc", "bcc", "inbox")


def _field(record: Any, name: str, default: Any = None) -> Any:
    return record.get(name, default) if isinstance(record, Mapping) else getattr(record, name, default)


def header_addresses(record: Any) -> list[tuple[str, str]]:
    """(display name, address) of everyone in a message record's `HEADER_FIELDS` (a mapping or an object)."""
    headers: list[str] = []
    for name in HEADER_FIELDS:
        value = _field(record, name)
        if isinstance(value, str):
            headers.append(value)
        elif isinstance(value, Iterable):  # a list, a tuple, or a set of recipients
            headers.extend(v for v in value if isinstance(v, str))
    return email.utils.getaddresses(headers)


def build_directory(emails: Iterable[Any]) -> Directory:
    """The directory of everyone in From/To/Cc/Bcc (and the mailbox owners) of these emails."""
    directory = Directory()
    for item in emails:
        for display, address in header_addresses(item):
            directory.add_address(display, address)
    return directory

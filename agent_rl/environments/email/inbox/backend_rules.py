"""Shared helpers of both store backends: keyword cleaning, duplicate keys, snippets.

Keywords are data, never query syntax: each backend turns the cleaned keyword into a quoted
phrase, so operators like OR, NEAR, *, quotes or SQL fragments are searched as plain words.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from email.utils import parseaddr

from agent_rl.records import Email

# Word characters without "_": close to what SQLite's unicode61 tokenizer keeps as token characters.
_WORD = re.compile(r"[^\W_]+")
_BARE_ADDRESS = re.compile(r"[^\s<>\"'(),;:\[\]]+")
SNIPPET_WORDS = 24


def clean_text(text: str) -> str:
    """Text any database accepts: no NUL characters, no lone surrogates."""
    if text.isascii():  # the common case, checked in O(1): ASCII has no surrogates to repair
        return text.replace("\x00", "") if "\x00" in text else text
    text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def keyword_terms(keyword: str) -> list[str]:
    """The words of one keyword as the full-text index sees them; empty when it has none (e.g. "*")."""
    return _WORD.findall(unicodedata.normalize("NFKC", clean_text(keyword)))


def sender_key(sender: str) -> str:
    """Case-insensitive address used for the sender filter; accepts "Name <addr>" too."""
    sender = clean_text(sender).strip()
    if _BARE_ADDRESS.fullmatch(sender):  # the common case; parseaddr costs ~100 us per call
        return sender.lower()
    _, address = parseaddr(sender)
    return (address or sender).strip().lower()


def content_hash(email: Email) -> str:
    """Duplicate key: the same inbox, sender, subject and body is the same email."""
    parts = (email.inbox, email.sender.strip().lower(), email.subject, email.body)
    return hashlib.sha256("\x1f".join(clean_text(p) for p in parts).encode("utf-8")).hexdigest()


def leading_snippet(body: str) -> str:
    """The start of the body, for hits found without keywords."""
    words = body.split()
    text = " ".join(words[:SNIPPET_WORDS])
    return text + ("…" if len(words) > SNIPPET_WORDS else "")


def email_from_row(row: Sequence[Any], date: datetime | None, recipients: dict[str, list[str]]) -> Email:
    """An Email from a row of (id, inbox, message_id, date, subject, sender, body, folder, file, ...);
    each backend decodes its own date column."""
    return Email(
        message_id=row[2], inbox=row[1], date=date, subject=row[4], sender=row[5], body=row[6], folder=row[7],
        file=row[8], to=tuple(recipients.get("to", ())), cc=tuple(recipients.get("cc", ())),
        bcc=tuple(recipients.get("bcc", ())),
    )

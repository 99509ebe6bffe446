"""Shared helpers of both store backends: keyword cleaning, duplicate keys, snippets.

Keywords are data, never query syntax: each backend turns the cleaned keyword into a quoted
phrase, so operators like OR, NEAR, *, quotes or SQL fragments are searched as plain words.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from email.utils import parseaddr
from typing import Any

from agent_rl.environments.email.inbox.store_interface import SearchQuery
from agent_rl.environments.email.records import Email
from agent_rl.utc import as_utc

# Word characters without "_": close to what SQLite's unicode61 tokenizer keeps as token characters.
_WORD = re.compile(r"[^\W_]+")
_BARE_ADDRESS = re.compile(r"[^\s<>\"'(),;:\[\]]+")
SNIPPET_WORDS = 24

# The email columns both backends' schemas declare alike, and their recipients table (only the id's type differs):
# written once so the two layouts cannot drift apart.
EMAIL_TEXT_COLUMNS = """subject TEXT NOT NULL DEFAULT '',
    sender TEXT NOT NULL DEFAULT '',
    sender_key TEXT NOT NULL DEFAULT '',
    body TEXT NOT NULL DEFAULT '',
    folder TEXT NOT NULL DEFAULT '',
    file TEXT NOT NULL DEFAULT '',
    content_hash TEXT NOT NULL,"""
EMAIL_UNIQUE_KEYS = """UNIQUE (inbox, message_id),
    UNIQUE (inbox, content_hash)"""


def recipients_table(id_type: str) -> str:
    """The recipients table's DDL, its email_id of the backend's id type."""
    return f"""CREATE TABLE IF NOT EXISTS recipients (
    email_id {id_type} NOT NULL REFERENCES emails (id) ON DELETE CASCADE,
    address TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('to', 'cc', 'bcc')),
    position INTEGER NOT NULL,
    UNIQUE (email_id, kind, address)
);"""


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


def batches(emails: Iterable[Email], size: int) -> Iterator[list[Email]]:
    """The emails in lists of `size` (the last shorter): each backend writes one list per transaction."""
    batch: list[Email] = []
    for email in emails:
        batch.append(email)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def recipient_entries(email: Email) -> Iterator[tuple[str, str, int]]:
    """(kind, address, position) of each recipient as stored: to, cc, then bcc, each in its written order."""
    for kind, addresses in (("to", email.to), ("cc", email.cc), ("bcc", email.bcc)):
        for position, address in enumerate(addresses):
            yield kind, clean_text(address), position


def search_filters(query: SearchQuery) -> list[tuple[str, str, Any]]:
    """A search's filters besides inbox and keywords, as (column, operator, value): "sender_key" with the sender's
    key, "date" with an aware UTC datetime; each backend writes them in its own SQL."""
    filters: list[tuple[str, str, Any]] = []
    if query.sender:
        filters.append(("sender_key", "=", sender_key(query.sender)))
    if query.sent_after is not None:
        filters.append(("date", ">=", as_utc(query.sent_after)))
    if query.sent_before is not None:
        filters.append(("date", "<", as_utc(query.sent_before)))
    return filters


def group_recipients(rows: Iterable[Sequence[Any]], found: dict[int, dict[str, list[str]]]) -> None:
    """Add rows of (email_id, kind, address), read in position order, to `found`: email id -> kind -> addresses."""
    for email_id, kind, address in rows:
        found.setdefault(email_id, {}).setdefault(kind, []).append(address)


def keyset_pages(read_page: Callable[[Any], tuple[list[Email], Any]], first: Any) -> Iterator[Email]:
    """Emails page after page: `read_page(cursor)` reads the page after `cursor` and returns it with the cursor of
    its last row; an empty page ends. Each page is its own short read, so nothing is held open between yields."""
    cursor = first
    while True:
        page, cursor = read_page(cursor)
        if not page:
            return
        yield from page

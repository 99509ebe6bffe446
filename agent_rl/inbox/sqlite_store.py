"""The default inbox store: one SQLite file with an FTS5 index (porter stemming), no server needed.

Each email's inbox is also indexed as one opaque token in the FTS table, so a search reads only
the postings of its own inbox instead of filtering matches from every mailbox afterwards.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

from agent_rl.inbox.backend_rules import (
    as_utc,
    check_max_results,
    clean_text,
    content_hash,
    keyword_terms,
    leading_snippet,
    sender_key,
)
from agent_rl.inbox.store import MAX_RESULTS, AddReport, InboxStore
from agent_rl.records import Email, SearchHit

BATCH = 5000
# FTS5 bm25 weights per column (inbox_key, subject, body): a subject hit counts double.
BM25 = "bm25(emails_fts, 0.0, 2.0, 1.0)"

SCHEMA = """
CREATE TABLE IF NOT EXISTS emails (
    id INTEGER PRIMARY KEY,
    inbox TEXT NOT NULL,
    message_id TEXT NOT NULL,
    date TEXT,              -- ISO 8601 with the original UTC offset
    date_ts REAL,           -- the same instant as Unix seconds, for filters and ordering
    subject TEXT NOT NULL DEFAULT '',
    sender TEXT NOT NULL DEFAULT '',
    sender_key TEXT NOT NULL DEFAULT '',
    body TEXT NOT NULL DEFAULT '',
    folder TEXT NOT NULL DEFAULT '',
    file TEXT NOT NULL DEFAULT '',
    content_hash TEXT NOT NULL,
    inbox_key TEXT NOT NULL,
    UNIQUE (inbox, message_id),
    UNIQUE (inbox, content_hash)
);
CREATE INDEX IF NOT EXISTS emails_inbox_date ON emails (inbox, date_ts);
CREATE INDEX IF NOT EXISTS emails_inbox_sender ON emails (inbox, sender_key, date_ts);
CREATE TABLE IF NOT EXISTS recipients (
    email_id INTEGER NOT NULL REFERENCES emails (id) ON DELETE CASCADE,
    address TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('to', 'cc', 'bcc')),
    position INTEGER NOT NULL,
    UNIQUE (email_id, kind, address)
);
CREATE VIRTUAL TABLE IF NOT EXISTS emails_fts USING fts5 (
    inbox_key, subject, body,
    content = 'emails', content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS emails_fts_insert AFTER INSERT ON emails BEGIN
    INSERT INTO emails_fts (rowid, inbox_key, subject, body)
    VALUES (new.id, new.inbox_key, new.subject, new.body);
END;
CREATE TRIGGER IF NOT EXISTS emails_fts_delete AFTER DELETE ON emails BEGIN
    INSERT INTO emails_fts (emails_fts, rowid, inbox_key, subject, body)
    VALUES ('delete', old.id, old.inbox_key, old.subject, old.body);
END;
"""

_INSERT_EMAIL = """
INSERT OR IGNORE INTO emails
    (inbox, message_id, date, date_ts, subject, sender, sender_key, body, folder, file, content_hash, inbox_key)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
# Recipients attach only to the row this very email created (same id and same content).
_INSERT_RECIPIENT = """
INSERT OR IGNORE INTO recipients (email_id, address, kind, position)
SELECT id, ?, ?, ? FROM emails WHERE inbox = ? AND message_id = ? AND content_hash = ?
"""


def inbox_key(inbox: str) -> str:
    """One FTS token per inbox: letters only, so no tokenizer or stemmer can split or merge two inboxes."""
    digest = hashlib.sha256(inbox.encode("utf-8")).digest()[:12]
    return "ibx" + "".join(chr(ord("a") + b % 26) for b in digest)


def fts_phrase(words: list[str]) -> str:
    """A quoted FTS5 phrase; the words contain no quotes, so nothing in them is query syntax."""
    return '"' + " ".join(words).replace('"', '""') + '"'


def _path_of(url: str) -> Path:
    for prefix in ("sqlite:///", "sqlite://"):
        if url.startswith(prefix):
            rest = url[len(prefix):]
            if rest and rest != ":memory:":
                return Path(rest.split("?", 1)[0])
    raise ValueError(f"SQLite inbox URL {url!r}: expected sqlite:///PATH/TO/inbox.db")


class SQLiteInboxStore(InboxStore):
    """InboxStore on a SQLite file (WAL mode, safe to share between threads of one process)."""

    def __init__(self, url: str) -> None:
        self.path = _path_of(url)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA cache_size=-65536")  # 64 MB: bulk FTS inserts touch many index pages
        with self._lock:
            self._db.executescript(SCHEMA)

    # -- writing -------------------------------------------------------------------------------

    def add_emails(self, emails: Iterable[Email]) -> AddReport:
        report = AddReport()
        batch: list[Email] = []
        for email in emails:
            batch.append(email)
            if len(batch) >= BATCH:
                self._add_batch(batch, report)
                batch = []
        if batch:
            self._add_batch(batch, report)
        return report

    def _add_batch(self, batch: list[Email], report: AddReport) -> None:
        rows, recipients = [], []
        for email in batch:
            inbox, message_id = clean_text(email.inbox), clean_text(email.message_id)
            digest = content_hash(email)
            rows.append((
                inbox, message_id,
                email.date.isoformat() if email.date else None,
                as_utc(email.date).timestamp() if email.date else None,
                clean_text(email.subject), clean_text(email.sender), sender_key(email.sender),
                clean_text(email.body), clean_text(email.folder), clean_text(email.file),
                digest, inbox_key(inbox),
            ))
            for kind, addresses in (("to", email.to), ("cc", email.cc), ("bcc", email.bcc)):
                for position, address in enumerate(addresses):
                    recipients.append((clean_text(address), kind, position, inbox, message_id, digest))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                # rowcount sums sqlite3_changes(), which leaves out the FTS trigger's own writes.
                inserted = self._db.executemany(_INSERT_EMAIL, rows).rowcount
                self._db.executemany(_INSERT_RECIPIENT, recipients)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        report.inserted += inserted
        report.duplicates += len(rows) - inserted

    # -- reading -------------------------------------------------------------------------------

    def search(
        self,
        inbox: str,
        keywords: list[str],
        sender: str | None = None,
        sent_after: datetime | None = None,
        sent_before: datetime | None = None,
        max_results: int = MAX_RESULTS,
    ) -> list[SearchHit]:
        check_max_results(max_results)
        inbox = clean_text(inbox)
        keywords = [keywords] if isinstance(keywords, str) else keywords  # one keyword, not its letters
        phrases = [fts_phrase(terms) for terms in map(keyword_terms, keywords) if terms]
        filters, params = ["e.inbox = ?"], [inbox]
        if sender:
            filters.append("e.sender_key = ?")
            params.append(sender_key(sender))
        if sent_after is not None:
            filters.append("e.date_ts >= ?")
            params.append(as_utc(sent_after).timestamp())
        if sent_before is not None:
            filters.append("e.date_ts < ?")
            params.append(as_utc(sent_before).timestamp())
        where = " AND ".join(filters)
        with self._lock:
            if not phrases:
                rows = self._db.execute(
                    f"SELECT e.id, e.message_id, e.subject, e.sender, e.date, e.body FROM emails e "
                    f"WHERE {where} ORDER BY e.date_ts IS NULL, e.date_ts DESC, e.id DESC LIMIT ?",
                    (*params, max_results),
                ).fetchall()
                return [self._hit(row, leading_snippet(row[5])) for row in rows]
            match = f"inbox_key : {fts_phrase([inbox_key(inbox)])} AND {{subject body}} : ({' AND '.join(phrases)})"
            # CROSS JOIN keeps the FTS index as the driving table; the other order scans the inbox.
            rows = self._db.execute(
                f"SELECT e.id, e.message_id, e.subject, e.sender, e.date, {BM25} AS score "
                f"FROM emails_fts CROSS JOIN emails e ON e.id = emails_fts.rowid "
                f"WHERE emails_fts MATCH ? AND {where} "
                f"ORDER BY score, e.date_ts IS NULL, e.date_ts DESC, e.id DESC LIMIT ?",
                (match, *params, max_results),
            ).fetchall()
            snippets = self._snippets(match, [row[0] for row in rows])
        return [self._hit(row, snippets.get(row[0], "")) for row in rows]

    def _snippets(self, match: str, ids: list[int]) -> dict[int, str]:
        """Snippets only for the returned hits: computing them in the ranking query costs one per match."""
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self._db.execute(
            f"SELECT rowid, snippet(emails_fts, 2, '', '', '…', {16}), snippet(emails_fts, 1, '', '', '…', 16) "
            f"FROM emails_fts WHERE emails_fts MATCH ? AND rowid IN ({marks})",
            (match, *ids),
        ).fetchall()
        return {rowid: (body_snippet.strip() or subject_snippet) for rowid, body_snippet, subject_snippet in rows}

    @staticmethod
    def _hit(row: tuple, snippet: str) -> SearchHit:
        return SearchHit(
            message_id=row[1],
            subject=row[2],
            sender=row[3],
            date=datetime.fromisoformat(row[4]) if row[4] else None,
            snippet=snippet,
        )

    def read(self, inbox: str, message_id: str) -> Email | None:
        with self._lock:
            row = self._db.execute(
                "SELECT id, inbox, message_id, date, subject, sender, body, folder, file FROM emails "
                "WHERE inbox = ? AND message_id = ?",
                (clean_text(inbox), clean_text(message_id)),
            ).fetchone()
            if row is None:
                return None
            return self._email(row, self._recipients([row[0]]).get(row[0], {}))

    def _recipients(self, ids: list[int]) -> dict[int, dict[str, list[str]]]:
        found: dict[int, dict[str, list[str]]] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            rows = self._db.execute(
                f"SELECT email_id, kind, address FROM recipients WHERE email_id IN ({','.join('?' * len(chunk))}) "
                f"ORDER BY email_id, kind, position",
                chunk,
            )
            for email_id, kind, address in rows:
                found.setdefault(email_id, {}).setdefault(kind, []).append(address)
        return found

    @staticmethod
    def _email(row: tuple, recipients: dict[str, list[str]]) -> Email:
        return Email(
            message_id=row[2],
            inbox=row[1],
            date=datetime.fromisoformat(row[3]) if row[3] else None,
            subject=row[4],
            sender=row[5],
            body=row[6],
            folder=row[7],
            file=row[8],
            to=tuple(recipients.get("to", ())),
            cc=tuple(recipients.get("cc", ())),
            bcc=tuple(recipients.get("bcc", ())),
        )

    def inboxes(self) -> list[str]:
        with self._lock:
            return [row[0] for row in self._db.execute("SELECT DISTINCT inbox FROM emails ORDER BY inbox")]

    def count(self, inbox: str | None = None) -> int:
        with self._lock:
            if inbox is None:
                return self._db.execute("SELECT count(*) FROM emails").fetchone()[0]
            return self._db.execute("SELECT count(*) FROM emails WHERE inbox = ?", (inbox,)).fetchone()[0]

    def iter_emails(self, inbox: str) -> Iterator[Email]:
        last = (0, float("-inf"), 0)  # keyset pagination: (date is null, date_ts, id)
        while True:
            with self._lock:
                rows = self._db.execute(
                    "SELECT id, inbox, message_id, date, subject, sender, body, folder, file, "
                    "date_ts IS NULL AS undated, coalesce(date_ts, 0) AS ts FROM emails WHERE inbox = ? "
                    "AND (date_ts IS NULL, coalesce(date_ts, 0), id) > (?, ?, ?) "
                    "ORDER BY undated, ts, id LIMIT 1000",
                    (inbox, *last),
                ).fetchall()
                recipients = self._recipients([row[0] for row in rows])
            if not rows:
                return
            for row in rows:
                yield self._email(row, recipients.get(row[0], {}))
            last = (rows[-1][9], rows[-1][10], rows[-1][0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

"""The default inbox store: one SQLite file with FTS5 indexes (porter stemming), no server needed.

Each inbox has its own FTS5 table over the shared `emails` rows, so a search reads only its own
mailbox's postings: bm25's document frequencies (which FTS5 counts by reading a word's whole
doclist) cover one inbox instead of the whole corpus, and no inbox filter runs per match.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

from agent_rl.disk import use_wal
from agent_rl.environments.email.inbox.backend_rules import (
    EMAIL_TEXT_COLUMNS, EMAIL_UNIQUE_KEYS, batches, clean_text, content_hash, email_from_row, group_recipients,
    keyset_pages, keyword_terms, leading_snippet, recipient_entries, recipients_table, search_filters, sender_key,
)
from agent_rl.environments.email.inbox.store_interface import AddReport, InboxStore, SearchQuery
from agent_rl.environments.email.records import Email, SearchHit
from agent_rl.utc import as_utc

log = logging.getLogger(__name__)

BATCH = 5000
# PRAGMA user_version of the layout below. Version 0 files (one FTS table for all inboxes, keyed by
# an inbox_key column) are migrated when opened; files from a newer version are refused.
SCHEMA_VERSION = 1
TOKENIZE = "porter unicode61 remove_diacritics 2"
# bm25 weights per FTS column (subject, body): a subject hit counts double.
BM25_WEIGHTS = "2.0, 1.0"
SNIPPET_TOKENS = 16
# Matches ranked past the last place, to see every match tied with it (emails of equal length and
# word counts score the same, so ties are common): only a longer tie needs the exact, slower query.
TIE_WINDOW = 40
# An add that grows an inbox's index by at least this share merges it into one segment afterwards:
# each extra segment costs every later search a seek, and merging a small addition is not worth it.
OPTIMIZE_SHARE = 0.2

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS emails (
    id INTEGER PRIMARY KEY,
    inbox TEXT NOT NULL,
    message_id TEXT NOT NULL,
    date TEXT,              -- ISO 8601 with the original UTC offset
    date_ts REAL,           -- the same instant as Unix seconds, for filters and ordering
    {EMAIL_TEXT_COLUMNS}
    {EMAIL_UNIQUE_KEYS}
);
CREATE INDEX IF NOT EXISTS emails_inbox_date ON emails (inbox, date_ts);
CREATE INDEX IF NOT EXISTS emails_inbox_sender ON emails (inbox, sender_key, date_ts);
-- What ranking reads for every match: small entries keep those lookups off the wide email rows.
CREATE INDEX IF NOT EXISTS emails_rank ON emails (id, date_ts, sender_key);
{recipients_table('INTEGER')}
-- One row per inbox: its slot names the inbox FTS table (fts_<slot>), so no address is ever SQL.
CREATE TABLE IF NOT EXISTS inboxes (
    slot INTEGER PRIMARY KEY,
    inbox TEXT NOT NULL UNIQUE
);
"""

_INSERT_EMAIL = """
INSERT OR IGNORE INTO emails
    (inbox, message_id, date, date_ts, subject, sender, sender_key, body, folder, file, content_hash)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
# Recipients attach only to the row this very email created (same id and same content).
_INSERT_RECIPIENT = """
INSERT OR IGNORE INTO recipients (email_id, address, kind, position)
SELECT id, ?, ?, ? FROM emails WHERE inbox = ? AND message_id = ? AND content_hash = ?
"""


def fts_phrase(words: list[str]) -> str:
    """A quoted FTS5 phrase; the words contain no quotes, so nothing in them is query syntax."""
    return '"' + " ".join(words).replace('"', '""') + '"'


def fts_table(slot: int) -> str:
    return f"fts_{int(slot)}"


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
        self._slots: dict[str, int] = {}  # inbox -> slot; a slot never changes once given
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        try:
            use_wal(self._db)
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute("PRAGMA cache_size=-65536")  # 64 MB: bulk FTS inserts touch many index pages
            # Reads map the file instead of copying each page through the 64 MB cache (SQLite caps it at 2 GB).
            self._db.execute("PRAGMA mmap_size=2147483648")
            with self._lock:
                self._prepare_schema()
        except BaseException:
            self._db.close()
            raise

    # -- schema --------------------------------------------------------------------------------

    def _prepare_schema(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"inbox store {self.path} has schema version {version}, newer than this agent-rl "
                f"understands ({SCHEMA_VERSION}); upgrade agent-rl or use another file"
            )
        self._db.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have created or migrated the file while we waited for the lock.
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version < SCHEMA_VERSION:
                self._create_or_migrate()
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _create_or_migrate(self) -> None:
        """Create the layout, or turn a version 0 file (one shared FTS table) into per-inbox indexes."""
        tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "emails" in tables:
            log.warning("inbox store %s: moving to schema version %d (one index per inbox); "
                        "this reindexes every email once", self.path, SCHEMA_VERSION)
        self._db.execute("DROP TRIGGER IF EXISTS emails_fts_insert")
        self._db.execute("DROP TRIGGER IF EXISTS emails_fts_delete")
        if "emails_fts" in tables:
            self._db.execute("DROP TABLE emails_fts")
        if "emails" in tables:
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(emails)")}
            if "inbox_key" in columns:
                self._db.execute("ALTER TABLE emails DROP COLUMN inbox_key")
        for statement in SCHEMA.split(";"):
            if statement.strip():
                self._db.execute(statement)
        inboxes = [row[0] for row in self._db.execute("SELECT DISTINCT inbox FROM emails ORDER BY inbox")]
        for inbox in inboxes:
            table = fts_table(self._slot(inbox, create=True))
            self._db.execute(
                f"INSERT INTO {table} (rowid, subject, body) SELECT id, subject, body FROM emails WHERE inbox = ?",
                (inbox,),
            )
            self._db.execute(f"INSERT INTO {table} ({table}) VALUES ('optimize')")
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _slot(self, inbox: str, create: bool = False) -> int | None:
        """The inbox's slot (its FTS table's number); with create, make both when missing."""
        slot = self._slots.get(inbox)
        if slot is not None:
            return slot
        row = self._db.execute("SELECT slot FROM inboxes WHERE inbox = ?", (inbox,)).fetchone()
        if row is None:
            if not create:
                return None
            slot = self._db.execute("INSERT INTO inboxes (inbox) VALUES (?) RETURNING slot", (inbox,)).fetchone()[0]
            self._db.execute(
                f"CREATE VIRTUAL TABLE {fts_table(slot)} USING fts5 (subject, body, "
                f"content = 'emails', content_rowid = 'id', tokenize = '{TOKENIZE}')"
            )
            # Not cached: the creating transaction may still roll back.
            return slot
        self._slots[inbox] = row[0]
        return row[0]

    # -- writing -------------------------------------------------------------------------------

    def add_emails(self, emails: Iterable[Email]) -> AddReport:
        report = AddReport()
        added: dict[str, int] = {}  # inbox -> emails indexed by this call
        for batch in batches(emails, BATCH):
            self._add_batch(batch, report, added)
        self._merge_grown_indexes(added)
        return report

    def _add_batch(self, batch: list[Email], report: AddReport, added: dict[str, int]) -> None:
        rows, recipients, texts = [], [], {}
        for email in batch:
            inbox, message_id = clean_text(email.inbox), clean_text(email.message_id)
            digest = content_hash(email)
            subject, body = clean_text(email.subject), clean_text(email.body)
            rows.append((
                inbox, message_id,
                email.date.isoformat() if email.date else None,
                as_utc(email.date).timestamp() if email.date else None,
                subject, clean_text(email.sender), sender_key(email.sender),
                body, clean_text(email.folder), clean_text(email.file),
                digest,
            ))
            # The content hash covers subject and body: one (inbox, hash) always has the same text.
            texts[inbox, digest] = (subject, body)
            for kind, address, position in recipient_entries(email):
                recipients.append((address, kind, position, inbox, message_id, digest))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                # A new INTEGER PRIMARY KEY is always above the current maximum: that is how the
                # rows this batch created (not the ignored duplicates) are found for indexing.
                before = self._db.execute("SELECT coalesce(max(id), 0) FROM emails").fetchone()[0]
                inserted = self._db.executemany(_INSERT_EMAIL, rows).rowcount
                self._db.executemany(_INSERT_RECIPIENT, recipients)
                new_rows: dict[str, list[tuple[int, str, str]]] = {}
                for email_id, inbox, digest in self._db.execute(
                    "SELECT id, inbox, content_hash FROM emails WHERE id > ?", (before,)
                ):
                    new_rows.setdefault(inbox, []).append((email_id, *texts[inbox, digest]))
                for inbox, fts_rows in new_rows.items():
                    table = fts_table(self._slot(inbox, create=True))
                    self._db.executemany(f"INSERT INTO {table} (rowid, subject, body) VALUES (?, ?, ?)", fts_rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        for inbox, fts_rows in new_rows.items():
            added[inbox] = added.get(inbox, 0) + len(fts_rows)
        report.inserted += inserted
        report.duplicates += len(rows) - inserted

    def _merge_grown_indexes(self, added: dict[str, int]) -> None:
        for inbox, count in added.items():
            with self._lock:
                total = self._db.execute("SELECT count(*) FROM emails WHERE inbox = ?", (inbox,)).fetchone()[0]
                if count >= OPTIMIZE_SHARE * total:
                    table = fts_table(self._slot(inbox))
                    self._db.execute(f"INSERT INTO {table} ({table}) VALUES ('optimize')")

    # -- reading -------------------------------------------------------------------------------

    def _search(self, query: SearchQuery) -> list[SearchHit]:
        inbox, keywords, max_results = clean_text(query.inbox), query.keywords, query.max_results
        keywords = [keywords] if isinstance(keywords, str) else keywords  # one keyword, not its letters
        phrases = [fts_phrase(terms) for terms in map(keyword_terms, keywords) if terms]
        filters, params = [], []
        for column, operator, value in search_filters(query):
            if column == "date":  # compared as Unix seconds, the date_ts column
                column, value = "date_ts", value.timestamp()
            filters.append(f"e.{column} {operator} ?")
            params.append(value)
        with self._lock:
            if not phrases:
                rows = self._db.execute(
                    f"SELECT e.id, e.message_id, e.subject, e.sender, e.date, e.body FROM emails e "
                    f"WHERE {' AND '.join(['e.inbox = ?', *filters])} "
                    f"ORDER BY e.date_ts IS NULL, e.date_ts DESC, e.id DESC LIMIT ?",
                    (inbox, *params, max_results),
                ).fetchall()
                return [self._hit(row, leading_snippet(row[5])) for row in rows]
            slot = self._slot(inbox)
            if slot is None:
                return []
            table, match = fts_table(slot), " AND ".join(phrases)
            ranked = self._rank(table, match, filters, params, max_results)
            rows = self._details(inbox, [email_id for email_id, _ in ranked])
            # best bm25 first (FTS5 scores are negative), then the newest, then the latest stored
            ranked.sort(key=lambda hit: (hit[1], *self._newest_first(rows.get(hit[0]), hit[0])))
            best = [email_id for email_id, _ in ranked if email_id in rows][:max_results]
            snippets = self._snippets(table, match, best)
        return [self._hit(rows[email_id], snippets.get(email_id, "")) for email_id in best]

    def _rank(self, table: str, match: str, filters: list[str], params: list, limit: int) -> list[tuple[int, float]]:
        """(id, bm25) of the best `limit` matches, plus any tied with the last place (dates break ties)."""
        score = f"bm25({table}, {BM25_WEIGHTS})"
        if not filters:
            # The index alone ranks; dates (a row lookup each) are read only for the matches tied
            # with the last place, which the window shows unless the tie runs past its end.
            window = limit + TIE_WINDOW
            ranked = self._db.execute(
                f"SELECT rowid, {score} AS score FROM {table} WHERE {table} MATCH ? ORDER BY score LIMIT ?",
                (match, window),
            ).fetchall()
            if len(ranked) <= limit:
                return ranked
            last = ranked[limit - 1][1]
            if len(ranked) < window or ranked[-1][1] != last:
                return ranked[:limit] + [hit for hit in ranked[limit:] if hit[1] == last]
        # CROSS JOIN keeps the FTS index as the driving table; the other order scans the inbox.
        return self._db.execute(
            f"SELECT f.rowid, {score} AS score FROM {table} f CROSS JOIN emails e INDEXED BY emails_rank "
            f"ON e.id = f.rowid "
            f"WHERE {table} MATCH ? {''.join(' AND ' + f for f in filters)} "
            f"ORDER BY score, e.date_ts IS NULL, e.date_ts DESC, e.id DESC LIMIT ?",
            (match, *params, limit),
        ).fetchall()

    def _details(self, inbox: str, ids: list[int]) -> dict[int, tuple]:
        if not ids:
            return {}
        # "+inbox" keeps the planner on the id lookups: the inbox index would walk the whole mailbox.
        rows = self._db.execute(
            f"SELECT id, message_id, subject, sender, date, date_ts FROM emails "
            f"WHERE id IN ({','.join('?' * len(ids))}) AND +inbox = ?",
            (*ids, inbox),
        )
        return {row[0]: row for row in rows}

    @staticmethod
    def _newest_first(row: tuple | None, email_id: int) -> tuple:
        date_ts = row[5] if row is not None else None
        return (date_ts is None, -(date_ts or 0.0), -email_id)

    def _snippets(self, table: str, match: str, ids: list[int]) -> dict[int, str]:
        """Snippets only for the returned hits: computing them in the ranking query costs one per match."""
        if not ids:
            return {}

        def column_snippets(column: int, wanted: list[int]) -> dict[int, str]:
            return dict(self._db.execute(
                f"SELECT rowid, snippet({table}, {column}, '', '', '…', {SNIPPET_TOKENS}) FROM {table} "
                f"WHERE {table} MATCH ? AND rowid IN ({','.join('?' * len(wanted))})",
                (match, *wanted),
            ))

        # The body around the match; the subject only for emails whose body is empty.
        snippets = {email_id: text.strip() for email_id, text in column_snippets(1, ids).items()}
        bodiless = [email_id for email_id in ids if not snippets.get(email_id)]
        if bodiless:
            snippets.update(column_snippets(0, bodiless))
        return snippets

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
            group_recipients(rows, found)
        return found

    @staticmethod
    def _email(row: tuple, recipients: dict[str, list[str]]) -> Email:
        return email_from_row(row, datetime.fromisoformat(row[3]) if row[3] else None, recipients)

    def inboxes(self) -> list[str]:
        with self._lock:
            return [row[0] for row in self._db.execute("SELECT DISTINCT inbox FROM emails ORDER BY inbox")]

    def count(self, inbox: str | None = None) -> int:
        with self._lock:
            if inbox is None:
                return self._db.execute("SELECT count(*) FROM emails").fetchone()[0]
            return self._db.execute("SELECT count(*) FROM emails WHERE inbox = ?", (inbox,)).fetchone()[0]

    def iter_emails(self, inbox: str) -> Iterator[Email]:
        # keyset pagination: (date is null, date_ts, id)
        return keyset_pages(lambda last: self._page(inbox, last), (0, float("-inf"), 0))

    def _page(self, inbox: str, last: tuple[int, float, int]) -> tuple[list[Email], tuple[int, float, int]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, inbox, message_id, date, subject, sender, body, folder, file, "
                "date_ts IS NULL AS undated, coalesce(date_ts, 0) AS ts FROM emails WHERE inbox = ? "
                "AND (date_ts IS NULL, coalesce(date_ts, 0), id) > (?, ?, ?) "
                "ORDER BY undated, ts, id LIMIT 1000",
                (inbox, *last),
            ).fetchall()
            recipients = self._recipients([row[0] for row in rows])
        emails = [self._email(row, recipients.get(row[0], {})) for row in rows]
        return emails, (rows[-1][9], rows[-1][10], rows[-1][0]) if rows else last

    def close(self) -> None:
        with self._lock:
            self._db.close()

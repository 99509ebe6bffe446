"""The production inbox store: PostgreSQL full-text search (stored tsvector + GIN index).

Text is indexed with an English snowball stemmer that keeps stopwords, so a keyword like "the"
or "will" is searched like any other word (as SQLite FTS5 does) instead of being dropped.
Bulk adds go through COPY into a temporary table and one INSERT ... ON CONFLICT DO NOTHING.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from agent_rl.environments.email.inbox.backend_rules import (
    EMAIL_TEXT_COLUMNS, EMAIL_UNIQUE_KEYS, batches, clean_text, content_hash, email_from_row, group_recipients,
    keyset_pages, keyword_terms, leading_snippet, recipient_entries, recipients_table, search_filters, sender_key,
)
from agent_rl.environments.email.inbox.store_interface import AddReport, InboxStore, SearchQuery
from agent_rl.environments.email.records import Email, SearchHit
from agent_rl.settings import sqlalchemy_url
from agent_rl.utc import as_utc

BATCH = 5000
TS_CONFIG = "agent_rl_english"
# tsvector holds at most 1 MB; huge bodies (pasted attachments) are indexed by their start.
INDEXED_BODY_CHARS = 200_000
HEADLINE = "MaxWords=24, MinWords=10, MaxFragments=1, FragmentDelimiter=…, StartSel=\"\", StopSel=\"\""

_TEXT_SEARCH_CONFIG = f"""
CREATE TEXT SEARCH DICTIONARY {TS_CONFIG}_stem (TEMPLATE = snowball, Language = english);
CREATE TEXT SEARCH CONFIGURATION {TS_CONFIG} (COPY = pg_catalog.english);
ALTER TEXT SEARCH CONFIGURATION {TS_CONFIG}
    ALTER MAPPING FOR asciiword, asciihword, hword_asciipart, word, hword, hword_part WITH {TS_CONFIG}_stem;
"""

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS emails (
    id BIGSERIAL PRIMARY KEY,
    inbox TEXT NOT NULL,
    message_id TEXT NOT NULL,
    date TIMESTAMPTZ,
    utc_offset_minutes INTEGER,  -- the sender's zone, so dates read back as written
    {EMAIL_TEXT_COLUMNS}
    search TSVECTOR GENERATED ALWAYS AS (
        setweight(to_tsvector('{TS_CONFIG}'::regconfig, left(subject, 10000)), 'A') ||
        setweight(to_tsvector('{TS_CONFIG}'::regconfig, left(body, {INDEXED_BODY_CHARS})), 'B')
    ) STORED,
    {EMAIL_UNIQUE_KEYS}
);
CREATE INDEX IF NOT EXISTS emails_search ON emails USING GIN (search);
CREATE INDEX IF NOT EXISTS emails_inbox_date ON emails (inbox, date);
CREATE INDEX IF NOT EXISTS emails_inbox_sender ON emails (inbox, sender_key, date);
{recipients_table('BIGINT')}
"""

_STAGE = """
CREATE TEMPORARY TABLE IF NOT EXISTS stage_emails (
    seq INTEGER, inbox TEXT, message_id TEXT, date TIMESTAMPTZ, utc_offset_minutes INTEGER, subject TEXT, sender TEXT,
    sender_key TEXT, body TEXT, folder TEXT, file TEXT, content_hash TEXT
) ON COMMIT DELETE ROWS;
CREATE TEMPORARY TABLE IF NOT EXISTS stage_recipients (
    seq INTEGER, address TEXT, kind TEXT, position INTEGER
) ON COMMIT DELETE ROWS;
"""

# One statement: insert the new emails, then the recipients of exactly those rows.
_MERGE = """
WITH inserted AS (
    INSERT INTO emails (inbox, message_id, date, utc_offset_minutes, subject, sender, sender_key, body, folder, file,
                        content_hash)
    SELECT inbox, message_id, date, utc_offset_minutes, subject, sender, sender_key, body, folder, file, content_hash
    FROM stage_emails ORDER BY seq
    ON CONFLICT DO NOTHING
    RETURNING id, inbox, message_id, content_hash
), attached AS (
    INSERT INTO recipients (email_id, address, kind, position)
    SELECT i.id, r.address, r.kind, r.position
    FROM inserted i
    JOIN stage_emails s ON s.inbox = i.inbox AND s.message_id = i.message_id AND s.content_hash = i.content_hash
    JOIN stage_recipients r ON r.seq = s.seq
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM inserted), (SELECT count(*) FROM attached)
"""


def _offset(value: datetime | None) -> int | None:
    if value is None:
        return None
    offset = value.utcoffset()
    return int(offset.total_seconds() // 60) if offset is not None else 0


def _local(value: datetime | None, offset_minutes: int | None) -> datetime | None:
    if value is None:
        return None
    return value.astimezone(timezone(timedelta(minutes=offset_minutes or 0)))


class PostgresInboxStore(InboxStore):
    """InboxStore on PostgreSQL; `url` may be postgresql://, postgres:// or postgresql+psycopg://."""

    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(sqlalchemy_url(url), pool_pre_ping=True)
        self._create_schema()

    def _create_schema(self) -> None:
        with self.engine.begin() as conn:
            # Several processes may open a fresh database at once; one of them creates the schema.
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('agent_rl_inbox_schema'))")
            exists = conn.exec_driver_sql(
                "SELECT 1 FROM pg_ts_config WHERE cfgname = %s AND cfgnamespace = current_schema()::regnamespace",
                (TS_CONFIG,),
            ).first()
            if not exists:
                conn.exec_driver_sql(_TEXT_SEARCH_CONFIG)
            conn.exec_driver_sql(_SCHEMA)

    # -- writing -------------------------------------------------------------------------------

    def add_emails(self, emails: Iterable[Email]) -> AddReport:
        report = AddReport()
        for batch in batches(emails, BATCH):
            self._add_batch(batch, report)
        return report

    def _add_batch(self, batch: list[Email], report: AddReport) -> None:
        with self.engine.begin() as conn:
            raw = conn.connection.driver_connection  # psycopg 3 connection, for COPY
            with raw.cursor() as cur:
                cur.execute(_STAGE)
                with cur.copy(
                    "COPY stage_emails (seq, inbox, message_id, date, utc_offset_minutes, subject, sender, sender_key, body, "
                    "folder, file, content_hash) FROM STDIN"
                ) as copy:
                    for seq, email in enumerate(batch):
                        copy.write_row((
                            seq, clean_text(email.inbox), clean_text(email.message_id),
                            as_utc(email.date) if email.date else None, _offset(email.date),
                            clean_text(email.subject), clean_text(email.sender), sender_key(email.sender),
                            clean_text(email.body), clean_text(email.folder), clean_text(email.file),
                            content_hash(email),
                        ))
                with cur.copy("COPY stage_recipients (seq, address, kind, position) FROM STDIN") as copy:
                    for seq, email in enumerate(batch):
                        for kind, address, position in recipient_entries(email):
                            copy.write_row((seq, address, kind, position))
                cur.execute(_MERGE)
                inserted = cur.fetchone()[0]
        report.inserted += inserted
        report.duplicates += len(batch) - inserted

    # -- reading -------------------------------------------------------------------------------

    def _tsquery(self, conn: sa.Connection, keywords: list[str]) -> str | None:
        """AND of one phrase query per keyword, as tsquery text; None when no keyword has a word."""
        keywords = [keywords] if isinstance(keywords, str) else keywords  # one keyword, not its letters
        texts = [" ".join(terms) for terms in map(keyword_terms, keywords) if terms]
        if not texts:
            return None
        rows = conn.execute(
            sa.text(f"SELECT phraseto_tsquery('{TS_CONFIG}', k)::text FROM unnest(CAST(:kws AS text[])) k"),
            {"kws": texts},
        ).scalars()
        parts = [f"({text})" for text in rows if text]
        # A keyword with no indexable lexeme (e.g. a lone "_") can never match: no results.
        return " & ".join(parts) if len(parts) == len(texts) else ""

    def _search(self, query: SearchQuery) -> list[SearchHit]:
        filters, params = ["inbox = :inbox"], {"inbox": clean_text(query.inbox), "n": query.max_results}
        for number, (column, operator, value) in enumerate(search_filters(query)):
            filters.append(f"{column} {operator} :f{number}")
            params[f"f{number}"] = value
        where = " AND ".join(filters)
        with self.engine.connect() as conn:
            tsquery = self._tsquery(conn, query.keywords)
            if tsquery == "":
                return []
            if tsquery is None:
                rows = conn.execute(
                    sa.text(
                        f"SELECT id, message_id, subject, sender, date, utc_offset_minutes, left(body, 2000) FROM emails WHERE {where} "
                        f"ORDER BY date DESC NULLS LAST, id DESC LIMIT :n"
                    ),
                    params,
                ).all()
                return [self._hit(row, leading_snippet(row[6])) for row in rows]
            params["q"] = tsquery
            rows = conn.execute(
                sa.text(
                    f"SELECT id, message_id, subject, sender, date, utc_offset_minutes, ts_rank(search, q) AS score "
                    f"FROM emails, CAST(:q AS tsquery) q WHERE search @@ q AND {where} "
                    f"ORDER BY score DESC, date DESC NULLS LAST, id DESC LIMIT :n"
                ),
                params,
            ).all()
            snippets = self._snippets(conn, tsquery, [row[0] for row in rows])
        return [self._hit(row, snippets.get(row[0], "")) for row in rows]

    def _snippets(self, conn: sa.Connection, query: str, ids: list[int]) -> dict[int, str]:
        if not ids:
            return {}
        rows = conn.execute(
            sa.text(
                f"SELECT id, ts_headline('{TS_CONFIG}', left(body, 20000), CAST(:q AS tsquery), :opts), "
                f"ts_headline('{TS_CONFIG}', subject, CAST(:q AS tsquery), :opts), "
                f"to_tsvector('{TS_CONFIG}', left(body, {INDEXED_BODY_CHARS})) @@ CAST(:q AS tsquery) "
                f"FROM emails WHERE id = ANY(:ids)"
            ),
            {"q": query, "ids": ids, "opts": HEADLINE},
        ).all()
        # Show the body around the match, or the subject when only the subject matched.
        return {row[0]: " ".join((row[1] if row[3] else row[2]).split()) for row in rows}

    @staticmethod
    def _hit(row: sa.Row, snippet: str) -> SearchHit:
        return SearchHit(message_id=row[1], subject=row[2], sender=row[3], date=_local(row[4], row[5]), snippet=snippet)

    def read(self, inbox: str, message_id: str) -> Email | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.text(
                    "SELECT id, inbox, message_id, date, subject, sender, body, folder, file, utc_offset_minutes FROM emails "
                    "WHERE inbox = :inbox AND message_id = :mid"
                ),
                {"inbox": clean_text(inbox), "mid": clean_text(message_id)},
            ).first()
            if row is None:
                return None
            return self._email(row, self._recipients(conn, [row[0]]).get(row[0], {}))

    @staticmethod
    def _recipients(conn: sa.Connection, ids: list[int]) -> dict[int, dict[str, list[str]]]:
        found: dict[int, dict[str, list[str]]] = {}
        rows = conn.execute(
            sa.text(
                "SELECT email_id, kind, address FROM recipients WHERE email_id = ANY(:ids) "
                "ORDER BY email_id, kind, position"
            ),
            {"ids": ids},
        )
        group_recipients(rows, found)
        return found

    @staticmethod
    def _email(row: sa.Row, recipients: dict[str, list[str]]) -> Email:
        return email_from_row(row, _local(row[3], row[9]), recipients)

    def inboxes(self) -> list[str]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.text("SELECT DISTINCT inbox FROM emails ORDER BY inbox")).scalars())

    def count(self, inbox: str | None = None) -> int:
        with self.engine.connect() as conn:
            if inbox is None:
                return conn.execute(sa.text("SELECT count(*) FROM emails")).scalar_one()
            return conn.execute(
                sa.text("SELECT count(*) FROM emails WHERE inbox = :inbox"), {"inbox": inbox}
            ).scalar_one()

    def iter_emails(self, inbox: str) -> Iterator[Email]:
        # Keyset pagination over (undated, date, id): no server-side cursor held between yields.
        return keyset_pages(lambda last: self._page(inbox, last), (False, float("-inf"), 0))

    def _page(self, inbox: str, last: tuple[bool, float, int]) -> tuple[list[Email], tuple[bool, float, int]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT id, inbox, message_id, date, subject, sender, body, folder, file, utc_offset_minutes, "
                    "date IS NULL AS undated, coalesce(extract(epoch FROM date), 0)::float8 AS d FROM emails "
                    "WHERE inbox = :inbox "
                    "AND (date IS NULL, coalesce(extract(epoch FROM date), 0)::float8, id) > (:u, :d, :id) "
                    "ORDER BY undated, d, id LIMIT 1000"
                ),
                {"inbox": inbox, "u": last[0], "d": last[1], "id": last[2]},
            ).all()
            recipients = self._recipients(conn, [row[0] for row in rows])
        emails = [self._email(row, recipients.get(row[0], {})) for row in rows]
        return emails, (rows[-1][10], rows[-1][11], rows[-1][0]) if rows else last

    def close(self) -> None:
        self.engine.dispose()

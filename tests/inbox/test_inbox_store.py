"""The InboxStore contract, run against both real backends (SQLite FTS5 and PostgreSQL) via `store_url`."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.environments.email.records import Email

ALICE = "alice@corp.example"
BOB = "bob@corp.example"


def utc(day: int, hour: int = 12) -> datetime:
    return datetime(2001, 5, day, hour, tzinfo=timezone.utc)


def email(n: int, inbox: str = ALICE, **fields) -> Email:
    values = dict(
        message_id=f"<{n}@corp.example>",
        inbox=inbox,
        date=utc(1 + n % 28),
        subject=f"Status report {n}",
        sender="Carol@Corp.Example",
        to=(inbox,),
        body=f"Routine numbers for week {n}.",
    )
    values.update(fields)
    return Email(**values)


@pytest.fixture
def store(store_url):
    opened = open_inbox_store(store_url)
    yield opened
    opened.close()


def test_add_reports_inserted_and_duplicates(store):
    emails = [email(n) for n in range(5)]
    assert store.add_emails(emails).inserted == 5
    again = store.add_emails(emails)
    assert (again.inserted, again.duplicates) == (0, 5)
    # Same inbox, sender, subject and body under a new Message-ID is still the same email.
    copy = email(0, message_id="<copy-of-0@corp.example>", folder="all_documents")
    assert store.add_emails([copy]).duplicates == 1
    # The same email in another mailbox belongs to that inbox too.
    assert store.add_emails([email(0, inbox=BOB)]).inserted == 1
    assert (store.count(), store.count(ALICE), store.count(BOB)) == (6, 5, 1)
    assert store.inboxes() == [ALICE, BOB]


def test_duplicates_inside_one_batch_are_stored_once(store):
    report = store.add_emails([email(1), email(1), email(1, message_id="<other@x>")])
    assert (report.inserted, report.duplicates) == (1, 2)


def test_read_returns_full_email_and_isolates_inboxes(store):
    original = email(
        7,
        to=("dave@corp.example", "erin@corp.example"),
        cc=("frank@corp.example",),
        bcc=("grace@corp.example",),
        body="Full body\nwith two lines, ünïcödé and a forwarded part:\n> quoted",
        folder="inbox",
        file="alice/inbox/7.",
    )
    store.add_emails([original, email(8, inbox=BOB)])
    assert store.read(ALICE, original.message_id) == original
    pacific = email(9, date=datetime(2001, 5, 14, 16, 39, tzinfo=timezone(timedelta(hours=-7))))
    store.add_emails([pacific])
    # Dates read back in the sender's zone, not only as the same instant.
    assert store.read(ALICE, pacific.message_id).date.utcoffset() == timedelta(hours=-7)
    assert store.search(ALICE, ["report", "9"])[0].date.isoformat() == "2001-05-14T16:39:00-07:00"
    # Another inbox's message is "not found", never its content.
    assert store.read(BOB, original.message_id) is None
    assert store.read(ALICE, email(8).message_id) is None
    assert store.read(ALICE, "<missing@corp.example>") is None


def test_search_requires_all_keywords_and_is_scoped_to_the_inbox(store):
    store.add_emails([
        email(1, body="The pipeline capacity auction closes Friday."),
        email(2, body="Capacity planning for the west desk."),
        email(3, inbox=BOB, body="Pipeline capacity auction for Bob only."),
    ])
    hits = store.search(ALICE, ["pipeline", "capacity"])
    assert [hit.message_id for hit in hits] == [email(1).message_id]
    assert "auction" in hits[0].snippet
    assert hits[0].subject == "Status report 1" and hits[0].sender == "Carol@Corp.Example"
    assert hits[0].date == utc(2)
    assert {hit.message_id for hit in store.search(ALICE, ["capacity"])} == {email(1).message_id, email(2).message_id}
    assert [hit.message_id for hit in store.search(BOB, ["auction"])] == [email(3).message_id]
    assert store.search("nobody@corp.example", ["capacity"]) == []
    assert [hit.message_id for hit in store.search(BOB, "auction")] == [email(3).message_id]  # a bare string


def test_search_stems_words(store):
    store.add_emails([email(1, body="We are meeting the traders tomorrow.")])
    assert [hit.message_id for hit in store.search(ALICE, ["meetings", "trader"])] == [email(1).message_id]


def test_search_ranks_better_matches_first_and_newest_on_ties(store):
    store.add_emails([
        email(1, subject="Lunch", body="gas gas gas gas storage report gas", date=utc(1)),
        email(2, subject="Lunch", body="one mention of gas in a long body " + "filler " * 40, date=utc(2)),
        email(3, subject="Same", body="identical text about gas", date=utc(3)),
        email(4, subject="Same", body="identical text about gas ", date=utc(9)),
    ])
    hits = [hit.message_id for hit in store.search(ALICE, ["gas"])]
    assert hits[0] == email(1).message_id
    assert hits.index(email(4).message_id) < hits.index(email(3).message_id) < hits.index(email(2).message_id)


def test_search_filters_by_sender_and_dates(store):
    store.add_emails([
        email(1, sender="trader@corp.example", date=utc(1), body="budget"),
        email(2, sender="Trader@Corp.Example", date=utc(10), body="budget"),
        email(3, sender="other@corp.example", date=utc(10), body="budget"),
        email(4, sender="trader@corp.example", date=utc(20), body="budget"),
        email(5, sender="trader@corp.example", date=None, body="budget"),
    ])

    def ids(**filters):
        return {hit.message_id for hit in store.search(ALICE, ["budget"], **filters)}

    from_trader = {email(n).message_id for n in (1, 2, 4, 5)}
    assert ids(sender="TRADER@corp.example") == from_trader
    assert ids(sender="The Trader <trader@corp.example>") == from_trader
    # sent_after is inclusive, sent_before exclusive; undated emails drop out of date filters.
    assert ids(sent_after=utc(10)) == {email(n).message_id for n in (2, 3, 4)}
    assert ids(sent_before=utc(10)) == {email(1).message_id}
    assert ids(sender="trader@corp.example", sent_after=utc(2), sent_before=utc(15)) == {email(2).message_id}
    # A filter without a zone is read as UTC.
    assert ids(sent_after=datetime(2001, 5, 20, 12)) == {email(4).message_id}
    # Without keywords the filters alone select, newest first.
    newest = store.search(ALICE, [], sender="trader@corp.example", max_results=2)
    assert [hit.message_id for hit in newest] == [email(4).message_id, email(2).message_id]


@pytest.mark.parametrize("bad", [0, 11, -1, 100])
def test_max_results_out_of_range_is_a_clear_error(store, bad):
    with pytest.raises(ValueError, match=r"max_results must be between 1 and 10"):
        store.search(ALICE, ["x"], max_results=bad)


def test_max_results_limits_hits(store):
    store.add_emails([email(n, body="quarterly forecast") for n in range(15)])
    assert len(store.search(ALICE, ["forecast"])) == 10
    assert len(store.search(ALICE, ["forecast"], max_results=3)) == 3


NASTY_KEYWORDS = [
    '"', '""', "'", "*", "mee*", "NEAR", "NEAR(a b)", "OR", "AND", "NOT", "-", "-gas", "subject:gas", ":",
    "(", ")", "(gas", "^gas", "'; DROP TABLE emails; --", "%", "_", "\\", "", "   ", "a & b | !c <-> d",
    "Zürich", "日本語", "emoji 🚀", "\x00", "{subject}", "gas OR oil",
]


@pytest.mark.parametrize("keyword", NASTY_KEYWORDS)
def test_keywords_are_searched_literally(store, keyword):
    store.add_emails([email(1, body="gas and oil NEAR the OR desk in Zürich; DROP TABLE emails")])
    hits = store.search(ALICE, [keyword])  # must never raise
    assert len(hits) <= 1
    assert store.count() == 1  # and never run as SQL


def test_query_words_match_as_plain_words(store):
    store.add_emails([
        email(1, body="Meet me NEAR the OR station, not the AND station."),
        email(2, body="The table was dropped from the agenda."),
    ])
    assert [hit.message_id for hit in store.search(ALICE, ["NEAR", "OR"])] == [email(1).message_id]
    assert store.search(ALICE, ["gas OR oil"]) == []  # "OR" is a word to find, not an operator
    assert store.search(ALICE, ["'; DROP TABLE emails; --"]) == []
    assert store.count() == 2


def test_unicode_text_is_found(store):
    store.add_emails([email(1, subject="Réunion à Zürich", body="Le café est prêt. 日本語のテキスト")])
    assert [hit.message_id for hit in store.search(ALICE, ["Zürich"])] == [email(1).message_id]
    assert [hit.message_id for hit in store.search(ALICE, ["café"])] == [email(1).message_id]


def test_iter_emails_oldest_first_with_undated_last(store):
    store.add_emails([email(1, date=utc(9)), email(2, date=None), email(3, date=utc(2)), email(4, inbox=BOB)])
    assert [e.message_id for e in store.iter_emails(ALICE)] == [email(n).message_id for n in (3, 1, 2)]
    assert next(store.iter_emails(ALICE)).to == (ALICE,)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keywords=st.lists(st.text(max_size=20), max_size=4), max_results=st.integers(1, 10))
def test_any_keywords_never_raise(store, keywords, max_results):
    if store.count() == 0:
        store.add_emails([email(n, body=f"gas oil (NEAR) \"quoted\" * {n}") for n in range(12)])
        store.add_emails([email(99, inbox=BOB, body="gas oil")])
    hits = store.search(ALICE, keywords, max_results=max_results)
    assert len(hits) <= max_results
    assert all(store.read(ALICE, hit.message_id) is not None for hit in hits)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(word=st.from_regex(r"[a-z]{3,12}", fullmatch=True))
def test_any_stored_word_is_found(store, word):
    store.add_emails([email(1000, message_id=f"<{word}@x>", subject=f"about {word}", body=f"zz {word} yy")])
    assert f"<{word}@x>" in {hit.message_id for hit in store.search(ALICE, [word])}


def test_store_reopens_with_its_data(store_url):
    first = open_inbox_store(store_url)
    first.add_emails([email(1)])
    first.close()
    again = open_inbox_store(store_url)
    try:
        assert again.count() == 1
        assert again.add_emails([email(1)]).duplicates == 1
    finally:
        again.close()


def test_sqlite_url_creates_parent_directories(tmp_path):
    store = open_inbox_store(f"sqlite:///{tmp_path}/a/b/c/inbox.db")
    try:
        store.add_emails([email(1)])
        assert (tmp_path / "a" / "b" / "c" / "inbox.db").exists()
    finally:
        store.close()


@pytest.mark.postgres
def test_plain_postgresql_url_is_accepted(pg_url):
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://")
    store = open_inbox_store(plain)
    try:
        store.add_emails([email(1, date=datetime(2001, 5, 1, 9, tzinfo=timezone(timedelta(hours=-7))))])
        assert store.read(ALICE, email(1).message_id).date == datetime(2001, 5, 1, 16, tzinfo=timezone.utc)
    finally:
        store.close()


def ids_of(hits) -> list[str]:
    return [hit.message_id for hit in hits]


@pytest.mark.parametrize("ties", [15, 60])
def test_ties_are_broken_by_newest_date_however_many_tie(store, ties):
    # Same subject length, same body: every email scores the same, so only the date orders them.
    tied = [
        email(n, subject=f"Note {n}", body="identical text about gas", date=utc(1) + timedelta(hours=n))
        for n in range(ties)
    ]
    best = email(100, subject="Gas", body="gas gas gas storage", date=utc(1))
    store.add_emails([best, *tied])
    newest = [tied[n].message_id for n in range(ties - 1, ties - 10, -1)]
    assert ids_of(store.search(ALICE, ["gas"])) == [best.message_id, *newest]
    # The same order when a filter is applied to every match.
    assert ids_of(store.search(ALICE, ["gas"], sender="carol@corp.example")) == [best.message_id, *newest]
    newest_three = [tied[ties - n].message_id for n in (1, 2, 3)]
    assert ids_of(store.search(ALICE, ["identical", "gas"], max_results=3)) == newest_three


def test_readding_keeps_one_hit_per_email(store):
    emails = [email(n, body=f"pipeline outage number {n}") for n in range(12)]
    store.add_emails(emails)
    store.add_emails(emails)
    store.add_emails(reversed(emails))
    hits = ids_of(store.search(ALICE, ["outage"]))
    assert len(hits) == len(set(hits)) == 10


def test_later_email_reusing_an_ignored_message_id_is_indexed_with_its_own_text(store):
    store.add_emails([email(1)])
    content_copy = email(1, message_id="<reused@corp.example>")  # a duplicate by content: skipped
    different = email(2, message_id="<reused@corp.example>", body="The zebra crossing report.")
    report = store.add_emails([content_copy, different])
    assert (report.inserted, report.duplicates) == (1, 1)
    hits = store.search(ALICE, ["zebra"])
    assert ids_of(hits) == ["<reused@corp.example>"] and "zebra" in hits[0].snippet
    assert store.search(ALICE, ["week", "1"])[0].message_id == email(1).message_id


def test_interleaved_inboxes_in_one_add_stay_isolated(store):
    inboxes = [f"user{i}@corp.example" for i in range(5)]
    store.add_emails(
        email(n, inbox=inboxes[n % 5], body=f"shared words plus marker{n % 5}") for n in range(40)
    )
    for i, inbox in enumerate(inboxes):
        assert len(store.search(inbox, ["shared", "words"])) == 8
        assert len(store.search(inbox, [f"marker{i}"])) == 8
        assert store.search(inbox, [f"marker{(i + 1) % 5}"]) == []


def test_subject_is_the_snippet_when_the_body_is_empty(store):
    store.add_emails([email(1, subject="Quarterly gas forecast", body="")])
    hits = store.search(ALICE, ["forecast"])
    assert ids_of(hits) == [email(1).message_id] and "forecast" in hits[0].snippet


def test_inbox_added_by_another_connection_is_searchable(store_url):
    reader, writer = open_inbox_store(store_url), open_inbox_store(store_url)
    try:
        assert reader.search(ALICE, ["pipeline"]) == []
        writer.add_emails([email(1, body="pipeline news")])
        assert ids_of(reader.search(ALICE, ["pipeline"])) == [email(1).message_id]
    finally:
        reader.close()
        writer.close()


# The layout written before per-inbox indexes (schema version 0): one FTS table for all inboxes.
SCHEMA_V0 = """
CREATE TABLE emails (
    id INTEGER PRIMARY KEY, inbox TEXT NOT NULL, message_id TEXT NOT NULL, date TEXT, date_ts REAL,
    subject TEXT NOT NULL DEFAULT '', sender TEXT NOT NULL DEFAULT '', sender_key TEXT NOT NULL DEFAULT '',
    body TEXT NOT NULL DEFAULT '', folder TEXT NOT NULL DEFAULT '', file TEXT NOT NULL DEFAULT '',
    content_hash TEXT NOT NULL, inbox_key TEXT NOT NULL,
    UNIQUE (inbox, message_id), UNIQUE (inbox, content_hash)
);
CREATE INDEX emails_inbox_date ON emails (inbox, date_ts);
CREATE INDEX emails_inbox_sender ON emails (inbox, sender_key, date_ts);
CREATE TABLE recipients (
    email_id INTEGER NOT NULL REFERENCES emails (id) ON DELETE CASCADE, address TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('to', 'cc', 'bcc')), position INTEGER NOT NULL,
    UNIQUE (email_id, kind, address)
);
CREATE VIRTUAL TABLE emails_fts USING fts5 (
    inbox_key, subject, body, content = 'emails', content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER emails_fts_insert AFTER INSERT ON emails BEGIN
    INSERT INTO emails_fts (rowid, inbox_key, subject, body) VALUES (new.id, new.inbox_key, new.subject, new.body);
END;
CREATE TRIGGER emails_fts_delete AFTER DELETE ON emails BEGIN
    INSERT INTO emails_fts (emails_fts, rowid, inbox_key, subject, body)
    VALUES ('delete', old.id, old.inbox_key, old.subject, old.body);
END;
"""


def write_v0_file(path, emails: list[Email]) -> None:
    from agent_rl.environments.email.inbox.backend_rules import content_hash, sender_key

    db = sqlite3.connect(path)
    db.executescript(SCHEMA_V0)
    for e in emails:
        email_id = db.execute(
            "INSERT INTO emails (inbox, message_id, date, date_ts, subject, sender, sender_key, body, content_hash, "
            "inbox_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (e.inbox, e.message_id, e.date.isoformat(), e.date.timestamp(), e.subject, e.sender, sender_key(e.sender),
             e.body, content_hash(e), "ibx" + e.inbox.split("@")[0]),
        ).lastrowid
        db.executemany(
            "INSERT INTO recipients (email_id, address, kind, position) VALUES (?, ?, 'to', ?)",
            [(email_id, address, position) for position, address in enumerate(e.to)],
        )
    db.commit()
    db.close()


def test_sqlite_file_of_schema_v0_is_migrated_when_opened(tmp_path):
    from agent_rl.environments.email.inbox.sqlite_store import SCHEMA_VERSION

    path = tmp_path / "old.db"
    old = [email(1, body="The pipeline capacity auction."), email(2, body="Gas desk notes."),
           email(3, inbox=BOB, body="Pipeline capacity for Bob.")]
    write_v0_file(path, old)
    store = open_inbox_store(f"sqlite:///{path}")
    try:
        assert store.count() == 3 and store.inboxes() == [ALICE, BOB]
        assert store.read(ALICE, old[0].message_id) == old[0]
        hits = store.search(ALICE, ["pipeline", "capacity"])
        assert ids_of(hits) == [old[0].message_id] and "auction" in hits[0].snippet
        assert ids_of(store.search(BOB, ["pipeline"])) == [old[2].message_id]
        # Duplicates of migrated emails are still recognised; new emails are searchable.
        assert store.add_emails(old).duplicates == 3
        store.add_emails([email(4, body="Pipeline maintenance window.")])
        assert {hit.message_id for hit in store.search(ALICE, ["pipeline"])} == {old[0].message_id, email(4).message_id}
    finally:
        store.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        assert "emails_fts" not in names and "emails_fts_insert" not in names
        assert "inbox_key" not in {row[1] for row in db.execute("PRAGMA table_info(emails)")}
    finally:
        db.close()
    again = open_inbox_store(f"sqlite:///{path}")  # a migrated file opens as it is
    try:
        assert again.count() == 4 and len(again.search(ALICE, ["pipeline"])) == 2
    finally:
        again.close()


def test_sqlite_file_from_a_newer_version_is_refused_clearly(tmp_path):
    path = tmp_path / "future.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(RuntimeError, match=r"schema version 99, newer than"):
        open_inbox_store(f"sqlite:///{path}")


def test_switching_to_wal_waits_out_another_process_holding_the_file(tmp_path):
    """Several arbiter workers open one store at start-up: one of them switching the file to WAL while another holds
    it failed with "database is locked" at once. The switch now waits (here a connection with no busy timeout of its
    own, so only the retry can wait) until the lock is gone."""
    import threading
    import time

    from agent_rl.disk import use_wal

    path = tmp_path / "inbox.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("create table t (x)")
    holder.execute("begin exclusive")
    impatient = sqlite3.connect(path, isolation_level=None, timeout=0)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        impatient.execute("PRAGMA journal_mode=WAL")  # what the store did before
    release = threading.Timer(0.3, lambda: holder.execute("commit"))
    release.start()
    started = time.monotonic()
    use_wal(impatient, wait_s=10)
    assert time.monotonic() - started >= 0.2
    assert impatient.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    release.join()
    impatient.close()
    holder.close()


def test_many_processes_open_one_new_store_together(tmp_path):
    import multiprocessing

    # Plain processes joined with a deadline, not a Pool: a Pool's exit terminates its spawned workers and has hung
    # joining one that was still starting up on a busy machine.
    url = f"sqlite:///{tmp_path / 'shared' / 'inbox.db'}"
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [context.Process(target=_open_and_count, args=(url, results)) for _ in range(6)]
    for worker in workers:
        worker.start()
    try:
        counts = [results.get(timeout=300) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.kill()
                worker.join()
    assert counts == [0] * 6
    assert [worker.exitcode for worker in workers] == [0] * 6


def _open_and_count(url: str, results) -> None:
    store = open_inbox_store(url)
    try:
        results.put(len(store.inboxes()))
    finally:
        store.close()

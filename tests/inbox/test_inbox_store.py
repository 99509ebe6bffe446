"""The InboxStore contract, run against both real backends (SQLite FTS5 and PostgreSQL) via `store_url`."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_rl.inbox.store import open_inbox_store
from agent_rl.records import Email

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

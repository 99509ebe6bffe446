"""The demo corpus: size, determinism, realistic structure, and facts that point at the emails stating them."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from agent_rl.environments.email.inbox.demo_corpus import DOMAIN, build_demo_corpus, generate_demo_corpus
from agent_rl.environments.email.records import Category
from agent_rl.reward.judge import contains_answer


@pytest.fixture(scope="module")
def corpus():
    return generate_demo_corpus(seed=0)


def test_default_size_is_at_least_eight_inboxes_and_4000_emails(corpus):
    assert len(corpus.inboxes) >= 8
    assert len(corpus.emails) >= 4000
    assert all(re.fullmatch(rf"[a-z]+\.[a-z]+@{re.escape(DOMAIN)}", inbox) for inbox in corpus.inboxes)
    per_inbox = Counter(e.inbox for e in corpus.emails)
    assert min(per_inbox.values()) >= 400


def test_same_seed_same_corpus_other_seed_other_corpus(corpus):
    again = generate_demo_corpus(seed=0)
    assert [e.model_dump() for e in again.emails] == [e.model_dump() for e in corpus.emails]
    assert again.facts == corpus.facts
    other = generate_demo_corpus(seed=1)
    assert [e.body for e in other.emails] != [e.body for e in corpus.emails]


def test_message_ids_are_unique_and_no_email_is_a_verbatim_duplicate(corpus):
    assert len({e.message_id for e in corpus.emails}) == len(corpus.emails)
    assert len({(e.inbox, e.sender, e.subject, e.body) for e in corpus.emails}) == len(corpus.emails)


def test_mailboxes_look_like_real_mail(corpus):
    bodies = [e.body for e in corpus.emails]
    assert sum("\n> " in b and " wrote:\n" in b for b in bodies) > 200  # replies quote the previous message
    assert sum("---------- Forwarded message ----------" in b for b in bodies) > 20
    assert sum("\n--\n" in b for b in bodies) > 1000  # signatures
    assert sum(e.subject.startswith("Northwind Weekly") for e in corpus.emails) > 50  # newsletters
    assert sum(e.subject.startswith("[ServiceDesk]") for e in corpus.emails) > 50  # automated noise
    assert {e.folder for e in corpus.emails} == {"inbox", "sent_items"}
    # people appear by full address in headers and by first name in the bodies
    assert all(e.sender and e.to for e in corpus.emails)
    assert sum(bool(e.cc) for e in corpus.emails) > 100
    assert sum(b.startswith(("Hi ", "Hello ", "Hey ", "Good morning ")) for b in bodies) > 1000


def test_facts_cover_five_categories_in_every_inbox(corpus):
    for inbox in corpus.inboxes:
        categories = Counter(f.category for f in corpus.facts if f.inbox == inbox)
        assert set(categories) == set(Category) - {Category.UNANSWERABLE}
        assert min(categories.values()) >= 5


def test_every_fact_is_stated_by_its_source_emails_in_its_own_inbox(corpus):
    for fact in corpus.facts:
        assert fact.source_ids, fact.id
        for source_id in fact.source_ids:
            email = corpus.email(source_id)
            assert email.inbox == fact.inbox
            assert contains_answer(email.body, fact.value), (fact.id, fact.value, email.body)
            assert email.date <= fact.stated_at


def test_corrected_facts_keep_the_corrected_value_from_the_correcting_reply(corpus):
    corrected = [f for f in corpus.facts if f.corrected]
    assert len(corrected) >= 40
    assert {f.category for f in corrected} == set(Category) - {Category.UNANSWERABLE}
    for fact in corrected:
        assert fact.value != fact.original_value
        [source] = fact.source_ids
        email = corpus.email(source)
        assert email.subject.startswith("Re: ")
        new_text = email.body.split(" wrote:\n")[0]  # what the reply says, before the quoted original
        assert contains_answer(new_text, fact.value)
        quoted = email.body.split(" wrote:\n", 1)[1]
        assert contains_answer(quoted, fact.original_value), "the quoted original should show the old value"


def test_people_have_realistic_names_in_bodies_and_headers(corpus):
    person_facts = [f for f in corpus.facts if f.category == Category.PERSON]
    for fact in person_facts[:20]:
        first, last = fact.value.split(" ", 1)
        assert first[0].isupper() and last[0].isupper()
        address = f"{first}.{last}".lower().replace("'", "") + f"@{DOMAIN}"
        assert any(address in (e.sender, *e.to, *e.cc) for e in corpus.emails)


def test_small_corpora_and_bad_sizes():
    small = generate_demo_corpus(seed=3, n_inboxes=2, n_emails=120)
    assert len(small.inboxes) == 2 and len(small.emails) >= 120 and small.facts
    with pytest.raises(ValueError, match="n_inboxes"):
        generate_demo_corpus(n_inboxes=0)
    with pytest.raises(ValueError, match="n_emails"):
        generate_demo_corpus(n_inboxes=8, n_emails=10)


def test_build_writes_every_email_into_a_real_sqlite_store(sqlite_url):
    from agent_rl.environments.email.inbox.store import open_inbox_store

    store = open_inbox_store(sqlite_url)
    try:
        corpus = build_demo_corpus(store, seed=0)
        assert store.count() == len(corpus.emails)
        assert sorted(store.inboxes()) == corpus.inboxes
        fact = next(f for f in corpus.facts if f.category == Category.AMOUNT)
        stored = store.read(fact.inbox, fact.source_ids[0])
        assert stored is not None and stored.body == corpus.email(fact.source_ids[0]).body
        words = fact.key.split()[:2]
        hits = store.search(fact.inbox, words)
        assert hits, f"searching {words} in {fact.inbox} found nothing"
        other_inbox = next(i for i in corpus.inboxes if i != fact.inbox)
        assert store.read(other_inbox, fact.source_ids[0]) is None
    finally:
        store.close()


def test_build_works_on_both_store_backends(store_url):
    from agent_rl.environments.email.inbox.store import open_inbox_store

    store = open_inbox_store(store_url)
    try:
        corpus = build_demo_corpus(store, seed=5, n_inboxes=2, n_emails=200)
        assert store.count() == len(corpus.emails) == 200
        for inbox in corpus.inboxes:
            assert [e.message_id for e in store.iter_emails(inbox)] == [e.message_id for e in corpus.emails_of(inbox)]
        again = build_demo_corpus(store, seed=5, n_inboxes=2, n_emails=200)  # idempotent: all duplicates
        assert store.count() == len(again.emails)
    finally:
        store.close()

"""The patterns curation runs over whole texts find exactly what the old, quadratic ones found.

The old patterns could begin a match anywhere inside a run of the characters they repeat, so they read a long
run again from every position (211 s on one 200 KB episode for the address pattern; cubic for message ids). The
new ones (agent_rl/privacy/patterns.py, leak_check.py) start once per run or per `@`; here they are compared with the old
ones on realistic text and on random text over the characters that matter to each.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl.curation import leak_check
from agent_rl.privacy.directory import EMAILISH
from agent_rl.privacy.leak_check import LeakAuditor
from agent_rl.privacy.patterns import MESSAGE_ID

# The patterns as they were: the reference.
OLD = {
    "address": re.compile(r"[\w.+\-']+@[\w\-]+(?:\.[\w\-]+)+"),
    "emailish": re.compile(r"[\w.+\-'\ufffd]+@[\w\-]+(?:\.[\w\-]+)*"),
    "message id": re.compile(r"<[^<>\s@]*\d{4,}[^<>\s@]*@[^<>\s]+>"),
    "lotus": re.compile(r"([A-Z][\w'’\-]*(?:[ \t]+(?:\n[ \t]*)?[A-Z][\w'’\-.]*){0,3})(?=[/@][A-Z]{2,}\b)"),
    "inverted": re.compile(r"\b([A-Z][a-zA-Z'’\-]+),[ \t]+([A-Z][a-zA-Z'’\-]+)\b"),
}
NEW = {"address": leak_check._ADDRESS, "emailish": EMAILISH, "message id": MESSAGE_ID,
       "lotus": leak_check._LOTUS, "inverted": leak_check._INVERTED}
# What the old ones' callers read: the whole match, or the name groups.
GROUPS = {"lotus": (1,), "inverted": (1, 2)}
# The characters that decide each pattern's matches, and a few that do not.
ALPHABETS = {
    "address": "ab.+-'@ _1é\ufffdX\n",
    "emailish": "ab.+-'@ _1\ufffd",
    "message id": "<>@ 12a.\n",
    "lotus": "AbCD /@'’-.\t\n1é_x",
    "inverted": "AbC, \t'’-1_éx",
}
REALISTIC = [
    "Please write to sherry.ortiz@northwind-energy.com or o'neil+bids@mail.contoso.org.",
    "Sent by: Alan Aronowitz@ECT on 05/14/2001; cc: Joseph P Hirl/HOU/ECT@ECT, Mary Heinitz/NA/Enron@Enron",
    "Message-ID: <8069939.1075855675628.JavaMail.evans@thyme> and a garbled <000022.9c9aa1\ufffdea@mail.enron.com>",
    "Farmer, Daren\nLowry, Donna J.\nto: O'Neil-Smith, Patrick; jeff.dasovich@enron.com.",
    "A cut address sherry.ortiz@north\u2026, one with a mis-decoded byte sh\ufffdrry@enron.com, a trailing dot x@y.com",
    "Call 713-853-5158 about the $1,250,000 deal with Goldman, Sachs & Co. on 2001-05-14.",
    '{"results":[{"from":"kay.mann@enron.com","subject":"Re: ECT/HOU gas","id":"<123456.JavaMail@x>"}]}',
    "-----Original Message-----\nFrom: \tTaylor, Mark E </O=ENRON/OU=NA/CN=RECIPIENTS/CN=MTAYLOR>",
]


def spans(pattern, text: str, name: str) -> list:
    groups = GROUPS.get(name)
    if groups:
        return [tuple(m.span(g) for g in groups) for m in pattern.finditer(text)]
    return [m.span() for m in pattern.finditer(text)]


@pytest.mark.parametrize("name", sorted(OLD))
def test_same_matches_as_the_old_patterns_on_realistic_text(name):
    for text in REALISTIC:
        assert spans(NEW[name], text, name) == spans(OLD[name], text, name), text


@pytest.mark.parametrize("name", sorted(OLD))
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_same_matches_as_the_old_patterns_on_random_text(name, data):
    text = data.draw(st.text(alphabet=ALPHABETS[name], max_size=40))
    assert spans(NEW[name], text, name) == spans(OLD[name], text, name)


def test_addresses_are_replaced_and_searched_as_before():
    for text in REALISTIC:
        assert leak_check._ADDRESS.sub(" ", text) == OLD["address"].sub(" ", text)
        assert EMAILISH.sub(lambda m: m.group().upper(), text) == OLD["emailish"].sub(lambda m: m.group().upper(), text)
        found, old = EMAILISH.search(text), OLD["emailish"].search(text)
        assert (found.span() if found else None) == (old.span() if old else None)


@pytest.mark.parametrize("run", ["a" * 100_000, "A" * 100_000, "A-" * 50_000, "<" + "1" * 100_000, "a.b-" * 25_000])
def test_a_long_run_is_read_once_and_holds_no_match(run):
    """The inputs that made the old patterns quadratic (or cubic): each holds nothing to find."""
    for name, pattern in NEW.items():
        assert list(pattern.finditer(run)) == [], name


def test_the_auditor_learns_and_finds_the_same_values_with_many_addresses_in_one_text():
    """The auditor's loops over a text's addresses and message ids look each up once (bisect), not per address."""
    people = [f"person{i}.example{i}@northwind-energy.com" for i in range(300)]
    text = " ".join(f"write to {a} about <{1000 + i}.JavaMail.evans@thyme>;" for i, a in enumerate(people))
    auditor = LeakAuditor(b"salt")
    auditor.learn_text(text)
    assert auditor.addresses == set(people)  # the message ids' tails are no one's address
    found = auditor.scan("episodes.jsonl", "line 1", {"body": text})
    assert sorted(f.kind for f in found) == ["address"] * 300


def _old_non_overlapping(spans: list) -> list:
    """The anonymizer's span choice as it was: every span checked against every kept one."""
    kept: list = []
    for span in sorted(spans, key=lambda s: (-(s.end - s.start), -s.score, s.start)):
        if all(span.end <= k.start or span.start >= k.end for k in kept):
            kept.append(span)
    return sorted(kept, key=lambda s: s.start)


span_lists = st.lists(st.tuples(st.integers(0, 30), st.integers(1, 8), st.sampled_from([0.4, 0.85, 1.0])),
                      max_size=12)


@settings(max_examples=400, deadline=None)
@given(raw=span_lists)
def test_the_anonymizer_keeps_the_same_spans_as_before(raw):
    from agent_rl.privacy.anonymize import _non_overlapping, _Span

    spans = [_Span(start, start + length, "PERSON", score) for start, length, score in raw]
    assert _non_overlapping(spans) == _old_non_overlapping(spans)


def test_the_context_enhancer_finds_the_token_presidio_finds():
    from presidio_analyzer.context_aware_enhancers import LemmaContextAwareEnhancer

    from agent_rl.privacy.presidio_engines import _context_enhancer, _engines

    text = ("Call Marguerite at (713) 555-0199 or write to m.l@x.com; acct #: 4471-0093-2210  twice  spaced.\n"
            "Card 4111 1111 1111 1111, IBAN DE89 3704 0044 0532 0130 00, from 10.0.0.1 on 2001-05-14.")
    doc = _engines().nlp.make_doc(text)
    indices = [token.idx for token in doc]
    ours = _context_enhancer()
    for start in range(len(text)):
        assert ours._find_index_of_match_token("w", start, doc, indices) == \
            LemmaContextAwareEnhancer._find_index_of_match_token("w", start, doc, indices), start

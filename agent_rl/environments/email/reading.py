"""How the email assistant's teacher reads text: the content words and proper phrases of a question, where an
email's own text and its quoted text are, how relevant a hit or an email is, and the answer an email gives
(a date, time, amount, count, name, place or status) without the scenarios' oracle."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, NamedTuple

from agent_rl.environments.email.records import Category

STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more most my
    myself no nor not now of off on once only or other our ours out over own same she should so some such
    than that the their theirs them then there these they this those through to too under until up very
    was we were what when where which while who whom whose why will with would you your yours yourself
    email emails mail inbox message sent send say said tell told get got know new many much time day date
    going go let us also please thanks thank regarding re fw fwd subject what's who's where's when's how's
    i'm we're supposed need needs""".split()
)
_WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9'&.-]*[A-Za-z0-9]|[0-9][0-9,.]*")
_PHRASE_WORD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9'&-]*")
_POSSESSIVE_RE = re.compile(r"'s$")
# Questions, hit texts and emails repeat across turns and episodes (every turn re-reads the whole
# conversation), so the pure text functions below are memoized; the bounds keep memory flat in
# long-running servers (entries are at most a few KB: a subject and a cut body).
TEXT_CACHE = 8192
def content_words(text: str) -> list[str]:
    """Distinct non-stop words of `text`, in order."""
    return list(_content_words(text))


@lru_cache(maxsize=TEXT_CACHE)
def _content_words(text: str) -> tuple[str, ...]:
    words: dict[str, None] = {}  # insertion-ordered set
    for word in _WORD_RE.findall(text):
        token = word.strip(".,'").lower()
        if len(token) > 1 and token not in STOP_WORDS:
            words[token] = None
    return tuple(words)


@lru_cache(maxsize=TEXT_CACHE)
def _word_set(text: str) -> frozenset[str]:
    """The distinct content words of `text`, lower-cased, for membership tests."""
    return frozenset(_content_words(text.lower()))


def proper_phrases(question: str) -> list[str]:
    """Runs of capitalized words ("Timber Ridge", "Trident Electrical Supply"): the most distinctive keywords."""
    return list(_phrases(question))


@lru_cache(maxsize=TEXT_CACHE)
def _phrases(question: str) -> tuple[str, ...]:
    phrases, run = [], []
    for index, word in enumerate(_PHRASE_WORD_RE.findall(question)):
        token = _POSSESSIVE_RE.sub("", word)
        proper = (token[:1].isupper() or token[:1].isdigit()) and token.lower() not in STOP_WORDS and index > 0
        if proper:
            run.append(token)
            if token != word and len(run) > 0:  # "Samuel's Regulatory Affairs": the possessive ends a name
                phrases.append(" ".join(run))
                run = []
        elif run:
            phrases.append(" ".join(run))
            run = []
    if run:
        phrases.append(" ".join(run))
    return tuple(dict.fromkeys(phrases))


# -- answer extraction (no oracle) ---------------------------------------------------------------

_MONTH = r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sept?(?:ember)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
_WEEKDAY = r"(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day"
_DATE_RE = re.compile(
    rf"\b(?:{_WEEKDAY},?\s+)?(?:{_MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?"
    rf"|\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}(?:,?\s+\d{{4}})?"
    rf"|\d{{4}}-\d{{2}}-\d{{2}}|\d{{1,2}}/\d{{1,2}}(?:/\d{{2,4}})?)\b"
)
_TIME_RE = re.compile(r"\b\d{1,2}(?::\d{2})?\s*(?:[ap]\.?m\.?)(?!\w)|\b(?:noon|midnight)\b", re.IGNORECASE)
_AMOUNT_RE = re.compile(
    r"(?:\$|USD\s?)\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:million|billion|thousand|[kKmM]{1,2}|bn)\b)?"
    r"|\b\d[\d,]*(?:\.\d+)?\s?(?:million|billion|thousand|[kKmM]{1,2}|bn)?\s?(?:dollars|USD)\b"
)
_COUNT_RE = re.compile(r"\b\d[\d,]*(?:\.\d+)?\b")
_NOT_NAMES = set(
    "The This That These Those Please Thanks Thank Dear Hi Hello Best Regards From Subject Sent Re Fw Fwd "
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June July "
    "August September October November December Inc Corp LLC Enron I We You He She It They Our Let Effective "
    "Update Hey Good Morning Afternoon Regards Cheers Update Heads FYI Note Attached Final Scratch".split()
)
_NAME_RE = re.compile(r"\b([A-Z][a-z]+(?:\s+[A-Z]\.)?\s+[A-Z](?:'[A-Z]|c[A-Z])?[a-z]+(?:-[A-Z][a-z]+)?)\b")  # O'Brien, McKay
_PLACE_RE = re.compile(r"\b(?:in|at|to|from|near|picked|chose|chosen|selected|going with)\s+(?:the\s+)?((?:[A-Z][A-Za-z]+|\d+[A-Z])(?:\s+(?:[A-Z][A-Za-z]+|\d+[A-Z])){0,3})")
_STATUS_RE = re.compile(
    r"\b(?:(?:not|never)\s+(?:been\s+|yet\s+(?:been\s+)?)?)?"
    r"(?:approved|rejected|declined|denied|on hold|postponed|completed|finished|cancell?ed|pending|signed off)\b",
    re.IGNORECASE,
)


# The question word decides first ("When is the budget review?" asks for a date, not an amount); topic words only
# when there is none ("What's the approved budget?", "the target date").
_QUESTION_WORD_RULES = (
    (Category.DATE, re.compile(r"\bwhen\b|what (?:date|day|time)|which (?:date|day)|\bdeadline\b")),
    (Category.PERSON, re.compile(r"\bwho\b|\bwhom\b|\bwhose\b|which person|name of")),
    (Category.LOCATION, re.compile(r"\bwhere\b|which (?:city|office|room|building|hotel|venue)|what (?:city|room|location|venue)")),
    (Category.AMOUNT, re.compile(r"\bhow (?:much|many)\b")),
)
_TOPIC_RULES = (
    (Category.AMOUNT, re.compile(r"\btotal\b|\bowe\b|\bcost|\bprice|\bamount|\bbudget|\bfee\b|\bpaid\b|\bpay\b|\$")),
    (Category.DATE, re.compile(r"\bdue\b|\bdate\b|\btargeted\b")),
    (Category.STATUS, re.compile(r"\bstatus\b|\bapproved?\b|\brejected\b|\bdecisions?\b|\bdecided?\b|\bon hold\b|\bcancel|what happened")),
)


def question_category(question: str) -> Category | None:
    """The kind of answer the question asks for, from its wording; None when the rules cannot tell."""
    return _question_category(question)


@lru_cache(maxsize=TEXT_CACHE)
def _question_category(question: str) -> Category | None:
    q = question.lower()
    return next((category for rules in (_QUESTION_WORD_RULES, _TOPIC_RULES) for category, rule in rules
                 if rule.search(q)), None)


def _own_text(body: str) -> str:
    """The email's own words: quoted replies ("> ...") and the signature after "--" are left out."""
    lines = []
    all_lines = body.splitlines()
    headers = _header_block_lines(all_lines)
    for index, line in enumerate(all_lines):
        if line.strip() in ("--", "-- "):
            break
        if line.lstrip().startswith(">") or _REPLY_HEADER_RE.match(line.strip()) or index in headers:
            # Quoted text and the "On <date>, <name> wrote:" line above it belong to the earlier email; a forwarded
            # email's "Date: Fri, Aug 2, 2024 at 3:40 PM" says when it was sent, not what was asked.
            continue
        lines.append(line)
    return "\n".join(lines)


def _header_block_lines(lines: list[str]) -> set[int]:
    """Indices of lines in runs of two or more "From:/Date:/To:..." lines: a forwarded email's headers. A lone
    "Date: Friday, March 8" in a meeting notice is the answer, not a header."""
    found, run = set(), []
    for index, line in enumerate(lines + [""]):
        if _HEADER_LINE_RE.match(line):
            run.append(index)
            continue
        if len(run) >= 2:
            found.update(run)
        run = []
    return found


def _quoted_text(body: str) -> str:
    """The earlier email a reply quotes ("> ..." lines, markers stripped), its signature left out."""
    lines = []
    for line in body.splitlines():
        stripped = line.lstrip()
        if not stripped.startswith(">"):
            continue
        text = stripped.lstrip("> ").rstrip()
        if text in ("--", "-- "):
            break  # the quoted email's signature: a phone number, a title, never the answer
        lines.append(text)
    return "\n".join(lines)


_REPLY_HEADER_RE = re.compile(r"^On .{6,200}wrote:$")
_HEADER_LINE_RE = re.compile(r"^\s*(?:From|Date|Sent|To|Cc|Subject):\s")
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|\n+")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END_RE.split(text) if s.strip()]


@lru_cache(maxsize=TEXT_CACHE)
def _relevance(question: str, text: str) -> float:
    """How surely `text` is about what the question asks: its names must all appear, then shared topic words."""
    lowered = text.lower()
    phrases = _phrases(question)
    if phrases and not all(p.lower() in lowered for p in phrases):
        return 0.0
    words = _word_set(text)
    shared = sum(w in words for w in _content_words(question))
    return (1.0 if phrases else 0.0) + shared / 100 if (phrases or shared >= 2) else 0.0


@lru_cache(maxsize=TEXT_CACHE)
def hit_relevance(question: str, text: str) -> float:
    """How likely a search hit (subject + snippet) is about the question: a snippet is a fragment, so one of the
    question's names suffices (the full email must then contain them all, see _relevance)."""
    lowered = text.lower()
    phrases = _phrases(question)
    named = sum(p.lower() in lowered for p in phrases)
    words = _word_set(text)
    shared = sum(w in words for w in _content_words(question))
    if phrases and not named:
        return 0.0
    return named + shared / 100 if (named or shared >= 2) else 0.0


# How a question asks, not what about: an email says "Franklin Boyd will own it" to "Who did Megan put in charge
# of it?" and "my team relocates to Santa Fe" to "Where is the group that Laura manages moving?".
_ASKING_WORDS = frozenset(
    "put charge lead leads leading responsible own owns manage manages managed managing group team moving move "
    "relocating relocate going held being hold holding scheduled set questions now".split()
)


@lru_cache(maxsize=TEXT_CACHE)
def _topic_coverage(question: str, text: str) -> float:
    """Share of the question's topic words (beyond its names) the text has, by 5-letter stem: an email about the
    same project but another event (a design review, not the site visit) must not answer the question."""
    in_names = {w.lower() for p in _phrases(question) for w in p.split()}
    topic = [w for w in _content_words(question)
             if w not in in_names and not w[:1].isdigit() and w not in _ASKING_WORDS]
    if not topic:
        return 1.0
    stems = {w[:5] for w in _word_set(text)}
    return sum(w[:5] in stems for w in topic) / len(topic)


@lru_cache(maxsize=TEXT_CACHE)
def shows_answer(question: str, text: str) -> bool:
    """Whether a hit's subject + snippet already holds an answer of the question's kind."""
    return _extract_answer(question, {"subject": "", "body": text}) is not None


class _Evidence(NamedTuple):
    """An answer span, and whether its sentence is in the earlier email a reply quotes."""

    answer: str
    from_quote: bool


def evidence_from(question: str, email: dict[str, Any]) -> _Evidence | None:
    """The evidence `email` holds if it is about the question's subject, else None."""
    subject, body = email.get("subject", ""), email.get("body", "")
    if isinstance(subject, str) and isinstance(body, str):
        return _evidence_from_text(question, subject, body)  # emails never change: answer each once
    return _evidence_from_email(question, email)


@lru_cache(maxsize=TEXT_CACHE)
def _evidence_from_text(question: str, subject: str, body: str) -> _Evidence | None:
    return _evidence_from_email(question, {"subject": subject, "body": body})


def _evidence_from_email(question: str, email: dict[str, Any]) -> _Evidence | None:
    text = f"{email.get('subject', '')} {email.get('body', '')}"
    if _relevance(question, text) <= 0 or _topic_coverage(question, text) < 0.5:
        return None
    return _extract_evidence(question, email)


def _extract_answer(question: str, email: dict[str, Any]) -> str | None:
    found = _extract_evidence(question, email)
    return found.answer if found else None


def _extract_evidence(question: str, email: dict[str, Any]) -> _Evidence | None:
    """The answer span of the question's type, from the sentences most like the question."""
    category = question_category(question)
    if category is None:
        return None
    asked = frozenset(w[:5] for w in _content_words(question))  # by stem: "target" finds "targeted"
    body = str(email.get("body", ""))
    # The email's own words first (a correction overrides what it quotes); then, for an acknowledgement ("Perfect,
    # thank you." above the quoted email), the quoted email: answering from it saves reading the original (a turn).
    for from_quote, text in ((False, f"{email.get('subject', '')}.\n{_own_text(body)}"), (True, _quoted_text(body))):
        # Stable sort: among equally relevant sentences the earlier (newer, in a reply) wins.
        for sentence in sorted(_sentences(text), key=lambda s: -len(asked.intersection(w[:5] for w in _content_words(s)))):
            found = _span(category, sentence, question)
            if found:
                return _Evidence(found, from_quote)
    return None


def _span(category: Category, sentence: str, question: str) -> str | None:
    if category == Category.DATE:
        values = [m.group().strip() for m in _DATE_RE.finditer(sentence)][:1]
        values += [m.group().strip() for m in _TIME_RE.finditer(sentence)][:1]
        return " at ".join(values) or None
    if category == Category.AMOUNT:
        money = _AMOUNT_RE.search(sentence)
        if money:
            return money.group().strip()
        if "how many" in question.lower():
            count = _COUNT_RE.search(_DATE_RE.sub(" ", sentence))
            return count.group() if count else None
        return None
    if category == Category.PERSON:
        for match in _NAME_RE.finditer(sentence):
            name = match.group(1)
            first = name.split()[0]
            asked = question.lower()
            if first not in _NOT_NAMES and not any(part.lower() in asked for part in name.split()):
                return name
        return None
    if category == Category.LOCATION:
        for match in _PLACE_RE.finditer(sentence):
            place = match.group(1)
            if place.split()[0] not in _NOT_NAMES and place.lower() not in question.lower():
                return place
        return None
    if category == Category.STATUS:
        match = _STATUS_RE.search(sentence)
        return match.group().strip() if match else None
    return None

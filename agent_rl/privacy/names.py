"""A second person-name recognizer for free text, beside spaCy's small NER model.

The small model misses names it has not seen in a telling context ("Call Marguerite Dubois at ...") and
reads Lotus Notes forwards (`Alan Aronowitz@ECT`, `Joseph P Hirl/HOU/ECT`) as anything but people. This
finder uses what the model lacks: first and last name lists of many origins (every locale Faker ships, read
from its wheel: no download), capitalised words next to a known name part, context words (greetings, "call",
"ask", closings), layout (signature lines, Lotus Notes `Name/ORG` and `Name@ORG`, quoted `To:`/`cc:` lines).
Words that are more often plain English (Faker's English word list, spaCy's stop words), places and
organisation words stop a run, so "Will Power Inc" or "New York" are not people.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from spacy.lang.en.stop_words import STOP_WORDS

# Words that start sentences, headings and company names far more often than they name someone.
_EXTRA_COMMON = (
    "hi hello hey dear thanks thank regards cheers best sincerely kind warm yours attached please note fyi fw fwd re "
    "subject sent original message messages email emails mail calendar contacts tasks forwarded meeting call today tomorrow yesterday morning afternoon evening "
    "january february march april may june july august september october november december "
    "monday tuesday wednesday thursday friday saturday sunday mon tue wed thu fri sat sun "
    "mr mrs ms miss dr prof sir madam team group all everyone folks guys board staff office inbox notes folders "
    "documents draft final report update agenda summary question answer deal contract invoice order account "
    "am pm est cst pst edt cdt pdt north south east west new old great little big grand saint san santa los las el la le de del "
    "president vice chairman director manager officer analyst counsel assistant associate senior junior chief "
    "head lead executive general legal finance risk trading gas power energy electric oil pipeline capital "
    "company corporation corp inc llc ltd co plc bank university college institute center centre services "
    "international national global america american americas houston london paris texas california enron will "
    "bill mark grant chase price rich young long white green brown king rose hope joy love art august dallas "
    "austin portland denver phoenix boston chicago calgary sydney tokyo japan china india canada europe "
    "street avenue road lane drive boulevard suite floor room building tower plaza park court place trail way "
    "terrace unit apt circle"
).split()
# A run holding one of these is an organisation or a place, not a person.
_ORG_WORDS = frozenset(
    "inc llc ltd corp corporation company co plc group bank university college institute center centre services "
    "association council department partners capital holdings international systems technologies energy power "
    "gas electric resources trading markets pipeline airlines hotel hospital school club foundation fund "
    "street avenue road lane drive boulevard parkway highway suite floor city county state river lake mount "
    "republic kingdom united states america airport station church cafe restaurant grill hall museum theater "
    "theatre stadium arena mall store shop".split()
)
# "San Antonio", "Fort Worth", "Lake Charles": a run that starts so is a place.
_PLACE_START = frozenset("san santa los las el fort port saint st lake mount mt palm grand new north south east west".split())
# Firms named after people that an energy or finance mailbox mentions all the time; they are answers, not people.
_FIRMS = frozenset((
    "goldman sachs", "morgan stanley", "wells fargo", "merrill lynch", "dean witter", "arthur andersen",
    "smith barney", "lehman brothers", "bear stearns", "charles schwab", "morgan chase", "salomon smith",
    "ernst young", "price waterhouse", "vinson elkins", "fulbright jaworski", "baker botts", "akin gump",
    "mayer brown", "sullivan cromwell", "davis polk", "jones day", "paine webber", "donaldson lufkin",
))
_FUNCTION = frozenset(
    "hi hello hey dear thanks thank regards cheers best sincerely mr mrs ms miss dr prof sir fyi fw fwd re cc "
    "attn per kudos both".split()
)
_CONTEXT_BEFORE = re.compile(
    r"(?i)(?:\b(?:hi|hello|hey|dear|thanks|thank\s+you|cheers|regards|call|ask|tell|contact|email|e-mail|ping|"
    r"cc|attn|attention|spoke\s+(?:with|to)|talked?\s+(?:with|to)|meet\s+with|met\s+with|according\s+to|"
    r"signed\s+by|approved\s+by|forwarded\s+by|sent\s+by|from)\b[,:]?)[ \t]+$"
)
# The closing words a signature follows, alone or as the start of a longer closing.
_CLOSINGS = r"thanks|thank\s+you|regards|best|cheers|sincerely"
_CLOSING_LINE = re.compile(
    rf"(?i)^\s*(?:{_CLOSINGS}|best\s+regards|kind\s+regards|yours(?:\s+truly)?|best\s+wishes|warm\s+regards|talk\s+soon|"
    r"-+)\s*[,.!]?\s*$"
)
# The name signed after a closing on its line, in lower case: "Regards,\tjaime____", "thanks, sheila".
_CLOSING_LOWER = re.compile(rf"(?i:\b(?:{_CLOSINGS}))[ \t]*[,.!\-]*[ \t]*(?:\n[ \t]*)?"
                            r"(?:-+[ \t]*)?([a-z]{2,})(?=_*(?![\w@.\-]))")
_HEADER_LINE = re.compile(r"(?im)^[ \t>]*(?:to|cc|bcc|from|sent\s+by|reply-to)[ \t]*:[ \t]*(.*)$")
_PARTICLES = frozenset("van von de da del della di du der den la le bin ibn al el ter ten dos das st".split())
# One name word: "Dubois", "O'Neil", "McSherry", "Gilbert-Smith", "Seung-Taek", accented letters too.
_WORD = re.compile(r"[^\W\d_]+(?:['’\-][^\W\d_]+)*")
_LOWER_PAIR = re.compile(r"(?<![\w@.])([a-z]{2,})[ \t]+(?=([a-z]{2,})(?![\w@]))")
_LOWER_WORD = re.compile(r"(?<![\w@.\-])[a-z]{3,}(?![\w@\-]|\.\w)")  # not "twana" of "twana.proby@..."
# A double-quoted stretch of text ("...", “...”) within a line: input quoted back (a search's keywords in
# its tool's reply).
_QUOTED = re.compile(r'"[^"\n]*"|“[^”\n]*”')
_UPPER_PAIR = re.compile(r"(?<![\w@./])([A-Z]{2,})(?=[ \t]+(?:[A-Z]\.?[ \t]+)?([A-Z]{2,}(?:-[A-Z]{2,})?)(?![\w@/]))")
_GAP = re.compile(r"[ \t]+(?:\n[ \t]*)?|[ \t]*\.[ \t]+")  # a space, a soft-wrapped line break, an initial's dot
# A line that is only "Surname, Given" (a directory entry, a JSON key naming a record), an initial allowed.
_INVERTED_LINE = re.compile(r"(?m)^[ \t]*([^\W\d_]+(?:['’\-][^\W\d_]+)*),[ \t]*([^\W\d_]+(?:['’\-][^\W\d_]+)*)"
                            r"(?:[ \t]+[A-Z]\.?)?[ \t]*$")


@functools.lru_cache(maxsize=1)
def name_lists() -> tuple[frozenset[str], frozenset[str]]:
    """Lowercase first and last names of every Faker locale (about 30k of each, from many origins); some are
    also plain words ("Grant", "Chase"), which `NameFinder` trusts only beside another name word."""
    from faker.config import AVAILABLE_LOCALES

    first: set[str] = set()
    last: set[str] = set()
    for locale in AVAILABLE_LOCALES:
        try:
            provider = importlib.import_module(f"faker.providers.person.{locale}").Provider
        except (ImportError, AttributeError):
            continue
        for attr, into in (("first_names", first), ("first_names_male", first), ("first_names_female", first),
                           ("first_names_nonbinary", first), ("last_names", last)):
            value = next((klass.__dict__[attr] for klass in provider.__mro__ if attr in klass.__dict__), None)
            if isinstance(value, (list, tuple, dict)):
                for name in value:
                    for piece in str(name).split():
                        if len(piece) > 1 and _WORD.fullmatch(piece):
                            into.add(piece.lower())
    return frozenset(first), frozenset(last)


@functools.lru_cache(maxsize=1)
def common_words() -> frozenset[str]:
    """Words too common to be read as a name on their own (English words, stop words, titles, places)."""
    from faker.providers.address.en_US import Provider as Address
    from faker.providers.lorem.en_US import Provider as Lorem
    from spacy.lang.en.stop_words import STOP_WORDS

    words = set(STOP_WORDS) | {w.lower() for w in Lorem.word_list} | set(_EXTRA_COMMON) | _ORG_WORDS
    for state in Address.states:
        words.update(state.lower().split())
    return frozenset(words)


@dataclass(frozen=True)
class _Word:
    start: int
    end: int
    text: str

    @property
    def lower(self) -> str:
        return self.text.lower()


class NameFinder:
    """Character spans of person names in a text; `known` says whether a lowercase word is a name part."""

    def __init__(self, known: Callable[[str], bool] | None = None) -> None:
        self.first, self.last = name_lists()
        self.common = common_words()
        self.function = frozenset(STOP_WORDS) | _FUNCTION
        self._known = known or (lambda word: False)
        self._lowercase: set[str] = set()

    def observe(self, text: str) -> None:
        """Remember the words this corpus writes in lowercase: "Imbalance Drawdowns" in a table is no one,
        since the mails also say "imbalance"; a surname is hardly ever written lowercase.

        Only a text that capitalises something counts. One typed all in lower case ("who did harold put in charge
        of the willow bend pilot", a careless user's re-ask) lowers names and words alike, so it says nothing about
        which of its words are ordinary; counting it made every name such a user typed an ordinary word, and the
        name then survived there in lower case (issue 47).

        Nor do the words a capitalised text quotes: an agent searches with the user's own words and a tool quotes
        them back ('No emails match all of the keywords ["office", "nina's"]'), so a name typed small stood in lower
        case in a text that capitalises, counted as ordinary, and survived in the user's re-ask. What a text puts in
        double quotes is someone else's input, not how the corpus writes the word."""
        if any(c.isupper() for c in text):
            self._lowercase.update(_LOWER_WORD.findall(_QUOTED.sub(" ", text)))

    def is_name_part(self, lower: str) -> bool:
        """A name word on its own: listed or known, and not also a common word."""
        return self._known(lower) or (lower not in self.common and (lower in self.first or lower in self.last))

    def written_lowercase(self, lower: str) -> bool:
        return lower in self._lowercase

    def ordinary(self, lower: str) -> bool:
        """A word the corpus uses as an ordinary word: a common word, or one it writes in lower case (`observe`)."""
        return lower in self.common or lower in self._lowercase

    @staticmethod
    def lowercase_words(text: str) -> Iterable[tuple[int, int, str]]:
        """(start, end, word) of every all-lowercase word of three letters or more that is not part of an address,
        a dotted id or a hyphenated word, in order: the words `observe` counts."""
        return ((m.start(), m.end(), m.group()) for m in _LOWER_WORD.finditer(text))

    def listed(self, lower: str) -> bool:
        """In a name list or known, even if also a common word ("Grant", "Chase", "Paris")."""
        return lower in self.first or lower in self.last or self._known(lower)

    def spans(self, text: str) -> list[tuple[int, int]]:
        found: list[tuple[int, int]] = []
        for run in self._runs(text):
            found.extend(self._judge(text, run))
        found.extend(self._header_lines(text))
        found.extend(self._inverted_lines(text))
        found.extend(self._lowercase_pairs(text))
        found.extend(self._lowercase_signatures(text))
        found.extend(self._upper_pairs(text))
        return _merge(found)

    def _upper_pairs(self, text: str) -> Iterable[tuple[int, int]]:
        """ "PLEASE RSVP TO BELINDA BATES AT ...": in all-caps text only the lists can tell a name."""
        for m in _UPPER_PAIR.finditer(text):
            first, last = m.group(1).lower(), m.group(2).lower()
            if self.is_name_part(first) and first in self.first and all(
                    p not in self.common and p not in _ORG_WORDS for p in last.split("-")):
                yield m.start(1), m.end(2)

    def _inverted_lines(self, text: str) -> Iterable[tuple[int, int]]:
        """ "Jover, Nerissa" alone on its line or as a whole key: two capitalised words around a comma that no
        dictionary knows, or that a name list holds ("Houston, Texas" is a place: both words are common)."""
        for m in _INVERTED_LINE.finditer(text):
            words = [m.group(1), m.group(2)]
            lowers = [w.lower() for w in words]
            if (all(_capitalised(w) and len(w) > 1 for w in words) and not any(w in _ORG_WORDS for w in lowers)
                    and all(self._unknown(w) or self.is_name_part(w) for w in lowers)):
                yield m.start(1), m.start(1) + len(text[m.start(1):m.end()].rstrip())

    def _lowercase_pairs(self, text: str) -> Iterable[tuple[int, int]]:
        """ "an email to donna lowry": a known first name then a known last name, both uncapitalised."""
        for m in _LOWER_PAIR.finditer(text):
            first, last = m.group(1), m.group(2)
            if first in self.first and last in self.last and first not in self.common and last not in self.common:
                yield m.start(1), m.end() + len(last)

    def _lowercase_signatures(self, text: str) -> Iterable[tuple[int, int]]:
        """ "Regards,\tjaime____": a name word signed in lower case after a closing; a word the corpus uses as an
        ordinary one elsewhere still counts here, since a signature is where people write their own name small."""
        for m in _CLOSING_LOWER.finditer(text):
            word = m.group(1)
            if (self.listed(word) and word not in self.common and word not in self.function
                    and word not in _ORG_WORDS):
                yield m.start(1), m.end(1)

    # -- runs of capitalised words --------------------------------------------------------------

    def _runs(self, text: str) -> Iterable[list[_Word]]:
        """Maximal runs of capitalised words (with initials and particles inside) on soft-wrapped lines."""
        words = [_Word(m.start(), m.end(), m.group()) for m in _WORD.finditer(text)]
        run: list[_Word] = []
        for word in words:
            if run and not self._joins(text, run[-1], word):
                yield from self._split(run)
                run = []
            if _capitalised(word.text) or (run and word.lower in _PARTICLES):
                run.append(word)
            elif run:
                yield from self._split(run)
                run = []
        if run:
            yield from self._split(run)

    @staticmethod
    def _joins(text: str, left: _Word, right: _Word) -> bool:
        gap = text[left.end:right.start]
        return bool(_GAP.fullmatch(gap)) and not (gap.strip() == "." and len(left.text) > 1)

    def _particle_name(self, word: _Word) -> bool:
        """A particle written capitalised that a name list holds ("Della", "Van"): a person's name word there."""
        return word.text[0].isupper() and self.listed(word.lower)

    def _split(self, run: list[_Word]) -> Iterable[list[_Word]]:
        # A particle ends no name ("Maria de"), unless it is itself a name ("Randee Della").
        while run and run[-1].lower in _PARTICLES and not (len(run) >= 2 and self._particle_name(run[-1])):
            run = run[:-1]
        if run:
            yield run

    def _judge(self, text: str, run: list[_Word]) -> Iterable[tuple[int, int]]:
        slashed = self._slashed_name(text, run)
        if text[max(0, run[0].start - 1):run[0].start] in ("/", "@") and not slashed:
            return  # the ORG of `Name/ORG/ORG@ORG`
        line_start = text.rfind("\n", 0, run[0].start) + 1
        line_end = text.find("\n", run[-1].end)
        line_end = len(text) if line_end < 0 else line_end
        previous_line = text[:line_start].rstrip("\n").rsplit("\n", 1)[-1] if line_start else ""
        whole_line = not text[line_start:run[0].start].strip() and not text[run[-1].end:line_end].strip(" \t,.")
        lowers_all = [w.lower for w in run if len(w.text) > 1]
        if (whole_line and line_start and _CLOSING_LINE.match(previous_line) and 1 <= len(lowers_all) <= 4
                and not any(w in _ORG_WORDS or w in self.function for w in lowers_all)):
            yield run[0].start, run[-1].end  # the name under "Best wishes," whatever its words
            return
        core = self._trim(run)
        if not core:
            return
        lowers = [w.lower for w in core if len(w.text) > 1 and w.lower not in _PARTICLES]
        if not lowers or any(w in _ORG_WORDS for w in lowers) or " ".join(lowers[:2]) in _FIRMS:
            return
        if lowers[0] in _PLACE_START and len(lowers) >= 2 and not self._known(lowers[0]):
            return
        span = (core[0].start, core[-1].end)
        after = text[core[-1].end:core[-1].end + 2]
        lotus = bool(re.match(r"[/@][A-Z]", after)) and text[core[-1].end + 1:core[-1].end + 4].isupper()
        alone = not text[line_start:core[0].start].strip() and not text[core[-1].end:line_end].strip(" \t,.")
        before = text[max(0, core[0].start - 40):core[0].start]
        known = [w for w in lowers if self.is_name_part(w)]
        if len(lowers) >= 2 and (known or self.listed(lowers[0])):
            yield span  # "Marguerite Dubois", "Chase Fabiszewski": a name word vouches for the words beside it
        elif len(lowers) >= 2 and all(self._unknown(w) for w in lowers):
            yield span  # "Ehtel Tijerino": capitalised words no list or dictionary knows, side by side
        elif lotus or slashed or self._slash_pair(text, core):
            yield span  # `Taylor@ECT`, `Hirl/HOU/ECT`; the "Sheila" of "Donna/Sheila"
        elif _CONTEXT_BEFORE.search(before) and (known or self._unknown(lowers[0])):
            yield span  # "call Nguyen", "Dear Ms. Okonkwo", "thanks Sherry"
        elif alone and 2 <= len(lowers) <= 4 and all(self._unknown(w) or self.listed(w) for w in lowers):
            yield span  # a signature line

    def _slashed_name(self, text: str, run: list[_Word]) -> bool:
        """ "Donna/Sheila--Call Irene": after a slash, a first name that no org code is (codes are capitals, and
        a Notes path goes on with another "/" or "@") is the second of two people."""
        after = text[run[-1].end:run[-1].end + 1]
        return (run[0].start > 0 and text[run[0].start - 1] == "/" and after not in ("/", "@") and len(run) <= 2
                and run[0].lower in self.first and self.is_name_part(run[0].lower))

    def _slash_pair(self, text: str, core: list[_Word]) -> bool:
        """The "Donna" of "Donna/Sheila": a first name joined by a slash to another that is no org code."""
        nxt = _WORD.match(text, core[-1].end + 1) if text[core[-1].end:core[-1].end + 1] == "/" else None
        return (len(core) == 1 and nxt is not None and _capitalised(nxt.group()) and len(nxt.group()) > 1
                and all(w in self.first and self.is_name_part(w) for w in (core[0].lower, nxt.group().lower())))

    def _unknown(self, lower: str) -> bool:
        return lower not in self.common and lower not in _ORG_WORDS and lower not in self._lowercase

    def _trim(self, run: list[_Word]) -> list[_Word]:
        """Drop edge words that are no name ("Thanks Sherry", "Sherry Thanks"); a common word inside ends it."""
        core = list(run)

        def droppable(word: _Word, first: bool = False) -> bool:
            lower = word.lower
            if self._known(lower):
                return False
            # A particle that is itself a name opens one ("Della Canny", "Al Smith"); inside a run it still ends
            # one ("Call El Paso": no one).
            particle = lower in _PARTICLES and not (first and self._particle_name(word))
            return lower in self.function or particle or (lower in self.common and not self.listed(lower))

        while core and droppable(core[0], first=True):
            core.pop(0)
        while core and (droppable(core[-1]) or len(core[-1].text) == 1):
            if len(core) >= 2 and self.listed(core[-2].lower) and core[-1].lower not in self.function \
                    and core[-1].lower not in _ORG_WORDS and len(core[-1].text) > 2:
                break  # "Chantelle Blue": after a first name, a common word is a surname
            core.pop()
        for i, word in enumerate(core[1:], 1):
            if droppable(word) and not (i == 1 and self.listed(core[0].lower) and word.lower not in self.function
                                        and word.lower not in _ORG_WORDS):
                return core[:i]
        return core

    def _header_lines(self, text: str) -> Iterable[tuple[int, int]]:
        """Every name in a quoted `To:`/`cc:`/`From:` line, ALL-CAPS ones too ("BARBE, ROBIN"); org codes
        (`/HOU/ECT@ECT`), short acronyms and common words are not part of one."""
        for line in _HEADER_LINE.finditer(text):
            offset = line.start(1)
            value = re.sub(r"<[^>]*>", lambda m: " " * len(m.group()), line.group(1))  # addresses: elsewhere
            run: list[tuple[int, int]] = []
            for m in re.finditer(r"[^\W\d_][\w'’\-]*\.?|[,;/@<>()\-]|\d+", value):
                word = m.group().rstrip(".")
                lower = word.lower()
                after_org = value[max(0, m.start() - 1):m.start()] in ("/", "@")
                if (not word[:1].isalpha() or after_org or lower in self.common or lower in _ORG_WORDS
                        or self._written_lower(lower) or (word.isupper() and len(word) <= 3 and len(word) > 1)
                        or not word[0].isupper()):
                    if run:
                        yield offset + run[0][0], offset + run[-1][1]
                    run = []
                    continue
                run.append((m.start(), m.start() + len(word)))
            if run:
                yield offset + run[0][0], offset + run[-1][1]

    def _written_lower(self, lower: str) -> bool:
        return lower in self._lowercase and not self.listed(lower)


def _capitalised(word: str) -> bool:
    """ "Dubois", "McSherry", "O'Neil", an initial "P"; not "HOU" (Notes org codes) or "iPhone"."""
    if not word[0].isupper():
        return False
    if len(word) == 1:
        return True
    return any(c.islower() for c in word[1:])


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(set(spans)):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out

"""Realistic, consistent surrogates for PII: a keyed hash (HMAC-SHA256) picks each pseudonym.

The same original always gets the same surrogate (under the same key), so a name in an email,
a question, a golden answer and a trajectory all change the same way and rewards stay valid.
First and last names are mapped separately, so "Sherry" and "Sherry Ortiz" stay consistent.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from collections.abc import Callable, Iterable

logger = logging.getLogger(__name__)

KEY_ENV = "AGENT_RL_PSEUDONYM_KEY"
DEV_KEY = "agent-rl-development-pseudonym-key"

FIRST_NAMES = (
    "Aaron Abigail Adrian Alana Albert Alicia Alvin Amelia Andre Angela Arthur Audrey Barbara Benjamin Bernard "
    "Bianca Bradley Brenda Caleb Camila Carl Carmen Cecilia Charles Chloe Clara Clifford Colin Dana Daniel Daphne "
    "Darius Delia Dennis Diana Dominic Dora Douglas Edgar Edith Edwin Elena Eliza Emil Erica Ernest Esther Eugene "
    "Evelyn Felix Fiona Floyd Frances Gabriel Gemma Gerald Gloria Gordon Greta Harold Harriet Hector Helena Henry "
    "Hilda Howard Ida Ingrid Irene Isaac Ivan Jasper Jenna Joel Josephine Julian Juliet Keith Kendra Kurt Laura "
    "Leon Lena Leonard Lillian Lionel Lucia Lucas Lydia Malcolm Marcel Margot Martin Maya Miles Miriam Monica Nadia "
    "Nathan Nora Norman Olga Oliver Oscar Paula Percy Philip Priya Quentin Rachel Ramon Rebecca Rita Roland Rosa "
    "Rupert Sabrina Samuel Selma Simon Sofia Stella Stuart Tamara Theo Tobias Ursula Vera Victor Vivian Walter "
    "Wanda Wendell Xavier Yolanda Yusuf Zara Zelda"
).split()
LAST_NAMES = (
    "Abbott Acosta Aldridge Alvarez Ambrose Archer Ashford Bachman Baldwin Barrett Beckett Bellamy Bishop Blake "
    "Boyle Bradford Brennan Calloway Carver Castillo Chandler Chapman Coleman Corbett Crane Dalton Delgado Donovan "
    "Dorsey Drummond Eastman Ellison Emerson Farley Fenwick Fletcher Forsyth Galloway Garrison Gibbs Goodwin "
    "Graves Hadley Halloran Hammond Harper Hawkins Holloway Huxley Ingram Jaffe Jansen Jennings Keller Kendrick "
    "Kessler Kimball Lachance Landry Langley Lindqvist Lockhart Lowell Maddox Mallory Marlowe Mathers Merritt "
    "Monroe Morrow Nakamura Navarro Nolan Norwood Oakley Okafor Osborne Pacheco Pemberton Prescott Quigley Radcliffe "
    "Ramsey Redding Rhodes Rinaldi Rourke Sandoval Sawyer Schaefer Sheridan Sinclair Soto Stanton Sterling Stroud "
    "Sullivan Talbot Tanaka Thornton Tolliver Underwood Vance Vasquez Vaughan Voss Wakefield Waller Whitaker "
    "Winslow Yates Yoder Zamora Ziegler"
).split()
TITLES = {"mr", "mrs", "ms", "miss", "dr", "prof", "sir", "mr.", "mrs.", "ms.", "dr.", "prof."}

_NAME_TOKEN = re.compile(r"[^\W\d_][\w'\-]*\.?|[^\W\d_]\.?")


def pseudonym_key(value: str | None = None) -> bytes:
    """The HMAC key: `value`, else AGENT_RL_PSEUDONYM_KEY, else the (warned-about) development key."""
    key = value or os.environ.get(KEY_ENV)
    if not key:
        logger.warning(
            "%s is not set: pseudonyms use the public development key, so anyone can re-derive them. "
            "Set a secret key for real data.", KEY_ENV,
        )
        key = DEV_KEY
    return key.encode("utf-8")


def match_case(surrogate: str, original: str) -> str:
    """Give `surrogate` the letter case style of `original` (UPPER, lower or Title)."""
    letters = [c for c in original if c.isalpha()]
    if letters and all(c.isupper() for c in letters) and len(letters) > 1:
        return surrogate.upper()
    if letters and all(c.islower() for c in letters):
        return surrogate.lower()
    return surrogate


STREET_SUFFIXES = (
    "Street", "St", "Avenue", "Ave", "Road", "Rd", "Boulevard", "Blvd", "Lane", "Ln", "Drive", "Dr", "Terrace",
    "Way", "Court", "Ct", "Place", "Pl", "Parkway", "Pkwy", "Square", "Highway", "Hwy", "Circle", "Plaza",
    "Trail", "Trl", "Pike", "Loop", "Crescent", "Ridge", "Row", "Alley", "Run", "Path", "Point", "Heights",
    "Crossing", "Bend", "Grove", "Creek", "Hill", "Park", "Pass", "Glen", "View", "Walk", "Expressway", "Freeway",
    "Turnpike", "Close", "Mews", "Gardens", "Cir", "Ter", "Trce", "Xing",
)
STREET_UNITS = ("Apt", "Apartment", "Suite", "Ste", "Unit", "Floor", "Fl")
_SUFFIX_WORDS = {w.lower() for w in STREET_SUFFIXES}
_UNIT_WORDS = {w.lower() for w in STREET_UNITS}
_DIRECTION_WORDS = {"north", "south", "east", "west", "ne", "nw", "se", "sw"}


class Surrogates:
    """Pseudonym factory bound to one key; `reserved` originals are never handed out as surrogates."""

    def __init__(
        self,
        key: bytes,
        reserved_names: Iterable[str] = (),
        first_names: Callable[[str], bool] | None = None,
        last_names: Callable[[str], bool] | None = None,
    ) -> None:
        self._key = key
        reserved = {name.lower() for name in reserved_names}
        # A surrogate equal to some real person's name would both confuse and trip the leak scan.
        self._first = [n for n in FIRST_NAMES if n.lower() not in reserved] or FIRST_NAMES
        self._last = [n for n in LAST_NAMES if n.lower() not in reserved] or LAST_NAMES
        self._is_first = first_names or (lambda token: False)
        self._is_last = last_names or (lambda token: False)

    def digest(self, kind: str, value: str) -> bytes:
        return hmac.new(self._key, f"{kind}\0{value}".encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    def _pick(self, kind: str, value: str, options: list[str]) -> str:
        return options[int.from_bytes(self.digest(kind, value)[:8], "big") % len(options)]

    def _digits(self, kind: str, value: str, count: int) -> list[int]:
        out: list[int] = []
        counter = 0
        while len(out) < count:
            out.extend(b % 10 for b in self.digest(kind, f"{value}#{counter}"))
            counter += 1
        return out[:count]

    # -- names -----------------------------------------------------------------------------------

    def first_name(self, token: str) -> str:
        return match_case(self._pick("first", token.lower(), self._first), token)

    def last_name(self, token: str) -> str:
        return match_case(self._pick("last", token.lower(), self._last), token)

    def person(self, text: str) -> str:
        """A full-name surrogate keeping separators, titles and the name's shape.

        A token is mapped as a last name when the directory knows it only as a last name or it
        ends a multi-word name; otherwise as a first name, so "Sherry" alone and the "Sherry"
        of "Sherry Ortiz" get the same surrogate.
        """
        tokens = list(_NAME_TOKEN.finditer(text))
        words = [m for m in tokens if m.group().lower().rstrip(".") not in TITLES and len(m.group().rstrip(".")) > 1]
        out, last = [], 0
        for m in tokens:
            token = m.group()
            out.append(text[last:m.start()])
            last = m.end()
            bare = token.rstrip(".")
            dot = token[len(bare):]
            if token.lower() in TITLES or bare.lower() in TITLES:
                out.append(token)
            elif len(bare) == 1:  # an initial: keep it an initial, just not the real one
                letter = chr(ord("A") + self.digest("initial", bare.upper())[0] % 26)
                out.append(match_case(letter, bare) + dot)
            else:
                out.append(self._name_word(bare, m, words) + dot)
        out.append(text[last:])
        return "".join(out)

    def _name_word(self, bare: str, match: re.Match[str], words: list[re.Match[str]]) -> str:
        lower = bare.lower()
        known_first, known_last = self._is_first(lower), self._is_last(lower)
        if known_last and not known_first:
            return self.last_name(bare)
        if known_first and not known_last:
            return self.first_name(bare)
        if len(words) > 1 and match is words[-1]:
            return self.last_name(bare)
        return self.first_name(bare)

    # -- contact details -------------------------------------------------------------------------

    def email(self, address: str) -> str:
        """Same domain, local part rebuilt from name surrogates ("sherry.ortiz" -> "maria.jensen")."""
        local, at, domain = address.rpartition("@")
        if not at:
            return self.generic(address)
        parts = re.split(r"([._+\-])", local)
        words = [p for p in parts if p and p[0].isalpha()]
        out = []
        for part in parts:
            if not part or part in "._+-":
                out.append(part)
            elif part.isalpha():
                lower = part.lower()
                known_first, known_last = self._is_first(lower), self._is_last(lower)
                as_last = (known_last and not known_first) or (
                    not known_first and len(words) > 1 and part is words[-1]
                )
                out.append((self.last_name(lower) if as_last else self.first_name(lower)).lower())
            else:
                out.append(self.generic(part))
        return "".join(out) + "@" + domain

    def phone(self, text: str) -> str:
        """Same layout, new digits; area code and exchange never start with 0 or 1 (NANP-valid look)."""
        positions = [i for i, c in enumerate(text) if c.isdigit()]
        digits = self._digits("phone", re.sub(r"\D", "", text), len(positions))
        # The last ten digits are area code + exchange + line when there are that many.
        tail = positions[-10:] if len(positions) >= 10 else positions[-7:]
        firsts = {tail[0]} | ({tail[3]} if len(tail) == 10 else set())
        chars = list(text)
        for pos, digit in zip(positions, digits):
            if pos in firsts:
                digit = 2 + digit % 8
            chars[pos] = str(digit)
        # Keep a leading country code as it was: it is not identifying and keeps the format real.
        for pos in positions[: max(0, len(positions) - 10)]:
            chars[pos] = text[pos]
        return "".join(chars)

    def credit_card(self, text: str) -> str:
        """Same length, layout and issuer digit, Luhn-valid."""
        positions = [i for i, c in enumerate(text) if c.isdigit()]
        if len(positions) < 2:
            return self.generic(text)
        digits = self._digits("card", re.sub(r"\D", "", text), len(positions))
        digits[0] = int(text[positions[0]])
        digits[-1] = luhn_check_digit(digits[:-1])
        chars = list(text)
        for pos, digit in zip(positions, digits):
            chars[pos] = str(digit)
        return "".join(chars)

    def street_address(self, text: str) -> str:
        """Same layout: new house and unit numbers, street-name words replaced; the suffix (the last suffix word:
        the "Park" of "250 Park Ave." is a name) and unit words kept."""
        digits = iter(self._digits("street", text, sum(c.isdigit() for c in text)))
        out = re.sub(r"\d", lambda _: str(next(digits)), text)
        words = list(re.finditer(r"(?<![\w-])[A-Z][A-Za-z'\-]+", out))
        suffixes = [m for m in words if m.group().lower() in _SUFFIX_WORDS]
        kept = {suffixes[-1].start()} if suffixes else set()
        kept |= {m.start() for m in words if m.group().lower() in _UNIT_WORDS | _DIRECTION_WORDS}

        def word(match: re.Match[str]) -> str:
            if match.start() in kept:
                return match.group(0)
            return self._pick("street-word", match.group(0).lower(), self._last)

        return re.sub(r"(?<![\w-])[A-Z][A-Za-z'\-]+", word, out)

    def ip_address(self, text: str) -> str:
        if ":" in text:  # IPv6: same shape, new hex groups
            return self.generic(text)
        d = self.digest("ip", text)
        return f"10.{d[0]}.{d[1]}.{1 + d[2] % 254}"

    def url(self, text: str) -> str:
        match = re.match(r"(?i)(https?://)?(www\.)?([^/\s]+)(.*)", text)
        scheme, www, _host, rest = match.groups() if match else ("", "", text, "")
        word = self._pick("url", text.lower(), self._last).lower()
        path = ""
        if rest.strip("/"):
            path = "/" + self.digest("url-path", rest).hex()[:10]
        return f"{scheme or ''}{www or ''}{word}-example.com{path}"

    def generic(self, text: str) -> str:
        """Same shape: digits to digits, letters to letters (case kept), punctuation as is."""
        d = self.digest("generic", text)
        out = []
        for i, c in enumerate(text):
            b = d[i % len(d)] ^ (i // len(d))
            if c.isdigit():
                out.append(str(b % 10))
            elif c.isalpha() and c.isascii():
                letter = chr(ord("a") + b % 26)
                out.append(letter.upper() if c.isupper() else letter)
            else:
                out.append(c)
        return "".join(out)


def luhn_check_digit(digits: list[int]) -> int:
    """The digit that makes `digits + [check]` pass the Luhn test."""
    total = 0
    for i, digit in enumerate(reversed(digits)):
        if i % 2 == 0:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return (10 - total % 10) % 10


def luhn_valid(number: str) -> bool:
    digits = [int(c) for c in number if c.isdigit()]
    return len(digits) >= 2 and luhn_check_digit(digits[:-1]) == digits[-1]

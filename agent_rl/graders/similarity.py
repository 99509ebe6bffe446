"""OpenAI's text_similarity metrics, each computed by the library OpenAI names for it (none written by hand here).

fuzzy_match: rapidfuzz's `fuzz.ratio` (normalized Indel similarity, 2 * matched characters / total length);
bleu: sacrebleu's sentence BLEU with effective order; gleu and meteor: NLTK's sentence GLEU and METEOR over
sacrebleu's 13a tokens; rouge_1..rouge_5, rouge_l: rouge-score's F-measure; cosine: the operator's embedding
function. Every score is in [0, 1].

METEOR matches synonyms through NLTK's WordNet data, which no package ships and which cannot be downloaded
while training; without it `meteor` is refused when the grader is validated, not scored without synonyms.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from agent_rl.graders.config import GraderConfigError

ROUGE_TYPES = {
    "rouge_1": "rouge1", "rouge_2": "rouge2", "rouge_3": "rouge3", "rouge_4": "rouge4", "rouge_5": "rouge5",
    "rouge_l": "rougeL",
}  # fmt: skip


def fuzzy_match(text: str, reference: str) -> float:
    from rapidfuzz import fuzz

    return fuzz.ratio(text, reference) / 100.0


@functools.cache
def _bleu():
    from sacrebleu.metrics import BLEU

    return BLEU(effective_order=True)


def bleu(text: str, reference: str) -> float:
    return _bleu().sentence_score(text, [reference]).score / 100.0


@functools.cache
def _tokenizer() -> Callable[[str], str]:
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    return Tokenizer13a()


def _tokens(text: str) -> list[str]:
    return _tokenizer()(text).split()


def gleu(text: str, reference: str) -> float:
    from nltk.translate.gleu_score import sentence_gleu

    hypothesis, wanted = _tokens(text), _tokens(reference)
    if not hypothesis or not wanted:
        return 1.0 if hypothesis == wanted else 0.0
    return float(sentence_gleu([wanted], hypothesis))


@functools.cache
def wordnet_problem() -> str | None:
    """Why METEOR cannot run here (NLTK's WordNet data not found), or None when it can; looked up once."""
    import nltk

    for resource in ("corpora/wordnet.zip/wordnet/", "corpora/wordnet"):
        try:
            nltk.data.find(resource)
            return None
        except LookupError:
            continue
    return (
        "the meteor metric needs NLTK's WordNet data, which is not installed and cannot be downloaded while "
        "training (looked in: " + ", ".join(map(str, nltk.data.path)) + "); install it where NLTK looks "
        "(python -m nltk.downloader -d <dir> wordnet on a machine with access, then NLTK_DATA=<dir>) or choose "
        "another metric"
    )


def meteor(text: str, reference: str) -> float:
    problem = wordnet_problem()
    if problem:
        raise GraderConfigError(problem)
    from nltk.translate.meteor_score import meteor_score

    return float(meteor_score([_tokens(reference)], _tokens(text)))


@functools.cache
def _rouge_scorer(rouge_type: str):
    from rouge_score.rouge_scorer import RougeScorer

    return RougeScorer([rouge_type])


def rouge(metric: str, text: str, reference: str) -> float:
    rouge_type = ROUGE_TYPES[metric]
    return float(_rouge_scorer(rouge_type).score(reference, text)[rouge_type].fmeasure)


def cosine(vectors: Sequence[Sequence[float]]) -> float:
    """Cosine similarity of the two embeddings, clipped at 0 (opposite directions score as unrelated ones)."""
    if len(vectors) != 2:
        raise GraderConfigError(f"the embedding function returned {len(vectors)} vectors for 2 texts")
    a, b = (list(map(float, v)) for v in vectors)
    if len(a) != len(b):
        raise GraderConfigError(f"the embedding function returned vectors of sizes {len(a)} and {len(b)}")
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    if norms == 0.0:
        return 0.0
    return min(1.0, max(0.0, sum(x * y for x, y in zip(a, b, strict=True)) / norms))


METRICS: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": fuzzy_match,
    "bleu": bleu,
    "gleu": gleu,
    "meteor": meteor,
    **{name: functools.partial(rouge, name) for name in ROUGE_TYPES},
}

"""text_similarity against scores computed by hand, each metric through the library OpenAI names for it."""

from __future__ import annotations

import math

import pytest

from agent_rl.graders import GraderConfigError, GraderContext, grade, make_sample, validate
from agent_rl.graders import similarity


def similar(metric: str) -> dict:
    return {"type": "text_similarity", "name": metric, "input": "{{ sample.output_text }}",
            "reference": "{{ item.reference }}", "evaluation_metric": metric}  # fmt: skip


def score(metric: str, output: str, reference: str, context: GraderContext | None = None) -> float:
    return grade(similar(metric), make_sample(output), {"reference": reference}, context).score


def test_fuzzy_match_is_the_normalized_indel_similarity():
    # kitten / sitting: longest common subsequence "ittn" (4), lengths 6 + 7: 2 * 4 / 13
    assert score("fuzzy_match", "kitten", "sitting") == pytest.approx(8 / 13)
    assert score("fuzzy_match", "Paris", "Paris") == 1.0
    assert score("fuzzy_match", "abc", "xyz") == 0.0


def test_bleu_of_an_identical_sentence_is_one_and_of_a_disjoint_one_zero():
    assert score("bleu", "the cat sat on the mat", "the cat sat on the mat") == pytest.approx(1.0)
    assert score("bleu", "dogs bark loudly", "the cat sat on the mat") == pytest.approx(0.0)


def test_gleu_counts_matching_ngrams_over_the_larger_side():
    # hypothesis "a b", reference "a c": 1- to 4-grams {a, b, a b} vs {a, c, a c}; 1 match / max(3, 3)
    assert score("gleu", "a b", "a c") == pytest.approx(1 / 3)
    assert score("gleu", "the cat sat", "the cat sat") == pytest.approx(1.0)


def test_rouge_f_measures_of_a_known_pair():
    output, reference = "the cat lay on the mat", "the cat sat on the mat"
    # unigrams: the x2, cat, on, mat shared = 5 of 6 on both sides
    assert score("rouge_1", output, reference) == pytest.approx(5 / 6)
    # bigrams: "the cat", "on the", "the mat" shared = 3 of 5 on both sides
    assert score("rouge_2", output, reference) == pytest.approx(3 / 5)
    # longest common subsequence "the cat on the mat" = 5 of 6
    assert score("rouge_l", output, reference) == pytest.approx(5 / 6)
    # 5-grams: none shared
    assert score("rouge_5", output, reference) == pytest.approx(0.0)


def test_cosine_uses_the_injected_embedding_function():
    vectors = {"close answer": [1.0, 0.0], "reference": [1.0, 1.0], "opposite": [-1.0, -1.0]}
    context = GraderContext(embed=lambda texts: [vectors[text] for text in texts])
    assert score("cosine", "close answer", "reference", context) == pytest.approx(1 / math.sqrt(2))
    assert score("cosine", "opposite", "reference", context) == 0.0  # clipped at 0
    validate(similar("cosine"), {"reference": "x"}, context)


def test_cosine_without_an_embedding_function_is_refused():
    with pytest.raises(GraderConfigError, match="needs an embedding function"):
        validate(similar("cosine"), {"reference": "x"})
    with pytest.raises(GraderConfigError, match="needs an embedding function"):
        score("cosine", "a", "b")


def test_meteor_without_wordnet_is_refused_at_validation(monkeypatch, tmp_path):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    similarity.wordnet_problem.cache_clear()
    try:
        with pytest.raises(GraderConfigError, match="WordNet data") as raised:
            validate(similar("meteor"), {"reference": "x"})
        assert str(tmp_path) in str(raised.value)
        with pytest.raises(GraderConfigError, match="WordNet data"):
            score("meteor", "a", "b")
    finally:
        similarity.wordnet_problem.cache_clear()


def test_meteor_with_wordnet_scores_an_identical_sentence():
    if similarity.wordnet_problem():
        pytest.skip("NLTK's WordNet data is not installed here (meteor is refused, tested above)")
    # every word matched in one chunk: fmean 1, penalty 0.5 * (1 / 6) ** 3
    assert score("meteor", "the cat sat on the mat", "the cat sat on the mat") == pytest.approx(1 - 0.5 / 216)

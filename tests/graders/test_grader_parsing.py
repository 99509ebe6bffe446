"""OpenAI's grader JSON loads into typed graders; what cannot grade is refused with a message naming the problem."""

from __future__ import annotations

import pytest

from agent_rl.graders import (
    GraderConfigError,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
    grade,
    make_sample,
    parse_grader,
)

# As OpenAI's guide writes them (fields and values), one of each type we take.
STRING_CHECK = {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
                "reference": "{{ item.answer }}", "operation": "eq"}  # fmt: skip
TEXT_SIMILARITY = {"type": "text_similarity", "name": "close", "input": "{{ sample.output_text }}",
                   "reference": "{{ item.answer }}", "evaluation_metric": "fuzzy_match", "pass_threshold": 0.8}  # fmt: skip
SCORE_MODEL = {
    "type": "score_model", "name": "judge", "model": "o4-mini",
    "input": [{"role": "developer", "content": "Grade 0 to 10."},
              {"role": "user", "content": [{"type": "input_text", "text": "Answer: {{ sample.output_text }}"}]}],
    "range": [0, 10], "sampling_params": {"temperature": 0.2, "seed": 7, "max_completions_tokens": 64},
}  # fmt: skip
PYTHON = {"type": "python", "name": "code", "source": "def grade(sample, item):\n    return 1.0\n"}


def test_each_openai_grader_type_parses_into_its_model():
    assert isinstance(parse_grader(STRING_CHECK), StringCheckGrader)
    similarity = parse_grader(TEXT_SIMILARITY)
    assert isinstance(similarity, TextSimilarityGrader) and similarity.evaluation_metric == "fuzzy_match"
    judge = parse_grader(SCORE_MODEL)
    assert isinstance(judge, ScoreModelGrader)
    assert judge.range == (0.0, 10.0) and judge.sampling_params.seed == 7
    assert isinstance(parse_grader(PYTHON), PythonGrader)
    multi = parse_grader({"type": "multi", "name": "both", "graders": {"exact": STRING_CHECK, "close": TEXT_SIMILARITY},
                          "calculate_output": "(exact + close) / 2"})  # fmt: skip
    assert isinstance(multi, MultiGrader)
    assert isinstance(multi.graders["exact"], StringCheckGrader)
    assert isinstance(multi.graders["close"], TextSimilarityGrader)


def test_unknown_type_names_the_type_and_the_allowed_ones():
    with pytest.raises(ValueError) as raised:
        parse_grader({"type": "label_model", "name": "labels", "input": [], "labels": ["a"], "passing_labels": ["a"]})
    message = str(raised.value)
    assert "unknown grader type 'label_model'" in message
    assert "allowed types: multi, python, score_model, string_check, text_similarity" in message


def test_unknown_type_inside_a_multi_grader_says_where():
    spec = {"type": "multi", "name": "m", "calculate_output": "a", "graders": {"a": {"type": "regex", "name": "r"}}}
    with pytest.raises(GraderConfigError, match=r"grader\.graders\.a: unknown grader type 'regex'"):
        parse_grader(spec)


def test_missing_type_and_misspelled_fields_are_refused():
    with pytest.raises(ValueError, match="no 'type'"):
        parse_grader({"name": "x", "input": "a", "reference": "b", "operation": "eq"})
    with pytest.raises(ValueError, match="evaluation_metrics"):  # the typo is named, not defaulted
        parse_grader({**TEXT_SIMILARITY, "evaluation_metrics": "bleu"})
    with pytest.raises(ValueError, match="operation"):
        parse_grader({**STRING_CHECK, "operation": "contains"})
    with pytest.raises(ValueError, match="low < high"):
        parse_grader({**SCORE_MODEL, "range": [10, 0]})


def test_grade_takes_the_json_as_well_as_the_model():
    sample, item = make_sample("Paris"), {"answer": "Paris"}
    assert grade(STRING_CHECK, sample, item).score == 1.0
    assert grade(parse_grader(STRING_CHECK), sample, item).score == 1.0

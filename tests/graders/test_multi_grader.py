"""multi: sub-grader scores combined by a formula that is parsed, checked and walked, never eval'd."""

from __future__ import annotations

import math

import pytest

from agent_rl.graders import GraderConfigError, grade, make_sample, validate
from agent_rl.graders.formula import evaluate_formula, parse_formula

EXACT = {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
         "reference": "{{ item.answer }}", "operation": "eq"}  # fmt: skip
FUZZY = {"type": "text_similarity", "name": "fuzzy", "input": "{{ sample.output_text }}",
         "reference": "{{ item.answer }}", "evaluation_metric": "fuzzy_match"}  # fmt: skip


def multi(formula: str) -> dict:
    return {"type": "multi", "name": "combined", "graders": {"exact": EXACT, "fuzzy": FUZZY}, "calculate_output": formula}


def test_the_formula_combines_the_sub_scores():
    # "kitten" vs "sitting": exact 0, fuzzy 8/13
    result = grade(multi("0.3 * exact + 0.7 * fuzzy"), make_sample("kitten"), {"answer": "sitting"})
    assert result.score == pytest.approx(0.7 * 8 / 13)
    assert result.sub_scores == {"exact": 0.0, "fuzzy": pytest.approx(8 / 13)}
    assert result.reason is None
    assert grade(multi("(exact + fuzzy) / 2"), make_sample("Paris"), {"answer": "Paris"}).score == 1.0


@pytest.mark.parametrize(
    ("formula", "expected"),
    [
        ("a + b * 2", 0.5 + 0.25 * 2),
        ("(a + b) * 2", 1.5),
        ("a ** 2", 0.25),
        ("2 ^ 3", 8.0),  # OpenAI writes power as ^
        ("-a + +b", -0.25),
        ("min(a, b) + max(a, b, 0.9)", 1.15),
        ("abs(b - a)", 0.25),
        ("sqrt(b)", 0.5),
        ("log(exp(a))", 0.5),
        ("log(8, 2)", 3.0),
        ("floor(a * 3) + ceil(b)", 2.0),
        ("1e-1 * 10", 1.0),
    ],
)
def test_allowed_arithmetic(formula, expected):
    assert evaluate_formula(parse_formula(formula, ["a", "b"]), {"a": 0.5, "b": 0.25}) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("formula", "named"),
    [
        ("__import__('os').system('true')", "calling __import__('os').system"),
        ("__import__('os')", "calling __import__"),
        ("a.__class__", "Attribute"),
        ("a.real", "Attribute"),
        ("(1).__class__.__bases__", "Attribute"),
        ("open('/etc/passwd')", "calling open"),
        ("eval('1')", "calling eval"),
        ("c + 1", "the name 'c'"),
        ("min", "the name 'min'"),
        ("[a][0]", "Subscript"),
        ("a if b else 0", "IfExp"),
        ("lambda: 1", "Lambda"),
        ("'text'", "the constant 'text'"),
        ("True", "the constant True"),
        ("a < b", "Compare"),
        ("a % 2", "the operator Mod"),
        ("a // 2", "the operator FloorDiv"),
        ("min(a, key=b)", "keyword arguments"),
        ("min(*[a, b])", "Starred"),
        ("sqrt(a, b)", "sqrt with 2 argument(s)"),
        ("a +", "not a formula"),
    ],
)
def test_anything_else_is_refused_before_grading(formula, named):
    with pytest.raises(GraderConfigError) as raised:
        parse_formula(formula, ["a", "b"])
    assert named in str(raised.value)


def test_validate_and_grade_refuse_a_bad_formula():
    grader = multi("exact + __import__('os').getpid()")
    with pytest.raises(ValueError, match="calling __import__"):
        validate(grader, {"answer": "x"})
    with pytest.raises(GraderConfigError, match="calling __import__"):
        grade(grader, make_sample("x"), {"answer": "x"})


def test_arithmetic_that_fails_scores_zero_with_the_reason():
    result = grade(multi("exact / (fuzzy - fuzzy)"), make_sample("Paris"), {"answer": "Paris"})
    assert result.score == 0.0
    assert "ZeroDivisionError" in result.reason
    assert result.sub_scores == {"exact": 1.0, "fuzzy": 1.0}
    overflow = grade(multi("10 ** 10 ** 10"), make_sample("Paris"), {"answer": "Paris"})
    assert overflow.score == 0.0 and "OverflowError" in overflow.reason
    negative_root = grade(multi("(0 - exact) ** 0.5"), make_sample("Paris"), {"answer": "Paris"})
    assert negative_root.score == 0.0 and "not a real number" in negative_root.reason


def test_deep_nesting_is_refused():
    with pytest.raises(GraderConfigError, match="nesting deeper than"):
        parse_formula(" + ".join(["a"] * 150), ["a"])
    assert math.isclose(evaluate_formula(parse_formula(" + ".join(["a"] * 50), ["a"]), {"a": 1.0}), 50.0)

"""string_check: eq and ne compare exactly, like is case-sensitive containment, ilike ignores case."""

from __future__ import annotations

import pytest

from agent_rl.graders import grade, make_sample


@pytest.mark.parametrize(
    ("operation", "output", "reference", "expected"),
    [
        ("eq", "Paris", "Paris", 1.0),
        ("eq", "paris", "Paris", 0.0),
        ("eq", "Paris ", "Paris", 0.0),
        ("ne", "Lyon", "Paris", 1.0),
        ("ne", "Paris", "Paris", 0.0),
        ("like", "The capital is Paris.", "Paris", 1.0),
        ("like", "The capital is PARIS.", "Paris", 0.0),
        ("ilike", "The capital is PARIS.", "paris", 1.0),
        ("ilike", "The capital is Lyon.", "paris", 0.0),
    ],
)
def test_operations(operation, output, reference, expected):
    grader = {"type": "string_check", "name": "s", "input": "{{ sample.output_text }}",
              "reference": "{{ item.answer }}", "operation": operation}  # fmt: skip
    result = grade(grader, make_sample(output), {"answer": reference})
    assert result.score == expected
    assert result.reason is None

"""The demo's summary says why a check failed, from the check's own findings."""

from __future__ import annotations

import dagster as dg

from pipelines.demo import _flagged_examples


def test_failed_check_examples_are_printed_for_triggered_findings_only():
    metadata = {
        "unsupported_answer": dg.MetadataValue.json({"triggered": True, "examples": [
            {"why": "only 0% of the answer's words are in the emails seen", "question": "Who approved it?",
             "final_answer": "Sherry"},
            {"why": "answered without seeing any email", "question": "When?", "final_answer": "Monday"},
            {"why": "third", "question": "q", "final_answer": "a"}]}),
        "tool_call_spam": dg.MetadataValue.json({"triggered": False, "examples": [{"why": "x"}]}),
        "note": dg.MetadataValue.text("not a finding"),
    }
    lines = _flagged_examples(metadata)
    assert len(lines) == 2 and all(line.startswith("unsupported_answer: ") for line in lines)
    assert "Who approved it?" in lines[0] and "'Sherry'" in lines[0]

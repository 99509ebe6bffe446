"""The GRPO prompt filter drops prompts known to teach nothing, and never starves training of prompts."""

from __future__ import annotations

import pytest

from agent_rl.train.config import PromptFilterSettings
from agent_rl.train.prompt_filter import filter_prompts


def _rows(n: int) -> list[dict]:
    return [{"scenario_id": f"s{i}", "prompt": [{"role": "user", "content": f"q{i}"}], "inbox": "a", "answer": "x",
             "category": "date"} for i in range(n)]


def test_drops_all_solved_and_never_solved_candidates_and_keeps_the_unexamined_rest():
    rows = _rows(20)
    rates = {"s0": 0.0, "s1": 0.5, "s2": 1.0, "s3": 0.0, "s4": 0.25}
    settings = PromptFilterSettings(mode="solve_rates", max_candidates=5)
    kept, report = filter_prompts(rows, settings, solve_rates=rates)
    assert [r["scenario_id"] for r in kept[:2]] == ["s1", "s4"]  # the survivors come first
    assert [r["scenario_id"] for r in kept[2:]] == [f"s{i}" for i in range(5, 20)]
    assert report.as_dict()["kept"] == 2 and report.as_dict()["unexamined_kept"] == 15 and not report.fallback


def test_nothing_passes_and_nothing_else_falls_back_to_the_candidates_or_fails_clearly():
    rows = _rows(3)
    rates = {"s0": 0.0, "s1": 0.0, "s2": 1.0}
    kept, report = filter_prompts(rows, PromptFilterSettings(mode="solve_rates", max_candidates=8), solve_rates=rates)
    assert kept == rows and report.fallback
    kept, _ = filter_prompts(rows, PromptFilterSettings(mode="solve_rates", max_candidates=8, keep_when_empty=False),
                             solve_rates=rates)
    assert kept == []
    with pytest.raises(ValueError, match="needs solve_rates"):
        filter_prompts(rows, PromptFilterSettings(mode="solve_rates"))

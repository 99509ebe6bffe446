"""The GRPO prompt filter drops prompts known to teach nothing, and never starves training of prompts."""

from __future__ import annotations

import pytest

from agent_rl.train.config import PromptFilterSettings
from agent_rl.train.prompt_filter import filter_prompts


def _rows(n: int) -> list[dict]:
    return [{"task_id": f"s{i}", "prompt": [{"role": "user", "content": f"q{i}"}], "inbox": "a", "answer": "x",
             "category": "date"} for i in range(n)]


def test_drops_all_solved_and_never_solved_candidates_and_keeps_the_unexamined_rest():
    rows = _rows(20)
    rates = {"s0": 0.0, "s1": 0.5, "s2": 1.0, "s3": 0.0, "s4": 0.25}
    settings = PromptFilterSettings(mode="solve_rates", max_candidates=5)
    kept, report = filter_prompts(rows, settings, solve_rates=rates)
    assert [r["task_id"] for r in kept[:2]] == ["s1", "s4"]  # the survivors come first
    assert [r["task_id"] for r in kept[2:]] == [f"s{i}" for i in range(5, 20)]
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


def _inbox_rows(tmp_path, n: int):
    """A demo inbox store, its first `n` scenarios and their GRPO rows."""
    from agent_rl.environments.email.grpo_rows import grpo_rows
    from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.environments.email.scenarios import generate_scenarios

    url = f"sqlite:///{tmp_path / 'inbox.db'}"
    store = open_inbox_store(url)
    scenarios = generate_scenarios(build_demo_corpus(store, seed=0, n_inboxes=2, n_emails=120))[:n]
    return url, store, scenarios, grpo_rows(scenarios, split=None)


def test_sampled_rates_play_each_scenario_row_as_the_email_runner_plays_its_scenario(tmp_path, monkeypatch):
    """The sampled pre-pass goes through the environment contract: a row's task is its scenario's own, and the
    outcomes are those of the email runner on the same store."""
    import agent_rl.agent.local_policy as local_policy
    from agent_rl.environments.email.environment import scenario_task
    from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
    from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
    from agent_rl.environments.registry import load_environment
    from agent_rl.train.prompt_filter import row_task, sampled_solve_rates

    url, store, scenarios, rows = _inbox_rows(tmp_path, 8)
    assert [row_task(row) for row in rows] == [scenario_task(s) for s in scenarios]

    teacher = HeuristicPolicy(HeuristicConfig(scenarios=scenarios, wrong_rate=0.4), store=store)
    monkeypatch.setattr(local_policy, "LocalPolicy", lambda *args, **kwargs: teacher)
    environment = load_environment("email", store_url=url)
    settings = PromptFilterSettings(mode="sampled", samples_per_prompt=2)
    try:
        rates = sampled_solve_rates("model", None, rows, environment, settings, max_turns=6)
    finally:
        environment.close()
    played = run_episodes(teacher, [EpisodeTask.from_scenario(s) for s in scenarios for _ in range(2)], store)
    store.close()
    expected = {s.id: sum(e.outcome == "correct" for e in played[2 * i: 2 * i + 2]) / 2 for i, s in enumerate(scenarios)}
    assert rates == expected and 0 < sum(rates.values()) < len(rates)


def test_sampled_solve_rates_do_not_depend_on_how_loaded_the_machine_is(tmp_path, monkeypatch):
    """Every turn of the sampled model takes an hour of the runner's clock (a loaded machine): the solve rates are
    still the model's; a wall-clock budget would end them as run out and drop prompts for the machine's sake."""
    import agent_rl.agent.local_policy as local_policy
    import agent_rl.environments.runner as runner
    from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
    from agent_rl.environments.registry import load_environment
    from agent_rl.train.prompt_filter import sampled_solve_rates

    url, store, scenarios, rows = _inbox_rows(tmp_path, 4)
    clock = [0.0]

    class _Slow(HeuristicPolicy):
        def act(self, *args, **kwargs):
            clock[0] += 3600.0
            return super().act(*args, **kwargs)

    class _Clock:
        @staticmethod
        def perf_counter() -> float:
            return clock[0]

    monkeypatch.setattr(runner, "time", _Clock)
    monkeypatch.setattr(local_policy, "LocalPolicy", lambda *args, **kwargs: _Slow(HeuristicConfig(scenarios=scenarios), store=store))
    environment = load_environment("email", store_url=url)
    try:
        rates = sampled_solve_rates("model", None, rows, environment, PromptFilterSettings(mode="sampled", samples_per_prompt=2),
                                    max_turns=6)
    finally:
        environment.close()
        store.close()
    assert clock[0] >= 3600.0 * len(rows) and rates == {str(row["task_id"]): 1.0 for row in rows}

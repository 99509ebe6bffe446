"""Held-out evaluation: the metrics users compare, `agent-rl eval --json`, and the validation gates."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agent_rl import settings
from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
from agent_rl.cli import app
from agent_rl.environments.email.environment import EmailEnvironment
from agent_rl.evaluate.harness import EvalConfig, evaluate_tasks, select_tasks
from agent_rl.evaluate.metrics import compute_metrics
from agent_rl.evaluate.report import category_markdown, choose_candidate, relative_improvement
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.records import Episode, Outcome, Split
from agent_rl.environments.email.scenarios.demo import build_demo_environment

METRIC_KEYS = {"accuracy", "source_accuracy", "hallucination_rate", "idk_rate", "avg_turns", "avg_tokens",
               "latency_ms_p50", "cost_per_1k_usd"}


@pytest.fixture
def env():
    store = open_inbox_store(settings.store_url())
    environment = build_demo_environment(store, seed=0, n_inboxes=3, n_emails=600)
    yield store, environment
    store.close()


def test_eval_cli_prints_one_json_object_with_the_contract_metrics(env):
    result = CliRunner().invoke(app, ["eval", "--policy", "heuristic", "--split", "test", "--n", "12", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["policy"] == "heuristic" and report["n"] == 12
    assert METRIC_KEYS <= set(report["metrics"])
    assert report["metrics"]["accuracy"] > 0.5  # the rule-based reader answers most questions
    assert report["metrics"]["avg_turns"] >= 2


def test_eval_cli_names_an_unknown_policy(env):
    result = CliRunner().invoke(app, ["eval", "--policy", "no-such-policy", "--json"])
    assert result.exit_code == 2 and "no-such-policy" in result.output


def test_same_seed_same_questions_and_oracle_teacher_is_perfect(env):
    store, environment = env
    config = EvalConfig(max_tasks=12, seed=3)
    email = EmailEnvironment(store, environment.scenarios)
    tasks = email.tasks(Split.TEST)
    assert select_tasks(tasks, config) == select_tasks(list(reversed(tasks)), config)
    oracle = HeuristicPolicy(HeuristicConfig(scenarios=environment.scenarios), store=store)
    result = evaluate_tasks(oracle, email, tasks, config)
    m = result.metrics
    assert (m.n, m.accuracy, m.hallucination_rate, m.valid_tool_call_rate) == (12, 1.0, 0.0, 1.0)
    assert m.source_accuracy == 1.0 and m.cost_per_1k_usd > 0


def test_the_sample_size_under_its_old_name_is_still_read_warned():
    with pytest.warns(DeprecationWarning, match=r"max_scenarios=...\) is now max_tasks"):
        config = EvalConfig(max_scenarios=5, seed=2)
    assert config.max_tasks == 5 and config.seed == 2


def test_metrics_count_hallucinations_idk_and_invalid_turns():
    def episode(outcome, answer, calls):
        messages = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": c}} for c in calls]}
                    if calls else {"role": "assistant", "content": "plain text"}]
        return Episode(inbox_id="a@x", question="q", policy_version="v", outcome=outcome, final_answer=answer,
                       messages=messages, turns=1)

    m = compute_metrics([episode(Outcome.CORRECT, "June 5", ["return_final_answer"]),
                         episode(Outcome.WRONG, "June 9", ["return_final_answer"]),
                         episode(Outcome.IDK, "I don't know", ["return_final_answer"]),
                         episode(Outcome.FORMAT_ERROR, None, [])], tool_names=("return_final_answer",))
    assert (m.accuracy, m.hallucination_rate, m.idk_rate, m.format_error_rate) == (0.25, 0.25, 0.25, 0.25)
    assert m.valid_tool_call_rate == 0.75


def test_metrics_break_outcomes_down_by_category_and_measure_cited_sources():
    def episode(sid, outcome, category, sources=()):
        return Episode(inbox_id="a@x", question="q", policy_version="v", task_id=sid, outcome=outcome,
                       task_category=category, sources=list(sources))

    expected = {"m1": ["e1"], "m2": ["e2", "e3"]}  # u1 (unanswerable) and the uncategorized one expect none
    m = compute_metrics([episode("m1", Outcome.CORRECT, "date", ["e1"]), episode("m2", Outcome.WRONG, "date", ["e9"]),
                         episode("u1", Outcome.WRONG, "unanswerable"), episode("unknown", Outcome.CORRECT, None)],
                        expected)
    assert set(m.by_category) == {"date", "unanswerable"}
    assert m.by_category["date"]["n"] == 2 and m.by_category["date"]["correct"] == 0.5
    assert m.by_category["unanswerable"]["wrong"] == 1.0 and m.by_category["unanswerable"]["idk"] == 0.0
    assert m.source_accuracy == 0.5  # one of the two tasks that expect citations cited a right one
    table = category_markdown(m)
    assert "| date | 2 | 50% | 50% |" in table and "| unanswerable | 1 | 0% | 100% |" in table


def test_relative_improvement_is_measured_against_the_champion():
    assert relative_improvement(0.55, 0.50) == pytest.approx(0.10)
    assert relative_improvement(0.3, 0.0) == float("inf") and relative_improvement(0.0, 0.0) == 0.0


def test_sft_plus_grpo_ships_only_when_it_is_not_worse_than_sft_alone():
    def metrics(accuracy, failure_rate):
        return compute_metrics([]).model_copy(update={"accuracy": accuracy, "failure_rate": failure_rate})

    assert choose_candidate(metrics(0.78, 0.10), metrics(0.80, 0.08)).name == "grpo"
    assert choose_candidate(metrics(0.78, 0.10), metrics(0.78, 0.10)).name == "grpo"  # a tie is not worse
    lower = choose_candidate(metrics(0.78, 0.10), metrics(0.74, 0.08))
    assert lower.name == "sft" and "made accuracy worse" in lower.reason
    more_failures = choose_candidate(metrics(0.78, 0.10), metrics(0.80, 0.14))
    assert more_failures.name == "sft" and "made failures worse" in more_failures.reason
    # GRPO whose rollouts hacked the reward is no candidate, however well it scores.
    hacked = choose_candidate(metrics(0.78, 0.10), metrics(0.90, 0.02), disqualified="tool_call_spam 17% > 10%")
    assert hacked.name == "sft" and "disqualified (tool_call_spam 17% > 10%)" in hacked.reason
    assert choose_candidate(metrics(0.78, 0.10), None, disqualified="reward hacking").name == "sft"


def test_failure_rate_counts_wrong_answers_broken_replies_and_running_out_together():
    def episode(outcome):
        return Episode(inbox_id="a@x", question="q", policy_version="v", outcome=outcome)

    m = compute_metrics([episode(o) for o in (Outcome.CORRECT, Outcome.WRONG, Outcome.FORMAT_ERROR, Outcome.RAN_OUT,
                                              Outcome.IDK)])
    assert m.failure_rate == 0.6 and m.hallucination_rate == 0.2


class _Busy(HeuristicPolicy):
    """The oracle teacher on a busy machine: every turn takes a while of wall clock."""

    def act(self, conversations, tools, *args, **kwargs):
        import time

        time.sleep(0.05)
        return super().act(conversations, tools, *args, **kwargs)


def test_held_out_outcomes_do_not_depend_on_how_busy_the_machine_is(env):
    """By default an evaluation has no wall-clock budget: a slow machine gives the same outcomes as a fast one (a
    budget of a few turns' time, as 300 s was for a loaded 2-core machine, ends right answers as run out)."""
    store, environment = env
    email = EmailEnvironment(store, environment.scenarios)
    tasks = email.tasks(Split.TEST)
    busy = _Busy(HeuristicConfig(scenarios=environment.scenarios), store=store)
    assert EvalConfig().timeout_s is None
    unbounded = evaluate_tasks(busy, email, tasks, EvalConfig(max_tasks=6, seed=1)).metrics
    assert unbounded.accuracy == 1.0
    bounded = evaluate_tasks(busy, email, tasks, EvalConfig(max_tasks=6, seed=1, timeout_s=0.06)).metrics
    assert bounded.accuracy < 1.0  # the budget still applies where a caller asks for one

"""Live gateway episodes in curation: users' feedback is their outcome, unrated ones never train, a stable share
of the good ones (rated, or labeled) is held out, and validation replays those steps (curation/live.py,
evaluate/replay.py)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from agent_rl.agent.policy import Policy, PolicyTurn, ToolCall
from agent_rl.curation.datasets import quality
from agent_rl.curation.live import (
    feedback_reward,
    held_out,
    judge_by_feedback,
    live_validation_config,
    split_live,
)
from agent_rl.curation.validate import validate_episodes
from agent_rl.evaluate.harness import EvalConfig
from agent_rl.evaluate.replay import evaluate_replay
from agent_rl.evaluate.report import choose_candidate
from agent_rl.evaluate.metrics import EvalMetrics

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a thing up.", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]


def live_episode(i: int, feedback: str | None = "up", category: str | None = "lookup") -> dict:
    return {
        "episode_id": f"ep-{i}", "created_at": datetime(2026, 11, 20, tzinfo=timezone.utc).isoformat(),
        "environment": "gateway", "context": "gateway", "task_category": category, "question": f"find {i}",
        "policy_version": "prod", "outcome": "unjudged", "reward": None, "feedback": feedback, "tools": TOOLS,
        "messages": [
            {"role": "system", "content": "You look things up."},
            {"role": "user", "content": f"find {i}"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": f'{{"key": "{i}"}}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": f"value {i}"},
            {"role": "assistant", "content": f"It is value {i}."},
        ],
    }


@pytest.mark.parametrize("feedback, reward", [
    ("up", 1.0), ("thumbs_down", -1.0), ("+1", 1.0), ("-1", -1.0), ("0.4", 0.4), ('{"reward": 0.25}', 0.25),
    ('{"verdict": "correct"}', 1.0), ("great, thanks", None), (None, None), ("", None),
])
def test_feedback_gives_a_reward_from_a_verdict_or_a_number(feedback, reward):
    assert feedback_reward(feedback) == reward


def test_users_feedback_is_the_outcome_and_only_rated_good_episodes_train():
    up, down, unrated = (judge_by_feedback(live_episode(i, f)) for i, f in enumerate(("up", "down", None)))
    assert (up["outcome"], up["reward"], quality(up)) == ("correct", 1.0, 1.0)
    assert (down["outcome"], down["reward"], quality(down)) == ("wrong", -1.0, 0.0)
    assert (unrated["outcome"], unrated["reward"], quality(unrated)) == ("unjudged", None, 0.0)
    no_category = judge_by_feedback(live_episode(3, category=None))
    assert no_category["task_category"] == "uncategorized"
    email = {"environment": "email", "outcome": "unjudged", "feedback": "up"}
    assert judge_by_feedback(email) == email  # other environments keep their own judging


def test_live_episodes_validate_against_their_clients_tools_and_feedback_range():
    rows = [judge_by_feedback(live_episode(i, f)) for i, f in enumerate(["up", None, "down", "7"])]
    bad_tool = judge_by_feedback(live_episode(9))
    bad_tool["messages"][2]["tool_calls"][0]["function"]["name"] = "format_disk"
    result = validate_episodes(rows + [bad_tool], live_validation_config(rows))
    assert [r["episode_id"] for r in result.clean] == ["ep-0", "ep-1", "ep-2"]
    reasons = {row["episode_id"]: " ".join(why) for row, why in result.quarantined}
    assert "reward" in reasons["ep-3"]  # a reward of 7 is outside the feedback range
    assert "format_disk" in reasons["ep-9"]


def test_a_stable_share_of_rated_good_episodes_is_held_out():
    ids = [f"episode-{i}" for i in range(2000)]
    kept = [i for i in ids if held_out(i)]
    assert 300 <= len(kept) <= 500 and kept == [i for i in ids if held_out(i)]
    rows = [judge_by_feedback(live_episode(i, "up" if i % 2 else "down")) for i in range(200)]
    train, test = split_live(rows)
    assert test and all(r["outcome"] == "correct" for r in test)
    assert {r["episode_id"] for r in train}.isdisjoint(r["episode_id"] for r in test) and len(train) + len(test) == 200
    with pytest.raises(ValueError, match="held-out share"):
        held_out("x", share=1.5)


class Lookup(Policy):
    """Looks up first, then answers in words: the approved episodes' actions."""

    version = "lookup"

    def act(self, conversations, tools, max_new_tokens=256):
        return [PolicyTurn(content="done") if messages[-1]["role"] == "tool"
                else PolicyTurn(tool_calls=[ToolCall("lookup", {"key": "x"})]) for messages in conversations]


class Talker(Policy):
    """Always answers in words, never looks anything up."""

    version = "talker"

    def act(self, conversations, tools, max_new_tokens=256):
        return [PolicyTurn(content="no idea") for _ in conversations]


def test_replay_measures_how_often_a_policy_takes_the_approved_action():
    episodes = [judge_by_feedback(live_episode(i)) for i in range(6)]
    agrees = evaluate_replay(Lookup(), episodes, EvalConfig(max_tasks=None, batch_size=4))
    assert (agrees.n, agrees.accuracy, agrees.failure_rate, agrees.valid_tool_call_rate) == (6, 1.0, 0.0, 1.0)
    assert agrees.by_category == {"lookup": {"n": 12, "accuracy": 1.0}}
    talks = evaluate_replay(Talker(), episodes, EvalConfig(max_tasks=None))
    assert talks.accuracy == 0.5  # right on the final replies, wrong where it should have looked up
    with pytest.raises(ValueError, match="judged good"):
        evaluate_replay(Lookup(), [], EvalConfig())


class ReadsTwice(Policy):
    """Looks up twice at once where the approved episode looked up once, then answers in words."""

    version = "reads-twice"

    def act(self, conversations, tools, max_new_tokens=256):
        return [PolicyTurn(content="done") if messages[-1]["role"] == "tool"
                else PolicyTurn(tool_calls=[ToolCall("lookup", {"key": "x"}), ToolCall("lookup", {"key": "y"})])
                for messages in conversations]


def test_the_kind_of_action_is_the_tools_called_not_how_many_calls_to_each():
    episodes = [judge_by_feedback(live_episode(i)) for i in range(3)]
    assert evaluate_replay(ReadsTwice(), episodes, EvalConfig(max_tasks=None)).accuracy == 1.0
    assert evaluate_replay(Talker(), episodes, EvalConfig(max_tasks=None)).accuracy == 0.5


def _labeled(row: dict) -> dict:
    """`row` as the week's labeler leaves an episode nobody rated and it labeled good."""
    return {**row, "feedback": None, "outcome": "correct", "reward": 1.0, "reward_components": {"labeler": 0.93}}


def test_replay_reads_rated_episodes_first_and_fills_its_sample_with_labeled_ones():
    from agent_rl.evaluate.replay import held_out_sample, replay

    rated = [judge_by_feedback(live_episode(i)) for i in range(4)]
    labeled = [_labeled(live_episode(i)) for i in range(10, 30)]
    sample = held_out_sample([*labeled, *rated], cap=10, seed=3)
    assert len(sample) == 10 and {e["episode_id"] for e in rated} <= {e["episode_id"] for e in sample}
    assert sample == held_out_sample([*rated, *labeled], cap=10, seed=3)  # the same, whatever the input order
    assert {e["episode_id"] for e in held_out_sample(rated + labeled, cap=3)} < {e["episode_id"] for e in rated}
    assert len(held_out_sample(rated + labeled, cap=None)) == 24
    done = replay(Talker(), [*rated, *labeled], EvalConfig(max_tasks=12))
    assert done.metrics.n == 12 and [s.rated for s in done.steps].count(True) == 8  # 4 rated episodes, 2 steps each


def test_the_answer_check_judges_only_the_answers_users_rated():
    from agent_rl.evaluate.replay import AnswerJudging, judge_answers, replay
    from agent_rl.feedback.judge import JudgeConfig

    labeled = [_labeled(live_episode(i)) for i in range(5)]
    done = replay(Lookup(), labeled, EvalConfig(max_tasks=None))
    judging = AnswerJudging(judge=JudgeConfig.model_validate(
        {"endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "judge"}}))
    check = judge_answers(judging, done.steps, done.turns)  # no call is made: nothing users rated to judge
    assert check.status == "nothing to judge" and check.answers_not_judged == 0 and check.passed


class PricedLookup(Lookup):
    """Lookup's actions, each turn reading 1,000 prompt tokens and writing 100."""

    def act(self, conversations, tools, max_new_tokens=256):
        turns = super().act(conversations, tools, max_new_tokens)
        for turn in turns:
            turn.prompt_tokens, turn.completion_tokens = 1000, 100
        return turns


def test_replay_prices_an_episode_as_serving_it_would_and_an_api_model_at_its_published_figure():
    # The non-inferiority-at-cost gate divides these: a replay priced at zero made every gateway week's challenger
    # "0.0x cheaper" than an API model, whatever its accuracy.
    from agent_rl.agent.api_models import api_model_profile

    episodes = [judge_by_feedback(live_episode(i)) for i in range(6)]
    config = EvalConfig(max_tasks=None, prompt_price_per_m=0.10, completion_price_per_m=0.30)
    ours = evaluate_replay(PricedLookup(), episodes, config)
    # two replayed steps an episode, each 1,000 prompt tokens at $0.10/M and 100 completion tokens at $0.30/M
    assert ours.cost_per_1k_usd == pytest.approx(1000 * 2 * (1000 * 0.10 + 100 * 0.30) / 1e6)
    api = Lookup()
    api.simulation = api_model_profile("o3")
    assert evaluate_replay(api, episodes, config).cost_per_1k_usd == pytest.approx(55.19)
    assert evaluate_replay(Lookup(), episodes, config).cost_per_1k_usd == 0.0  # no tokens counted, nothing priced


def test_skipped_grpo_leaves_sft_as_the_candidate_and_says_why():
    sft = EvalMetrics(n=1, accuracy=0.5, source_accuracy=0, hallucination_rate=0, idk_rate=0, format_error_rate=0,
                      valid_tool_call_rate=1, avg_turns=1, avg_tokens=1, latency_ms_p50=1, latency_ms_p95=1,
                      cost_per_1k_usd=0)
    choice = choose_candidate(sft, None, skipped="GRPO skipped: no tools to run")
    assert choice.name == "sft" and "GRPO skipped: no tools to run" in choice.reason


def _simulated_week(rated_share: float):
    from agent_rl.simulated_users.population import PopulationConfig, simulate

    simulated = simulate(PopulationConfig(n_episodes=2000, rated_share=rated_share, seed=4))
    rows = [judge_by_feedback(s.episode.model_dump(mode="json")) for s in simulated]
    return rows, {s.episode.episode_id: s.satisfied for s in simulated}


def test_unrated_gateway_episodes_get_the_labelers_confident_labels_and_stay_told_apart_from_ratings():
    from agent_rl.curation.live import LABELER, label_unrated, split_live
    from agent_rl.feedback.labeler import LabelerConfig

    rows, truth = _simulated_week(rated_share=0.25)
    before = {r["episode_id"]: r for r in rows}
    labeled_rows, report = label_unrated(rows, LabelerConfig(min_auc=0.7, max_ece=0.1))
    assert report.passed, report.reason
    labeled = [r for r in labeled_rows if LABELER in (r.get("reward_components") or {})]
    assert len(labeled) == report.n_labeled > 200
    for row in labeled:  # only episodes nobody rated, labeled as a rating would be, with the labeler's probability
        assert before[row["episode_id"]]["outcome"] == "unjudged" and row["reward"] in (1.0, -1.0)
        assert (row["outcome"] == "correct") == (row["reward"] > 0)
        probability = row["reward_components"][LABELER]
        assert probability >= 0.8 if row["outcome"] == "correct" else probability <= 0.2
    right = sum((r["outcome"] == "correct") == truth[r["episode_id"]] for r in labeled)
    assert right / len(labeled) > 0.85  # against what the simulated users really felt
    rated = [r for r in labeled_rows if before[r["episode_id"]]["outcome"] != "unjudged"]
    assert all(r == before[r["episode_id"]] for r in rated)  # ratings are left as they were
    train, held_out = split_live(labeled_rows)
    # Held out: the good episodes, rated or labeled, whose id the hash keeps; a label that said "bad" never is.
    assert all(r["outcome"] == "correct" for r in held_out)
    held_labeled = [r for r in held_out if LABELER in (r.get("reward_components") or {})]
    assert held_labeled and len(held_labeled) < len(held_out)
    assert {r["episode_id"] for r in held_out}.isdisjoint(r["episode_id"] for r in train)


def test_a_labeler_that_fails_its_check_labels_nothing_and_says_why():
    from agent_rl.curation.live import label_unrated
    from agent_rl.feedback.labeler import LabelerConfig

    rows, _ = _simulated_week(rated_share=0.05)
    out, report = label_unrated(rows, LabelerConfig(min_rated=10_000))
    assert out == rows and not report.passed and report.n_labeled == 0
    assert "10000" in report.reason or "10,000" in report.reason

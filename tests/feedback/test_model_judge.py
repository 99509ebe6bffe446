"""The model judge (agent_rl/feedback/judge.py and friends) against a real local OpenAI-compatible server
(tests/openai_stub.py): absolute and relative modes, strict replies retried, what the judge is shown, its agreement
with ratings by the labeler's measures, the judge in curation's labeling, as a GRPO reward, and DSPy tuning."""

from __future__ import annotations

import json
import random
import re

import pytest

from agent_rl.agent.chat_client import ChatEndpoint
from agent_rl.feedback.judge import (
    JudgeConfig,
    JudgePrompt,
    JudgeReward,
    ModelJudge,
    ModelJudgeError,
    compact_transcript,
    task_key,
)
from agent_rl.feedback.judge_agreement import JudgeLabeler, judge_agreement
from agent_rl.records import Episode, Outcome
from tests.openai_stub import OpenAIStub

BAD_MARK = "couldn't find"


@pytest.fixture
def openai_stub():
    """tests/openai_stub.py's server, started on a free loopback port (a fixture here keeps pyflakes quiet)."""
    stub = OpenAIStub().start()
    try:
        yield stub
    finally:
        stub.stop()


def endpoint(stub, **overrides) -> ChatEndpoint:
    return ChatEndpoint(base_url=stub.url, model="judge-model", api_key_env=None, retry_backoff_s=0, **overrides)


def judge_for(stub, **config) -> ModelJudge:
    return ModelJudge(JudgeConfig(endpoint=endpoint(stub), **config))


def conversation(i: int, good: bool, request: str | None = None) -> list[dict]:
    request = request or f"Where is my order {10000 + i}?"
    answer = f"Order {10000 + i} is shipped and arrives Friday." if good else f"Sorry, I {BAD_MARK} order {10000 + i}."
    call = {"id": f"call_{i}", "type": "function",
            "function": {"name": "lookup_order", "arguments": json.dumps({"order_id": str(10000 + i)})}}
    return [{"role": "system", "content": "You are a shop's support assistant."},
            {"role": "user", "content": request},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": json.dumps({"status": "shipped", "n": i})},
            {"role": "assistant", "content": answer}]


def episode(i: int, good: bool, *, feedback: str | None = None, request: str | None = None, **fields) -> dict:
    """A gateway episode as the pool exports it."""
    return {"episode_id": f"ep-{i}", "environment": "gateway", "context": "shop", "question": "",
            "policy_version": "v1", "outcome": "unjudged", "messages": conversation(i, good, request),
            "feedback": feedback, **fields}


def last_user(request: dict) -> str:
    return request["messages"][-1]["content"]


def agreeing(request: dict) -> str:
    """A judge that sees what the rating saw: answers with a confident, right score."""
    text = last_user(request)
    if "### Trajectory" in text:
        blocks = re.split(r"### Trajectory (\d+)\n", text)[1:]
        scores = [{"trajectory": int(n), "score": 0.02 if BAD_MARK in body else 0.98}
                  for n, body in zip(blocks[::2], blocks[1::2])]
        return json.dumps({"scores": scores[::-1]})  # out of order on purpose: mapped by trajectory number
    return json.dumps({"score": 0.02 if BAD_MARK in text else 0.98})


def test_absolute_mode_retries_unusable_replies_then_parses_the_score(openai_stub):
    openai_stub.queue("I think it went well", json.dumps({"score": 1.7}), json.dumps({"score": True}),
                      json.dumps({"score": 0.73, "reason": "answered"}))
    with judge_for(openai_stub, retries=3) as judge:
        assert judge.score(episode(1, True)) == pytest.approx(0.73)
    assert len(openai_stub.requests) == 4
    request = openai_stub.requests[0]
    assert request["model"] == "judge-model" and request["response_format"] == {"type": "json_object"}
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    assert '{"score": P}' in request["messages"][0]["content"]


def test_absolute_mode_gives_up_with_a_clear_error(openai_stub):
    openai_stub.script(lambda request: "no json here")
    with judge_for(openai_stub, retries=1) as judge, pytest.raises(ModelJudgeError) as error:
        judge.score(episode(7, True))
    assert len(openai_stub.requests) == 2
    assert "episode ep-7" in str(error.value) and "unusable reply" in str(error.value)


def test_relative_mode_sends_one_call_per_task_with_every_trajectory_and_maps_scores_back(openai_stub):
    openai_stub.script(agreeing)
    same = "Where is my order 10001?"
    episodes = [episode(0, True, request=same), episode(1, False, request="How much is shipping to Denver?"),
                episode(2, False, request=same), episode(3, True, request="how much is shipping   to Denver?"),
                episode(4, True, request="Is the kettle in stock?"), episode(5, True, request=same)]
    with judge_for(openai_stub, mode="relative") as judge:
        scores = judge.score_episodes(episodes)
    assert [s.episode_id for s in scores] == [e["episode_id"] for e in episodes]
    assert [s.score for s in scores] == [0.98, 0.02, 0.02, 0.98, 0.98, 0.98]
    assert [(s.mode, s.group) for s in scores] == [("relative", 3), ("relative", 2), ("relative", 3),
                                                   ("relative", 2), ("absolute", 1), ("relative", 3)]
    assert len(openai_stub.requests) == 3  # two tasks compared, the lone one judged absolutely
    first = last_user(openai_stub.requests[0])
    assert first.count("### Trajectory") == 3
    for i in (0, 2, 5):  # every trajectory of the task, in input order
        assert f"order_id\": \"{10000 + i}" in first.split(f"### Trajectory {(0, 2, 5).index(i) + 1}\n")[1]
    assert "3 conversations" in openai_stub.requests[0]["messages"][0]["content"]


def test_relative_mode_splits_a_large_task_evenly_and_retries_an_incomplete_ranking(openai_stub):
    openai_stub.queue(json.dumps({"scores": [{"trajectory": 1, "score": 0.5}]}))  # misses trajectories 2 and 3
    openai_stub.script(agreeing)
    episodes = [episode(i, i % 3 != 0, request="same question") for i in range(9)]
    with judge_for(openai_stub, mode="relative", group_size=4) as judge:
        scores = judge.score_episodes(episodes)
    assert [s.group for s in scores] == [3] * 9 and len(openai_stub.requests) == 4
    assert [s.score for s in scores] == [0.02 if i % 3 == 0 else 0.98 for i in range(9)]


def test_the_judge_never_sees_the_rating_the_feedback_or_the_outcome(openai_stub):
    openai_stub.script(agreeing)
    secret = "SECRET-FEEDBACK-4711"
    rated = [episode(i, True, request="same", feedback=json.dumps({"reward": 1, "comment": secret}),
                     reward=0.987654, outcome="correct", reward_components={"feedback": 0.987654}) for i in range(3)]
    rated.append(Episode(episode_id="ep-obj", context="shop", question="same", environment="gateway",
                         policy_version="v1", messages=conversation(9, True, "same"), outcome=Outcome.CORRECT,
                         reward=0.987654, feedback=f"up {secret}"))
    with judge_for(openai_stub, mode="relative") as judge:
        judge.score_episodes(rated)
    with judge_for(openai_stub, mode="absolute") as judge:
        judge.score_episodes(rated)
    sent = json.dumps(openai_stub.requests)
    assert len(openai_stub.requests) == 5
    for leak in (secret, "0.987654", "reward_components", '"correct"', "feedback"):
        assert leak not in sent


def test_the_transcript_is_compact_roles_calls_and_cut_tool_results():
    messages = conversation(3, True)
    messages[3]["content"] = "x" * 5000
    text = compact_transcript({"messages": messages}, max_message_chars=100)
    assert text.splitlines()[:3] == ["SYSTEM: You are a shop's support assistant.", "USER: Where is my order 10003?",
                                     'ASSISTANT calls lookup_order({"order_id": "10003"})']
    assert "TOOL lookup_order returned: " + "x" * 100 + "... [4900 chars cut]" in text
    long = [{"role": "user", "content": "first request"}] + [{"role": "assistant", "content": f"step {i} " * 20}
                                                            for i in range(100)]
    short = compact_transcript({"messages": long}, max_chars=1000)
    assert len(short) <= 1000 and short.startswith("USER: first request") and "lines left out" in short
    assert short.endswith(("step 99 " * 20).strip())
    assert task_key({"context": "c", "environment": "gateway", "question": "order_status",
                     "messages": [{"role": "user", "content": " Where  IS it?"}]}) == ("c", "where is it?")


def test_a_judge_config_refuses_a_stored_key():
    with pytest.raises(ValueError, match="api_key_env"):
        JudgeConfig.model_validate({"endpoint": {"base_url": "http://x/v1", "model": "m", "api_key": "sk-1"}})
    config = JudgeConfig.model_validate({"endpoint": {"base_url": "http://x/v1", "model": "m", "api_key_env": "K",
                                                      "max_tokens": 50}})
    assert "sk-" not in config.model_dump_json()


def rated_week(n: int = 60, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        good = rng.random() < 0.6
        out.append(episode(i, good, feedback="up" if good else "down"))
    return out


def test_an_agreeing_judge_passes_the_labelers_check_and_a_random_one_fails_it(openai_stub):
    week = rated_week() + [episode(100 + i, True) for i in range(5)]  # unrated: not measured
    openai_stub.script(agreeing)
    with judge_for(openai_stub) as judge:
        report = judge_agreement(judge, week)
    assert report["passed"] and report["auc"] == 1.0 and report["ece"] <= 0.05 and report["n"] == 60
    assert report["reason"] == "" and report["calls"] == 60
    rng = random.Random(1)
    openai_stub.script(lambda request: json.dumps({"score": round(rng.random(), 3)}))
    with judge_for(openai_stub) as judge:
        report = judge_agreement(judge, week)
    assert not report["passed"] and report["auc"] < 0.75 and "AUC" in report["reason"]
    assert "(model judge)" in report["reason"]
    with judge_for(openai_stub) as judge:
        report = judge_agreement(judge, week[:10])
    assert not report["passed"] and report["auc"] is None and "too few rated" in report["reason"]
    assert report["calls"] == 0


def test_curation_labels_unrated_gateway_episodes_with_a_judge_that_passed_its_check(openai_stub):
    from agent_rl.curation.live import LABELER, label_unrated

    openai_stub.script(agreeing)
    unrated = [episode(200 + i, i % 2 == 0) for i in range(6)]
    rows = rated_week(80) + unrated
    labeler = JudgeLabeler(judge=JudgeConfig(endpoint=endpoint(openai_stub)))
    out, report = label_unrated(rows, labeler)
    assert report.passed and report.n_unrated == 6 and report.n_labeled == 6 and report.n_labeled_good == 3
    labeled = {r["episode_id"]: r for r in out if LABELER in (r.get("reward_components") or {})}
    assert sorted(labeled) == sorted(e["episode_id"] for e in unrated)
    assert labeled["ep-200"]["outcome"] == "correct" and labeled["ep-201"]["outcome"] == "wrong"
    openai_stub.script(lambda request: json.dumps({"score": 0.5}))
    calls = len(openai_stub.requests)
    out, report = label_unrated(rows, labeler)
    assert not report.passed and report.n_labeled == 0 and "AUC" in report.reason
    assert not any(LABELER in (r.get("reward_components") or {}) for r in out)
    assert len(openai_stub.requests) - calls < len(rows)  # unrated episodes are not scored after a failed check


def test_the_profile_field_turns_the_judge_on(openai_stub):
    from resources.curation import CurationResource

    spec = json.dumps({"endpoint": {"base_url": openai_stub.url, "model": "m", "api_key_env": None},
                       "mode": "relative"})
    labeler = CurationResource(labeler_judge=spec, labeler_min_auc=0.9).labeler()
    assert isinstance(labeler, JudgeLabeler) and labeler.judge.mode == "relative" and labeler.min_auc == 0.9
    with pytest.raises(Exception, match="mode"):
        CurationResource(labeler_judge=json.dumps({"endpoint": {"base_url": "http://x/v1", "model": "m"},
                                                   "mode": "ranked"}))


def test_the_judge_as_a_grpo_reward_compares_the_rollouts_of_one_prompt(openai_stub):
    from agent_rl.train.rewards import ExtraReward, check_extra_rewards

    openai_stub.script(agreeing)
    reward = JudgeReward(judge_for(openai_stub, mode="relative"))
    check_extra_rewards([ExtraReward(reward, weight=0.5)])
    prompts = [[{"role": "user", "content": "Where is order 1?"}]] * 3 + [[{"role": "user", "content": "Other?"}]]
    completions = [[{"role": "assistant", "content": "Order 1 is shipped."}],
                   [{"role": "assistant", "content": f"I {BAD_MARK} it."}],
                   [{"role": "assistant", "content": "It arrives Friday."}],
                   [{"role": "assistant", "content": f"I {BAD_MARK} that."}]]
    assert reward(prompts=prompts, completions=completions, environments=[None] * 4) == [0.98, 0.02, 0.98, 0.02]
    assert len(openai_stub.requests) == 2
    openai_stub.script(lambda request: "garbage")
    assert reward(prompts=prompts, completions=completions) == [None] * 4


def test_dspy_tunes_the_prompt_and_reports_agreement_before_and_after(openai_stub, tmp_path):
    from agent_rl.feedback.judge_optimize import optimize_judge_prompt

    def needs_examples(request: dict) -> str:
        """A judge that only gets it right with scored examples before the episode; alone it hedges at 0.5."""
        if len(request["messages"]) <= 2:
            return json.dumps({"score": 0.5})
        return json.dumps({"score": 0.02 if BAD_MARK in last_user(request) else 0.98})

    openai_stub.script(needs_examples)
    week = rated_week(40, seed=3)
    report = optimize_judge_prompt(week, endpoint(openai_stub), tmp_path / "prompt.json", max_demos=2,
                                   min_auc=0.8, max_ece=0.1)
    assert report["optimizer"] == "BootstrapFewShot" and report["n_train"] + report["n_held_out"] == 40
    assert report["before"]["auc"] == 0.5 and not report["before"]["passed"]
    assert report["after"]["auc"] == 1.0 and report["after"]["passed"] and report["improved"]
    # DSPy spoke OpenAI's chat API to the same endpoint (its own prompt layout, the transcript as input).
    assert any("[[ ## transcript ## ]]" in json.dumps(r["messages"]) for r in openai_stub.requests)
    tuned = JudgePrompt.load(report["path"])
    assert len(tuned.demos) == report["demos"] == 2 and tuned.source["after"]["auc"] == 1.0
    assert {d["score"] >= 0.5 for d in tuned.demos} == {True, False}  # demos of both kinds
    openai_stub.requests.clear()
    with ModelJudge(JudgeConfig(endpoint=endpoint(openai_stub), prompt_path=report["path"])) as judge:
        assert judge.score(episode(99, False)) == 0.02
    sent = openai_stub.requests[0]["messages"]
    assert len(sent) == 2 + 2 * len(tuned.demos) and sent[1]["content"] == tuned.demos[0]["transcript"]


def test_the_key_comes_from_the_named_environment_variable(openai_stub, monkeypatch):
    openai_stub.require_api_key = "sk-judge-test"
    openai_stub.script(agreeing)
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-judge-test")
    config = JudgeConfig(endpoint=endpoint(openai_stub).model_copy(update={"api_key_env": "JUDGE_TEST_KEY"}))
    with ModelJudge(config) as judge:
        assert judge.score(episode(1, True)) == 0.98
    assert openai_stub.headers[-1]["Authorization"] == "Bearer sk-judge-test"
    assert "sk-judge-test" not in config.model_dump_json()

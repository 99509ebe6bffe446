"""The model judge (agent_rl/feedback/judge.py and friends) against a real local OpenAI-compatible server
(tests/openai_stub.py): absolute and relative modes, strict replies retried, what the judge is shown, its agreement
with ratings by the labeler's measures, the judge in curation's labeling (alone, or as one signal of the signals
labeler), as a GRPO reward, and DSPy tuning."""

from __future__ import annotations

import json
import random
import re

import pytest

from agent_rl.chat_client import ChatEndpoint
from agent_rl.feedback.judge import (
    JudgeConfig,
    JudgePrompt,
    JudgeReward,
    ModelJudge,
    ModelJudgeError,
    compact_transcript,
    task_key,
)
from agent_rl.feedback.judge_agreement import JudgeAndSignalsLabeler, JudgeLabeler, judge_agreement
from agent_rl.feedback.labeler import LabelerConfig, label_episodes
from agent_rl.records import Episode, Outcome
from tests.openai_stub import OpenAIStub, openai_stub  # noqa: F401 (fixture)

BAD_MARK = "couldn't find"


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


def judge_by(score_of):
    """A scripted judge in either mode: `score_of(transcript)` scores each conversation it is shown."""
    def respond(request: dict) -> str:
        text = last_user(request)
        if "### Trajectory" in text:
            blocks = re.split(r"### Trajectory (\d+)\n", text)[1:]
            scores = [{"trajectory": int(n), "score": score_of(body)} for n, body in zip(blocks[::2], blocks[1::2])]
            return json.dumps({"scores": scores[::-1]})  # out of order on purpose: mapped by trajectory number
        return json.dumps({"score": score_of(text)})
    return respond


# A judge that sees what the rating saw: answers with a confident, right score.
agreeing = judge_by(lambda transcript: 0.02 if BAD_MARK in transcript else 0.98)


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


# -- the judge as one signal of the signals labeler ---------------------------------------------------------------

WRONG = "was delivered yesterday"  # a wrong answer stated as confidently as a right one: no signal shows it


def answered(i: int, good: bool, *, rated: bool = True, follow_up: str | None = None) -> dict:
    """An episode whose conversation is a good one's but for the answer's words (right, or WRONG); `follow_up`:
    the user's next turn, the only implicit signal that may tell them apart. One request for all: one task, so a
    relative judge compares up to 32 in a call (a few calls per week keep the tests fast)."""
    row = episode(i, True, feedback=("up" if good else "down") if rated else None, request="Where is my order?")
    if not good:
        row["messages"][-1]["content"] = f"Order {10000 + i} {WRONG}."
    if follow_up:
        row["messages"] += [{"role": "user", "content": follow_up}, {"role": "assistant", "content": "Glad to help."}]
    return row


def silent_week(n_rated: int = 120, n_unrated: int = 40, seed: int = 0) -> tuple[list[dict], dict[str, bool]]:
    """Episodes whose implicit signals are all alike: only reading the answer tells good from bad. (rows, truth)"""
    rng = random.Random(seed)
    truth = {f"ep-{i}": rng.random() < 0.5 for i in range(n_rated + n_unrated)}
    return [answered(i, truth[f"ep-{i}"], rated=i < n_rated) for i in range(n_rated + n_unrated)], truth


def reads_the_answer(low: float = 0.02, high: float = 0.98):
    """A judge that tells a WRONG answer from a right one, scoring them `low` and `high`."""
    return judge_by(lambda transcript: low if WRONG in transcript else high)


def relative_judge(stub) -> JudgeConfig:
    return JudgeConfig(endpoint=endpoint(stub), mode="relative", group_size=32)


def test_the_judge_as_a_signal_passes_the_check_where_the_signals_alone_cannot(openai_stub):
    from agent_rl.curation.live import LABELER, label_unrated

    rated = 140  # validation holds out a fifth of the rated episodes by id: >= 100 are left to fit on
    rows, truth = silent_week(n_rated=rated)
    alone = label_episodes(rows, LabelerConfig())  # the signals alone are at chance
    assert not alone.report.passed and abs(alone.report.auc - 0.5) < 0.05 and "< 0.76" in alone.report.reason
    assert alone.report.judge_calls is None
    openai_stub.script(reads_the_answer())
    labeler = JudgeAndSignalsLabeler(judge=relative_judge(openai_stub))
    out, report = label_unrated(rows, labeler)
    assert report.passed and report.auc == 1.0 and report.ece_excess <= 0.05, report.reason
    # Every episode it learned from or labeled is scored once; rated ones held out for validation are never sent.
    n = report.n_rated + report.n_unrated
    assert report.judge_calls == len(openai_stub.requests) == -(-n // 32)
    assert sum(last_user(r).count("### Trajectory") for r in openai_stub.requests) == n
    assert report.n_unrated == 40 and report.n_labeled == 40
    labeled = {r["episode_id"]: r["outcome"] for r in out if LABELER in (r.get("reward_components") or {})}
    assert labeled == {i: "correct" if truth[i] else "wrong" for i in list(truth)[rated:]}
    # Scores go back to their episodes by position, checked id by id: rated episodes without an id keep their own.
    for row in rows[:rated]:
        row["episode_id"] = None
    result = labeler.label(rows)
    assert result.report.passed and result.report.auc == 1.0 and result.report.n_labeled == 40


def test_a_judge_in_the_right_order_but_unsure_is_calibrated_by_the_combination(openai_stub):
    """Alone, a judge scoring every right answer 0.6 and every wrong one 0.4 fails the calibration bar and labels
    nothing; as a signal, the ratings scale it into confident, right labels."""
    rows, truth = silent_week(seed=1)
    openai_stub.script(reads_the_answer(0.4, 0.6))
    judge = relative_judge(openai_stub)
    alone = JudgeLabeler(judge=judge).label(rows)
    assert not alone.report.passed and alone.report.auc == 1.0 and "ECE" in alone.report.reason
    assert alone.labels == ()
    combined = JudgeAndSignalsLabeler(judge=judge).label(rows)
    assert combined.report.passed and combined.report.ece_excess <= 0.05, combined.report.reason
    assert {label.episode_id: label.good for label in combined.labels} == {i: truth[i] for i in list(truth)[120:]}
    assert all(not 0.2 < label.probability < 0.8 for label in combined.labels)


def test_a_judge_answering_noise_leaves_a_labeler_the_signals_carry_as_it_was(openai_stub):
    rng = random.Random(2)
    rows = []
    for i in range(160):
        good = rng.random() < 0.5
        # Most users say how it went; some say nothing, and a few thank a wrong answer.
        said = rng.random() < 0.85
        follow_up = ("Thanks, that helps!" if good else "No, that's not right.") if said else \
            "Thanks!" if not good and rng.random() < 0.3 else None
        rows.append(answered(i, good, rated=i < 120, follow_up=follow_up))
    alone = label_episodes(rows, LabelerConfig())
    assert alone.report.passed and alone.labels
    noise = random.Random(3)
    openai_stub.script(judge_by(lambda transcript: round(noise.random(), 3)))
    combined = JudgeAndSignalsLabeler(judge=relative_judge(openai_stub)).label(rows)
    assert combined.report.passed and combined.report.judge_calls == 5
    assert combined.report.auc >= alone.report.auc - 0.03  # the ratings gave the noise next to no weight
    assert [label.good for label in combined.scored] == [label.good for label in alone.scored]


def test_too_few_ratings_spend_no_judge_call_and_bad_judge_scores_are_refused(openai_stub):
    openai_stub.script(reads_the_answer())
    rows, _ = silent_week(n_rated=60, n_unrated=10)
    result = JudgeAndSignalsLabeler(judge=JudgeConfig(endpoint=endpoint(openai_stub))).label(rows)
    assert not result.report.passed and "too few rated episodes: 60 < 100" in result.report.reason
    assert result.report.judge_calls == 0 and openai_stub.requests == []
    with pytest.raises(ValueError, match="judge_scores has 69 scores for 70 episodes"):
        label_episodes(rows, judge_scores=[0.5] * 69)
    for wrong, shown in ((1.5, "1.5"), (float("nan"), "nan"), (-0.1, "-0.1"), (True, "True"), ("0.7", "'0.7'")):
        with pytest.raises(ValueError, match=rf"judge_scores\[3\] is {re.escape(shown)}: .* finite number in \[0, 1\]"):
            label_episodes(rows, judge_scores=[0.5] * 3 + [wrong] + [0.5] * 66)
    with pytest.raises(ValueError, match="min_per_class"):  # the signals labeler's own settings are checked
        JudgeAndSignalsLabeler(judge=JudgeConfig(endpoint=endpoint(openai_stub)),
                               signals=LabelerConfig(min_per_class=4))


def test_the_profile_field_makes_the_judge_a_signal_and_needs_a_judge(openai_stub):
    from resources.curation import CurationResource

    spec = json.dumps({"endpoint": {"base_url": openai_stub.url, "model": "m", "api_key_env": None}})
    labeler = CurationResource(labeler_judge=spec, labeler_judge_role="signal", labeler_min_auc=0.9).labeler()
    assert isinstance(labeler, JudgeAndSignalsLabeler) and labeler.signals.min_auc == 0.9
    assert labeler.signals.min_rated == 100
    assert isinstance(CurationResource(labeler_judge=spec).labeler(), JudgeLabeler)  # the judge alone by default
    with pytest.raises(Exception, match="labeler_judge_role \"signal\" needs a judge"):
        CurationResource(labeler_judge_role="signal")
    with pytest.raises(Exception, match="labeler_judge_role"):
        CurationResource(labeler_judge=spec, labeler_judge_role="both")

"""Replay validation's answer check (agent_rl/evaluate/replay.py: `judge_answers`, through validation.py's `validate`)
with a real local OpenAI-compatible server as the judge (tests/openai_stub.py): where the approved episode and the
candidate both answered in words, the judge compares the two answers; a candidate it prefers passes and is reported,
one it finds worse fails the improvement gate, a judge that fails is recorded without its replies or the key, and
without a judge the report says that answer quality is left to the A/B test."""

from __future__ import annotations

import json
import re

import pytest

from agent_rl.chat_client import ChatEndpoint
from agent_rl.agent.policy import Policy, PolicyTurn, ToolCall
from agent_rl.environments.gateway import GatewayEnvironment
from agent_rl.evaluate.cache import EvaluationCache
from agent_rl.evaluate.gates import GateSettings
from agent_rl.evaluate.harness import EvalConfig
from agent_rl.evaluate.replay import AnswerJudging, failure_kind, judge_answers, replay
from agent_rl.evaluate.validation import Model, held_out_measure, validate
from agent_rl.feedback.judge import JudgeConfig, ModelJudgeError
from tests.evaluate.test_validation_run import Log
from tests.openai_stub import OpenAIStub, fail, malformed, openai_stub  # noqa: F401 (fixture)

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a thing up.", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]
EPISODES = 8
CONFIG = EvalConfig(max_tasks=None, seed=0)
BETTER = "as the lookup returned"  # what the scripted judge likes best
BAD = "no idea"


def approved_episode(i: int) -> dict:
    """A held-out gateway episode users rated good: a lookup, then the answer in words."""
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": f'{{"key": "{i}"}}'}}
    return {"episode_id": f"ep-{i}", "environment": "gateway", "task_category": "lookup", "outcome": "correct",
            "feedback": "up", "tools": TOOLS, "messages": [
                {"role": "system", "content": "You look things up."},
                {"role": "user", "content": f"find {i}"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": f"value {i}"},
                {"role": "assistant", "content": f"It is value {i}."}]}


class Answers(Policy):
    """Looks up first (the approved action), then answers in words with `answer(i)`."""

    version = "answers"

    def __init__(self, answer):
        self.answer = answer

    def act(self, conversations, tools, max_new_tokens=256):
        turns = []
        for messages in conversations:
            key = re.search(r"find (\d+)", next(m["content"] for m in messages if m["role"] == "user")).group(1)
            turns.append(PolicyTurn(content=self.answer(key)) if messages[-1]["role"] == "tool"
                         else PolicyTurn(tool_calls=[ToolCall("lookup", {"key": key})]))
        return turns


def better():
    return Answers(lambda key: f"It is value {key}, {BETTER}.")


def worse():
    return Answers(lambda key: f"Sorry, {BAD}.")


class Talker(Policy):
    """Production's incumbent in these tests: never looks anything up, so the candidate wins on actions."""

    version = "talker"

    def act(self, conversations, tools, max_new_tokens=256):
        return [PolicyTurn(content="Sorry, no idea.") for _ in conversations]


def score_of(transcript: str) -> float:
    last = transcript.strip().splitlines()[-1]
    return 0.95 if BETTER in last else 0.05 if BAD in last else 0.8


def judge(request: dict) -> str:
    """A relative judge: scores each trajectory by its final answer."""
    blocks = re.split(r"### Trajectory (\d+)\n", request["messages"][-1]["content"])[1:]
    return json.dumps({"scores": [{"trajectory": int(n), "score": score_of(body)}
                                  for n, body in zip(blocks[::2], blocks[1::2])]})


def judging(stub: OpenAIStub, **endpoint) -> AnswerJudging:
    return AnswerJudging(judge=JudgeConfig(endpoint=ChatEndpoint(
        base_url=stub.url, model="judge-model", retry_backoff_s=0, **{"api_key_env": None, **endpoint}), retries=1))


def run(candidate, tmp_path, answer_judge=None, gate="superiority"):
    episodes = [approved_episode(i) for i in range(EPISODES)]
    held_out = held_out_measure(GatewayEnvironment.capabilities, CONFIG, rated_good=lambda: episodes,
                                worlds=lambda: pytest.fail("live traffic has no world"), answer_judge=answer_judge)
    models = {"sft": Model(candidate, lambda: "w-sft"), "incumbent": Model(Talker, lambda: None, label=" (v0)")}
    log = Log()
    result = validate(models, held_out, base=Talker, gates=GateSettings(kind=gate), incumbent_version="v0",
                      cache=EvaluationCache(tmp_path / "cache"), inputs="replay-1", out_dir=tmp_path / "report",
                      threads=1, hacked=None, skipped="GRPO skipped: gateway", log=log)
    return result, result.report("run-1", ("v0", "talker"), held_out, None, None), log


def test_a_candidate_whose_answers_the_judge_prefers_passes_and_is_reported(openai_stub, tmp_path):
    openai_stub.script(judge)
    result, report, log = run(better, tmp_path, judging(openai_stub))
    answers = report["answers"]
    assert answers["status"] == "judged" and answers["gating"] and answers["passed"]
    assert (answers["answers_judged"], answers["answers_at_least_as_good"], answers["share"]) == (8, 8, 1.0)
    assert answers["episodes_judged"] == 8 and answers["answers_not_judged"] == 0
    assert set(answers["verdicts"]) == {f"ep-{i}:{2 * i + 1}" for i in range(EPISODES)}  # the answer steps only
    gate = report["gates"]["improvement"]
    assert gate["passed"] and "8 of 8 at least as good (100%" in gate["message"]
    assert gate["details"]["answers_share"] == 1.0 and gate["details"]["answers_judged"] == 8
    assert answers["summary"] in log.lines
    # One call per answer; both conversations, unnamed, in a shuffled order (never always the approved one first).
    assert len(openai_stub.requests) == EPISODES
    firsts = []
    for request in openai_stub.requests:
        text = request["messages"][-1]["content"]
        assert text.count("### Trajectory") == 2 and "approved" not in text.lower() and "candidate" not in text.lower()
        first = re.split(r"### Trajectory \d+\n", text)[1]
        firsts.append(BETTER in first)
        assert "USER: find" in first and "TOOL lookup returned: value" in first
    assert 0 < sum(firsts) < EPISODES


def test_a_candidate_whose_answers_the_judge_rejects_fails_the_gate_even_on_a_rerun(openai_stub, tmp_path):
    openai_stub.script(judge)
    result, report, log = run(worse, tmp_path, judging(openai_stub))
    assert result.results["sft"].accuracy == 1.0  # the approved action at every step: the kind of action passes
    answers = report["answers"]
    assert (answers["status"], answers["passed"], answers["answers_at_least_as_good"], answers["share"]) == (
        "judged", False, 0, 0.0)
    assert answers["p_value"] == pytest.approx(0.5 ** EPISODES)
    gate = report["gates"]["improvement"]
    assert not gate["passed"] and "0 of 8 at least as good" in gate["message"] and "below the bar of 50%" in gate[
        "message"]
    # A rerun of the week does not reuse the cached replay: the candidate's answers are judged again.
    again, report, _ = run(worse, tmp_path, judging(openai_stub))
    assert not again.improvement.passed and len(openai_stub.requests) == 2 * EPISODES


def test_under_an_open_gate_the_answers_are_reported_but_do_not_gate(openai_stub, tmp_path):
    openai_stub.script(judge)
    result, report, _ = run(worse, tmp_path, judging(openai_stub), gate="open")
    assert report["answers"]["share"] == 0.0 and not report["answers"]["gating"]
    assert result.improvement.passed and "reported only, no bar" in result.improvement.message


def test_without_a_judge_the_summary_leaves_answer_quality_to_the_ab_test(tmp_path):
    result, report, _ = run(better, tmp_path)
    assert report["answers"]["status"] == "no judge" and report["answers"]["answers_judged"] == 0
    assert "answer quality is left to the A/B test" in report["answers"]["summary"]
    assert result.improvement.passed and "answer quality is left to the A/B test" in result.improvement.message


def test_a_candidate_that_never_answers_in_words_has_nothing_to_judge(openai_stub, tmp_path):
    openai_stub.script(judge)
    always_looks_up = Answers(lambda key: "")  # an empty reply where the approved episode answered
    check = judge_answers(judging(openai_stub), *_replayed(always_looks_up))
    assert (check.status, check.passed, check.answers_not_judged) == ("nothing to judge", True, EPISODES)
    assert "answer quality is left to the A/B test" in check.summary and not openai_stub.requests


def _replayed(policy):
    done = replay(policy, [approved_episode(i) for i in range(EPISODES)], CONFIG)
    return done.steps, done.turns


@pytest.mark.parametrize("reply, kind", [(fail(500, '{"error": {"message": "It is value 3. overloaded"}}'), "HTTP 500"),
                                         (malformed("It is value 3, the answer you sent"), "unusable reply")])
def test_a_judge_that_fails_is_recorded_as_unavailable_without_replies_or_key(openai_stub, tmp_path, monkeypatch,
                                                                              reply, kind):
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-very-secret-1234")
    openai_stub.require_api_key = "sk-very-secret-1234"
    openai_stub.script(lambda request: reply)
    result, report, log = run(worse, tmp_path, judging(openai_stub, api_key_env="JUDGE_TEST_KEY"))
    answers = report["answers"]
    assert answers["status"] == "judge unavailable" and answers["passed"] and not answers["gating"]
    assert f"{kind} after 2 attempt(s)" in answers["summary"]
    assert "after judging 0 of 8 answers: answer quality is left to the A/B test" in answers["summary"]
    assert result.improvement.passed  # an outside endpoint's outage does not block the week
    shown = json.dumps(report) + "\n".join(log.lines)
    assert "value 3" not in shown and "sk-very-secret" not in shown and "overloaded" not in shown
    assert openai_stub.headers[0]["Authorization"] == "Bearer sk-very-secret-1234"  # the key was sent, never shown


def test_failure_kind_keeps_statuses_and_error_names_only():
    error = ModelJudgeError("the model judge gave no usable score for a group: chat endpoint http://x/v1 (model 'j') "
                            "failed after 3 attempt(s): HTTP 503: secret body; ConnectError: [Errno 111] refused; "
                            "unusable reply: expected JSON, got 'the user's address is 1 Main St'")
    assert failure_kind(error) == "HTTP 503, ConnectError, unusable reply after 3 attempt(s)"


def test_the_evaluation_resource_names_the_judge_or_takes_the_weeks_labeler_judge():
    from pydantic import ValidationError

    from resources.evaluation import EvaluationResource

    week = json.dumps({"endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "labeler-judge"}, "mode": "relative"})
    own = json.dumps({"endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "answer-judge"}})
    assert EvaluationResource().answer_judging(None) is None
    assert EvaluationResource(min_answer_share=0.4).answer_judging(week).judge.endpoint.model == "labeler-judge"
    assert EvaluationResource(min_answer_share=0.4).answer_judging(week).min_share == 0.4
    assert EvaluationResource(answer_judge=own).answer_judging(week).judge.endpoint.model == "answer-judge"
    assert EvaluationResource(answer_judge=None).answer_judging(week) is None
    with pytest.raises(ValidationError):
        EvaluationResource(answer_judge=json.dumps({"endpoint": {"base_url": "x", "model": "m"}, "modes": "relative"}))
    with pytest.raises(ValidationError, match="credential"):
        EvaluationResource(answer_judge=json.dumps({"endpoint": {"base_url": "x", "model": "m", "api_key": "sk-1"}}))

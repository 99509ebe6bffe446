"""Judges: normalized deterministic matching (table-driven) and the LLM judge over a real local HTTP stub."""

from __future__ import annotations

import json
import time

import pytest

from agent_rl.reward.judge import DeterministicJudge, Judge, JudgeError, LLMJudge, Verdict, is_idk
from agent_rl.chat_client import ChatEndpoint
from tests.openai_stub import delay, fail, malformed, openai_stub  # noqa: F401 (fixture)

Q = "question"

SAME = [
    # dates
    ("June 5, 2001", "2001-06-05"),
    ("2001-06-05", "June 5, 2001"),
    ("June 5, 2001", "5 June 2001"),
    ("June 5, 2001", "6/5/2001"),
    ("June 5, 2001", "It's on Tuesday, June 5th."),
    ("June 5, 2001", "the 5th of June, 2001"),
    ("June 5, 2001", "Jun. 5, 2001"),
    ("September 25, 2024 at 8:30 AM", "Wednesday, 25 September 2024 at 8:30am"),
    ("September 25, 2024 at 2:30 PM", "9/25 at 14:30"),
    ("March 18, 2024", "The cost estimate is due March 18."),
    # amounts
    ("$1.2 million", "$1,200,000"),
    ("$1,200,000", "1.2M USD"),
    ("$1,200,000", "$1.2M"),
    ("$350,000", "$350K"),
    ("$48,250.00", "The invoice total is $48,250."),
    ("$48,250.00", "USD 48,250.00"),
    ("50 cards", "You asked Kevin for 50."),
    ("$12.2 MM", "about $12.2 million"),
    # names
    ("John Smith", "John Smith"),
    ("John Smith", "Smith, John"),
    ("John Smith", "It's john smith now."),
    ("John Smith", "John Q. Smith is the lead"),
    ("Smith, John", "John Smith"),
    ("Kevin O'Brien", "Kevin O'Brien took it over"),
    ("Lisa Woods Ford", "Lisa Woods Ford referred him"),
    ("Allen", "Allen Humbolt"),
    # locations, case and punctuation
    ("Denver", "The offsite moved to Denver."),
    ("Salt Lake City", "salt lake city, Utah"),
    ("Churrasco's", "churrasco's (their choice)"),
    # decisions
    ("Approved", "It was approved by the committee."),
    ("Rejected", "It was not approved."),
    ("Rejected", "The committee declined it."),
    ("On hold", "It's been put on hold until next quarter."),
    ("Cancelled", "They canceled it."),
    ("Not completed", "The migration was not completed."),
    ("Pending", "It's not yet approved."),
    # unanswerable
    ("I don't know", "I don't know."),
    ("I don't know", "I could not find anything about that in your inbox."),
    ("I don't know", "There is no information about that offsite."),
    # long golden answers
    (
        "Vince said there was no problem and that Martin should go ahead and submit it",
        "Vince said there's no problem; Martin should go ahead and submit it.",
    ),
]

DIFFERENT = [
    ("June 5, 2001", "June 6, 2001"),
    ("June 5, 2001", "2002-06-05"),
    ("June 5, 2001", "5/6/2001"),  # month first
    ("June 5, 2001", "June 1, June 2, June 3, June 4 or June 5"),  # shotgun
    ("September 25, 2024 at 8:30 AM", "September 25, 2024 at 1:00 PM"),
    ("September 25, 2024 at 8:30 AM", "8:30 AM"),
    ("$1,200,000", "$1.3 million"),
    ("$1,200,000", "$1,200"),
    ("$48,250.00", "$48,205.00"),
    ("$350,000", "It is $100K, $200K, $300K or $350K"),
    ("John Smith", "John"),
    ("John Smith", "Smith"),
    ("John Smith", "John Smithson"),
    ("John Smith", "Jane Smith"),
    ("John Smith", "Not John Smith; Jane Doe took it over."),
    ("Denver", "Not Denver anymore; it moved."),
    ("Denver", "Denverton"),
    ("Portland", "Austin"),
    ("Completed", "Not completed"),
    ("completed", "The work was not completed."),
    ("Approved", "not approved"),
    ("Approved", "It was rejected."),
    ("Approved", "Approved, or maybe rejected"),
    ("Rejected", "Approved"),
    ("On hold", "Cancelled"),
    ("Denver", "I don't know"),
    ("$1,200,000", "I couldn't find the budget."),
    ("I don't know", "Denver"),
    ("I don't know", "The budget is $1.2 million."),
    ("Denver", ""),
    ("Vince said there was no problem and that Martin should go ahead and submit it",
     "Vince said Martin should not submit it."),
]  # fmt: skip


@pytest.mark.parametrize(("golden", "answer"), SAME)
def test_equivalent_answers_are_correct(golden, answer):
    verdict = DeterministicJudge().judge(Q, golden, answer)
    assert verdict.correct, verdict.reason


@pytest.mark.parametrize(("golden", "answer"), DIFFERENT)
def test_different_answers_are_wrong(golden, answer):
    verdict = DeterministicJudge().judge(Q, golden, answer)
    assert not verdict.correct
    assert verdict.reason


@pytest.mark.parametrize(
    "answer",
    ["I don't know", "I do not know.", "I dont know", "I couldn't find that.", "I could not find any emails about it",
     "No information about that in the inbox.", "Unable to determine from the emails.", "I'm not sure.",
     "There is no mention of an offsite.", "The date is not mentioned in any email.", "Unknown", "N/A",
     "I was unable to locate the invoice.", "None of the emails mention the offsite.",
     "Sorry, I don't have enough information to answer.", ""],
)  # fmt: skip
def test_idk_phrasings_are_recognised(answer):
    assert is_idk(answer)


@pytest.mark.parametrize(
    "answer",
    ["Denver", "The report was not completed.", "It was not approved.", "No, it was rejected.",
     "I couldn't find the memo, but the review is on June 5 at 2 PM.", "Known issue: the VPN drops.",
     "Nobody owns it yet; Sherry is interim lead."],
)  # fmt: skip
def test_real_answers_are_not_idk(answer):
    assert not is_idk(answer)


def _endpoint(stub, **kw) -> ChatEndpoint:
    return ChatEndpoint(base_url=stub.url, model="judge-model", api_key_env=None, retry_backoff_s=0, **kw)


def test_both_judges_satisfy_the_protocol(openai_stub):
    judges: list[Judge] = [DeterministicJudge(), LLMJudge(_endpoint(openai_stub))]
    assert all(callable(j.judge) for j in judges)


def test_llm_judge_returns_the_models_structured_verdict(openai_stub):
    def grade(request):
        payload = json.loads(request["messages"][-1]["content"])
        accept = payload["candidate_answer"].startswith("Denver")
        return json.dumps({"accept": accept, "reasoning": f"compared with {payload['golden_answer']}"})

    openai_stub.script(grade)
    judge = LLMJudge(_endpoint(openai_stub))
    assert judge.judge("Where is the offsite?", "Denver", "Denver, CO") == Verdict(True, "compared with Denver")
    assert not judge.judge("Where is the offsite?", "Denver", "Austin").correct
    request = openai_stub.requests[0]
    assert request["model"] == "judge-model"
    assert request["response_format"] == {"type": "json_object"}
    assert request["messages"][0]["role"] == "system"
    assert "about what its tools can look up" in request["messages"][0]["content"]  # no environment's words


def test_llm_judge_is_told_what_the_questions_are_about_in_the_environments_words(openai_stub):
    openai_stub.script(lambda request: '{"accept": true, "reasoning": "same order"}')
    LLMJudge(_endpoint(openai_stub), subject="a customer's orders").judge("Which order?", "A-17", "A-17")
    system = openai_stub.requests[0]["messages"][0]["content"]
    assert "questions about a customer's orders." in system and "inbox" not in system


def test_llm_judge_decides_unanswerable_questions_without_calling_the_model(openai_stub):
    judge = LLMJudge(_endpoint(openai_stub))
    assert judge.judge("Where is the offsite?", "I don't know", "I couldn't find it").correct
    assert not judge.judge("Where is the offsite?", "I don't know", "Denver").correct
    assert openai_stub.requests == []


def test_llm_judge_retries_server_errors_and_malformed_replies(openai_stub):
    openai_stub.queue(fail(500), malformed(), "not json at all", '{"reasoning": "no accept field"}',
                      '```json\n{"accept": true, "reasoning": "same date"}\n```')  # fmt: skip
    judge = LLMJudge(_endpoint(openai_stub, max_retries=4))
    assert judge.judge(Q, "June 5", "6/5") == Verdict(True, "same date")
    assert len(openai_stub.requests) == 5


def test_llm_judge_times_out_and_retries(openai_stub):
    openai_stub.queue(delay(2.0, '{"accept": false, "reasoning": "late"}'), '{"accept": true, "reasoning": "ok"}')
    judge = LLMJudge(_endpoint(openai_stub, timeout_s=0.3, max_retries=1))
    start = time.monotonic()
    assert judge.judge(Q, "Denver", "Denver").correct
    assert time.monotonic() - start < 1.9


def test_llm_judge_gives_a_clear_error_when_the_endpoint_keeps_failing(openai_stub):
    openai_stub.script(lambda request: fail(503))
    judge = LLMJudge(_endpoint(openai_stub, max_retries=2))
    with pytest.raises(JudgeError, match=r"failed after 3 attempt\(s\): HTTP 503"):
        judge.judge(Q, "Denver", "Denver")
    assert len(openai_stub.requests) == 3


def test_llm_judge_does_not_retry_client_errors(openai_stub):
    openai_stub.require_api_key = "sk-right"
    judge = LLMJudge(_endpoint(openai_stub, max_retries=3))
    with pytest.raises(JudgeError, match="HTTP 401"):
        judge.judge(Q, "Denver", "Denver")


def test_llm_judge_sends_the_api_key_from_the_named_variable(openai_stub, monkeypatch):
    openai_stub.require_api_key = "sk-right"
    monkeypatch.setenv("JUDGE_KEY", "sk-right")
    openai_stub.script(lambda request: '{"accept": true, "reasoning": "fine"}')
    endpoint = ChatEndpoint(base_url=openai_stub.url, model="m", api_key_env="JUDGE_KEY")
    assert LLMJudge(endpoint).judge(Q, "Denver", "Denver").correct

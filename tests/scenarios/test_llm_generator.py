"""The ART-E style LLM generator against a real local OpenAI-compatible stub: batching, parsing,
validation with counted drop reasons, realism filter, retries and failure reports."""

from __future__ import annotations

import json
import re

import pytest

from agent_rl.environments.email.inbox.demo_corpus import generate_demo_corpus
from agent_rl.records import Split
from agent_rl.environments.email.records import Category
from agent_rl.chat_client import ChatEndpoint
from agent_rl.environments.email.scenarios.llm_generator import LLMGeneratorConfig, generate_llm_scenarios
from tests.openai_stub import fail, malformed, openai_stub  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def emails():
    return generate_demo_corpus(seed=1, n_inboxes=2, n_emails=80).emails  # 40 per inbox: 2 batches each


def _ids(request) -> list[str]:
    return re.findall(r"^Message-ID: (\S+)$", request["messages"][-1]["content"], flags=re.M)


def _config(stub, **kw) -> LLMGeneratorConfig:
    endpoint = ChatEndpoint(base_url=stub.url, model="gen", api_key_env=None, retry_backoff_s=0,
                            max_retries=kw.pop("max_retries", 1))  # fmt: skip
    return LLMGeneratorConfig(endpoint=endpoint, **kw)


def _good(request) -> str:
    ids = _ids(request)
    return json.dumps({"questions": [
        {"question": f"What did the email {ids[0]} say?", "answer": "Something", "source_ids": [ids[0]],
         "category": "status", "realism": 0.9},
        {"question": f"When was {ids[1]} sent?", "answer": "Monday", "source_ids": [ids[1], ids[2]],
         "category": "date", "realism": 0.7},
    ]})  # fmt: skip


def test_batches_of_one_inbox_become_validated_scenarios(openai_stub, emails):
    openai_stub.script(_good)
    scenarios, report = generate_llm_scenarios(emails, _config(openai_stub, test_fraction=0.5))
    assert report.batches == 4 and len(openai_stub.requests) == 4 and not report.failed_batches
    by_id = {e.message_id: e for e in emails}
    for request in openai_stub.requests:
        ids = _ids(request)
        assert 1 <= len(ids) <= 20
        assert len({by_id[i].inbox for i in ids}) == 1
        assert request["model"] == "gen"
    assert report.accepted == len(scenarios) == 8 and not report.dropped
    assert report.prompt_tokens > 0 and report.completion_tokens > 0
    for s in scenarios:
        assert s.source_ids and all(by_id[i].inbox == s.inbox_id for i in s.source_ids)
        assert s.query_date > max(by_id[i].date for i in s.source_ids)
        assert s.category in (Category.STATUS, Category.DATE)
    # a batch's questions share one split, so no email supports questions in both splits
    train = {i for s in scenarios if s.split == Split.TRAIN for i in s.source_ids}
    test = {i for s in scenarios if s.split == Split.TEST for i in s.source_ids}
    assert not train & test
    again, _ = generate_llm_scenarios(emails, _config(openai_stub, test_fraction=0.5))
    assert [(s.id, s.split) for s in again] == [(s.id, s.split) for s in scenarios]


def test_invalid_items_are_dropped_with_counted_reasons(openai_stub, emails):
    def mixed(request):
        ids = _ids(request)
        good = {"question": f"Q ok {ids[0]}?", "answer": "A", "source_ids": [ids[0]], "category": "amount",
                "realism": 0.8}  # fmt: skip
        return json.dumps([
            good,
            {**good, "question": f"Q brackets {ids[0]}?", "source_ids": [ids[1].strip("<>")]},  # accepted: same id
            {**good, "question": f"q OK {ids[0]}?"},  # duplicate
            {"question": "Q missing?", "answer": "A", "category": "date", "realism": 0.9},
            {**good, "question": "Q cat?", "category": "gossip"},
            {**good, "question": "Q foreign?", "source_ids": ["<not-in-batch@example.com>"]},
            {**good, "question": "Q low?", "realism": 0.2},
            {**good, "question": "Q weird realism?", "realism": "very"},
            {**good, "question": "Q none?", "source_ids": []},
            {**good, "question": "Q idk with sources?", "category": "unanswerable"},
            {**good, "question": f"Q idk {ids[0]}?", "category": "Unanswerable", "source_ids": [], "answer": "nothing"},
            "not an object",
        ])  # fmt: skip

    openai_stub.script(mixed)
    scenarios, report = generate_llm_scenarios(emails, _config(openai_stub, min_realism=0.5))
    per_batch = dict(report.dropped)
    assert per_batch == {reason: 4 for reason in (
        "duplicate", "missing_field", "unknown_category", "unknown_source", "low_realism", "bad_realism",
        "no_source", "unanswerable_with_sources", "not_an_object")}  # fmt: skip
    assert report.accepted == len(scenarios) == 12
    unanswerable = [s for s in scenarios if s.category == Category.UNANSWERABLE]
    assert len(unanswerable) == 4 and all(s.answer == "I don't know" and not s.source_ids for s in unanswerable)
    bracketed = [s for s in scenarios if s.question.startswith("Q brackets")]
    assert len(bracketed) == 4 and all(s.source_ids[0].startswith("<") for s in bracketed)


def test_a_question_repeated_in_a_later_batch_of_the_same_inbox_is_dropped(openai_stub, emails):
    openai_stub.script(lambda request: json.dumps([{"question": "Same?", "answer": "A", "source_ids": [_ids(request)[0]],
                                                    "category": "person", "realism": 1}]))  # fmt: skip
    scenarios, report = generate_llm_scenarios(emails, _config(openai_stub))
    assert len(scenarios) == 2 and len({s.inbox_id for s in scenarios}) == 2  # one per inbox
    assert report.dropped == {"duplicate": 2}
    assert len({s.id for s in scenarios}) == 2


def test_non_json_replies_are_retried_then_reported(openai_stub, emails):
    openai_stub.queue("Here are some questions: none, sorry", malformed("<html>oops</html>"))
    openai_stub.script(_good)
    scenarios, report = generate_llm_scenarios(emails, _config(openai_stub, max_retries=2))
    assert not report.failed_batches and report.accepted == 8
    assert report.http_attempts == 6  # first batch took three attempts

    openai_stub.queue(fail(500), "still not json")  # first batch fails twice and is given up
    scenarios, report = generate_llm_scenarios(emails, _config(openai_stub, max_retries=1))
    assert len(report.failed_batches) == 1
    assert "HTTP 500" in report.failed_batches[0] and "no JSON found" in report.failed_batches[0]
    assert report.batches == 4 and report.accepted == 6 == len(scenarios)


def test_config_is_validated(openai_stub):
    with pytest.raises(ValueError, match="min_realism"):
        _config(openai_stub, min_realism=1.5)
    with pytest.raises(ValueError, match="batch_size"):
        _config(openai_stub, batch_size=0)

"""score_model over real HTTP: a local OpenAI-compatible stub answers, the number is mapped from `range` to [0, 1]."""

from __future__ import annotations

import pytest

from agent_rl.chat_client import ChatEndpoint
from agent_rl.graders import GraderConfigError, GraderContext, grade, make_sample, validate
from tests.openai_stub import fail, openai_stub  # noqa: F401 (fixture)

JUDGE = {
    "type": "score_model", "name": "judge", "model": "grader-model",
    "input": [
        {"role": "developer", "content": "Rate how well the answer matches {{ item.reference }}."},
        {"role": "user", "content": [{"type": "input_text", "text": "Answer: {{ sample.output_text }}"},
                                     {"type": "input_text", "text": "Tools: {{ sample.output_tools }}"}]},
    ],
    "range": [0, 10],
    "sampling_params": {"temperature": 0.3, "max_completions_tokens": 50, "seed": 1},
}  # fmt: skip
ITEM = {"reference": "Paris"}


def context_for(stub) -> GraderContext:
    endpoint = ChatEndpoint(base_url=stub.url, model="default-model", api_key_env=None, retry_backoff_s=0.0)
    return GraderContext(chat_endpoint=endpoint)


def test_the_model_is_asked_with_rendered_messages_and_its_number_is_normalized(openai_stub):
    openai_stub.queue('{"result": 7}')
    context = context_for(openai_stub)
    result = grade(JUDGE, make_sample("Paris"), ITEM, context)
    context.close()
    assert result.score == pytest.approx(0.7)
    assert result.reason is None
    request = openai_stub.requests[0]
    assert request["model"] == "grader-model"
    assert request["temperature"] == 0.3 and request["max_tokens"] == 50
    system, user = request["messages"]
    assert system["role"] == "system"  # OpenAI's developer role, sent as system
    assert system["content"].startswith("Rate how well the answer matches Paris.")
    assert '{"result": <a number from 0 to 10>}' in system["content"]
    assert user == {"role": "user", "content": "Answer: Paris\nTools: []"}


@pytest.mark.parametrize(
    ("reply", "expected"),
    [("4", 0.4), ('{"score": 2.5}', 0.25), ('```json\n{"result": 10}\n```', 1.0), ('{"result": 0}', 0.0)],
)
def test_reply_shapes(openai_stub, reply, expected):
    openai_stub.queue(reply)
    assert grade(JUDGE, make_sample("Paris"), ITEM, context_for(openai_stub)).score == pytest.approx(expected)


def test_a_number_outside_the_range_is_clipped_and_said(openai_stub):
    openai_stub.queue('{"result": 15}')
    result = grade(JUDGE, make_sample("Paris"), ITEM, context_for(openai_stub))
    assert result.score == 1.0
    assert "outside [0, 10]" in result.reason


def test_an_unusable_reply_is_asked_again(openai_stub):
    openai_stub.queue("I would say it is quite good", '{"result": 3}')
    assert grade(JUDGE, make_sample("Paris"), ITEM, context_for(openai_stub)).score == pytest.approx(0.3)
    assert len(openai_stub.requests) == 2


def test_an_endpoint_that_keeps_failing_scores_zero_with_the_reason(openai_stub):
    openai_stub.queue(fail(500), fail(500), fail(500))
    result = grade(JUDGE, make_sample("Paris"), ITEM, context_for(openai_stub))
    assert result.score == 0.0
    assert "score_model 'judge' got no score" in result.reason and "HTTP 500" in result.reason


def test_without_an_endpoint_score_model_is_refused():
    with pytest.raises(GraderConfigError, match="needs a chat endpoint"):
        validate(JUDGE, ITEM)
    with pytest.raises(GraderConfigError, match="needs a chat endpoint"):
        grade(JUDGE, make_sample("Paris"), ITEM)


def test_without_a_system_message_one_is_inserted_for_the_instruction(openai_stub):
    openai_stub.queue("1")
    grader = {"type": "score_model", "name": "j", "model": "m",
              "input": [{"role": "user", "content": "{{ sample.output_text }}"}]}  # fmt: skip
    assert grade(grader, make_sample("hi"), {}, context_for(openai_stub)).score == 1.0  # default range [0, 1]
    messages = openai_stub.requests[0]["messages"]
    assert messages[0]["role"] == "system" and "from 0 to 1" in messages[0]["content"]
    assert messages[1] == {"role": "user", "content": "hi"}

"""The OpenAI-compatible HTTP policy against a real chat-completions server on loopback."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from agent_rl.agent.http_policy import HttpPolicy, PolicyRequestError
from agent_rl.environments.messages import wire_messages
from tests.openai_stub import delay, fail, malformed, openai_stub, reply, tool_call  # noqa: F401 (fixture)

TOOLS = [{"type": "function", "function": {"name": "read_email", "description": "Read one email",
                                           "parameters": {"type": "object", "properties": {
                                               "message_id": {"type": "string"}}}}}]
QUESTION = [{"role": "system", "content": "Answer questions about the inbox."},
            {"role": "user", "content": "When is the budget meeting?"}]


def make_policy(stub, **options) -> HttpPolicy:
    options = {"retry_backoff_s": 0.01, **options}
    return HttpPolicy(base_url=stub.url, model="smollm2", **options)


def test_native_tool_call_with_usage(openai_stub):
    openai_stub.queue(reply(None, tool_calls=[tool_call("read_email", {"message_id": "m-7"}, call_id="c-1")],
                            usage={"prompt_tokens": 120, "completion_tokens": 17}))
    with make_policy(openai_stub) as policy:
        turn = policy.act([QUESTION], TOOLS, max_new_tokens=64)[0]
    assert turn.parse_error is None and turn.content == ""
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [("c-1", "read_email", {"message_id": "m-7"})]
    assert (turn.prompt_tokens, turn.completion_tokens) == (120, 17)
    sent = openai_stub.requests[0]
    assert sent["model"] == "smollm2" and sent["max_tokens"] == 64 and sent["tools"] == TOOLS
    assert sent["messages"] == QUESTION


def test_history_is_sent_in_openai_layout(openai_stub):
    history = QUESTION + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "read_email", "arguments": {"message_id": "m-1"}}}]},
        {"role": "tool", "name": "read_email", "content": "Subject: budget"},
    ]
    with make_policy(openai_stub) as policy:
        policy.act([history], TOOLS)
    assistant, tool = openai_stub.requests[0]["messages"][2:]
    call = assistant["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"message_id": "m-1"}
    assert assistant["content"] is None and call["id"] and tool["tool_call_id"] == call["id"]
    assert tool["content"] == "Subject: budget"


@pytest.mark.parametrize("call, reason", [
    (tool_call("read_email", '{"message_id": '), "not valid JSON"),
    (tool_call("", {"message_id": "m-1"}), "no 'name'"),
    (tool_call("read_email", "[1, 2]"), "must be a JSON object"),
])
def test_malformed_native_calls_become_parse_errors(openai_stub, call, reason):
    openai_stub.queue(reply(None, tool_calls=[call]))
    with make_policy(openai_stub) as policy:
        turn = policy.act([QUESTION], TOOLS)[0]
    assert turn.parse_error and reason in turn.parse_error and turn.tool_calls == []


def test_tool_calls_written_as_text_are_parsed(openai_stub):
    """A vLLM server started without a tool-call parser returns the model's raw Qwen2.5 text."""
    openai_stub.queue(reply('<tool_call>\n{"name": "read_email", "arguments": {"message_id": "m-2"}}\n</tool_call>'))
    with make_policy(openai_stub) as policy:
        turn = policy.act([QUESTION], TOOLS)[0]
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("read_email", {"message_id": "m-2"})]


def test_batch_is_sent_concurrently_and_answers_keep_their_order(openai_stub):
    in_flight, peak, lock = 0, 0, threading.Lock()

    def answer(request):
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.2)  # long enough for the other requests to arrive while this one is open
        with lock:
            in_flight -= 1
        return "answer to " + request["messages"][-1]["content"]

    openai_stub.script(answer)
    questions = [[{"role": "user", "content": f"question {i}"}] for i in range(6)]
    with make_policy(openai_stub, concurrency=3) as policy:
        turns = policy.act(questions, TOOLS)
    assert [t.content for t in turns] == [f"answer to question {i}" for i in range(6)]
    assert 1 < peak <= 3


def test_transient_failures_are_retried(openai_stub):
    openai_stub.queue(fail(503), fail(429), reply("Friday"))
    with make_policy(openai_stub, max_retries=2) as policy:
        assert policy.act([QUESTION], TOOLS)[0].content == "Friday"
    assert len(openai_stub.requests) == 3


def test_a_slow_attempt_times_out_and_the_retry_answers(openai_stub):
    openai_stub.queue(delay(2.0, "too late"), reply("in time"))
    with make_policy(openai_stub, timeout_s=0.3, max_retries=1) as policy:
        assert policy.act([QUESTION], TOOLS)[0].content == "in time"


def test_persistent_failure_raises_naming_the_endpoint(openai_stub):
    openai_stub.queue(fail(500), malformed("<html>oops</html>"))
    with make_policy(openai_stub, max_retries=1) as policy, \
            pytest.raises(PolicyRequestError, match=r"chat/completions failed after 2 attempt\(s\): unreadable"):
        policy.act([QUESTION], TOOLS)


def test_wrong_api_key_fails_at_once(openai_stub, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    openai_stub.require_api_key = "sk-right"
    with make_policy(openai_stub, max_retries=3) as policy, pytest.raises(PolicyRequestError, match="401"):
        policy.act([QUESTION], TOOLS)
    assert len(openai_stub.requests) == 0  # refused before reaching the responder, and not retried
    monkeypatch.setenv("OPENAI_API_KEY", "sk-right")
    with make_policy(openai_stub) as policy:
        assert policy.act([QUESTION], TOOLS)[0].content == "ok"


def test_a_rejected_conversation_is_that_turns_error(openai_stub):
    openai_stub.queue(fail(400, '{"error": {"message": "prompt is longer than the context window"}}'), reply("fine"))
    with make_policy(openai_stub, concurrency=1) as policy:
        rejected, answered = policy.act([QUESTION, QUESTION], TOOLS)
    assert "context window" in rejected.parse_error and answered.content == "fine"


def test_unreachable_endpoint_raises():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with HttpPolicy(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1, retry_backoff_s=0.01) as policy, \
            pytest.raises(PolicyRequestError, match=f"127.0.0.1:{port}"):
        policy.act([QUESTION], TOOLS)


def test_tool_messages_without_ids_are_matched_in_order():
    wire = wire_messages([
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": "{}"}}]},
        {"role": "tool", "content": "A"}, {"role": "tool", "content": "B"},
    ])
    ids = [c["id"] for c in wire[0]["tool_calls"]]
    assert [m["tool_call_id"] for m in wire[1:]] == ids and len(set(ids)) == 2
    assert wire[0]["tool_calls"][1]["function"]["arguments"] == "{}"

"""JSON nested deeper than the pool's readers can walk is refused where it enters, not where it breaks.

A tool result or tool-call arguments holding JSON a few hundred levels deep (a kilobyte) used to be stored and
then crash a week's anonymization; a tool schema ~130 objects deep was accepted, answered by the upstream and then
failed to record, the caller's tokens spent. Now every such request gets a 400 naming the field (never its
content) before the upstream is asked, on both gateway routes and on /v1/feedback, and the pool holds nothing.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from agent_rl.arbiter.gateway.wire import GatewayError, parse_chat_request
from agent_rl.json_walk import MAX_JSON_DEPTH, text_too_deep, too_deep
from agent_rl.pool import PoolRepository
from tests.arbiter.arbiter_fixtures import bearer
from tests.arbiter.test_gateway import (
    TOKEN_A,
    all_episodes,
    end,
    gateway,
    run_agent,
    stub_spec,
    upstream_key,  # noqa: F401 (fixture)
)
from tests.openai_stub import openai_stub  # noqa: F401 (fixture)

MARKER = "deep-secret-4e1c"  # inside every hostile value: no error may repeat it


def nested(levels: int) -> Any:
    """An object `levels` deep with the marker at the bottom."""
    value: Any = MARKER
    for _ in range(levels):
        value = {"k": value}
    return value


def schema(objects: int) -> dict[str, Any]:
    """A tool's parameters with `objects` object types inside one another (two JSON levels each)."""
    value: dict[str, Any] = {"type": "string", "description": MARKER}
    for _ in range(objects):
        value = {"type": "object", "properties": {"inner": value}}
    return value


def messages_with(tool_result: str = "4", arguments: str = '{"expression": "2 * 2"}',
                  question: Any = "What is 2 * 2?") -> list[dict[str, Any]]:
    return [{"role": "user", "content": question},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": tool_result}]


def tool(parameters: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "calculator", "parameters": parameters}}]


DEEP = json.dumps(nested(300))  # about a kilobyte and a half
# Each hostile request and the field its refusal names.
HOSTILE: dict[str, tuple[dict[str, Any], str]] = {
    "tool result": ({"messages": messages_with(tool_result=DEEP)}, "messages[2].content"),
    "tool-call arguments": ({"messages": messages_with(arguments=DEEP)},
                            "messages[1].tool_calls[0].function.arguments"),
    "a content written as JSON": ({"messages": messages_with(question=DEEP)}, "messages[0].content"),
    "content parts": ({"messages": messages_with(question=[{"type": "text", "text": "hi", "x": nested(40)}])},
                      "messages[0].content[0]"),
    "tool schema": ({"messages": messages_with(), "tools": tool(schema(130))}, "tools[0].function.parameters"),
    "an extra field": ({"messages": messages_with(), "user_data": nested(40)}, "user_data.k.k.k"),
}


def body(case: str) -> dict[str, Any]:
    return {"model": "agent-rl", **HOSTILE[case][0]}


# -- the limit ------------------------------------------------------------------------------------


def test_depth_counts_objects_and_arrays_and_each_string_of_json_from_its_own_root():
    assert too_deep(nested(MAX_JSON_DEPTH)) is None
    assert too_deep(nested(MAX_JSON_DEPTH + 1)) == "k.k.k.k"  # the first parts only
    assert too_deep({"a": [json.dumps(nested(MAX_JSON_DEPTH))]}) is None  # a string of JSON starts again at 1
    assert too_deep({"a": ["x", json.dumps(nested(MAX_JSON_DEPTH + 1))]}) == "a[1]"
    assert not text_too_deep('["' + "[" * 100 + '"]')  # brackets inside strings are text
    assert not text_too_deep('["\\"' + "[" * 100)  # even in a string never closed
    assert text_too_deep("[" * (MAX_JSON_DEPTH + 1) + " not JSON at all")  # a parser would try it all the same
    assert too_deep({"a": "[not json" + "]" * 500}) is None


def test_a_document_deeper_than_the_interpreter_stack_is_measured_without_recursion():
    value: Any = "x"
    for _ in range(100_000):
        value = [value]
    assert too_deep(value) == "[0][0][0][0]"
    assert text_too_deep("[" * 1_000_000)


def test_requests_at_the_limit_are_accepted():
    for request in ({"messages": messages_with(tool_result=json.dumps(nested(MAX_JSON_DEPTH)))},
                    {"messages": messages_with(arguments=json.dumps(nested(MAX_JSON_DEPTH)))},
                    {"messages": messages_with(), "tools": tool(schema(13))}):  # 13 objects: 31 levels of the body
        parsed, _ = parse_chat_request(json.dumps({"model": "x", **request}).encode(), "application/json")
        assert parsed.messages


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_each_entry_point_refuses_json_nested_too_deep_naming_the_field_not_the_content(case):
    with pytest.raises(GatewayError) as caught:
        parse_chat_request(json.dumps(body(case)).encode(), "application/json")
    error = caught.value
    assert (error.status, error.code, error.param) == (400, "json_too_deep", HOSTILE[case][1])
    assert HOSTILE[case][1] in error.message and str(MAX_JSON_DEPTH) in error.message
    assert MARKER not in error.message and MARKER not in error.log_detail


def test_a_body_too_deep_for_the_json_parser_is_a_400_too():
    raw = b'{"model": "x", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(GatewayError) as caught:
        parse_chat_request(raw, "application/json")
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, "json_too_deep", None)
    assert "the request body is nested more than" in caught.value.message


# -- a running arbiter: refused at the door, nothing asked upstream, nothing stored ---------------------------


def test_the_gateway_refuses_deep_json_before_the_upstream_and_stores_nothing(sqlite_url, openai_stub, upstream_key):
    openai_stub.script(lambda request: "4")
    with gateway(sqlite_url, {"stub": 1.0}, {"stub": stub_spec(openai_stub)}) as url:
        headers = {**bearer(TOKEN_A), "Content-Type": "application/json"}
        for case, (_, field) in sorted(HOSTILE.items()):
            for path in ("/v1/chat/completions", f"/s/job-{len(case)}/v1/chat/completions"):
                response = httpx.post(f"{url}{path}", headers=headers, content=json.dumps(body(case)), timeout=30)
                assert response.status_code == 400, (case, path, response.text[:300])
                error = response.json()["error"]
                assert (error["type"], error["code"]) == ("invalid_request_error", "json_too_deep")
                assert error["param"] == field
                assert MARKER not in response.text
        too_deep_to_parse = b'{"model": "x", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        response = httpx.post(f"{url}/v1/chat/completions", headers=headers, content=too_deep_to_parse, timeout=30)
        assert response.status_code == 400 and response.json()["error"]["code"] == "json_too_deep"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:  # the official client reads it as OpenAI's own
            client.chat.completions.create(model="x", messages=messages_with(tool_result=DEEP))
        assert caught.value.body["code"] == "json_too_deep"
        assert openai_stub.requests == []  # no upstream was asked, no tokens spent
        assert httpx.get(f"{url}/healthz", headers=bearer(TOKEN_A)).json()["gateway"]["live_episodes"] == 0
    assert all_episodes(sqlite_url) == {}


def test_feedback_nested_too_deep_is_refused_and_not_stored(sqlite_url):
    with gateway(sqlite_url, {"calc": 1.0}, {"calc": "calc-bot"}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        _, episode = run_agent(client, "What is 3 * 3?")
        assert end(url, TOKEN_A, episode).status_code == 200
        hostile = {
            "a verdict written as deep JSON": {"episode_id": episode,
                                               "verdict": '{"reward": ' + "[" * 40 + "]" * 40 + "}"},
            "a deep extra field": {"episode_id": episode, "verdict": "up", "extra": nested(40)},
        }
        for case, sent in hostile.items():
            response = httpx.post(f"{url}/v1/feedback", headers=bearer(TOKEN_A), json=sent, timeout=30)
            assert response.status_code == 400, (case, response.text[:300])
            assert response.json()["error"] == "nested too deep" and MARKER not in response.text
        # Past the parser's own limit, within the endpoint's 64 KB.
        raw = b'{"episode_id": "' + episode.encode() + b'", "verdict": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
        response = httpx.post(f"{url}/v1/feedback", headers={**bearer(TOKEN_A), "Content-Type": "application/json"},
                              content=raw, timeout=30)
        assert response.status_code == 400 and response.json()["error"] == "nested too deep"
    pool = PoolRepository(sqlite_url)
    try:
        assert pool.get(episode).feedback is None  # the episode is there, no verdict on it
    finally:
        pool.close()

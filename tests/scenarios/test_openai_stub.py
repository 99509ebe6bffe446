"""The OpenAI-compatible stub server and the chat client, over real loopback HTTP."""

from __future__ import annotations

import httpx
import pytest

from agent_rl.chat_client import ChatClient, ChatEndpoint, ChatEndpointError, extract_json
from tests.openai_stub import fail, openai_stub, reply, tool_call  # noqa: F401 (fixture)


def test_stub_speaks_the_chat_completions_protocol(openai_stub):
    openai_stub.script(lambda request: f"you said {request['messages'][-1]['content']}")
    response = httpx.post(f"{openai_stub.url}/chat/completions",
                          json={"model": "m", "messages": [{"role": "user", "content": "hello"}]})  # fmt: skip
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion" and body["model"] == "m"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "you said hello"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["total_tokens"] >= body["usage"]["completion_tokens"]
    assert httpx.get(f"{openai_stub.url}/models").json()["data"][0]["id"] == "stub"


def test_stub_returns_tool_calls_and_scripted_usage(openai_stub):
    call = tool_call("search_emails", {"keywords": ["offsite"]}, call_id="call_1")
    openai_stub.queue(reply(None, tool_calls=[call], usage={"prompt_tokens": 7, "completion_tokens": 3}))
    body = httpx.post(f"{openai_stub.url}/chat/completions", json={"model": "m", "messages": []}).json()
    message = body["choices"][0]["message"]
    assert message["tool_calls"][0]["function"] == {"name": "search_emails", "arguments": '{"keywords": ["offsite"]}'}
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def test_stub_reports_bad_requests_and_broken_responders(openai_stub):
    assert httpx.post(f"{openai_stub.url}/chat/completions", content=b"{nope").status_code == 400
    assert httpx.post(f"{openai_stub.url}/chat/completions", json={"stream": True}).status_code == 400
    assert httpx.post(f"{openai_stub.url}/embeddings", json={}).status_code == 404
    openai_stub.script(lambda request: 1 / 0)
    response = httpx.post(f"{openai_stub.url}/chat/completions", json={"messages": []})
    assert response.status_code == 500 and "ZeroDivisionError" in response.text


def test_chat_client_returns_content_and_counts_attempts(openai_stub):
    openai_stub.queue(fail(502), fail(429), '{"x": 1}')
    endpoint = ChatEndpoint(base_url=openai_stub.url, model="m", api_key_env=None, retry_backoff_s=0, max_retries=2)
    with ChatClient(endpoint) as client:
        assert client.complete([{"role": "user", "content": "hi"}], lambda r: extract_json(r.content)) == {"x": 1}
        assert client.attempts == 3


def test_chat_client_error_names_endpoint_and_every_failure(openai_stub):
    openai_stub.queue(fail(500), "plain words")
    endpoint = ChatEndpoint(base_url=openai_stub.url, model="m", api_key_env=None, retry_backoff_s=0, max_retries=1)
    with ChatClient(endpoint) as client, pytest.raises(ChatEndpointError) as error:
        client.complete([], lambda r: extract_json(r.content))
    message = str(error.value)
    assert openai_stub.url in message and "'m'" in message
    assert "HTTP 500" in message and "unusable reply: no JSON found" in message


def test_chat_client_reports_an_unreachable_endpoint():
    endpoint = ChatEndpoint(base_url="http://127.0.0.1:9/v1", model="m", api_key_env=None, retry_backoff_s=0,
                            max_retries=1, timeout_s=2)  # fmt: skip
    with ChatClient(endpoint) as client, pytest.raises(ChatEndpointError, match="ConnectError"):
        client.complete([], lambda r: r.content)


@pytest.mark.parametrize(
    ("text", "value"),
    [('{"a": 1}', {"a": 1}), ('```json\n[1, 2]\n```', [1, 2]), ('Sure! {"accept": true} hope it helps', {"accept": True})],
)
def test_extract_json_tolerates_fences_and_prose(text, value):
    assert extract_json(text) == value


def test_the_chat_clients_old_module_name_still_imports_warned():
    import importlib
    import sys

    sys.modules.pop("agent_rl.agent.chat_client", None)
    with pytest.warns(DeprecationWarning, match="now agent_rl.chat_client"):
        old = importlib.import_module("agent_rl.agent.chat_client")
    assert old.ChatClient is ChatClient and old.extract_json is extract_json

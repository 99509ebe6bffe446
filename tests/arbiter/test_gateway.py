"""The OpenAI-compatible gateway, driven by the official `openai` client over loopback.

A small calculator agent (its own tool, run by the client) talks to the arbiter with nothing changed but
the base URL; upstreams are a scripted Policy registered as a loader and the OpenAI stub server (a real
HTTP server). The pool must then hold exactly the episodes and messages the clients saw.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import operator
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest

from agent_rl.agent.policy import Policy, PolicyTurn, ToolCall
from agent_rl.arbiter.config import ArbiterConfig
from agent_rl.arbiter.policies import PolicyLoadError, load_policy, register_policy_loader
from agent_rl.arbiter.server import running_arbiter
from agent_rl.pool import PoolRepository
from tests.arbiter.arbiter_fixtures import api_key, bearer
from tests.openai_stub import openai_stub, tool_call  # noqa: F401 (fixture)

TOKEN_A = "gateway-tests-key-a-61c0"
TOKEN_B = "gateway-tests-key-b-93d2"
NARROW = "gateway-tests-key-narrow-0f7e"
UPSTREAM_KEY_ENV = "AGENT_RL_TEST_UPSTREAM_KEY"
UPSTREAM_KEY = "sk-upstream-secret-4f1d9a"

TOOLS = [
    {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "answer", "description": "Give the final answer.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}},
]
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculator(expression: str) -> str:
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        raise ValueError("unsupported expression")
    result = value(ast.parse(expression, mode="eval").body)
    return str(int(result) if float(result).is_integer() else result)


def _expression(question: str) -> str:
    return question.removeprefix("What is ").rstrip("?")


def _next_step(messages: list[dict[str, Any]], tool_names: set[str]) -> tuple[str, dict[str, Any] | None]:
    """The scripted model: compute with the calculator, then answer (with the answer tool when offered)."""
    last = messages[-1]
    if last["role"] == "tool":
        if "answer" in tool_names:
            return "", {"name": "answer", "arguments": {"answer": str(last["content"])}}
        return f"The result is {last['content']}.", None
    question = next(m["content"] for m in messages if m["role"] == "user")
    return "", {"name": "calculator", "arguments": {"expression": _expression(question)}}


class CalcBot(Policy):
    """A tiny scripted policy behind the Policy interface."""

    version = "calc-bot"

    def act(self, conversations, tools, max_new_tokens=256):
        turns = []
        names = {t["function"]["name"] for t in tools}
        for messages in conversations:
            content, call = _next_step(messages, names)
            turn = PolicyTurn(content=content, prompt_tokens=10 * len(messages), completion_tokens=7)
            if call:
                turn.tool_calls = [ToolCall(call["name"], call["arguments"])]
            turns.append(turn)
        return turns


register_policy_loader("calc-bot", lambda rest: CalcBot())


def stub_responder(request: dict[str, Any]) -> Any:
    names = {t["function"]["name"] for t in request.get("tools") or []}
    content, call = _next_step(request["messages"], names)
    if call:
        return {"content": None, "tool_calls": [tool_call(call["name"], call["arguments"])]}
    return content


@pytest.fixture
def upstream_key(monkeypatch) -> str:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    return UPSTREAM_KEY


def stub_spec(stub) -> str:
    return "openai:" + json.dumps({"base_url": stub.url, "model": "stub-model", "api_key_env": UPSTREAM_KEY_ENV,
                                   "retry_backoff_s": 0})


@contextmanager
def gateway(pool_url: str, weights: dict[str, float], specs: dict[str, str], **options: Any) -> Iterator[str]:
    """A running arbiter routing by `weights`; yields the base URL (without /v1)."""
    pool = PoolRepository(pool_url)
    pool.set_routing(weights, specs, reason="gateway test", actor="tests")
    pool.close()
    options.setdefault("api_keys", (
        api_key(TOKEN_A, "a", "tenant-a"),
        api_key(TOKEN_B, "b", "tenant-b"),
        api_key(NARROW, "narrow", "tenant-a", contexts=("calc-env",), replay=False),
    ))
    options.setdefault("gateway_rate_per_s", 1000.0)
    options.setdefault("gateway_rate_burst", 1000)
    with running_arbiter(ArbiterConfig(pool_url=pool_url, routing_ttl_s=0.2, **options), log_level="warning") as url:
        yield url


def run_agent(client: openai.OpenAI, question: str, metadata: dict[str, str] | None = None,
              headers: dict[str, str] | None = None, append_objects: bool = False) -> tuple[list[dict[str, Any]], str]:
    """The agent loop every production agent has: call the model, run its tools, until it answers."""
    messages: list[Any] = [{"role": "system", "content": "You are a careful calculator agent."},
                           {"role": "user", "content": question}]
    seen: list[dict[str, Any]] = [dict(m) for m in messages]
    episode = ""
    for _ in range(6):
        raw = client.chat.completions.with_raw_response.create(
            model="agent-rl", messages=messages, tools=TOOLS, temperature=0, max_tokens=64,
            metadata=metadata, extra_headers=headers)
        completion = raw.parse()
        episode = raw.headers["x-agent-rl-episode"]
        assert completion.model_extra["agent_rl"]["episode_id"] == episode
        assert completion.usage is not None
        message = completion.choices[0].message
        messages.append(message if append_objects else message.model_dump(exclude_none=True))
        seen.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        done = False
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            if call.function.name == "answer":
                done = True
                continue
            result = {"role": "tool", "tool_call_id": call.id, "content": calculator(arguments["expression"])}
            messages.append(result)
            seen.append(result)
        if done:
            break
    return seen, episode


def canonical(messages: list[dict[str, Any]]) -> list[tuple]:
    return [(m["role"], m.get("content") or "", m.get("tool_call_id"),
             tuple((c["id"], c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []))
            for m in messages]


def all_episodes(pool_url: str) -> dict[str, Any]:
    pool = PoolRepository(pool_url)
    try:
        return {e.episode_id: e for page in pool.iter_export() for e in page.episodes}
    finally:
        pool.close()


def wait_for_episodes(pool_url: str, n: int, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        stored = all_episodes(pool_url)
        if len(stored) >= n or time.monotonic() > deadline:
            return stored
        time.sleep(0.05)


def end(url: str, token: str, episode: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/episodes/{episode}/end", headers=bearer(token), timeout=30)


# -- the agent loop, both upstreams, both pools ---------------------------------------------------


def test_agents_run_unchanged_and_the_pool_holds_what_they_saw(store_url, openai_stub, upstream_key, caplog):
    openai_stub.require_api_key = upstream_key
    openai_stub.script(stub_responder)
    caplog.set_level(logging.INFO)
    with gateway(store_url, {"calc": 0.5, "stub": 0.5}, {"calc": "calc-bot", "stub": stub_spec(openai_stub)}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        assert {m.id for m in client.models.list()} >= {"agent-rl", "calc", "stub"}
        seen: dict[str, list[dict[str, Any]]] = {}
        # Grouped by the conversation they extend (no session at all): the final answer tool ends them.
        for i in range(8):
            messages, episode = run_agent(client, f"What is {i} * 7?", metadata={"final_tool": "answer"},
                                          append_objects=i % 2 == 0)
            seen[episode] = messages
        # Named by the URL (an SDK that only takes a base URL): ended explicitly.
        for i in range(8):
            session_client = openai.OpenAI(base_url=f"{url}/s/job-{i}/v1", api_key=TOKEN_A, max_retries=0)
            messages, episode = run_agent(session_client, f"What is {i} + 100?")
            assert end(url, TOKEN_A, episode).json()["written"] is True
            seen[episode] = messages
        # Named by the header.
        for i in range(4):
            messages, episode = run_agent(client, f"What is {i} - 3?", headers={"X-Agent-RL-Episode": f"task-{i}"},
                                          metadata={"context": "calc-env", "task": f"subtract {i}",
                                                    "environment": "calculator"})
            assert end(url, TOKEN_A, episode).status_code == 200
            seen[episode] = messages
        wait_for_episodes(store_url, len(seen))  # final-tool episodes are written in the background
        # Feedback by the returned episode id, as for /v1/ask episodes.
        some = next(iter(seen))
        response = httpx.post(f"{url}/v1/feedback", headers=bearer(TOKEN_A), json={"episode_id": some, "verdict": "up"})
        assert response.status_code == 200, response.text
    stored = all_episodes(store_url)
    assert set(stored) == set(seen)  # exactly the episodes the clients saw
    for episode_id, messages in seen.items():
        record = stored[episode_id]
        assert canonical(record.messages) == canonical(messages)
        assert record.outcome == "unjudged" and record.reward is None
        assert record.tenant == "tenant-a" and record.turns == sum(1 for m in messages if m["role"] == "assistant")
        assert record.prompt_tokens > 0 and record.completion_tokens > 0 and record.latency_ms > 0
    assert stored[some].feedback == "up"
    versions = [e.policy_version for e in stored.values()]
    assert set(versions) == {"calc", "stub"}  # split between the two versions
    # Sticky: every call of a stub episode reached the stub, and no call of a calc episode did.
    assert len(openai_stub.requests) == sum(e.turns for e in stored.values() if e.policy_version == "stub")
    header_episodes = [e for e in stored.values() if e.inbox_id == "calc-env"]
    assert len(header_episodes) == 4 and {e.question for e in header_episodes} == {f"subtract {i}" for i in range(4)}
    assert {e.inbox_id for e in stored.values()} == {"gateway", "calc-env"}
    # The environment the caller declared (default: "gateway", an agent that is no plug-in of ours), and the tools
    # it offered the model, which SFT trains with.
    assert {e.environment for e in header_episodes} == {"calculator"}
    assert {e.environment for e in stored.values() if e.context == "gateway"} == {"gateway"}
    assert all([t["function"]["name"] for t in e.tools] == [t["function"]["name"] for t in TOOLS]
               for e in stored.values())
    # The upstream's key reached the upstream, and nothing else: not the pool, not the log.
    assert all(h.get("Authorization") == f"Bearer {upstream_key}" for h in openai_stub.headers)
    assert upstream_key not in json.dumps([e.model_dump(mode="json") for e in stored.values()])
    assert upstream_key not in caplog.text and TOKEN_A not in caplog.text


class StreamedMessage:
    """The assistant message a client puts together from a stream's chunks (content and tool-call deltas)."""

    def __init__(self) -> None:
        self.content = ""
        self.calls: dict[int, dict[str, str]] = {}

    def add(self, chunk: Any) -> None:
        for choice in chunk.choices:
            self.content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = self.calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = delta.id or call["id"]
                call["name"] += (delta.function.name or "") if delta.function else ""
                call["arguments"] += (delta.function.arguments or "") if delta.function else ""

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            message["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["name"], "arguments": c["arguments"]}}
                                     for c in self.calls.values()]
        return message


def test_async_and_streaming_clients(sqlite_url, openai_stub, upstream_key):
    openai_stub.script(stub_responder)
    openai_stub.streams = True  # the stub's replies are relayed chunk by chunk, ours are streamed whole

    async def agent(client: openai.AsyncOpenAI, question: str, session: str) -> tuple[list[dict[str, Any]], str]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
        episode = ""
        for _ in range(4):
            stream = await client.chat.completions.create(
                model="agent-rl", messages=messages, tools=TOOLS[:1], stream=True,
                stream_options={"include_usage": True}, extra_headers={"X-Agent-RL-Episode": session})
            reply, usage = StreamedMessage(), None
            async for chunk in stream:
                episode = (chunk.model_extra or {}).get("agent_rl", {}).get("episode_id", episode)
                usage = chunk.usage or usage
                reply.add(chunk)
            assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
            message = reply.message()
            messages.append(message)
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": calculator(json.loads(call["function"]["arguments"])["expression"])})
        return messages, episode

    with gateway(sqlite_url, {"calc": 0.5, "stub": 0.5}, {"calc": "calc-bot", "stub": stub_spec(openai_stub)}) as url:
        async def main() -> list[tuple[list[dict[str, Any]], str]]:
            async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0) as client:
                return await asyncio.gather(*(agent(client, f"What is {i} * 3?", f"stream-{i}") for i in range(12)))

        results = asyncio.run(main())
        for _, episode in results:
            assert end(url, TOKEN_A, episode).status_code == 200
    stored = all_episodes(sqlite_url)
    assert set(stored) == {episode for _, episode in results}
    for messages, episode in results:
        assert canonical(stored[episode].messages) == canonical(messages)
        assert messages[-1]["content"].startswith("The result is ")
    assert {e.policy_version for e in stored.values()} == {"calc", "stub"}
    assert openai_stub.requests and all(r["stream"] and r["stream_options"]["include_usage"] for r in openai_stub.requests)
    assert all("metadata" not in r for r in openai_stub.requests)


# -- routing, sessions, tenants -------------------------------------------------------------------


def test_sessions_are_sticky_and_scoped_to_the_tenant(sqlite_url):
    with gateway(sqlite_url, {"calc": 1.0}, {"calc": "calc-bot"}) as url:
        a = openai.OpenAI(base_url=f"{url}/s/shared-name/v1", api_key=TOKEN_A, max_retries=0)
        b = openai.OpenAI(base_url=f"{url}/s/shared-name/v1", api_key=TOKEN_B, max_retries=0)
        first = a.chat.completions.with_raw_response.create(
            model="x", messages=[{"role": "user", "content": "What is 1 + 1?"}], tools=TOOLS[:1])
        episode_a = first.headers["x-agent-rl-episode"]
        # The same session name, and even A's episode id, name an episode of B's own for tenant B.
        other = b.chat.completions.with_raw_response.create(
            model="x", messages=[{"role": "user", "content": "What is 2 + 2?"}], tools=TOOLS[:1],
            extra_headers={"X-Agent-RL-Episode": "shared-name"})
        assert other.headers["x-agent-rl-episode"] != episode_a
        by_id = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_B, max_retries=0).chat.completions.with_raw_response.create(
            model="x", messages=[{"role": "user", "content": "What is 3 + 3?"}], tools=TOOLS[:1],
            extra_headers={"X-Agent-RL-Episode": episode_a})
        assert by_id.headers["x-agent-rl-episode"] not in (episode_a, other.headers["x-agent-rl-episode"])
        # A key of A's own tenant limited to another context cannot reach it either.
        narrow = openai.OpenAI(base_url=f"{url}/s/shared-name/v1", api_key=NARROW, max_retries=0)
        scoped = narrow.chat.completions.with_raw_response.create(
            model="x", messages=[{"role": "user", "content": "What is 4 + 4?"}], tools=TOOLS[:1],
            metadata={"context": "calc-env"})
        assert scoped.headers["x-agent-rl-episode"] != episode_a
        assert end(url, NARROW, episode_a).status_code == 404
        # B can neither end nor give feedback on A's episode; both read as unknown.
        assert end(url, TOKEN_B, episode_a).status_code == 404
        assert httpx.post(f"{url}/v1/feedback", headers=bearer(TOKEN_B),
                          json={"episode_id": episode_a, "verdict": "down"}).status_code == 404
        assert end(url, TOKEN_A, episode_a).status_code == 200
        assert end(url, TOKEN_A, episode_a).json()["written"] is True  # ending again (a retry) is safe
        assert end(url, TOKEN_B, episode_a).status_code == 404  # and still nobody else's
    stored = all_episodes(sqlite_url)
    assert stored[episode_a].tenant == "tenant-a" and stored[episode_a].feedback is None
    assert stored[episode_a].messages[0]["content"] == "What is 1 + 1?"  # untouched by B's calls


def test_idle_episodes_are_written(sqlite_url):
    with gateway(sqlite_url, {"calc": 1.0}, {"calc": "calc-bot"}, gateway_idle_s=0.3) as url:
        schema = httpx.get(f"{url}/openapi.json").json()
        assert "messages" in json.dumps(schema["paths"]["/v1/chat/completions"]["post"]["requestBody"])
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        messages, episode = run_agent(client, "What is 5 * 5?")
        wait_for_episodes(sqlite_url, 1)
        assert httpx.get(f"{url}/healthz", headers=bearer(TOKEN_A)).json()["gateway"]["live_episodes"] == 0
    assert canonical(all_episodes(sqlite_url)[episode].messages) == canonical(messages)


def test_shutdown_writes_live_episodes(sqlite_url):
    with gateway(sqlite_url, {"calc": 1.0}, {"calc": "calc-bot"}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        _, episode = run_agent(client, "What is 9 - 4?")
    assert episode in all_episodes(sqlite_url)


def test_heuristic_upstream_answers_in_openai_shape(sqlite_url):
    with gateway(sqlite_url, {"heuristic": 1.0}, {"heuristic": "heuristic"}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        from agent_rl.environments.email.tools import tool_schemas

        completion = client.chat.completions.create(
            model="agent-rl", messages=[{"role": "user", "content": "When is the Acme board meeting?"}],
            tools=tool_schemas())
        message = completion.choices[0].message
        assert completion.model == "heuristic" and (message.tool_calls or message.content)
        for call in message.tool_calls or []:
            assert isinstance(json.loads(call.function.arguments), dict)


# -- errors ---------------------------------------------------------------------------------------


def test_errors_are_openai_shaped_and_write_nothing(sqlite_url):
    with gateway(sqlite_url, {"calc": 1.0}, {"calc": "calc-bot"}, gateway_max_body_bytes=20_000,
                 gateway_rate_per_s=0.5, gateway_rate_burst=8) as url:
        good = [{"role": "user", "content": "What is 2 * 2?"}]
        with pytest.raises(openai.AuthenticationError) as caught:
            openai.OpenAI(base_url=f"{url}/v1", api_key="not-a-key", max_retries=0).chat.completions.create(
                model="x", messages=good)
        assert caught.value.body["type"] == "authentication_error"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="x", messages=[*good, {"role": "tool", "content": "4"}])
        assert caught.value.body["param"] == "messages[1]" and "tool_call_id" in caught.value.body["message"]
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="x", messages=good, tools=TOOLS, tool_choice={
                "type": "function", "function": {"name": "nope"}})
        assert caught.value.body["param"] == "tool_choice" or "tool_choice" in caught.value.body["message"]
        raw = httpx.post(f"{url}/v1/chat/completions", headers={**bearer(TOKEN_A), "Content-Type": "application/json"},
                         content=b'{"model": "x", "messages": [{"role": "user", "content": "\\ud800"}]}')
        assert raw.status_code == 400 and raw.json()["error"]["param"] == "messages[0].content"
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x" * 30_000}])
        assert caught.value.status_code == 413 and caught.value.body["code"] == "request_too_large"
        narrow = openai.OpenAI(base_url=f"{url}/v1", api_key=NARROW, max_retries=0)
        with pytest.raises(openai.PermissionDeniedError):
            narrow.chat.completions.create(model="x", messages=good)  # 'gateway' is not among its contexts
        with pytest.raises(openai.BadRequestError):
            openai.OpenAI(base_url=f"{url}/s/bad name/v1", api_key=TOKEN_A, max_retries=0).chat.completions.create(
                model="x", messages=good)
        assert httpx.post(f"{url}/v1/episodes/nothing-here/end", headers=bearer(TOKEN_A)).json()["error"]["type"] == \
            "not_found_error"
        statuses = [httpx.post(f"{url}/v1/chat/completions", headers=bearer(TOKEN_A), json={"model": "x", "messages": []})
                    for _ in range(12)]
        assert statuses[-1].status_code == 429 and statuses[-1].headers["retry-after"]
        assert statuses[-1].json()["error"]["code"] == "rate_limit_exceeded"
        assert {r.status_code for r in statuses} == {400, 429}
        assert httpx.get(f"{url}/healthz", headers=bearer(TOKEN_A)).json()["gateway"]["live_episodes"] == 0
    assert all_episodes(sqlite_url) == {}  # refused and malformed requests left no episode behind


def test_upstream_failures_answer_clearly_and_record_nothing(sqlite_url, openai_stub, upstream_key, caplog):
    from tests.openai_stub import fail

    openai_stub.streams = True
    openai_stub.queue(fail(401, '{"error": {"message": "Incorrect API key provided: sk-ups***9a"}}'),
                      fail(400, '{"error": {"message": "context too long"}}'), fail(403))
    with gateway(sqlite_url, {"stub": 1.0}, {"stub": stub_spec(openai_stub)}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
        assert caught.value.status_code == 502 and "127.0.0.1" not in caught.value.body["message"]
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
        assert "context too long" in caught.value.body["message"]
        with pytest.raises(openai.APIStatusError) as caught:  # a stream refused before its first byte: a status
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], stream=True)
        assert caught.value.status_code == 502
    assert all_episodes(sqlite_url) == {}
    assert upstream_key not in caplog.text and "sk-ups" not in caplog.text  # not even the upstream's echo of it
    assert UPSTREAM_KEY_ENV in caplog.text  # the operators learn where to look


def test_tenants_see_a_version_name_never_the_upstreams_address_or_key_variable(sqlite_url, openai_stub,
                                                                                 upstream_key, monkeypatch):
    """A version routed by its spec alone would name the upstream's address and key variable in every response;
    tenants see its kind and a fingerprint, the admin the spec."""
    openai_stub.script(stub_responder)
    spec = stub_spec(openai_stub)
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", "gateway-admin-7f1e")
    with gateway(sqlite_url, {spec: 1.0}, {}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        seen: list[str] = []
        completion = client.chat.completions.create(model="agent-rl", messages=[{"role": "user", "content": "hi"}],
                                                    tools=TOOLS[:1])
        seen += [completion.model, completion.model_extra["agent_rl"]["policy_version"]]
        openai_stub.streams = True
        for chunk in client.chat.completions.create(model="agent-rl", messages=[{"role": "user", "content": "yo"}],
                                                    tools=TOOLS[:1], stream=True):
            seen += [chunk.model, (chunk.model_extra or {}).get("agent_rl", {}).get("policy_version", chunk.model)]
        seen += [m.id for m in client.models.list()]
        episode = completion.model_extra["agent_rl"]["episode_id"]
        seen.append(end(url, TOKEN_A, episode).json()["policy_version"])
        reads = [httpx.get(f"{url}{path}", headers=bearer(TOKEN_A)) for path in ("/v1/routing", "/healthz", "/metrics")]
        admin = httpx.get(f"{url}/v1/routing", headers=bearer("gateway-admin-7f1e")).json()
    shown = {name for name in seen if name != "agent-rl"}
    assert len(shown) == 1 and shown.pop().startswith("openai-")
    for text in [*seen, *(r.text for r in reads)]:
        assert openai_stub.url not in text and "127.0.0.1" not in text and UPSTREAM_KEY_ENV not in text
    assert all(r.status_code == 200 for r in reads)
    assert list(admin["weights"]) == [spec]  # the admin, who wrote it, reads the spec
    assert {e.policy_version for e in all_episodes(sqlite_url).values()} == {spec}  # the pool keeps the real name


def test_openai_specs_refuse_keys_without_repeating_them():
    with pytest.raises(PolicyLoadError) as caught:
        load_policy('openai:{"base_url": "http://127.0.0.1:1/v1", "model": "m", "api_key": "sk-do-not-store"}')
    assert "sk-do-not-store" not in str(caught.value) and "api_key_env" in str(caught.value)
    with pytest.raises(PolicyLoadError) as caught:
        load_policy('openai:{"base_url": "ftp://x", "model": "m", "api_key_env": "1BAD"}')
    assert "base_url" in str(caught.value) and "api_key_env" in str(caught.value) and "1BAD" not in str(caught.value)


def test_identical_conversations_side_by_side_stay_apart(sqlite_url):
    with gateway(sqlite_url, {"calc": 1.0}, {"calc": "calc-bot"}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        start = [{"role": "user", "content": "What is 6 * 7?"}]
        firsts = [client.chat.completions.with_raw_response.create(model="x", messages=start, tools=TOOLS[:1])
                  for _ in range(3)]
        ids = [r.headers["x-agent-rl-episode"] for r in firsts]
        assert len(set(ids)) == 3  # a new conversation is a new episode, even word for word the same
        seconds = []
        for raw in firsts:
            message = raw.parse().choices[0].message
            follow = [*start, message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "42"}]
            seconds.append(client.chat.completions.with_raw_response.create(model="x", messages=follow, tools=TOOLS[:1]))
        assert [r.headers["x-agent-rl-episode"] for r in seconds] == ids  # each continued its own
    stored = all_episodes(sqlite_url)
    assert set(stored) == set(ids) and all(e.turns == 2 for e in stored.values())


@pytest.mark.parametrize("upstream", ["calc", "stub"])
def test_a_client_gone_mid_stream_loses_nothing(sqlite_url, openai_stub, upstream_key, upstream):
    openai_stub.script(stub_responder)
    openai_stub.streams = True
    specs = {"calc": "calc-bot", "stub": stub_spec(openai_stub)}
    with gateway(sqlite_url, {upstream: 1.0}, {upstream: specs[upstream]}) as url:
        body = {"model": "x", "stream": True, "messages": [{"role": "user", "content": "What is 12 * 12?"}],
                "tools": TOOLS[:1]}
        with httpx.stream("POST", f"{url}/s/hang-up/v1/chat/completions", json=body, headers=bearer(TOKEN_A)) as response:
            episode = response.headers["x-agent-rl-episode"]
            next(response.iter_bytes())  # read the first chunk, then hang up
        assert end(url, TOKEN_A, episode).status_code == 200
    record = all_episodes(sqlite_url)[episode]
    assert record.policy_version == upstream
    assert json.loads(record.messages[-1]["tool_calls"][0]["function"]["arguments"]) == {"expression": "12 * 12"}


def test_unjudged_live_episodes_never_become_sft_positives(sqlite_url):
    from agent_rl.curation.datasets import quality, sft_rows
    from agent_rl.curation.live import live_validation_config
    from agent_rl.curation.validate import validate_episodes

    with gateway(sqlite_url, {"calc": 1.0}, {"calc": "calc-bot"}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        _, episode = run_agent(client, "What is 3 * 3?")
        assert end(url, TOKEN_A, episode).status_code == 200
        assert httpx.post(f"{url}/v1/feedback", headers=bearer(TOKEN_A),
                          json={"episode_id": episode, "verdict": "up"}).status_code == 200
    row = all_episodes(sqlite_url)[episode].model_dump(mode="json")
    assert quality(row) == 0.0 and sft_rows([row], tools=TOOLS) == []
    result = validate_episodes([row], live_validation_config([row], require_reward=True))
    assert result.clean == [] and any("reward" in reason for reason in result.quarantined[0][1])


@pytest.mark.postgres
def test_a_pool_outage_mid_run_loses_no_episode(tmp_path):
    from tests.pg_server import postgres_bin, private_postgres

    if postgres_bin() is None:
        pytest.fail("PostgreSQL server binaries are needed for the outage test (apt-get install postgresql)")
    with private_postgres() as pg:
        with gateway(pg.url, {"calc": 1.0}, {"calc": "calc-bot"}, gateway_write_retry_s=0.5) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
            before = [run_agent(client, f"What is {i} * 2?", metadata={"final_tool": "answer"})[1] for i in range(3)]
            wait_for_episodes(pg.url, 3)
            pg.stop("fast")
            outage_started = time.monotonic()
            try:
                # Traffic goes on (routing keeps its last split); ends are queued, an explicit one says 503.
                during = [run_agent(client, f"What is {i} * 5?", metadata={"final_tool": "answer"})[1] for i in range(3)]
                _, explicit = run_agent(client, "What is 8 * 8?")
                refused = end(url, TOKEN_A, explicit)
                assert refused.status_code == 503 and refused.json()["error"]["code"] == "pool_unavailable"
                assert refused.headers["retry-after"]
                health = httpx.get(f"{url}/healthz", headers=bearer(TOKEN_A)).json()["gateway"]
                assert health["unwritten_episodes"] == 4
                time.sleep(max(0.0, 3.0 - (time.monotonic() - outage_started)))  # a 3-second outage
            finally:
                pg.start()
            assert end(url, TOKEN_A, explicit).status_code == 200  # ending again is safe
            stored = wait_for_episodes(pg.url, 7)
            assert httpx.get(f"{url}/healthz", headers=bearer(TOKEN_A)).json()["gateway"]["unwritten_episodes"] == 0
        assert set(stored) == {*before, *during, explicit}


def test_ab_counts_unjudged_live_episodes_only_with_a_verdict():
    from datetime import datetime, timezone

    from agent_rl.ab.outcomes import arm_stats_from_episodes

    now = datetime.now(timezone.utc)
    rows = [{"policy_version": "v", "outcome": "unjudged", "created_at": now, "feedback": feedback, "latency_ms": 5.0}
            for feedback in (None, "a free comment", "up", "down")] + [
           {"policy_version": "v", "outcome": "correct", "created_at": now, "latency_ms": 5.0}]
    stats = arm_stats_from_episodes(rows)["v"]
    assert (stats.trials, stats.successes, stats.hallucinations, stats.errors) == (3, 2, 0, 0)


def test_live_episodes_beyond_the_cap_are_written_not_dropped(sqlite_url):
    with gateway(sqlite_url, {"calc": 1.0}, {"calc": "calc-bot"}, gateway_max_live=3) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        ids = [run_agent(client, f"What is {i} + {i}?")[1] for i in range(5)]
        assert httpx.get(f"{url}/healthz", headers=bearer(TOKEN_A)).json()["gateway"]["live_episodes"] <= 3
        assert set(wait_for_episodes(sqlite_url, 2)) >= set(ids[:2])  # the least recently active ones
    assert set(all_episodes(sqlite_url)) == set(ids)


def test_sessions_split_by_the_routing_weights(sqlite_url):
    from agent_rl.arbiter.routing import Split, key_point

    weights = {"calc": 0.7, "calc-b": 0.3}
    with gateway(sqlite_url, weights, {"calc": "calc-bot", "calc-b": "calc-bot"}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        served = {}
        for i in range(120):
            raw = client.chat.completions.with_raw_response.create(
                model="x", messages=[{"role": "user", "content": f"What is {i} + 1?"}], tools=TOOLS[:1],
                extra_headers={"X-Agent-RL-Episode": f"split-{i}"})
            served[f"split-{i}"] = (raw.headers["x-agent-rl-episode"], raw.parse().model)
    stored = all_episodes(sqlite_url)  # written at shutdown
    split = Split.from_weights(weights, {})
    for session, (episode, model) in served.items():
        expected = split.pick(key_point(f"gateway\0tenant-a\0{session}"))
        assert stored[episode].policy_version == model == expected  # sticky: the hash of the session picks it
    share = sum(1 for e in stored.values() if e.policy_version == "calc") / len(stored)
    assert len(stored) == 120 and 0.55 <= share <= 0.85


def test_a_malformed_environment_name_is_refused_and_writes_nothing(sqlite_url):
    with gateway(sqlite_url, {"calc": 1.0}, {"calc": "calc-bot"}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        with pytest.raises(openai.BadRequestError, match="environment must be an environment name"):
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "What is 1 + 1?"}],
                                           metadata={"environment": "no spaces/please"})
    assert all_episodes(sqlite_url) == {}


def test_the_declared_category_is_stored_and_a_malformed_one_refused(sqlite_url):
    with gateway(sqlite_url, {"calc": 1.0}, {"calc": "calc-bot"}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        with pytest.raises(openai.BadRequestError, match="category must be a category name"):
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "What is 1 + 1?"}],
                                           metadata={"category": "two words"})
        _, episode = run_agent(client, "What is 2 + 2?", metadata={"category": "add", "final_tool": "answer"})
        stored = wait_for_episodes(sqlite_url, 1)
    assert list(stored) == [episode] and stored[episode].task_category == "add"

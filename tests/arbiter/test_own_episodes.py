"""A gateway user reads what the pool recorded of their own traffic, and nothing of anyone else's.

Real arbiter over loopback, the official `openai` client as the agent, the OpenAI stub server (a real HTTP
server) as the upstream; the listing and reading go through `GET /v1/episodes` and the `agent-rl episodes` CLI.
"""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from typer.testing import CliRunner

from agent_rl.arbiter.config import ArbiterConfig
from agent_rl.arbiter.server import running_arbiter
from agent_rl.cli import app as cli
from agent_rl.pool import PoolRepository
from tests.arbiter.arbiter_fixtures import api_key, bearer
from tests.openai_stub import openai_stub, tool_call  # noqa: F401 (fixture)

TOKEN_A = "own-episodes-key-a-7d21"
TOKEN_B = "own-episodes-key-b-c04e"
NARROW = "own-episodes-key-narrow-5a9b"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def weather_bot(request):
    if request["messages"][-1]["role"] == "tool":
        return f"It is {request['messages'][-1]['content']}."
    return {"content": None, "tool_calls": [tool_call("get_weather", {"city": "Oslo"})]}


def converse(url: str, token: str, question: str, context: str | None = None) -> str:
    """One two-call conversation with its own tool; returns the episode id after ending it."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0)
    metadata = {"context": context} if context else None
    messages = [{"role": "user", "content": question}]
    raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, tools=TOOLS, metadata=metadata)
    episode = raw.headers["x-agent-rl-episode"]
    message = raw.parse().choices[0].message
    messages += [message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "sunny"}]
    client.chat.completions.create(model="m", messages=messages, tools=TOOLS, metadata=metadata,
                                   extra_headers={"X-Agent-RL-Episode": episode})
    assert httpx.post(f"{url}/v1/episodes/{episode}/end", headers=bearer(token), timeout=30).status_code == 200
    return episode


@pytest.fixture
def served(sqlite_url, openai_stub, monkeypatch):
    monkeypatch.setenv("OWN_EPISODES_UPSTREAM_KEY", "sk-own-episodes")
    openai_stub.script(weather_bot)
    spec = "openai:" + json.dumps({"base_url": openai_stub.url, "model": "stub", "api_key_env": "OWN_EPISODES_UPSTREAM_KEY",
                                   "retry_backoff_s": 0})
    pool = PoolRepository(sqlite_url)
    pool.set_routing({"weather": 1.0}, {"weather": spec}, reason="test", actor="tests")
    pool.close()
    keys = (api_key(TOKEN_A, "a", "tenant-a"), api_key(TOKEN_B, "b", "tenant-b"),
            api_key(NARROW, "narrow", "tenant-a", contexts=("travel",), replay=False))
    config = ArbiterConfig(pool_url=sqlite_url, api_keys=keys, gateway_rate_per_s=1000.0, gateway_rate_burst=1000)
    with running_arbiter(config, log_level="warning") as url:
        mine = []
        for i, context in enumerate([None, "travel", None]):
            mine.append(converse(url, TOKEN_A, f"Weather in Oslo, day {i}?", context))
            time.sleep(0.01)  # distinct creation times, so "newest first" is observable
        theirs = converse(url, TOKEN_B, "Weather for tenant B?")
        yield url, mine, theirs, openai_stub.url


def listing(url: str, token: str, **params) -> httpx.Response:
    return httpx.get(f"{url}/v1/episodes", params=params, headers=bearer(token), timeout=30)


def test_a_tenant_lists_and_reads_its_own_episodes_only(served):
    url, mine, theirs, upstream_url = served
    page = listing(url, TOKEN_A).json()
    assert [row["episode_id"] for row in page["data"]] == mine[::-1] and page["next_cursor"] is None
    assert all("messages" not in row for row in page["data"])
    assert upstream_url not in json.dumps(page)  # versions by public name, never the upstream's address
    assert [row["episode_id"] for row in listing(url, TOKEN_B).json()["data"]] == [theirs]

    # Pages of one never repeat or skip an episode.
    seen, cursor = [], None
    while True:
        page = listing(url, TOKEN_A, limit=1, **({"cursor": cursor} if cursor else {})).json()
        seen += [row["episode_id"] for row in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == mine[::-1]

    full = httpx.get(f"{url}/v1/episodes/{mine[0]}", headers=bearer(TOKEN_A), timeout=30).json()
    assert [m["role"] for m in full["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert full["final_answer"] == "It is sunny." and full["tools"][0]["function"]["name"] == "get_weather"

    # Another tenant's episode reads exactly like one that does not exist.
    foreign = httpx.get(f"{url}/v1/episodes/{theirs}", headers=bearer(TOKEN_A), timeout=30)
    missing = httpx.get(f"{url}/v1/episodes/no-such-episode", headers=bearer(TOKEN_A), timeout=30)
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json() == missing.json()


def test_a_key_limited_to_some_contexts_sees_only_those(served):
    url, mine, _, _ = served
    assert [row["episode_id"] for row in listing(url, NARROW).json()["data"]] == [mine[1]]
    assert httpx.get(f"{url}/v1/episodes/{mine[0]}", headers=bearer(NARROW), timeout=30).status_code == 404
    assert [row["episode_id"] for row in listing(url, TOKEN_A, context="travel").json()["data"]] == [mine[1]]


def test_bad_requests_are_refused_clearly(served):
    url = served[0]
    assert httpx.get(f"{url}/v1/episodes", timeout=30).status_code == 401
    bad_limit = listing(url, TOKEN_A, limit=0)
    assert bad_limit.status_code == 422 and "limit" in bad_limit.json()["error"]["message"]
    bad_cursor = listing(url, TOKEN_A, cursor="yesterday")
    assert bad_cursor.status_code == 422 and "cursor" in bad_cursor.json()["error"]["message"]


def test_the_cli_lists_and_shows_with_the_key_from_the_environment(served, monkeypatch):
    url, mine, theirs, _ = served
    runner = CliRunner()
    monkeypatch.setenv("AGENT_RL_API_KEY", TOKEN_A)
    listed = runner.invoke(cli, ["episodes", "list", "--url", url, "--limit", "2"])
    assert listed.exit_code == 0, listed.output
    assert mine[2] in listed.output and mine[1] in listed.output and mine[0] not in listed.output
    assert theirs not in listed.output and "--cursor" in listed.output
    shown = runner.invoke(cli, ["episodes", "show", mine[0], "--url", url])
    assert shown.exit_code == 0 and json.loads(shown.output)["episode_id"] == mine[0]
    refused = runner.invoke(cli, ["episodes", "show", theirs, "--url", url])
    assert refused.exit_code == 1 and "404" in refused.output
    monkeypatch.delenv("AGENT_RL_API_KEY")
    assert "AGENT_RL_API_KEY" in runner.invoke(cli, ["episodes", "list", "--url", url]).output

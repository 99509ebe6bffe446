"""The README's gateway quickstart, run as written: a client that declares only its own tool never gets a reply
calling a tool it did not declare.

The commands are read from the README's block (so a README that drifts fails here): `agent-rl arbiter new-key`
and `agent-rl arbiter serve` run as subprocesses of the installed command in a scratch directory, the routing
update is the README's own body sent to the arbiter, with the upstream's address pointed at the local OpenAI
stub server (no network); the agent is the official `openai` client.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from agent_rl.arbiter.server import free_port, stop_arbiter, wait_until_serving
from tests.arbiter.test_own_episodes import TOOLS as WEATHER
from tests.openai_stub import openai_stub, tool_call  # noqa: F401 (fixture)

README = Path(__file__).resolve().parents[2] / "README.md"


def quickstart_lines() -> list[str]:
    text = README.read_text()
    section = text[text.index("### Bring an agent that is not ours"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    lines, pending = [], ""
    for line in block.splitlines():  # one command per entry: continuations and quotes spanning lines joined
        pending = f"{pending}\n{line}" if pending else line
        try:
            shlex.split(pending, comments=True)
        except ValueError:
            continue
        lines.append(pending)
        pending = ""
    return lines


def line_starting(lines: list[str], prefix: str) -> str:
    return next(line for line in lines if line.strip().startswith(prefix))


def agent_rl(*args: str) -> list[str]:
    return [sys.executable, "-m", "agent_rl.cli", *args]


def weather_bot(request):
    names = {t["function"]["name"] for t in request.get("tools") or []}
    assert names == {"get_weather"}, names  # the gateway forwards the client's own tools
    if request["messages"][-1]["role"] == "tool":
        return f"It is {request['messages'][-1]['content']} in Oslo."
    return {"content": None, "tool_calls": [tool_call("get_weather", {"city": "Oslo"})]}


@pytest.mark.slow
def test_the_readme_quickstart_never_answers_with_tools_the_client_did_not_declare(tmp_path, openai_stub):
    lines = quickstart_lines()
    env = {**os.environ, "AGENT_RL_HOME": str(tmp_path / "home"), "AGENT_RL_ADMIN_TOKEN": "quickstart-admin-7f3e",
           "OPENAI_API_KEY": "sk-quickstart-upstream", "HF_HUB_OFFLINE": "1"}
    openai_stub.require_api_key = "sk-quickstart-upstream"
    openai_stub.script(weather_bot)

    # TOKEN=$(agent-rl arbiter new-key ...), as written.
    new_key = line_starting(lines, "TOKEN=$(").split("$(", 1)[1].split(")", 1)[0]
    words = shlex.split(new_key)
    assert words[:3] == ["agent-rl", "arbiter", "new-key"]
    made = subprocess.run(agent_rl(*words[1:]), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()

    serve = shlex.split(line_starting(lines, "agent-rl arbiter serve").split("#", 1)[0])
    port = free_port()
    server = subprocess.Popen(agent_rl(*serve[1:], "--port", str(port), "--log-level", "warning"), cwd=tmp_path,
                              env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, server)

        client = openai.OpenAI(base_url=f"{url}/s/run-1/v1", api_key=token, max_retries=0)
        question = [{"role": "user", "content": "What is the weather in Oslo?"}]
        # Before any routing: the arbiter's default version is no model of this client's; whatever it does, it
        # never hands the client a call to a tool it did not declare.
        try:
            early = client.chat.completions.create(model="m", messages=question, tools=WEATHER)
            assert all(c.function.name == "get_weather" for c in early.choices[0].message.tool_calls or [])
        except openai.APIStatusError as exc:
            assert exc.status_code == 502 and "did not declare" in str(exc)

        # The README's routing update, its upstream pointed at the local stub.
        put = shlex.split(line_starting(lines, "curl -X PUT"))
        body = json.loads(put[put.index("-d") + 1])
        for version, spec in body["specs"].items():
            upstream = json.loads(spec.removeprefix("openai:"))
            upstream["base_url"] = openai_stub.url
            body["specs"][version] = "openai:" + json.dumps(upstream)
        routed = httpx.put(f"{url}/v1/routing", json=body, timeout=30,
                           headers={"Authorization": f"Bearer {env['AGENT_RL_ADMIN_TOKEN']}"})
        assert routed.status_code == 200, routed.text
        time.sleep(1.2)  # the README serves several workers: each re-reads the routing within routing_ttl_s (1 s)

        client = openai.OpenAI(base_url=f"{url}/s/run-2/v1", api_key=token, max_retries=0)
        first = client.chat.completions.create(model="m", messages=question, tools=WEATHER).choices[0].message
        assert [c.function.name for c in first.tool_calls] == ["get_weather"]
        messages = [*question, first.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "sunny"}]
        reply = client.chat.completions.create(model="m", messages=messages, tools=WEATHER)
        final, episode = reply.choices[0].message, reply.model_extra["agent_rl"]["episode_id"]
        assert final.content == "It is sunny in Oslo." and not final.tool_calls

        # `agent-rl episodes list`, as written, shows the conversation once it has ended.
        episodes_line = line_starting(lines, "AGENT_RL_API_KEY=$TOKEN agent-rl episodes list")
        ended = httpx.post(f"{url}/v1/episodes/{episode}/end", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert ended.status_code == 200, ended.text
        listed = subprocess.run(agent_rl(*shlex.split(episodes_line.split("#", 1)[0])[2:], "--url", url), cwd=tmp_path,
                                env={**env, "AGENT_RL_API_KEY": token}, capture_output=True, text=True, timeout=120)
        assert listed.returncode == 0 and "weather in Oslo" in listed.stdout, listed.stdout + listed.stderr
    finally:
        stop_arbiter(server)


def test_a_reply_calling_an_undeclared_tool_is_refused_and_records_nothing(sqlite_url):
    """The arbiter's default version (the email assistant's rule-based reader) answers a weather client with
    `search_emails`: the client gets a 502 naming the version, never the call, and the pool holds no episode."""
    from agent_rl.arbiter.config import ArbiterConfig
    from agent_rl.arbiter.server import running_arbiter
    from agent_rl.pool import PoolRepository
    from tests.arbiter.arbiter_fixtures import api_key

    token = "quickstart-undeclared-key-19ab"
    config = ArbiterConfig(pool_url=sqlite_url, api_keys=(api_key(token, "w", "weather"),))
    with running_arbiter(config, log_level="warning") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0)
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="m", tools=WEATHER,
                                           messages=[{"role": "user", "content": "When is the board meeting?"}])
        assert refused.value.status_code == 502 and "did not declare" in str(refused.value)
        assert "search_emails" not in str(refused.value)
    pool = PoolRepository(sqlite_url)
    assert pool.count() == 0
    pool.close()

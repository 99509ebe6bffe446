"""Versions served by a vLLM server as LoRA adapters loaded and unloaded at run time (arbiter/vllm_lora.py).

vLLM needs a GPU, which the test machines do not have: these tests run against tests/vllm_stub.py, a real HTTP
server on loopback implementing exactly vLLM's dynamic-adapter endpoints (POST /v1/load_lora_adapter, POST
/v1/unload_lora_adapter) and chat completions routed by `model=<lora_name>`. The arbiter's code path is the one
that talks to a real server."""

from __future__ import annotations

import asyncio
import json

import pytest

from agent_rl.arbiter.policies import PolicyCache, PolicyLoadError
from agent_rl.arbiter.vllm_lora import VllmServing, registered_on_vllm, write_combined_adapter
from agent_rl.policy_specs import load_served, load_stacked
from arbiter_fixtures import demo_world, start_arbiter  # noqa: F401  (pytest fixtures)
from tests.adapter_fixtures import versions
from tests.vllm_stub import vllm_stub  # noqa: F401  (fixture)

ADMIN_TOKEN = "vllm-admin-token-93ab"
QUESTION = [[{"role": "user", "content": "When is the budget meeting?"}]]


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    return versions(tmp_path_factory.mktemp("vllm"))


def test_the_combined_adapter_serves_exactly_the_stack(stacks, tmp_path):
    base, adapters = stacks
    combined = write_combined_adapter(adapters["stack"], tmp_path / "combined")
    conversations = [[{"role": "user", "content": f"meeting {w} budget"}] for w in ("Friday", "Houston", "invoice")]
    stack = load_stacked(str(base), adapters["stack"], version="stack", dtype="float32")
    one = load_stacked(str(base), [combined], version="combined", dtype="float32")
    assert [t.as_message() for t in one.act(conversations, [], 16)] == \
        [t.as_message() for t in stack.act(conversations, [], 16)]


def test_a_version_loads_its_adapter_is_routed_by_name_and_unloads_when_dropped(vllm_stub, stacks, tmp_path):
    base, adapters = stacks
    serving = VllmServing(base_url=vllm_stub.url, adapter_dir=tmp_path / "adapters")
    policies = PolicyCache(lambda spec: load_served(spec, vllm=serving))
    upstream = registered_on_vllm(serving, "v3", adapters["stack"])  # what `mlflow:v3` loads with `vllm` set
    assert vllm_stub.adapters == {"agent-rl-v3": str((tmp_path / "adapters" / "agent-rl-v3").resolve())}
    spec = "vllm-lora:" + json.dumps({"base_url": vllm_stub.url, "lora_name": "agent-rl-v4",
                                      "lora_path": str(write_combined_adapter(adapters["one"], tmp_path / "v4"))})
    v4 = policies.get(spec)
    assert set(vllm_stub.adapters) == {"agent-rl-v3", "agent-rl-v4"}

    # The batch path and the gateway path both name the adapter as the model.
    assert upstream.act(QUESTION, [], 8)[0].content == "agent-rl-v3 answers"
    assert v4.act(QUESTION, [], 8)[0].content == "agent-rl-v4 answers"

    async def gateway_call():
        try:
            return await v4.complete({"messages": QUESTION[0]})
        finally:
            await v4.aclose()

    assert asyncio.run(gateway_call())["choices"][0]["message"]["content"] == "agent-rl-v4 answers"
    assert [body["model"] for body in vllm_stub.completions()] == ["agent-rl-v3", "agent-rl-v4", "agent-rl-v4"]

    # Loading a version the server already holds is not an error (an arbiter restart); dropping unloads it.
    assert policies.get(spec) is v4 and registered_on_vllm(serving, "v3", adapters["stack"]).adapter.lora_name
    policies.retain([])
    assert set(vllm_stub.adapters) == {"agent-rl-v3"}
    assert ("unload_lora_adapter", {"lora_name": "agent-rl-v4"}) in vllm_stub.events
    assert v4.act(QUESTION, [], 8)[0].parse_error  # the server no longer serves it
    upstream.release()
    upstream.release()  # already gone: fine
    assert vllm_stub.adapters == {}


def test_an_adapter_the_server_cannot_load_is_a_load_error(vllm_stub, tmp_path):
    spec = "vllm-lora:" + json.dumps({"base_url": vllm_stub.url, "lora_name": "missing",
                                      "lora_path": str(tmp_path / "nothing-here")})
    with pytest.raises(PolicyLoadError, match="refused to load adapter 'missing'"):
        load_served(spec)
    with pytest.raises(PolicyLoadError, match="lora_name"):
        load_served("vllm-lora:" + json.dumps({"base_url": vllm_stub.url, "lora_name": "bad name", "lora_path": "/x"}))


def test_promotion_and_rollback_through_the_arbiter_load_and_unload_adapters(start_arbiter, demo_world, vllm_stub,
                                                                             stacks, tmp_path, monkeypatch):
    base, adapters = stacks
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    path = write_combined_adapter(adapters["stack"], tmp_path / "challenger")
    spec = "vllm-lora:" + json.dumps({"base_url": vllm_stub.url, "lora_name": "challenger", "lora_path": str(path)})
    scenario = demo_world.scenarios[0]
    with start_arbiter() as arbiter:
        arbiter.client.put("/v1/routing", json={"weights": {"heuristic": 0, "challenger": 1},
                                                "specs": {"heuristic": "heuristic", "challenger": spec},
                                                "reason": "promote"}, headers=auth).raise_for_status()
        assert set(vllm_stub.adapters) == {"challenger"}
        answer = arbiter.client.post("/v1/ask", json={"inbox": scenario.inbox_id, "question": scenario.question}).json()
        assert answer["policy_version"] == "challenger"
        assert vllm_stub.completions()[-1]["model"] == "challenger"
        arbiter.client.put("/v1/routing", json={"weights": {"heuristic": 1, "challenger": 0}, "reason": "rollback"},
                           headers=auth).raise_for_status()
        assert vllm_stub.adapters == {}

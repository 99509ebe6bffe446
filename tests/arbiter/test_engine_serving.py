"""The serving engine (vLLM for CPU, agent/engine.py) with a real engine process on a small base of ours:

- what the engine is given is, token for token, what SFT trains on for the same conversation;
- two versions of one base (an adapter, a two-adapter stack) and the base itself, decoded in one engine batch, each
  answer exactly what that version answers alone and what our torch decoder answers with the version merged (fp32
  on both sides): one adapter applied to another version's rows would change them;
- the arbiter, routing an A/B split between the two versions, serves both through one engine and records each
  episode as that version plays it alone; a version taken out of the routing is unloaded from the engine;
- with versions served merged (the CPU default, AGENT_RL_ENGINE_VERSIONS=merged), each version runs on an engine of
  its own, answers as our torch decoder with it merged, and a rolled-back version's engine stops.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from agent_rl.agent import engine as engine_module
from agent_rl.agent.chat_format import render_prompt
from agent_rl.agent.engine import EnginePolicy, MixedEnginePolicy, engine_policy, shared_engine, vllm_installed
from agent_rl.agent.models import build_tiny_model
from agent_rl.environments.runner import RunnerConfig
from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.policy_specs import load_stacked
from agent_rl.train.sft import tokenize_rows
from arbiter_fixtures import demo_world, start_arbiter  # noqa: F401  (pytest fixtures)
from tests.adapter_fixtures import lora_spec, make_adapter, vary

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not vllm_installed(), reason="vLLM for CPU is not installed (make setup installs it)")]

ADMIN_TOKEN = "engine-serving-admin-3c1f"
RUNNER = RunnerConfig(max_new_tokens=24, max_turns=2)
TOOLS = [{"type": "function", "function": {
    "name": "search_inbox", "description": "Search the inbox.",
    "parameters": {"type": "object", "properties": {"keywords": {"type": "array", "items": {"type": "string"}}},
                   "required": ["keywords"]}}}]


def engine_base(root: Path) -> Path:
    """A small random Qwen2 with the tiny tokenizer and 64-wide attention heads (the engine's CPU kernels take 32
    and up; the suite's tiny model has 16), weights large enough that greedy output depends on the prompt."""
    tiny = build_tiny_model(root / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    vary(model)
    base = root / "base"
    model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    return base


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    previous = os.environ.get("AGENT_RL_ENGINE_VERSIONS")
    os.environ["AGENT_RL_ENGINE_VERSIONS"] = "adapters"  # these tests: versions as adapters on one engine
    root = tmp_path_factory.mktemp("engine")
    base = engine_base(root)
    adapters = {"one": [make_adapter(base, root / "a", seed=1)],
                "stack": [make_adapter(base, root / "sft", seed=2),
                          make_adapter(base, root / "grpo", seed=3, targets=("k_proj", "gate_proj"), r=2)]}
    # fp32 so that the engine and our torch decoder can be compared token for token.
    engine = shared_engine(base, dtype="float32", max_model_len=4096, max_loras=4)
    yield base, adapters, engine
    engine_module.stop_engines()
    if previous is None:
        os.environ.pop("AGENT_RL_ENGINE_VERSIONS", None)
    else:
        os.environ["AGENT_RL_ENGINE_VERSIONS"] = previous


def conversations() -> list[list[dict]]:
    return [[{"role": "system", "content": "You answer questions about the user's inbox."},
             {"role": "user", "content": question}]
            for question in ("When is the budget review?", "Who sent the contract?", "What did Vince ask for?",
                             "Is the offsite in June?")]


def test_the_engine_is_given_what_training_renders(served):
    base, _, _ = served
    policy = engine_policy(base, [], version="base")
    tokenizer = policy.tokenizer
    conversation = [
        {"role": "system", "content": "You answer questions about the user's inbox."},
        {"role": "user", "content": "When is the budget review?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "search_inbox",
                                                              "arguments": '{"keywords": ["budget"]}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": '[{"id": "m1", "snippet": "review on Friday"}]'},
    ]
    answer = {"role": "assistant", "content": "Friday."}
    sent = policy.prompt_ids(conversation, TOOLS)
    trained = tokenize_rows(tokenizer, [{"messages": [*conversation, answer], "tools": TOOLS}], max_length=100_000)
    assert trained.input_ids[0][: len(sent)] == sent
    assert sent == tokenizer(render_prompt(tokenizer, conversation, TOOLS), add_special_tokens=False)["input_ids"]
    # The engine bills exactly those tokens: it decoded the prompt it was given, nothing re-rendered.
    [turn] = policy.act([conversation], TOOLS, max_new_tokens=4)
    assert turn.prompt_tokens == len(sent)


def test_versions_side_by_side_each_get_their_own_weights(served):
    base, adapters, engine = served
    policies = {name: engine_policy(base, stack, version=name) for name, stack in adapters.items()}
    policies["base"] = engine_policy(base, [], version="base")
    chats = conversations()
    alone = {name: [t.content for t in policy.act(chats, [], max_new_tokens=16)] for name, policy in policies.items()}
    assert len({tuple(v) for v in alone.values()}) == 3, "the versions must answer differently for the test to bite"

    rows = ["one", "stack", "base", "one", "stack", "base", "stack", "one"]
    mixed = MixedEnginePolicy(policies).act_rows(rows, [chats[i % 4] for i in range(len(rows))], [], 16)
    for i, (version, turn) in enumerate(zip(rows, mixed)):
        assert turn.content == alone[version][i % 4], f"row {i} ({version}) got another version's answer"

    # Our torch decoder with each stack merged, fp32: the same greedy answers.
    for name in ("one", "stack"):
        merged = load_stacked(str(base), adapters[name], version=name, dtype="float32")
        assert [t.content for t in merged.act(chats, [], max_new_tokens=16)] == alone[name], name
    assert set(engine.adapters()) == {policies["one"].adapter, policies["stack"].adapter}


def test_the_arbiter_serves_an_ab_split_through_one_engine(served, start_arbiter, demo_world, monkeypatch):
    base, adapters, engine = served
    monkeypatch.setenv("AGENT_RL_ENGINE", "vllm")
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    calls: list[tuple[set[str], float, float]] = []  # versions asked for, when the call started and ended
    act_rows = MixedEnginePolicy.act_rows

    def recorded(self, rows, *args, **kwargs):
        started = time.perf_counter()
        try:
            return act_rows(self, rows, *args, **kwargs)
        finally:
            calls.append((set(rows), started, time.perf_counter()))

    monkeypatch.setattr(MixedEnginePolicy, "act_rows", recorded)
    specs = {name: lora_spec(base, stack, name) for name, stack in adapters.items()}
    scenarios = [s for s in demo_world.scenarios if s.answerable][:6]
    with start_arbiter(batch_window_ms=300, max_batch=16, runner=RUNNER) as arbiter:
        arbiter.client.put("/v1/routing", json={"weights": {"one": 1, "stack": 1}, "specs": specs, "reason": "A/B"},
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).raise_for_status()
        answers: dict[int, dict] = {}

        def ask(i: int) -> None:
            body = {"inbox": scenarios[i].inbox_id, "question": scenarios[i].question, "request_key": f"user-{i}"}
            answers[i] = arbiter.client.post("/v1/ask", json=body).json()

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(scenarios))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert {a["policy_version"] for a in answers.values()} == {"one", "stack"}
        # The runner keeps the episodes in flight (one call per episode and turn): both versions' requests must be
        # on the engine at the same time, for it to batch them together.
        assert any(len(a | b) == 2 and a_start < b_end and b_start < a_end
                   for a, a_start, a_end in calls for b, b_start, b_end in calls), \
            "both versions should be in flight on the engine together"

        # Each recorded episode is what its version plays alone (here: on the engine, one version at a time).
        store = open_inbox_store(demo_world.inbox_url)
        alone = {name: engine_policy(base, stack, version=name) for name, stack in adapters.items()}
        for i, answer in answers.items():
            version = answer["policy_version"]
            task = EpisodeTask(inbox=scenarios[i].inbox_id, question=scenarios[i].question, policy_version=version)
            [played] = run_episodes(alone[version], [task], store, RUNNER)
            assert arbiter.pool.get(answer["episode_id"]).messages == played.messages, version
        store.close()
        del alone

        # Rolled back: "stack" leaves the engine once nothing holds it; "one" stays.
        arbiter.client.put("/v1/routing", json={"weights": {"one": 1, "stack": 0}, "reason": "rollback"},
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).raise_for_status()
        gc.collect()
        names = set(engine.adapters())
        assert any(name.startswith("one-") for name in names)
        assert not any(name.startswith("stack-") for name in names)


def test_merged_versions_run_on_engines_of_their_own_and_stop_when_rolled_back(tmp_path, start_arbiter, demo_world,
                                                                              monkeypatch):
    root = tmp_path / "merged"
    base = engine_base(root)
    adapters = {"one": [make_adapter(base, root / "a", seed=1)],
                "stack": [make_adapter(base, root / "sft", seed=2),
                          make_adapter(base, root / "grpo", seed=3, targets=("k_proj", "gate_proj"), r=2)]}
    monkeypatch.setenv("AGENT_RL_ENGINE", "vllm")
    monkeypatch.setenv("AGENT_RL_ENGINE_VERSIONS", "merged")
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("AGENT_RL_ENGINE_DTYPE", "float32")  # to compare with our fp32 decoder token for token
    specs = {name: lora_spec(base, stack, name) for name, stack in adapters.items()}
    chats = conversations()
    before = set(engine_module._ENGINES)  # the module's other engine may still run
    try:
        with start_arbiter(batch_window_ms=100, max_batch=16, runner=RUNNER) as arbiter:
            arbiter.client.put("/v1/routing", json={"weights": {"one": 1, "stack": 1}, "specs": specs,
                                                    "reason": "A/B"},
                               headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                               timeout=600).raise_for_status()  # two engines start before it answers
            engines = {key: e for key, e in engine_module._ENGINES.items() if key not in before}
            assert len(engines) == 2 and not any(e.config.lora for e in engines.values())
            for name in ("one", "stack"):  # the merged version on its engine answers as our fp32 decoder
                checkpoint = str(engine_module.merged_checkpoint(base, adapters[name]))
                cores = next(e.config.cores for e in engines.values() if e.config.model == checkpoint)
                with engine_module.placed_on(cores):  # the arbiter's own engine, on the share it was given
                    policy = engine_policy(base, adapters[name], version=name)
                assert policy.engine in engines.values()
                assert hasattr(policy, "model")  # a model of ours: validation's forgetting probe asks it
                with monkeypatch.context() as local:
                    local.setenv("AGENT_RL_ENGINE", "torch")
                    merged = load_stacked(str(base), adapters[name], version=name, dtype="float32")
                assert [t.content for t in policy.act(chats, [], 16)] == \
                    [t.content for t in merged.act(chats, [], 16)], name
                del policy
            scenario = next(s for s in demo_world.scenarios if s.answerable)
            answer = arbiter.client.post("/v1/ask", json={"inbox": scenario.inbox_id, "question": scenario.question,
                                                          "request_key": "merged-1"}).json()
            assert answer["policy_version"] in ("one", "stack")
            stack_engine = next(e for e in engines.values() if e.process is not None and
                                e.config.model == str(engine_module.merged_checkpoint(base, adapters["stack"])))
            arbiter.client.put("/v1/routing", json={"weights": {"one": 1, "stack": 0}, "reason": "rollback"},
                               headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).raise_for_status()
            gc.collect()
            assert stack_engine.process is None, "the rolled-back version's engine still runs"
            assert len(set(engine_module._ENGINES) - before) == 1
    finally:
        for key in set(engine_module._ENGINES) - before:
            engine_module._ENGINES[key].stop()

"""Versions served as adapters on one shared base (agent/shared_base.py, agent/row_lora.py), on the tiny model in
fp32: each version answers exactly as that version loaded alone as a merged model, rows of different versions
decode in one batch, and adapters load and drop while another version serves."""

from __future__ import annotations

import gc
import threading
import time

import pytest
from tests.adapter_fixtures import versions
from transformers import AutoModelForCausalLM

from agent_rl.agent.row_lora import UnsupportedAdapter, read_stack
from agent_rl.agent.shared_base import AdapterPolicy, MixedVersionPolicy, ServingSettings, serving_stats, shared_base
from agent_rl.policy_specs import load_stacked

QUESTIONS = [[{"role": "system", "content": "Answer questions about the inbox."},
              {"role": "user", "content": " ".join("meeting budget invoice contract Houston Friday".split()[: i + 1])}]
             for i in range(6)]
FP32 = ServingSettings(dtype="float32", batch_size=8)
TOKENS = 16


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return versions(tmp_path_factory.mktemp("shared"))


def merged_outputs(base, adapters, conversations=QUESTIONS):
    policy = load_stacked(str(base), adapters, version="merged", dtype="float32")
    return [t.as_message() for t in policy.act(conversations, tools=[], max_new_tokens=TOKENS)]


def test_each_version_answers_as_its_merged_model(world):
    base, versions = world
    served = {name: AdapterPolicy.load(str(base), adapters, version=name, settings=FP32)
              for name, adapters in versions.items()}
    assert len({id(p.base) for p in served.values()}) == 1  # one base in memory for all three
    outputs = {}
    for name, adapters in versions.items():
        outputs[name] = [t.as_message() for t in served[name].act(QUESTIONS, tools=[], max_new_tokens=TOKENS)]
        assert outputs[name] == merged_outputs(base, adapters), name
        again = [t.as_message() for t in served[name].act(QUESTIONS, tools=[], max_new_tokens=TOKENS)]
        assert again == outputs[name]  # from the per-version system-prompt and turn caches
    assert len({str(o) for o in outputs.values()}) == 3  # the adapters change what the model says


def test_a_mixed_batch_gives_every_row_its_own_versions_output(world):
    base, versions = world
    served = {name: AdapterPolicy.load(str(base), adapters, version=name, settings=FP32)
              for name, adapters in versions.items()}
    questions = [[c[0], {"role": "user", "content": c[1]["content"] + " schedule?"}] for c in QUESTIONS]
    merged = {name: merged_outputs(base, adapters, questions) for name, adapters in versions.items()}
    mixed = MixedVersionPolicy(served)
    rows = ["one", "stack", "base", "stack", "one", "base"]
    # New conversations: the shared system prompt is computed once per version in the batch, then rows split.
    turns = mixed.act_rows(rows, questions, tools=[], max_new_tokens=TOKENS)
    assert [t.as_message() for t in turns] == [merged[v][i] for i, v in enumerate(rows)]
    # Each conversation asked of every version in one batch (rows resume from their own version's turn cache).
    everyone = [v for v in versions for _ in questions]
    turns = mixed.act_rows(everyone, questions * 3, tools=[], max_new_tokens=TOKENS)
    assert [t.as_message() for t in turns] == [merged[v][i % len(questions)] for i, v in enumerate(everyone)]


def test_concurrent_calls_of_different_versions_are_decoded_together(world, monkeypatch):
    """Single conversations of two versions from two threads (the gateway's calls): whichever thread gets the
    model decodes the other's waiting call in the same batch, and each still gets its own version's answer."""
    from agent_rl.agent.local_policy import LocalPolicy

    base, versions = world
    served = {name: AdapterPolicy.load(str(base), versions[name], version=name, settings=FP32)
              for name in ("one", "stack")}
    alone = {name: [t.as_message() for t in policy.act(QUESTIONS[:2], tools=[], max_new_tokens=TOKENS)]
             for name, policy in served.items()}
    batches, generate = [], LocalPolicy._generate_locked

    def recorded(self, prompts, system_length, max_new_tokens, adapters):
        batches.append(list(adapters))
        return generate(self, prompts, system_length, max_new_tokens, adapters)

    monkeypatch.setattr(LocalPolicy, "_generate_locked", recorded)
    engine = next(iter(served.values())).base.engine
    errors, seen = [], {}

    def call(name):
        try:
            seen[name] = [t.as_message() for t in served[name].act(QUESTIONS[:2], tools=[], max_new_tokens=TOKENS)]
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(name,)) for name in served]
    with engine._lock:  # the model is busy: both calls queue up
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while len(engine._waiting) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    for thread in threads:
        thread.join()
    assert not errors
    assert seen == alone
    assert [sorted(set(adapters)) for adapters in batches] == [sorted(p.adapter for p in served.values())]


def test_adapters_load_and_drop_while_another_version_serves(world, tmp_path):
    base, versions = world
    serving = AdapterPolicy.load(str(base), versions["one"], version="one", settings=FP32)
    expected = [t.as_message() for t in serving.act(QUESTIONS[:2], tools=[], max_new_tokens=TOKENS)]
    errors, answers, stop = [], [], threading.Event()

    def traffic():
        while not stop.is_set():
            try:
                answers.append([t.as_message() for t in serving.act(QUESTIONS[:2], tools=[], max_new_tokens=TOKENS)])
            except Exception as exc:  # pragma: no cover - the assertion below reports it
                errors.append(exc)

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        time.sleep(0.2)
        started = time.perf_counter()
        challenger = AdapterPolicy.load(str(base), versions["stack"], version="challenger", settings=FP32)
        load_seconds = time.perf_counter() - started
        assert "challenger" in serving_stats()["versions"]
        assert challenger.act(QUESTIONS[:1], tools=[], max_new_tokens=TOKENS)[0].as_message() == \
            merged_outputs(base, versions["stack"], QUESTIONS[:1])[0]
        adapters_before = len(serving.base.rows.adapters)
        del challenger
        gc.collect()
        assert len(serving.base.rows.adapters) == adapters_before - 1  # dropped with its policy
        assert "challenger" not in serving_stats()["versions"]
        time.sleep(0.2)
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert answers and all(a == expected for a in answers)
    assert load_seconds < 1.0


def test_caches_of_all_versions_share_one_budget_and_adapters_report_their_memory(world):
    base, versions = world
    policy = AdapterPolicy.load(str(base), versions["stack"], version="stack", settings=FP32)
    policy.act(QUESTIONS, tools=[], max_new_tokens=TOKENS)
    stats = serving_stats()
    assert stats["adapter_bytes"] > 0 and stats["base_bytes"] > stats["adapter_bytes"]
    assert 0 < stats["cache_bytes"] <= stats["cache_budget_bytes"]
    assert policy.base is shared_base(str(base), FP32)


def test_an_adapter_that_is_not_plain_lora_is_refused(world, tmp_path):
    from peft import LoraConfig, get_peft_model

    base, _ = world
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    model.save_pretrained(tmp_path / "dora")
    with pytest.raises(UnsupportedAdapter, match="DoRA"):
        read_stack([tmp_path / "dora"])


@pytest.mark.slow
def test_smollm2_versions_on_one_base_answer_as_their_merged_models(tmp_path):
    """The real base in fp32: a two-adapter stack of the demo's shape (r=16 on every projection) served on the
    shared base gives the merged model's greedy turns, alone and in a batch mixed with the base."""
    import torch
    from peft import LoraConfig, get_peft_model

    from agent_rl.agent.models import resolve_model
    from agent_rl.environments.email.prompts import initial_messages
    from agent_rl.environments.email.tools import tool_schemas

    path = resolve_model("base")
    stack = []
    for seed in range(2):
        torch.manual_seed(seed)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(path), LoraConfig(
            r=16, lora_alpha=32, init_lora_weights=False,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.mul_(0.02)
        model.save_pretrained(tmp_path / f"adapter{seed}")
        stack.append(tmp_path / f"adapter{seed}")
        del model
    conversations = [initial_messages("jane.doe@enron.example", q) for q in
                     ("When is the budget review?", "Who approved the Houston move?", "What did Sally send?")]
    tools = tool_schemas()
    merged = load_stacked("base", stack, version="merged", dtype="float32")
    expected = [t.as_message() for t in merged.act(conversations, tools, 32)]
    plain = [t.as_message() for t in load_stacked("base", [], version="plain", dtype="float32").act(conversations, tools, 32)]
    del merged
    version = AdapterPolicy.load("base", stack, version="v1", settings=FP32)
    base = AdapterPolicy.load("base", [], version="base", settings=FP32)
    assert [t.as_message() for t in version.act(conversations, tools, 32)] == expected
    mixed = MixedVersionPolicy({"v1": version, "base": base})
    rows = ["v1", "base", "v1"]
    turns = mixed.act_rows(rows, conversations, tools, 32)
    assert [t.as_message() for t in turns] == [expected[0], plain[1], expected[2]]


def test_the_serving_batch_and_cache_come_from_the_environment_and_a_bad_batch_is_named(monkeypatch):
    from pydantic import ValidationError

    monkeypatch.setenv("AGENT_RL_SERVING_BATCH", "16")
    monkeypatch.setenv("AGENT_RL_SERVING_CACHE_MB", "64")
    settings = ServingSettings.from_env()
    assert settings.batch_size == 16 and settings.cache_bytes == 64 * 2**20
    assert ServingSettings.from_env(batch_size=4).batch_size == 4  # an explicit setting wins
    monkeypatch.setenv("AGENT_RL_SERVING_BATCH", "0")
    with pytest.raises(ValidationError, match="batch_size"):
        ServingSettings.from_env()

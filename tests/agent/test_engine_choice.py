"""Which engine a model of ours generates on: $AGENT_RL_ENGINE, and the engine's kernels' head sizes."""

from __future__ import annotations

import json

import pytest

from agent_rl.agent import engine
from agent_rl.agent.engine import EngineError, chosen_engine, head_size, serves_on_engine


def checkpoint(tmp_path, name: str, **config) -> str:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_auto_uses_the_engine_for_heads_it_takes_and_our_decoder_for_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "vllm_installed", lambda: True)
    smol = checkpoint(tmp_path, "smol", hidden_size=576, num_attention_heads=9)
    tiny = checkpoint(tmp_path, "tiny", hidden_size=64, num_attention_heads=4)
    assert head_size(smol) == 64 and head_size(tiny) == 16
    monkeypatch.setenv("AGENT_RL_ENGINE", "auto")
    assert serves_on_engine(smol) and not serves_on_engine(tiny)
    monkeypatch.setenv("AGENT_RL_ENGINE", "vllm")
    with pytest.raises(EngineError, match="heads of 32, 64.*has 16"):
        serves_on_engine(tiny)
    monkeypatch.setenv("AGENT_RL_ENGINE", "torch")
    assert not serves_on_engine(smol)


def test_auto_without_vllm_is_our_decoder_and_asking_for_it_says_so(monkeypatch):
    monkeypatch.setattr(engine, "vllm_installed", lambda: False)
    assert chosen_engine("auto") == "torch"
    with pytest.raises(EngineError, match="not installed"):
        chosen_engine("vllm")
    with pytest.raises(ValueError, match="expected vllm, torch or auto"):
        chosen_engine("tensorrt")


def test_the_engine_computes_in_bf16_only_where_the_hardware_runs_it_fast(monkeypatch):
    """bf16 on a CPU without AMX or AVX512_BF16 is emulated (~80x slower than fp32 on an AVX2-only EPYC): the engine
    serves fp32 there, bf16 where the CPU multiplies it faster; an explicit choice wins."""
    from agent_rl.agent import precision
    from agent_rl.agent.engine import DTYPE_ENV, engine_dtype

    monkeypatch.delenv(DTYPE_ENV, raising=False)
    for fast, dtype in (("0", "float32"), ("1", "bfloat16")):
        monkeypatch.setenv(precision.BF16_OVERRIDE_ENV, fast)
        precision.cpu_has_fast_bf16.cache_clear()  # measured once per process
        assert engine_dtype() == dtype
    monkeypatch.setenv(DTYPE_ENV, "float32")
    assert engine_dtype() == "float32"
    monkeypatch.setenv(DTYPE_ENV, "int4")
    with pytest.raises(ValueError, match="int4"):
        engine_dtype()
    precision.cpu_has_fast_bf16.cache_clear()

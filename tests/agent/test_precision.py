import pytest
import torch

from agent_rl.agent.precision import cpu_has_fast_bf16, hidden_size_of, resolve_dtype, resolve_dtype_name


def test_explicit_dtypes_pass_through_and_auto_follows_the_hardware():
    assert resolve_dtype_name("float32") == "float32"
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype_name("auto", "cuda") == "bfloat16"
    assert resolve_dtype_name("auto", "cpu") == ("bfloat16" if cpu_has_fast_bf16() else "float32")
    assert resolve_dtype_name("auto", "cpu", hidden_size=64) == "float32", "tiny matrices stay fp32"


def test_the_hidden_size_comes_from_the_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 576}')
    assert hidden_size_of(tmp_path) == 576
    assert hidden_size_of(tmp_path / "missing") is None


def test_an_unknown_dtype_is_named_in_the_error():
    with pytest.raises(ValueError, match="'float8'"):
        resolve_dtype_name("float8")


def test_bf16_is_chosen_only_when_measured_faster_and_the_choice_can_be_pinned(monkeypatch):
    import agent_rl.agent.precision as precision

    def decide(flags: set[str], fp32_s: float, bf16_s: float, env: str | None = None) -> bool:
        precision.cpu_has_fast_bf16.cache_clear()
        monkeypatch.setattr(precision, "_cpu_flags", lambda: flags)
        monkeypatch.setattr(precision, "_matmul_seconds", lambda dtype: fp32_s if dtype is torch.float32 else bf16_s)
        if env is None:
            monkeypatch.delenv(precision.BF16_OVERRIDE_ENV, raising=False)
        else:
            monkeypatch.setenv(precision.BF16_OVERRIDE_ENV, env)
        return precision.cpu_has_fast_bf16()

    try:
        assert decide({"avx512_bf16"}, fp32_s=2.3, bf16_s=1.0) is True  # Zen 4: 188 vs 81 GFLOP/s
        assert decide({"avx512_bf16"}, fp32_s=1.0, bf16_s=1.8) is False  # a Xeon without AMX: 81 vs 147
        assert decide({"avx2"}, fp32_s=9.0, bf16_s=1.0) is False  # no native bf16: never, whatever a timer says
        assert decide({"avx2"}, fp32_s=1.0, bf16_s=9.0, env="1") is True  # pinned by the operator
        assert decide({"amx_bf16"}, fp32_s=3.0, bf16_s=1.0, env="0") is False
    finally:
        precision.cpu_has_fast_bf16.cache_clear()

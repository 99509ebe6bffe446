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

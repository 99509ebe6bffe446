"""The grouped decoding attention gives SDPA's results without copying the GQA cache."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agent_rl.agent.attention import NAME, grouped_decode_attention, use_grouped_decode_attention


def _inputs(dtype, boolean_mask: bool):
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 6, 1, 16, generator=generator).to(dtype)
    key, value = (torch.randn(3, 2, 40, 16, generator=generator).to(dtype) for _ in range(2))
    mask = torch.ones(3, 1, 1, 40, dtype=torch.bool)
    mask[1, ..., :7] = False  # left padding of different widths
    mask[2, ..., :25] = False
    if not boolean_mask:
        mask = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    return query, key, value, mask


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("boolean_mask", [True, False])
def test_decoding_step_matches_sdpa_with_padding(dtype, tolerance, boolean_mask):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = SimpleNamespace(num_key_value_groups=3, training=False, is_causal=True)
    query, key, value, mask = _inputs(dtype, boolean_mask)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    got, _ = grouped_decode_attention(module, query, key, value, mask, scaling=0.25)
    assert got.shape == expected.shape == (3, 1, 6, 16)
    assert torch.allclose(got.float(), expected.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_prompt_attention_with_padding_matches_sdpa(dtype, tolerance):
    """Several query tokens after a cached prefix (a continued conversation), rows left-padded differently."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = SimpleNamespace(num_key_value_groups=3, training=False, is_causal=True)
    generator = torch.Generator().manual_seed(2)
    query = torch.randn(2, 6, 7, 16, generator=generator).to(dtype)
    key, value = (torch.randn(2, 2, 30, 16, generator=generator).to(dtype) for _ in range(2))
    mask = torch.ones(30, 30, dtype=torch.bool).tril()[-7:].expand(2, 1, 7, 30).clone()
    mask[1, ..., :9] = False
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    got, _ = grouped_decode_attention(module, query, key, value, mask, scaling=0.25)
    assert got.shape == expected.shape == (2, 7, 6, 16)
    assert torch.allclose(got.float(), expected.float(), atol=tolerance, rtol=tolerance)


def test_training_takes_the_sdpa_path_unchanged():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = SimpleNamespace(num_key_value_groups=3, training=True, is_causal=True)
    query = torch.randn(2, 6, 5, 16)
    key, value = torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16)
    expected, _ = sdpa_attention_forward(module, query, key, value, None)
    got, _ = grouped_decode_attention(module, query, key, value, None)
    assert torch.equal(got, expected)


def test_greedy_generation_is_unchanged_on_a_gqa_model(tmp_path):
    from transformers import AutoModelForCausalLM

    from agent_rl.agent.models import build_tiny_model

    path = build_tiny_model(tmp_path / "tiny")
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    grouped = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert use_grouped_decode_attention(grouped) and grouped.config._attn_implementation == NAME
    assert reference.config._attn_implementation == "sdpa"
    ids = torch.randint(5, 200, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :9] = 0
    kwargs = {"attention_mask": mask, "max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(reference.generate(ids, **kwargs), grouped.generate(ids, **kwargs))


def test_models_without_grouped_heads_are_left_alone():
    model = SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa", num_attention_heads=4,
                                                   num_key_value_heads=4), set_attn_implementation=None)
    assert use_grouped_decode_attention(model) is False
    eager = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager", num_attention_heads=4,
                                                   num_key_value_heads=2), set_attn_implementation=None)
    assert use_grouped_decode_attention(eager) is False

"""SFT on the real SmolLM2-135M-Instruct (built offline from its GGUF): a tiny budget, the real model."""

from __future__ import annotations

import math

import pytest


@pytest.mark.slow
def test_smollm2_sft_three_steps_learns_and_keeps_every_row(train_data, tmp_path):
    from agent_rl.agent.models import prepare_model
    from agent_rl.train.config import SFTSettings
    from agent_rl.train.sft import train_sft

    model = prepare_model(tmp_path / "smollm2")
    result = train_sft(model, train_data["sft"], tmp_path / "sft",
                       SFTSettings(max_steps=3, per_device_train_batch_size=2, learning_rate=3e-4,
                                   warmup_ratio=0.0, save_steps=3))
    assert result.steps == 3 and result.cut_rows == 0 and not result.dropped
    assert all(math.isfinite(x) for x in result.losses)
    assert result.losses[-1] < result.losses[0]  # the teacher's tool calls are learnable
    assert result.tokens_per_second > 0
    assert (result.adapter_dir / "adapter_model.safetensors").is_file()

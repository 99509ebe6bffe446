"""SFT on the real SmolLM2-135M-Instruct (built offline from its GGUF): a tiny budget, the real model."""

from __future__ import annotations

import math

import pytest


@pytest.mark.slow
def test_smollm2_sft_three_steps_learns_a_teacher_trajectory(train_data, tmp_path):
    from agent_rl.agent.models import prepare_model
    from agent_rl.train.config import SFTSettings
    from agent_rl.train.sft import train_sft

    model = prepare_model(tmp_path / "smollm2")
    # One teacher trajectory seen three times: the loss on it must fall (a 2-core machine shared with other
    # jobs runs ~1 min per step, so the budget is kept this small).
    rows = train_data["sft"].read_text().splitlines()
    one_row = tmp_path / "one.jsonl"
    one_row.write_text(min(rows, key=len) + "\n")
    result = train_sft(model, one_row, tmp_path / "sft",
                       SFTSettings(max_steps=3, per_device_train_batch_size=1, gradient_accumulation_steps=1,
                                   learning_rate=3e-4, save_steps=3))
    assert result.steps == 3 and result.cut_rows == 0 and not result.dropped
    assert all(math.isfinite(x) for x in result.losses)
    assert result.losses[-1] < result.losses[0]  # the teacher's tool calls are learnable
    assert result.tokens_per_second > 0
    assert (result.adapter_dir / "adapter_model.safetensors").is_file()

"""SFT on the real SmolLM2-135M-Instruct (built offline from its GGUF): a tiny budget, the real model."""

from __future__ import annotations

import math

import pytest


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from agent_rl.agent.models import prepare_model

    return prepare_model(tmp_path_factory.mktemp("smollm2") / "smollm2")


@pytest.mark.slow
def test_smollm2_sft_three_steps_learns_a_teacher_trajectory(train_data, tmp_path, smollm2):
    from agent_rl.train.config import SFTSettings
    from agent_rl.train.sft import train_sft

    model = smollm2
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


@pytest.mark.slow
def test_rehearsal_rows_are_the_base_models_own_finished_replies(smollm2):
    """What SFT rehearses against forgetting is exactly what the base model says greedily; cut-off replies are
    left out rather than taught as if they ended there."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_rl.evaluate.harness import FORGETTING_PROBE
    from agent_rl.train.retain import RETAIN_PROMPTS, retain_rows

    assert not {p.lower() for p in RETAIN_PROMPTS} & {q.lower() for q, _ in FORGETTING_PROBE}
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    model.train()
    budget = 40
    rows = retain_rows(model, tokenizer, 8, max_new_tokens=budget)
    assert model.training and tokenizer.padding_side == "right"  # left as it was for training

    expected = {}
    stops = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    for prompt in RETAIN_PROMPTS[:8]:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=budget, do_sample=False, eos_token_id=sorted(stops),
                                 pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
        if out and out[-1] in stops:
            expected[prompt] = tokenizer.decode(out[:-1], skip_special_tokens=True).strip()
    assert 0 < len(expected) < 8  # the budget cuts some replies off, and those are not rehearsed
    assert {row["messages"][0]["content"]: row["messages"][1]["content"] for row in rows} == expected

"""Decoding into reserved cache slots says exactly what transformers' own generate() says, row by row, while
the buffer grows past its reserve and rows leave the batch at different lengths."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from agent_rl.agent.chat_format import render_prompt
from agent_rl.agent.local_policy import LocalPolicy
from agent_rl.agent.slot_cache import RESERVE, SlotLayer, ensure_room, reserve_slots
from tests.agent.test_local_policy import QUESTIONS, TOOLS, tiny, varied_tiny_model  # noqa: F401


def test_slots_are_written_in_place_and_the_mask_covers_the_whole_buffer():
    cache = DynamicCache()
    cache.update(torch.ones(2, 1, 3, 4), torch.ones(2, 1, 3, 4), 0)
    reserve_slots(cache, extra=2)
    layer = cache.layers[0]
    assert isinstance(layer, SlotLayer) and (layer.length, layer.capacity) == (3, 5)
    buffer = layer.keys
    keys, _ = cache.update(torch.full((2, 1, 1, 4), 7.0), torch.full((2, 1, 1, 4), 7.0), 0)
    assert keys is buffer and layer.keys is buffer  # written in place: no copy per token
    assert cache.get_seq_length() == 4 and cache.get_mask_sizes(1, 0) == (5, 0)
    assert torch.equal(keys[:, :, 3], torch.full((2, 1, 4), 7.0)) and not keys[:, :, 4].any()

    mask = torch.ones(2, 4, dtype=torch.long)
    mask = ensure_room(cache, mask, extra=3)  # room for one more: nothing to grow yet
    assert mask.shape == (2, 5) and layer.capacity == 5 and not mask[:, 4].any()
    cache.update(torch.zeros(2, 1, 1, 4), torch.zeros(2, 1, 1, 4), 0)
    mask = ensure_room(cache, mask, extra=3)  # full: grows by 3, keeps what was written
    assert layer.capacity == 8 and mask.shape == (2, 8) and cache.get_seq_length() == 5
    assert torch.equal(layer.keys[:, :, 3], torch.full((2, 1, 4), 7.0))
    cache.batch_select_indices(torch.tensor([1]))  # a finished row leaves the batch
    assert layer.keys.shape == (1, 1, 8, 4) and cache.get_seq_length() == 5


def test_batched_slot_decoding_matches_generate_row_by_row(tiny):  # noqa: F811
    path, tokenizer = tiny
    model = varied_tiny_model(path).to(torch.float32).eval()
    policy = LocalPolicy.from_model(model, tokenizer, batch_size=8)
    prompts = [tokenizer(render_prompt(tokenizer, q, TOOLS), add_special_tokens=False)["input_ids"]
               for q in QUESTIONS]
    budget = 2 * RESERVE + 7  # the buffer grows twice
    unstopped = policy.generate_ids(prompts, budget)
    # A stop token no row says within its first reserve but some say later: rows leave the batch at different
    # steps after the buffer has grown.
    early = {token for row in unstopped for token in row[:RESERVE + 1]}
    policy.stop_token_ids = [next(t for row in unstopped for t in row[RESERVE + 1:] if t not in early)]
    batched = policy.generate_ids(prompts, budget)
    with torch.inference_mode():
        for prompt, row in zip(prompts, batched):
            reference = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                       max_new_tokens=budget, do_sample=False,
                                       eos_token_id=policy.stop_token_ids, pad_token_id=tokenizer.pad_token_id)
            assert row == reference[0, len(prompt):].tolist()[:len(row)]
            assert len(row) == budget or row[-1] in policy.stop_token_ids
    lengths = {len(row) for row in batched}
    assert len(lengths) > 1 and max(lengths) > RESERVE  # rows stopped at different lengths, one outgrew a reserve

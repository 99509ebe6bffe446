"""SFT's loss computed only at the trained positions (optionally after a cached static prefix).

Used by the trainer (agent_rl/train/sft_trainer.py), which agent_rl/train/sft.py loads when training starts; a
module of its own so the trainer does not import sft.py back.
"""

from __future__ import annotations


def trained_positions_loss(model, inputs: dict, num_items_in_batch=None, prefix_cache=None):
    """(loss, outputs, token accuracy) of a causal LM on `inputs["labels"]` (-100 = not trained), computing
    logits only at the positions whose next token is trained in some row of the batch.

    Equal to the model's own shifted cross-entropy: summed over trained tokens and divided by
    `num_items_in_batch` (the trained tokens of the whole accumulated batch) when given, else averaged.
    With `prefix_cache` (the keys/values of the rows' first n tokens, train/static_prefix.py) only the rest of
    each row goes through the model.
    """
    import torch
    import torch.nn.functional as F

    targets = inputs["labels"][:, 1:]
    trained = targets != -100
    positions = trained.any(0).nonzero().squeeze(-1)
    model_inputs = {k: v for k, v in inputs.items() if k not in ("labels", "num_items_in_batch")}
    if prefix_cache is None:
        outputs = model(**model_inputs, logits_to_keep=positions, use_cache=False)
    else:
        cached = prefix_cache.get_seq_length()
        ids = model_inputs.pop("input_ids")
        mask = model_inputs.pop("attention_mask", None)
        if mask is None:
            mask = torch.ones_like(ids)
        model_inputs.pop("position_ids", None)
        rest = torch.arange(cached, ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
        outputs = model(input_ids=ids[:, cached:], attention_mask=mask, position_ids=rest, past_key_values=prefix_cache,
                        use_cache=True, logits_to_keep=positions - cached, **model_inputs)
    logits = outputs.logits
    if positions.numel() == 0:  # nothing to learn from this batch: a zero loss that still has a graph
        return logits.sum() * 0.0, outputs, None
    chosen = targets[:, positions]
    flat = logits.float().reshape(-1, logits.shape[-1])
    total = F.cross_entropy(flat, chosen.reshape(-1), ignore_index=-100, reduction="sum")
    count = num_items_in_batch if num_items_in_batch is not None else trained.sum()
    loss = total / count
    with torch.no_grad():
        valid = chosen != -100
        accuracy = (logits.argmax(-1)[valid] == chosen[valid]).float().mean().item()
    return loss, outputs, accuracy

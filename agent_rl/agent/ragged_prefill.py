"""The prompt pass of a batch whose rows bring new tokens of very different lengths, without computing the padding.

A turn of an episode batch gives each row a different amount of new text (a search result of ~150 tokens, an
email body of ~700, a one-line tool error), and the padded prompt pass computes every row to the longest one:
on the demo's held-out evaluation (SmolLM2-135M, batch 16) 46% of the prompt tokens computed were padding, and
the prompt pass was half of the evaluation's time. Rows are therefore grouped by how many new tokens they bring
(sorted, a group closing when padding would pass `MAX_PADDING` of it), each group runs its own prompt pass on
its rows of the cache, and the groups' caches are put back into one batch cache laid out exactly as the padded
pass would have left it: the row's earlier cache, then its padding (zeros, masked), then its new tokens. The
padding mask, the positions and everything after the prompt pass stay as they were.

Each group is a smaller matrix product than the whole batch's, so results can differ from the padded pass in
the last bits (bf16 blocking), as they do between batch sizes.
"""

from __future__ import annotations

from typing import Any, Callable

# Padding a group may carry, as a share of the tokens it computes: a separate pass per row costs a full walk
# through the layers (~15 ms for SmolLM2-135M on one core), so rows of nearly the same length stay together.
MAX_PADDING = 0.15
# Below this share of padding in the whole batch, one padded pass is cheaper than several passes.
MIN_BATCH_PADDING = 0.2


def new_token_lengths(mask: Any, width: int) -> list[int]:
    """Per row, the real tokens among the last `width` positions (the prompt pass's input)."""
    return [int(n) for n in mask[:, mask.shape[1] - width:].sum(dim=1).tolist()]


def prefill_groups(lengths: list[int], max_padding: float = MAX_PADDING) -> list[list[int]]:
    """Row indices grouped by new-token length (ascending), each group padding at most `max_padding` of the
    tokens it computes; one group when the batch as a whole pads less than MIN_BATCH_PADDING."""
    rows = sorted(range(len(lengths)), key=lambda i: lengths[i])
    longest, total = max(lengths, default=0), sum(lengths)
    if not rows or longest * len(rows) - total <= MIN_BATCH_PADDING * longest * len(rows):
        return [list(range(len(lengths)))]
    groups: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for row in rows:
        width = lengths[row]  # ascending: the newest row is the group's widest
        size = len(current) + 1
        if current and width * size - (tokens + width) > max_padding * width * size:
            groups.append(current)
            current, tokens = [], 0
        current.append(row)
        tokens += width
    groups.append(current)
    return groups


def grouped_prefill(forward: Callable[..., Any], cache: Any, ids: Any, mask: Any, positions: Any, cached: int,
                    lengths: list[int], groups: list[list[int]], select_rows: Callable[[list[int]], None],
                    config: Any) -> tuple[Any, Any]:
    """Run the prompt pass group by group; returns (last-token logits of every row, in batch order, and the
    batch cache of length cached + width holding every row's prompt where the padded pass would have put it).

    `forward(input_ids, attention_mask, position_ids, past_key_values)` is the model call returning logits of the
    last position; `lengths` are new_token_lengths of the batch, `groups` prefill_groups of them; `select_rows(rows)`
    tells per-row adapters which rows the next pass holds."""
    import torch
    from transformers import DynamicCache

    batch, width = ids.shape[0], ids.shape[1] - cached
    logits = None
    layers: list[tuple[Any, Any]] | None = None
    for group in groups:
        index = torch.tensor(group, device=ids.device)
        own = max(lengths[i] for i in group)
        if cached:
            part = DynamicCache(ddp_cache_data=[(layer.keys[index], layer.values[index]) for layer in cache.layers],
                                config=config)
        else:
            part = DynamicCache(config=config)
        # The group's last `own` positions hold each row's new tokens (after any padding): the rest of the
        # batch-wide padding in front of them is not computed.
        keep = torch.cat([torch.arange(cached, device=ids.device),
                          torch.arange(cached + width - own, cached + width, device=ids.device)])
        select_rows(group)
        out = forward(ids[index][:, cached + width - own:], mask[index][:, keep],
                      positions[index][:, cached + width - own:], part)
        if logits is None:
            logits = out.new_empty((batch, out.shape[-1]))
        logits[index] = out
        if layers is None:
            layers = [(layer.keys.new_zeros((batch, layer.keys.shape[1], cached + width, layer.keys.shape[3])),
                       layer.values.new_zeros((batch, layer.values.shape[1], cached + width,
                                               layer.values.shape[3])))
                      for layer in part.layers]
        for (keys, values), layer in zip(layers, part.layers):
            keys[index, :, :cached] = layer.keys[:, :, :cached]
            values[index, :, :cached] = layer.values[:, :, :cached]
            keys[index, :, cached + width - own:] = layer.keys[:, :, cached:]
            values[index, :, cached + width - own:] = layer.values[:, :, cached:]
    select_rows(list(range(batch)))
    return logits, DynamicCache(ddp_cache_data=layers, config=config)

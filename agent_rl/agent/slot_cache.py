"""A decoding cache whose keys and values are written in place into reserved slots, not concatenated.

transformers' DynamicLayer appends every generated token with `torch.cat`, which copies each layer's whole
key/value cache once per token: at batch 8 that was 8% of a SmolLM2 decoding step on one core (4.8 of 63 ms,
vs 0.8 of 48 ms at batch 1), a per-row cost that keeps batched decoding from scaling. Views of a bigger buffer
would avoid the copy, but oneDNN's bf16 batched matmul copies a strided batch again (measured earlier: 905 vs
92 us per product). So attention reads the whole reserved buffer, which is contiguous, and the
padding mask hides the slots not written yet: the mask is as wide as the buffer (`get_mask_sizes`), the
causal mask hides the later slots too, and the buffer grows by `reserve` slots (one copy) when it is full.

Used only by LocalPolicy's decoding loop, after the prompt pass has filled an ordinary DynamicCache.
"""

from __future__ import annotations

from typing import Any

from transformers.cache_utils import DynamicLayer

# Slots added at a time: a copy every RESERVE tokens instead of every token, and at most RESERVE unwritten
# slots read by the attention (a 48-token turn over a ~400-token prompt: ~6% more attention work).
RESERVE = 32


class SlotLayer(DynamicLayer):
    """One layer's keys/values in a buffer of `capacity` slots, the first `length` of them written."""

    def __init__(self, keys: Any, values: Any, length: int) -> None:
        super().__init__()
        self.keys, self.values, self.length = keys, values, length
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    @property
    def capacity(self) -> int:
        return self.keys.shape[-2]

    @classmethod
    def reserved(cls, layer: Any, extra: int) -> SlotLayer:
        """The contents of a filled DynamicLayer followed by `extra` free slots."""
        keys, values = layer.keys, layer.values
        length = keys.shape[-2]
        shape = (*keys.shape[:-2], length + extra, keys.shape[-1])
        new_keys, new_values = keys.new_zeros(shape), values.new_zeros(shape)
        new_keys[..., :length, :] = keys
        new_values[..., :length, :] = values
        return cls(new_keys, new_values, length)

    def grow(self, extra: int) -> None:
        grown = SlotLayer.reserved(self, extra)  # copies the whole buffer; its written slots are what matter
        self.keys, self.values = grown.keys, grown.values

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        start, count = self.length, key_states.shape[-2]
        if start + count > self.capacity:
            raise RuntimeError(f"slot cache full: {start} + {count} tokens > capacity {self.capacity} "
                               "(SlotCache.ensure_room must run before the forward pass)")
        self.keys[..., start:start + count, :] = key_states
        self.values[..., start:start + count, :] = value_states
        self.length = start + count
        return self.keys, self.values  # the whole buffer: contiguous, the mask hides the unwritten slots

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.capacity, 0

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a slot cache is never cropped; decoding only appends")


def reserve_slots(cache: Any, extra: int = RESERVE) -> None:
    """Turn every layer of a filled DynamicCache into a SlotLayer with `extra` free slots (in place)."""
    cache.layers = [SlotLayer.reserved(layer, extra) for layer in cache.layers]


def ensure_room(cache: Any, mask: Any, tokens: int = 1, extra: int = RESERVE) -> Any:
    """Grow the cache when the next `tokens` do not fit, and return the padding mask widened to its capacity
    (new slots masked out until written)."""
    import torch

    layers = cache.layers
    if layers[0].length + tokens > layers[0].capacity:
        for layer in layers:
            layer.grow(max(extra, tokens))
    width = layers[0].capacity
    if mask.shape[1] < width:
        mask = torch.cat([mask, mask.new_zeros((mask.shape[0], width - mask.shape[1]))], dim=1)
    return mask

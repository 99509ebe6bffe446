"""The block of tokens most SFT rows open with (instructions + tool schemas), computed once per optimizer step.

On the demo that block is ~610 of a ~1,450-token row and it is never trained (no label inside it). Forwarding
it with every row and back-propagating through it was ~40% of the SFT compute. Here its keys and values come
from one no-gradient forward pass with the current weights, recomputed whenever the optimizer has changed
them (the trainer's global step), and every row that opens with the block feeds only its own remainder. The
forward pass is exact. The gradient leaves out one path: how the adapter would change the block's own keys and
values. The adapter still trains on every position that follows.
"""

from __future__ import annotations

from typing import Any

from agent_rl.environments.messages import training_messages
from agent_rl.train.chat_rows import row_tools

# Below this many tokens the separate forward pass saves less than it costs.
MIN_PREFIX_TOKENS = 64
# Use the block only when most rows open with it (data from an older prompt layout simply goes the long way).
MIN_SHARE = 0.5


class StaticPrefix:
    """Token ids of the shared opening block and its keys/values for the weights of one optimizer step."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = list(ids)
        self._step: int | None = None
        self._layers: list[tuple[Any, Any]] | None = None
        self.computed = 0  # forward passes over the block (one per optimizer step that used it)
        self.rows = 0  # rows that fed only their remainder

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def find(cls, tokenizer: Any, rows: list[dict[str, Any]], input_ids: list[list[int]]) -> StaticPrefix | None:
        """The first row's opening system message rendered with its tool schemas, when at least MIN_SHARE of
        the rows open with exactly those tokens and the block is worth a pass of its own; else None."""
        from agent_rl.agent.chat_format import render_prompt

        for row in rows:
            messages = training_messages(row.get("messages"), "SFT row")
            if messages[0]["role"] != "system":
                continue
            block = render_prompt(tokenizer, messages[:1], row_tools(row.get("tools")) or [],
                                  add_generation_prompt=False)
            ids = tokenizer(block, add_special_tokens=False)["input_ids"]
            opening = sum(1 for row_ids in input_ids if len(row_ids) > len(ids) and row_ids[:len(ids)] == ids)
            if len(ids) >= MIN_PREFIX_TOKENS and input_ids and opening >= MIN_SHARE * len(input_ids):
                return cls(ids)
            return None
        return None

    @classmethod
    def of_system_message(cls, tokenizer: Any, message: dict[str, Any], tools: list[dict[str, Any]]) -> StaticPrefix | None:
        """The block one system message opens with its tool schemas (GRPO prompts: TRL renders the same schemas
        in the same order, so the prompts' ids start with these), if it is worth a pass of its own."""
        from agent_rl.agent.chat_format import render_prompt

        if message.get("role") != "system":
            return None
        ids = tokenizer(render_prompt(tokenizer, [message], tools, add_generation_prompt=False),
                        add_special_tokens=False)["input_ids"]
        return cls(ids) if len(ids) >= MIN_PREFIX_TOKENS else None

    def opens(self, input_ids: Any, attention_mask: Any | None, labels: Any) -> bool:
        """Whether every row of the batch starts with the block, unpadded, and trains nothing inside it."""
        import torch

        n = len(self.ids)
        if input_ids.shape[1] <= n:
            return False
        block = torch.as_tensor(self.ids, device=input_ids.device)
        if not bool((input_ids[:, :n] == block).all()):
            return False
        if attention_mask is not None and not bool(attention_mask[:, :n].all()):
            return False
        return not bool((labels[:, 1:n + 1] != -100).any())  # no target is predicted from inside the block

    def cache(self, model: Any, step: int, batch: int) -> Any:
        """A fresh DynamicCache holding the block's keys/values for `batch` rows (recomputed when `step` moved)."""
        import torch
        from transformers import DynamicCache

        if self._step != step or self._layers is None:
            # The module itself, not its DDP wrapper: a DDP forward may exchange buffers with the other processes,
            # and whether a micro-batch opens with the block (so computes it here) differs between processes.
            if isinstance(model, torch.nn.parallel.DistributedDataParallel):
                model = model.module
            device = next(model.parameters()).device
            fresh = DynamicCache()
            with torch.no_grad():
                model(input_ids=torch.tensor([self.ids], device=device), past_key_values=fresh, use_cache=True,
                      logits_to_keep=1)
            self._layers = [(layer.keys, layer.values) for layer in fresh.layers]
            self._step = step
            self.computed += 1
        self.rows += batch
        layers = [(keys.expand(batch, -1, -1, -1), values.expand(batch, -1, -1, -1)) for keys, values in self._layers]
        return DynamicCache(ddp_cache_data=layers)

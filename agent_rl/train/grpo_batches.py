"""GRPO batch selection: which rollout groups of a generated batch train, and the rows and padding columns kept.

Pure functions on TRL's generated batch, shared by the trainer (agent_rl/train/grpo_trainer.py) and its tests; a
module of their own so that the trainer does not import agent_rl/train/grpo.py, which imports the trainer.
"""

from __future__ import annotations

from typing import Any


def scored_alike(rewards: list[float]) -> bool:
    """A group whose rollouts all got the same reward: zero advantage, nothing to learn."""
    return max(rewards) - min(rewards) < 1e-6


def choose_groups(totals: list[float], group_size: int, wanted: int) -> list[int]:
    """Indices of the `wanted` groups to train on: groups with reward variance first, then groups that scored
    alike, each in generation order (the batch's own groups come first)."""
    groups = [totals[i: i + group_size] for i in range(0, len(totals), group_size)]
    varied = [g for g, values in enumerate(groups) if not scored_alike(values)]
    alike = [g for g, values in enumerate(groups) if scored_alike(values)]
    return sorted((varied + alike)[:wanted])


def select_rows(output: dict[str, Any], rows: list[int]) -> dict[str, Any]:
    """TRL's generated batch with only `rows` (text-only batches: every per-row tensor has the batch as its first
    dimension). `num_items_in_batch`, the loss normaliser of 'dapo', is recounted over what is kept."""
    import torch

    if any(output.get(key) is not None for key in _MULTIMODAL_KEYS):
        raise ValueError("extra_prompts_per_step supports text-only GRPO")
    size = output["completion_ids"].shape[0]
    index = torch.tensor(rows, dtype=torch.long, device=output["completion_ids"].device)
    selected = {}
    for key, value in output.items():
        if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == size:
            selected[key] = value.index_select(0, index)
        elif isinstance(value, list) and len(value) == size:
            selected[key] = [value[i] for i in rows]
        else:
            selected[key] = value
    loss_mask = selected["completion_mask"]
    if selected.get("tool_mask") is not None:
        loss_mask = loss_mask * selected["tool_mask"]
    if isinstance(output.get("num_items_in_batch"), torch.Tensor):
        selected["num_items_in_batch"] = loss_mask.sum().to(output["num_items_in_batch"].dtype)
    return selected


# Micro-batch tensors aligned with the prompt / the completion columns (text-only GRPO).
_PROMPT_KEYS = ("prompt_ids", "prompt_mask")
_COMPLETION_KEYS = ("completion_ids", "completion_mask", "tool_mask", "old_per_token_logps",
                    "sampling_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio")
_MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "token_type_ids", "mm_token_type_ids", "num_images")


def trim_padding(inputs: dict[str, Any]) -> dict[str, Any]:
    """The micro-batch without the leading prompt columns and trailing completion columns that are padding in
    every one of its rows (multimodal batches are returned unchanged)."""
    if any(inputs.get(key) is not None for key in _MULTIMODAL_KEYS):
        return inputs
    prompt_used = inputs["prompt_mask"].bool().any(0).nonzero()
    completion_used = inputs["completion_mask"].bool().any(0).nonzero()
    start = int(prompt_used[0]) if len(prompt_used) else 0
    end = int(completion_used[-1]) + 1 if len(completion_used) else 1
    prompt_width, completion_width = inputs["prompt_ids"].shape[1], inputs["completion_ids"].shape[1]
    if start == 0 and end == completion_width:
        return inputs
    trimmed = dict(inputs)
    for key in _PROMPT_KEYS:
        if getattr(inputs.get(key), "ndim", 0) == 2 and inputs[key].shape[1] == prompt_width:
            trimmed[key] = inputs[key][:, start:]
    for key in _COMPLETION_KEYS:
        if getattr(inputs.get(key), "ndim", 0) == 2 and inputs[key].shape[1] == completion_width:
            trimmed[key] = inputs[key][:, :end]
    return trimmed

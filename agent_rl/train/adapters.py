"""Turn a trained adapter directory into a plain checkpoint: base model + every adapter of its stack, merged.

SFT and GRPO (beta = 0) leave one adapter over the base; GRPO with beta > 0 trains a second adapter over the
merged SFT model. `agent_rl_adapter.json` in the adapter directory lists the stack; this applies it in order.
"""

from __future__ import annotations

import json
from pathlib import Path

from agent_rl.train.sft import MANIFEST


def adapter_stack(adapter_dir: str | Path) -> tuple[Path, list[Path]]:
    """(base model, adapters in the order they were trained) of an adapter directory."""
    adapter_dir = Path(adapter_dir)
    manifest = adapter_dir / MANIFEST
    if not manifest.is_file():
        if (adapter_dir / "adapter_config.json").is_file():
            base = json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
            return Path(base), [adapter_dir]
        raise ValueError(f"{adapter_dir} is not an adapter directory (no {MANIFEST} or adapter_config.json)")
    data = json.loads(manifest.read_text())
    return Path(data["base_model"]), [Path(p) for p in data["adapters"]]


def merge_adapter_stack(adapter_dir: str | Path, out_dir: str | Path) -> Path:
    """Write base + merged adapters as a checkpoint directory any policy can load (LocalPolicy, vLLM)."""
    import torch
    from transformers import AutoTokenizer

    from agent_rl.agent.precision import load_merged

    base, stack = adapter_stack(adapter_dir)
    model = load_merged(base, stack, torch.float32)
    out_dir = Path(out_dir)
    model.save_pretrained(str(out_dir))
    AutoTokenizer.from_pretrained(str(stack[-1] if (stack[-1] / "tokenizer_config.json").exists() else base)
                                  ).save_pretrained(str(out_dir))
    return out_dir

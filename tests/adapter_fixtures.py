"""Adapter stacks on a tiny base for the serving tests (`from tests.adapter_fixtures import versions`)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent_rl.agent.models import build_tiny_model

TARGETS = ("q_proj", "v_proj", "o_proj", "up_proj", "down_proj")


def vary(model) -> None:
    """Larger random weights (seeded): at the standard init a tiny model prints newlines whatever it is asked; with
    these its greedy output depends on the prompt, so comparisons between versions mean something."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.15)


def lora_spec(base, adapters, version: str) -> str:
    """The `lora:` policy spec of an adapter stack on `base`."""
    import json

    return "lora:" + json.dumps({"base": str(base), "adapters": [str(a) for a in adapters], "version": version})


def varied_base(root: Path) -> Path:
    """The tiny model with varied weights (`vary`), saved."""
    tiny = build_tiny_model(root / "tiny")
    model = AutoModelForCausalLM.from_pretrained(tiny)
    vary(model)
    base = root / "base"
    model.save_pretrained(base)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(base)
    return base


def make_adapter(base: Path, out: Path, seed: int, targets=TARGETS, r: int = 4) -> Path:
    """A PEFT LoRA adapter with random weights large enough to change the base's greedy outputs."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(targets), init_lora_weights=False))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.mul_(3.0)
    model.save_pretrained(out)
    return out


def versions(root: Path) -> tuple[Path, dict[str, list[Path]]]:
    """A varied base, a one-adapter version and a two-adapter stack (SFT then GRPO, as the registry holds them)."""
    base = varied_base(root)
    one = [make_adapter(base, root / "a", seed=1)]
    stack = [make_adapter(base, root / "sft", seed=2),
             make_adapter(base, root / "grpo", seed=3, targets=("k_proj", "gate_proj"), r=2)]
    return base, {"base": [], "one": one, "stack": stack}

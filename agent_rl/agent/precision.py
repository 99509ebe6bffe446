"""Which dtype to compute in: bf16 where the hardware multiplies it fast, fp32 elsewhere.

On CPUs with AMX (Intel Sapphire Rapids and later) oneDNN runs bf16 matrix multiplies ~3x faster than fp32
(measured here: 277 vs ~95 GFLOP/s for a 1400x576x1536 product on one core) and, unlike fp32 MKL, a batch of
8 rows costs about what one row does - so training with a bf16 frozen base is ~2x faster and batched decoding
scales with the batch. AMD Zen 4 (AVX512_BF16, no AMX) gains less but still 2.3x on the same product (188 vs 81
GFLOP/s; a 1,373-token SFT row trains in 8.6 s vs 12.1 s in fp32), though a single-row product is slower in bf16
(19 vs 26 GFLOP/s). Without either instruction set, bf16 on a CPU is emulated and slower: keep fp32 there.
And the flag is not enough: an Intel Xeon with AVX512_BF16 but no AMX ran bf16 at half its fp32 speed, so the
choice is confirmed by a short measurement (`cpu_has_fast_bf16`).
"""

from __future__ import annotations

import functools
from typing import Literal

DtypeName = Literal["auto", "float32", "bfloat16", "float16"]
# Below this hidden size the matrices are too small for bf16 to pay for its conversions (the tiny test model,
# hidden 64, generated 8 x 128 tokens in 0.76 s in bf16 vs 0.53 s in fp32 here).
MIN_BF16_HIDDEN_SIZE = 256
FAST_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


# bf16 must beat fp32 by this much on a training-shaped product to be chosen (measured, not assumed).
MIN_BF16_SPEEDUP = 1.2
BF16_OVERRIDE_ENV = "AGENT_RL_CPU_BF16"


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.split())
    except OSError:
        pass
    return set()


def _matmul_seconds(dtype, rounds: int = 3, budget_s: float = 0.05) -> float:
    """Best time of one 512x576x1536 product (a SmolLM2 projection over a block of rows) in `dtype`."""
    import time

    import torch

    a, b = torch.randn(512, 576).to(dtype), torch.randn(576, 1536).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(rounds):
        n, started = 0, time.perf_counter()
        while time.perf_counter() - started < budget_s:
            a @ b
            n += 1
        best = min(best, (time.perf_counter() - started) / n)
    return best


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """True when this CPU multiplies bf16 faster than fp32: it has AMX or AVX512_BF16 (/proc/cpuinfo) AND a quick
    measurement confirms it (~0.3 s, once per process). The flag alone misleads: on an Intel Xeon with
    AVX512_BF16 but no AMX, bf16 ran at 81 GFLOP/s against 147 in fp32 and SFT took twice as long.
    AGENT_RL_CPU_BF16=1/0 skips the measurement (reproducible runs, or a busy machine)."""
    import os

    override = os.environ.get(BF16_OVERRIDE_ENV, "").strip()
    if override in ("0", "1"):
        return override == "1"
    if not FAST_BF16_FLAGS & _cpu_flags():
        return False
    import torch

    fp32 = _matmul_seconds(torch.float32)
    bf16 = _matmul_seconds(torch.bfloat16)
    return fp32 / bf16 >= MIN_BF16_SPEEDUP


def resolve_dtype_name(name: DtypeName | str, device: str = "cpu", hidden_size: int | None = None) -> str:
    """'auto' -> bfloat16 on CUDA, and on AMX or AVX512_BF16 CPUs for models at least MIN_BF16_HIDDEN_SIZE wide; float32
    otherwise. Explicit names pass through."""
    if name not in ("auto", "float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {name!r}")
    if name != "auto":
        return name
    if device.startswith("cuda"):
        return "bfloat16"
    if cpu_has_fast_bf16() and (hidden_size is None or hidden_size >= MIN_BF16_HIDDEN_SIZE):
        return "bfloat16"
    return "float32"


def resolve_dtype(name: DtypeName | str, device: str = "cpu", hidden_size: int | None = None):
    """The torch dtype for `name` on `device` (see resolve_dtype_name)."""
    import torch

    return getattr(torch, resolve_dtype_name(name, device, hidden_size))


def load_merged(base, adapters, dtype):
    """The base checkpoint with each PEFT adapter merged in order, cast to `dtype` at the end.

    Merging happens in fp32: a low-rank update added to bf16 weights would mostly round away."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    for adapter in adapters:
        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    return model.to(dtype)


def hidden_size_of(model_path) -> int | None:
    """The model's hidden size from its config.json, None if unreadable (then size does not decide)."""
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = config.get("hidden_size") or config.get("text_config", {}).get("hidden_size")
    return size if isinstance(size, int) else None

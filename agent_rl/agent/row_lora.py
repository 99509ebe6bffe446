"""LoRA adapters applied per row of a batch, on one shared base model, without merging them into its weights.

Every version the loop produces is a LoRA adapter stack (SFT, then GRPO trained over the merged SFT model) on
the same base. Both only add low-rank updates to Linear layers, so a stack's update is the sum of its adapters'
(`B1 A1 s1 + B2 A2 s2`), which is one low-rank pair with the ranks concatenated: `[B1 s1, B2 s2] @ [A1; A2]`.
Serving then needs one base in memory and a few megabytes per version: each decoder Linear is wrapped so that
`y = base(x) + ((x @ A^T) * mask) @ B^T`, where A and B hold the pairs of the versions present in the batch side
by side and `mask` keeps, for each row, only its own version's rank columns. A batch of one version skips the
mask; rows without an adapter (the base model) get zeros.

Adapters are read straight from PEFT directories (adapter_config.json + adapter_model.safetensors). What is not
a plain additive LoRA on Linear layers (DoRA, modules trained in full, embedding adapters) is refused with
`UnsupportedAdapter`, and the caller serves that version merged instead.
"""

from __future__ import annotations

import json
import math
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PEFT_PREFIX = "base_model.model."


class UnsupportedAdapter(ValueError):
    """The adapter is not a plain additive LoRA on Linear layers; serve it merged."""


@dataclass(frozen=True)
class LowRank:
    """One module's update: `delta(x) = (x @ a.T) @ b.T`, the scale folded into `b`."""

    a: Any  # [rank, in]
    b: Any  # [out, rank]


@dataclass(frozen=True)
class AdapterWeights:
    """A version's adapter stack as one low-rank pair per target module (module name -> LowRank)."""

    modules: dict[str, LowRank]

    @property
    def nbytes(self) -> int:
        return sum(p.a.numel() * p.a.element_size() + p.b.numel() * p.b.element_size() for p in self.modules.values())


def _alpha_for(module: str, config: dict[str, Any], default: float) -> float:
    for pattern, alpha in (config.get("alpha_pattern") or {}).items():
        if module == pattern or module.endswith("." + pattern) or re.fullmatch(pattern, module):
            return float(alpha)
    return default


def read_adapter(directory: str | Path) -> dict[str, tuple[Any, Any]]:
    """One PEFT LoRA adapter as {module name: (A [r, in], B [out, r] times its scale)}, in fp32."""
    import torch

    directory = Path(directory)
    try:
        config = json.loads((directory / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{directory} is not a PEFT adapter directory (adapter_config.json: {exc})") from exc
    if config.get("peft_type", "LORA") != "LORA":
        raise UnsupportedAdapter(f"{directory}: peft_type {config.get('peft_type')!r} is not LORA")
    for flag, why in (("use_dora", "DoRA"), ("fan_in_fan_out", "fan_in_fan_out"), ("modules_to_save", "modules_to_save")):
        if config.get(flag):
            raise UnsupportedAdapter(f"{directory}: {why} adapters are served merged")
    if config.get("bias", "none") != "none":
        raise UnsupportedAdapter(f"{directory}: adapters with trained biases are served merged")
    weights_file = directory / "adapter_model.safetensors"
    if weights_file.is_file():
        from safetensors.torch import load_file

        tensors = load_file(str(weights_file))
    else:
        tensors = torch.load(directory / "adapter_model.bin", map_location="cpu", weights_only=True)
    pairs: dict[str, dict[str, Any]] = {}
    for key, tensor in tensors.items():
        match = re.fullmatch(r"(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", key)
        if match is None:
            raise UnsupportedAdapter(f"{directory}: tensor {key!r} is not a LoRA A/B matrix of a Linear layer")
        name = match.group(1).removeprefix(PEFT_PREFIX)
        pairs.setdefault(name, {})[match.group(2)] = tensor.float()
    out = {}
    alpha = float(config.get("lora_alpha", config.get("r", 8)))
    for name, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise UnsupportedAdapter(f"{directory}: module {name} lacks its A or B matrix")
        a, b = pair["A"], pair["B"]
        rank = a.shape[0]
        module_alpha = _alpha_for(name, config, alpha)
        scale = module_alpha / math.sqrt(rank) if config.get("use_rslora") else module_alpha / rank
        out[name] = (a, b * scale)
    return out


def read_stack(directories: list[str | Path]) -> dict[str, tuple[Any, Any]]:
    """An adapter stack applied in order as one pair per module: ranks concatenated, updates summed (fp32)."""
    import torch

    parts: dict[str, list[tuple[Any, Any]]] = {}
    for directory in directories:
        for name, pair in read_adapter(directory).items():
            parts.setdefault(name, []).append(pair)
    return {name: (torch.cat([a for a, _ in pairs]), torch.cat([b for _, b in pairs], dim=1))
            for name, pairs in parts.items()}


def prepare_weights(stack: dict[str, tuple[Any, Any]], dtype: Any, device: Any = "cpu") -> AdapterWeights:
    return AdapterWeights({name: LowRank(a.to(device=device, dtype=dtype).contiguous(),
                                         b.to(device=device, dtype=dtype).contiguous())
                           for name, (a, b) in stack.items()})


class RowLoraLinear:
    """Marker base for the wrapped Linear layers (the torch module class is built lazily, see `_module_class`)."""


_MODULE_CLASS: type | None = None


def _module_class() -> type:
    """The wrapper module, defined on first use so that importing this file does not import torch."""
    global _MODULE_CLASS
    if _MODULE_CLASS is None:
        import torch

        class _RowLora(torch.nn.Module, RowLoraLinear):
            def __init__(self, base: torch.nn.Linear, name: str, rows: RowAdapters) -> None:
                super().__init__()
                self.base, self.name, self.rows = base, name, rows

            @property
            def weight(self):  # code reading a projection's weight (dtype, device) sees the base's
                return self.base.weight

            def forward(self, x):
                y = self.base(x)
                update = self.rows.update_for(self.name, x.shape[0])
                if update is None:
                    return y
                a, b, mask = update
                hidden = torch.matmul(x, a.t())
                if mask is not None:
                    hidden = hidden * (mask if hidden.dim() == 2 else mask.unsqueeze(1))
                return y + torch.matmul(hidden, b.t())

        _MODULE_CLASS = _RowLora
    return _MODULE_CLASS


class RowAdapters:
    """The adapters loaded on one base model and which one each row of the current batch uses.

    Adding and dropping adapters is a dict update, safe while another version generates: a batch reads only the
    adapters its rows name. `set_rows`/`select_rows` belong to the generating thread (the policy's lock)."""

    def __init__(self, dtype: Any, device: Any) -> None:
        self.dtype, self.device = dtype, device
        self.adapters: dict[str, AdapterWeights] = {}
        self.targets: set[str] = set()
        self._lock = threading.Lock()  # guards `_stacked` (built lazily per combination of versions)
        self._stacked: dict[tuple[str, ...], dict[str, tuple[Any, Any, tuple[int, ...]]]] = {}
        self._names: tuple[str, ...] = ()
        self._row_groups: Any = None  # [rows] index into _names, -1 for rows of the base alone
        self._uniform = True  # every row uses _names[0]
        self._masks: dict[tuple[int, ...], Any] = {}

    # -- adapters ------------------------------------------------------------------------------------------

    def add(self, name: str, weights: AdapterWeights) -> None:
        missing = set(weights.modules) - self.targets
        if missing:
            raise UnsupportedAdapter(f"adapter {name!r} targets modules that are not decoder Linear layers: "
                                     f"{sorted(missing)[:3]}")
        self.adapters[name] = weights

    def drop(self, name: str) -> None:
        self.adapters.pop(name, None)
        with self._lock:
            for key in [k for k in self._stacked if name in k]:
                del self._stacked[key]

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in list(self.adapters.values()))

    # -- the current batch ---------------------------------------------------------------------------------

    def set_rows(self, names: list[str | None]) -> None:
        """Rows of the next forward passes use these adapters (None: the base alone)."""
        import torch

        distinct = tuple(dict.fromkeys(n for n in names if n is not None))
        missing = [n for n in distinct if n not in self.adapters]
        if missing:
            raise KeyError(f"adapter {missing[0]!r} is not loaded")
        self._names = distinct
        index = {n: i for i, n in enumerate(distinct)}
        self._row_groups = torch.tensor([index.get(n, -1) if n is not None else -1 for n in names],
                                        device=self.device)
        self._uniform = len(distinct) == 1 and None not in names
        self._masks = {}

    def select_rows(self, keep: Any) -> None:
        """Rows left the batch (finished): keep these, in this order."""
        if self._row_groups is None or not self._names:
            return
        self._row_groups = self._row_groups[keep]
        groups = set(self._row_groups.tolist())
        self._uniform = len(self._names) == 1 and groups == {0}
        self._masks = {}

    def clear_rows(self) -> None:
        self._names, self._row_groups, self._uniform, self._masks = (), None, True, {}

    def update_for(self, module: str, batch: int) -> tuple[Any, Any, Any] | None:
        """(A, B, row mask or None) for this module in the current batch; None when no row adapts it."""
        names = self._names
        if not names:
            return None
        if len(names) == 1:
            pair = self.adapters[names[0]].modules.get(module)
            if pair is None:
                return None
            if self._uniform:
                return pair.a, pair.b, None
            columns = (0,) * pair.a.shape[0]
            return pair.a, pair.b, self._mask(columns, batch)
        stacked = self._stacked_for(names).get(module)
        if stacked is None:
            return None
        a, b, columns = stacked
        return a, b, self._mask(columns, batch)

    def _mask(self, columns: tuple[int, ...], batch: int) -> Any:
        mask = self._masks.get(columns)
        if mask is None:
            import torch

            groups = torch.tensor(columns, device=self.device)
            mask = (self._row_groups[:, None] == groups[None, :]).to(self.dtype)
            self._masks[columns] = mask
        if mask.shape[0] != batch:
            raise RuntimeError(f"row adapters set for {mask.shape[0]} rows, forward pass has {batch}")
        return mask

    def _stacked_for(self, names: tuple[str, ...]) -> dict[str, tuple[Any, Any, tuple[int, ...]]]:
        with self._lock:
            stacked = self._stacked.get(names)
        if stacked is not None:
            return stacked
        import torch

        stacked = {}
        modules = {m for n in names for m in self.adapters[n].modules}
        for module in modules:
            pieces = [(i, self.adapters[n].modules[module]) for i, n in enumerate(names)
                      if module in self.adapters[n].modules]
            a = torch.cat([p.a for _, p in pieces])
            b = torch.cat([p.b for _, p in pieces], dim=1)
            columns = tuple(i for i, p in pieces for _ in range(p.a.shape[0]))
            stacked[module] = (a, b, columns)
        with self._lock:
            if len(self._stacked) >= 8:  # combinations seen recently; a few versions make a few
                self._stacked.pop(next(iter(self._stacked)))
            self._stacked[names] = stacked
        return stacked


def install_row_adapters(model: Any) -> RowAdapters:
    """Wrap the Linear layers of the model's decoder (not the output head) for per-row adapters; in place."""
    import torch

    parameter = next(model.parameters())
    rows = RowAdapters(parameter.dtype, parameter.device)
    wrapper = _module_class()
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear and child is not output:
                full = f"{name}.{child_name}" if name else child_name
                setattr(module, child_name, wrapper(child, full, rows))
                rows.targets.add(full)
    return rows


def write_combined_adapter(adapters: list[str | Path], out_dir: str | Path) -> Path:
    """An adapter stack as one PEFT LoRA adapter (ranks concatenated, scales folded into B, zero-padded to one
    rank for every module), which serves exactly the stack's summed update."""
    import torch
    from safetensors.torch import save_file

    stack = read_stack(list(adapters))
    rank = max(a.shape[0] for a, _ in stack.values())
    tensors = {}
    for name, (a, b) in stack.items():
        pad = rank - a.shape[0]
        a = torch.cat([a, a.new_zeros(pad, a.shape[1])]) if pad else a
        b = torch.cat([b, b.new_zeros(b.shape[0], pad)], dim=1) if pad else b
        tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = a.contiguous()
        tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = b.contiguous()
    first = json.loads((Path(adapters[0]) / "adapter_config.json").read_text())
    config = {
        "peft_type": "LORA", "task_type": first.get("task_type", "CAUSAL_LM"),
        "base_model_name_or_path": first.get("base_model_name_or_path"),
        "r": rank, "lora_alpha": rank, "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
        "target_modules": sorted({name.rsplit(".", 1)[-1] for name in stack}), "inference_mode": True,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out

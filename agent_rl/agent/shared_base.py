"""One loaded base model per (model, dtype, device) in the process, every served version an adapter on it.

Loading a version as a merged model costs a whole model and its own caches per version: two versions of a
135M model during an A/B test grew the arbiter to ~7.7 GB, and a 7-14B model would need a GPU per version. Here
all versions on a base share one `LocalPolicy` (the engine: one model, one lock, one decoding loop) whose
decoder Linear layers apply each row's adapter stack (agent/row_lora.py), so rows of different versions decode
in one batch. Loading a version reads its adapters (megabytes) outside any lock and adds them with a dict
update: traffic of the other versions never waits for it. A version is dropped when its `AdapterPolicy` is
garbage-collected (the arbiter's policy cache let go of it and no batch still holds it), with its caches.
Earlier turns' attention caches of every version and base live in one turn cache bounded by one byte budget
(`ServingSettings.cache_bytes`).
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from agent_rl.agent.policy import Conversation, PolicyTurn, RowRoutedPolicy, ToolSchema
from agent_rl.agent.turn_cache import TurnCache

CACHE_BYTES_ENV = "AGENT_RL_SERVING_CACHE_MB"
BATCH_ENV = "AGENT_RL_SERVING_BATCH"


class ServingSettings(BaseModel):
    """How shared bases are loaded and how much memory their caches may hold."""

    model_config = ConfigDict(frozen=True)

    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "auto", description="compute dtype of the base ('auto': bfloat16 where it is fast, see agent/precision.py)")
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    batch_size: PositiveInt = Field(8, description="conversations decoded together in one forward batch")
    cache_bytes: NonNegativeInt = Field(
        1536 * 2**20, description="earlier turns' attention caches kept for all versions and bases of the process "
        "together (~23 KB per token for SmolLM2-135M in bf16); 0 turns the turn cache off")

    @classmethod
    def from_env(cls, **overrides: Any) -> ServingSettings:
        """Defaults, with the cache budget from $AGENT_RL_SERVING_CACHE_MB and the batch from
        $AGENT_RL_SERVING_BATCH when set."""
        raw = os.environ.get(CACHE_BYTES_ENV, "").strip()
        if raw and "cache_bytes" not in overrides:
            overrides["cache_bytes"] = int(float(raw) * 2**20)
        batch = os.environ.get(BATCH_ENV, "").strip()
        if batch and "batch_size" not in overrides:
            overrides["batch_size"] = batch
        return cls(**overrides)


_BASES: weakref.WeakValueDictionary[tuple[str, str, str], SharedBase] = weakref.WeakValueDictionary()
_BASES_LOCK = threading.Lock()
_TURN_CACHE: TurnCache | None = None
_TURN_CACHE_LOCK = threading.Lock()
_NAMES = itertools.count(1)


def process_turn_cache(settings: ServingSettings | None = None) -> TurnCache:
    """The turn cache every shared base of this process uses (created with the first settings given)."""
    global _TURN_CACHE
    with _TURN_CACHE_LOCK:
        if _TURN_CACHE is None:
            budget = (settings or ServingSettings.from_env()).cache_bytes
            # Tokens are not the bound here, bytes are (one budget whatever the model's width).
            _TURN_CACHE = TurnCache(max_tokens=2**62 if budget else 0, max_bytes=budget)
        return _TURN_CACHE


def loaded_bases() -> list[SharedBase]:
    with _BASES_LOCK:
        return list(_BASES.values())


class SharedBase:
    """A base model loaded once, with per-row adapters installed, serving every version on it."""

    def __init__(self, model_spec: str, settings: ServingSettings) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agent_rl.agent.local_policy import LocalPolicy
        from agent_rl.agent.models import resolve_model
        from agent_rl.agent.precision import hidden_size_of, resolve_dtype
        from agent_rl.agent.row_lora import install_row_adapters

        path = resolve_model(model_spec)
        device = settings.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = resolve_dtype(settings.dtype, device, hidden_size_of(path))
        self.model_path, self.dtype, self.device = Path(path), dtype, device
        self.key = f"{Path(path).name}:{str(dtype).removeprefix('torch.')}:{device}"
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        self.base_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self.rows = install_row_adapters(model)
        # Frozen weights: the system prompt's and earlier turns' attention caches are kept between calls.
        self.engine = LocalPolicy.from_model(model, tokenizer, version=self.key, reuse_prefix_cache=True,
                                             batch_size=settings.batch_size)
        self.engine.rows = self.rows
        self.engine.use_turn_cache(process_turn_cache(settings))
        self.versions: dict[str, str] = {}  # adapter name -> version label (for reporting)
        self._versions_lock = threading.Lock()

    def add_version(self, version: str, adapters: Sequence[str | Path]) -> str | None:
        """Load a version's adapter stack (none: the base itself); its adapter name, None for the base."""
        from agent_rl.agent.row_lora import prepare_weights, read_stack

        if not adapters:
            name = None
        else:
            weights = prepare_weights(read_stack(list(adapters)), self.dtype, self.device)  # outside every lock
            name = f"{version}#{next(_NAMES)}"
            self.rows.add(name, weights)
        with self._versions_lock:
            self.versions[name or f"{version}#base"] = version
        return name

    def drop_version(self, name: str | None, version: str) -> None:
        """Unload a version's adapter and forget its caches (a finalizer: takes no lock that generation holds)."""
        if name is not None:
            self.rows.drop(name)
            self.engine.forget_adapter(name)
        with self._versions_lock:
            self.versions.pop(name or f"{version}#base", None)

    def stats(self) -> dict[str, Any]:
        with self._versions_lock:
            versions = sorted(set(self.versions.values()))
        return {"base": self.key, "versions": versions, "adapters": len(self.rows.adapters),
                "adapter_bytes": self.rows.nbytes, "base_bytes": self.base_bytes}


def shared_base(model_spec: str, settings: ServingSettings | None = None) -> SharedBase:
    """The process's base for `model_spec` with these settings, loaded on first use."""
    import torch

    from agent_rl.agent.models import resolve_model
    from agent_rl.agent.precision import hidden_size_of, resolve_dtype_name

    settings = settings or ServingSettings.from_env()
    path = str(resolve_model(model_spec))
    device = settings.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    key = (path, resolve_dtype_name(settings.dtype, device, hidden_size_of(path)), device)
    with _BASES_LOCK:
        base = _BASES.get(key)
        if base is None:
            base = SharedBase(path, settings)
            _BASES[key] = base
        return base


class AdapterPolicy(RowRoutedPolicy):
    """One version served from a shared base: its adapter stack applied to its rows, nothing merged."""

    def __init__(self, base: SharedBase, version: str, adapters: Sequence[str | Path] = ()) -> None:
        self.base = base
        self.version = version
        self.adapter = base.add_version(version, adapters)
        self.config = base.engine.config
        self.tokenizer = base.engine.tokenizer
        self._finalizer = weakref.finalize(self, base.drop_version, self.adapter, version)

    @classmethod
    def load(cls, model_spec: str, adapters: Sequence[str | Path], version: str,
             settings: ServingSettings | None = None) -> AdapterPolicy:
        return cls(shared_base(model_spec, settings), version, adapters)

    @property
    def lane(self) -> str:
        """Versions with the same lane can be decoded in one batch."""
        return f"shared:{self.base.key}"

    def act(self, conversations: list[Conversation], tools: list[ToolSchema],
            max_new_tokens: int = 256) -> list[PolicyTurn]:
        return self.base.engine.act_with_adapters(conversations, [self.adapter] * len(conversations), tools,
                                                  max_new_tokens)

    def act_rows(self, rows: list[str | None], conversations: list[Conversation],
                 tools: list[ToolSchema], max_new_tokens: int = 256) -> list[PolicyTurn]:
        return self.act(conversations, tools, max_new_tokens)


class MixedVersionPolicy(RowRoutedPolicy):
    """Several versions on one shared base as one policy: each row is decoded with its own version's adapter."""

    def __init__(self, policies: dict[str, AdapterPolicy]) -> None:
        bases = {id(p.base) for p in policies.values()}
        if len(bases) != 1:
            raise ValueError("a mixed-version batch needs versions on one shared base")
        self.policies = dict(policies)
        self.base = next(iter(policies.values())).base
        self.version = "+".join(sorted(policies))

    def act(self, conversations: list[Conversation], tools: list[ToolSchema],
            max_new_tokens: int = 256) -> list[PolicyTurn]:
        raise TypeError("a mixed-version policy needs each row's version: call act_rows")

    def act_rows(self, rows: list[str | None], conversations: list[Conversation],
                 tools: list[ToolSchema], max_new_tokens: int = 256) -> list[PolicyTurn]:
        unknown = sorted({str(v) for v in rows if v not in self.policies})
        if unknown:  # e.g. a runner that does not pass each row's routed version
            raise ValueError(f"mixed-version batch: rows of versions {unknown} not in {sorted(self.policies)}")
        adapters = [self.policies[version].adapter for version in rows]  # type: ignore[index]
        return self.base.engine.act_with_adapters(conversations, adapters, tools, max_new_tokens)


def serving_stats() -> dict[str, Any]:
    """Loaded bases and versions, adapter and cache memory, for health and metrics endpoints."""
    bases = [base.stats() for base in loaded_bases()]
    cache = _TURN_CACHE
    return {
        "bases": bases,
        "versions": sorted({v for b in bases for v in b["versions"]}),
        "base_bytes": sum(b["base_bytes"] for b in bases),
        "adapter_bytes": sum(b["adapter_bytes"] for b in bases),
        "cache_bytes": cache.nbytes if cache is not None else 0,
        "cache_budget_bytes": cache.max_bytes if cache is not None else 0,
        "cache_entries": len(cache) if cache is not None else 0,
    }


def resident_bytes() -> tuple[int, int]:
    """This process's resident memory now and at its peak, in bytes (from /proc; 0 where unreadable)."""
    found = {}
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    found[line[:5]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return found.get("VmRSS", 0), found.get("VmHWM", 0)

"""Policy specs beyond the arbiter's built-ins: `base`, `tiny`, registered models `mlflow:ALIAS|vN`, and adapter
stacks that are not registered, `lora:{"base": "tiny", "adapters": ["/sft", "/grpo"]}`.

`load_policy(spec)` (agent_rl.arbiter.policies) serves `agent-rl eval` and the evaluation asset: each
version loaded alone, its adapters merged. The arbiter loads through `load_served(spec)`: the same versions as
adapters on one shared base per model (agent/shared_base.py), greedy-identical in fp32, so a version means the
same model everywhere while the arbiter holds one base for all of them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_rl import registry
from agent_rl.agent.policy import Policy
from agent_rl.arbiter.policies import load_policy, register_policy_loader

if TYPE_CHECKING:
    from agent_rl.arbiter.vllm_lora import VllmServing

log = logging.getLogger(__name__)


def _on_engine(model: str | Path, device: str = "cpu") -> bool:
    """Whether a model of ours generates on the serving engine (agent/engine.py) rather than our torch decoder."""
    from agent_rl.agent.engine import chosen_engine, serves_on_engine
    from agent_rl.agent.models import resolve_model

    return device == "cpu" and chosen_engine() == "vllm" and serves_on_engine(resolve_model(str(model)))


def _local(model: str, adapter: str | None = None, version: str | None = None) -> Policy:
    if _on_engine(model):
        from agent_rl.agent.engine import engine_policy

        return engine_policy(model, [adapter] if adapter else [], version=version or model)
    from agent_rl.agent.local_policy import LocalPolicy

    return LocalPolicy(model, adapter=adapter, version=version)


def load_stacked(base_model: str, adapters: list[str | Path], version: str, dtype: str = "auto",
                 device: Literal["cpu", "cuda"] = "cpu") -> Policy:
    """The base model with each adapter merged in order (SFT, then GRPO), as a local policy on `device`.

    Merging happens in fp32; the merged model is then cast to `dtype` ('auto': bf16 where it is fast on `device`).
    On the CPU with the serving engine (agent/engine.py) the stack is the engine's adapter instead, unmerged."""
    if _on_engine(base_model, device):
        from agent_rl.agent.engine import engine_policy

        return engine_policy(base_model, list(adapters), version=version)
    from transformers import AutoTokenizer

    from agent_rl.agent.local_policy import DEFAULT_TURN_CACHE_TOKENS, LocalPolicy
    from agent_rl.agent.models import resolve_model
    from agent_rl.agent.precision import hidden_size_of, load_merged, resolve_dtype

    path = resolve_model(base_model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_merged(path, adapters, resolve_dtype(dtype, device, hidden_size_of(path))).to(device).eval()
    # Frozen weights: keep the system prompt's and earlier turns' attention caches between calls.
    return LocalPolicy.from_model(model, tokenizer, version=version, device=device, reuse_prefix_cache=True,
                                  turn_cache_tokens=DEFAULT_TURN_CACHE_TOKENS)


def load_registered(ref: str, tracking_uri: str | None = None, shared: bool = False,
                    vllm: VllmServing | None = None) -> Policy:
    """A registered model by alias (`champion`, `challenger`) or version (`v3`), loaded on its base model
    (merged, or with `shared` as an adapter on the process's shared base, or with `vllm` as an adapter loaded on
    that vLLM server). `<name>/<alias or version>` names another registered model than the environment's (a
    fine-tuning job's: `mlflow:agent-rl-ftjob-.../challenger`)."""
    name, _, ref = ref.strip().rpartition("/")
    name = name or registry.MODEL_NAME
    if not ref:
        raise ValueError("mlflow policy spec needs an alias or a version, e.g. mlflow:champion or mlflow:v3")
    if ref.startswith("v") and ref[1:].isdigit():
        number = ref[1:]
    else:
        number = registry.get_version(ref, name=name, tracking_uri=tracking_uri).version
    path, manifest = registry.download_version(version=number, name=name, tracking_uri=tracking_uri)
    label = f"v{number}" if name == registry.MODEL_NAME else f"{name}-v{number}"  # no clash with production's v1
    if "policy_spec" in manifest:  # a policy that is configuration (rule-based, prompted API model)
        policy = (load_served if shared else load_policy)(manifest["policy_spec"])
        policy.version = label
        return policy
    adapters = [path / a for a in manifest["adapters"]]
    if vllm is not None:
        from agent_rl.arbiter.vllm_lora import registered_on_vllm

        return registered_on_vllm(vllm, label, adapters)
    if shared:
        return load_adapter_version(manifest["base_model"], adapters, version=label)
    return load_stacked(manifest["base_model"], adapters, version=label)


def load_adapter_version(base_model: str, adapters: list[str | Path], version: str) -> Policy:
    """A version as an adapter stack on the process's shared base (the engine's base model, or our torch decoder's);
    merged when the adapters are not plain LoRA."""
    if _on_engine(base_model):
        from agent_rl.agent.engine import engine_policy

        return engine_policy(base_model, list(adapters), version=version)
    from agent_rl.agent.row_lora import UnsupportedAdapter
    from agent_rl.agent.shared_base import AdapterPolicy

    try:
        return AdapterPolicy.load(base_model, adapters, version=version)
    except UnsupportedAdapter as exc:
        log.warning("version %s is served merged: %s", version, exc)
        return load_stacked(base_model, adapters, version=version)


_SHARED_BASE_SPECS = {"base": "base", "tiny": "tiny"}


class AdapterStackSpec(BaseModel):
    """`lora:{...}`: a base model spec and the PEFT adapter directories applied to it in order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: str = Field(min_length=1, description="model spec: 'base', 'tiny' or a checkpoint directory")
    adapters: list[str] = Field(min_length=1, description="adapter directories, applied in order (SFT, then GRPO)")
    version: str = Field("lora", min_length=1, description="the version's label when the routing gives none")


def _adapter_stack(rest: str) -> AdapterStackSpec:
    from agent_rl.arbiter.policies import PolicyLoadError

    try:
        return AdapterStackSpec.model_validate_json(rest)
    except ValidationError as exc:
        raise PolicyLoadError(f"lora policy spec: expected lora:{{\"base\": ..., \"adapters\": [...]}} ({exc})") from None


def _merged_stack(stack: AdapterStackSpec) -> Policy:
    return load_stacked(stack.base, list(stack.adapters), version=stack.version)


def load_served(spec: str, vllm: VllmServing | None = None) -> Policy:
    """The arbiter's loader: registered versions, `lora:` stacks and the base models as adapters on a shared base
    (no adapter for a base), every other spec as `load_policy` loads it. With `vllm`, registered versions are
    adapters loaded on that vLLM server instead. Errors are PolicyLoadErrors naming the spec."""
    return load_policy(spec, served=True, vllm=vllm)


def may_run_own_engine(spec: str) -> bool:
    """Whether the arbiter may serve `spec` on an engine of its own (a model of ours, each version merged, on the
    engine): before it is loaded, so a version a test adds starts on its share of the cores
    (agent_rl/arbiter/placement.py). A guess from the spec's prefix; the loaded policy says for sure."""
    from agent_rl.agent.engine import chosen_engine, versions_mode

    prefix = spec.partition(":")[0]
    ours = prefix in _SHARED_BASE_SPECS or prefix in ("mlflow", "lora") or prefix in registry.ALIASES
    return ours and chosen_engine() == "vllm" and versions_mode() == "merged"


def _shared_base(name: str, rest: str = "") -> Policy:
    """A base model as the arbiter serves it: its shared base with no adapter (on the engine where it runs).
    `rest` qualifies it (`tiny:ENV`, the tiny model fitted to an environment, models.build_world_tiny_model)."""
    model = _base_spec(name, rest)
    if _on_engine(model):
        from agent_rl.agent.engine import engine_policy

        return engine_policy(model, [], version=name)
    from agent_rl.agent.shared_base import AdapterPolicy

    return AdapterPolicy.load(model, [], version=name)


def _served_stack(rest: str) -> Policy:
    stack = _adapter_stack(rest)
    return load_adapter_version(stack.base, list(stack.adapters), version=stack.version)


def _base_spec(name: str, rest: str) -> str:
    return f"{_SHARED_BASE_SPECS[name]}:{rest.strip()}" if rest.strip() else _SHARED_BASE_SPECS[name]


for _name in _SHARED_BASE_SPECS:
    register_policy_loader(_name, lambda rest, _n=_name: _local(_base_spec(_n, rest), version=_n),
                           served=lambda rest, vllm, _n=_name: _shared_base(_n, rest))
register_policy_loader("mlflow", load_registered,
                       served=lambda rest, vllm: load_registered(rest, shared=True, vllm=vllm))
register_policy_loader("lora", lambda rest: _merged_stack(_adapter_stack(rest)),
                       served=lambda rest, vllm: _served_stack(rest))
for _alias in registry.ALIASES:
    register_policy_loader(_alias, lambda rest, _a=_alias: load_registered(_a),
                           served=lambda rest, vllm, _a=_alias: load_registered(_a, shared=True, vllm=vllm))

__all__ = ["load_policy", "load_registered", "load_served", "may_run_own_engine"]

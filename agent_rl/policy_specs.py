"""Policy specs beyond the arbiter's built-ins: `base`, `tiny`, and registered models `mlflow:ALIAS|vN`.

`load_policy(spec)` (agent_rl.arbiter.policies) serves the arbiter, `agent-rl eval` and the
evaluation asset alike, so a version means the same model everywhere.
"""

from __future__ import annotations

from pathlib import Path

from agent_rl import registry
from agent_rl.agent.policy import Policy
from agent_rl.arbiter.policies import load_policy, register_policy_loader


def _local(model: str, adapter: str | None = None, version: str | None = None) -> Policy:
    from agent_rl.agent.local_policy import LocalPolicy

    return LocalPolicy(model, adapter=adapter, version=version)


def load_stacked(base_model: str, adapters: list[str | Path], version: str, dtype: str = "auto") -> Policy:
    """The base model with each adapter merged in order (SFT, then GRPO), as a local policy.

    Merging happens in fp32; the merged model is then cast to `dtype` ('auto': bf16 where it is fast)."""
    from transformers import AutoTokenizer

    from agent_rl.agent.local_policy import DEFAULT_TURN_CACHE_TOKENS, LocalPolicy
    from agent_rl.agent.models import resolve_model
    from agent_rl.agent.precision import hidden_size_of, load_merged, resolve_dtype

    path = resolve_model(base_model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_merged(path, adapters, resolve_dtype(dtype, hidden_size=hidden_size_of(path))).eval()
    # Frozen weights: keep the system prompt's and earlier turns' attention caches between calls.
    return LocalPolicy.from_model(model, tokenizer, version=version, reuse_prefix_cache=True,
                                  turn_cache_tokens=DEFAULT_TURN_CACHE_TOKENS)


def load_registered(ref: str, tracking_uri: str | None = None) -> Policy:
    """A registered model by alias (`champion`, `challenger`) or version (`v3`), loaded on its base model."""
    ref = ref.strip()
    if not ref:
        raise ValueError("mlflow policy spec needs an alias or a version, e.g. mlflow:champion or mlflow:v3")
    if ref.startswith("v") and ref[1:].isdigit():
        number = ref[1:]
    else:
        number = registry.get_version(ref, tracking_uri=tracking_uri).version
    path, manifest = registry.download_version(version=number, tracking_uri=tracking_uri)
    if "policy_spec" in manifest:  # a policy that is configuration (rule-based, prompted API model)
        policy = load_policy(manifest["policy_spec"])
        policy.version = f"v{number}"
        return policy
    return load_stacked(manifest["base_model"], [path / a for a in manifest["adapters"]], version=f"v{number}")


register_policy_loader("base", lambda rest: _local("base", version="base"))
register_policy_loader("tiny", lambda rest: _local("tiny", version="tiny"))
register_policy_loader("mlflow", load_registered)
for _alias in registry.ALIASES:
    register_policy_loader(_alias, lambda rest, _a=_alias: load_registered(_a))

__all__ = ["load_policy", "load_registered"]

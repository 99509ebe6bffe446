"""Policy specs beyond the arbiter's built-ins: `base`, `tiny`, and registered models `mlflow:ALIAS|vN`.

`load_policy(spec)` (agent_rl.arbiter.policies) serves the arbiter, `agent-rl eval` and the
evaluation asset alike, so a version means the same model everywhere.
"""

from __future__ import annotations

from agent_rl import registry
from agent_rl.agent.policy import Policy
from agent_rl.arbiter.policies import load_policy, register_policy_loader


def _local(model: str, adapter: str | None = None, version: str | None = None) -> Policy:
    from agent_rl.agent.local_policy import LocalPolicy

    return LocalPolicy(model, adapter=adapter, version=version)


def load_registered(ref: str, tracking_uri: str | None = None) -> Policy:
    """A registered model by alias (`champion`, `challenger`) or version (`v3`), loaded on its base model."""
    ref = ref.strip()
    if not ref:
        raise ValueError("mlflow policy spec needs an alias or a version, e.g. mlflow:champion or mlflow:v3")
    if ref.startswith("v") and ref[1:].isdigit():
        path, manifest = registry.download_version(version=ref[1:], tracking_uri=tracking_uri)
        version = ref
    else:
        found = registry.get_version(ref, tracking_uri=tracking_uri)
        path, manifest = registry.download_version(version=found.version, tracking_uri=tracking_uri)
        version = f"v{found.version}"
    if manifest.get("adapter", True):
        return _local(manifest["base_model"], adapter=str(path), version=version)
    return _local(str(path), version=version)


register_policy_loader("base", lambda rest: _local("base", version="base"))
register_policy_loader("tiny", lambda rest: _local("tiny", version="tiny"))
register_policy_loader("mlflow", load_registered)
for _alias in registry.ALIASES:
    register_policy_loader(_alias, lambda rest, _a=_alias: load_registered(_a))

__all__ = ["load_policy", "load_registered"]

"""Load serving policies from their routing spec, and keep them loaded.

A spec is `PREFIX:REST` for a registered loader prefix (`heuristic`, `heuristic:{"json": "config"}`,
`local:/path`, and whatever the lead registers, e.g. `mlflow:challenger`) or a bare local path to a
checkpoint directory. `register_policy_loader` adds prefixes without touching this module.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent_rl.agent.policy import Policy

log = logging.getLogger(__name__)

PolicyLoader = Callable[[str], Policy]
_LOADERS: dict[str, PolicyLoader] = {}
_LOADERS_LOCK = threading.Lock()


class PolicyLoadError(RuntimeError):
    """A spec could not be turned into a policy (unknown prefix, missing checkpoint, bad config)."""


def register_policy_loader(prefix: str, loader: PolicyLoader) -> None:
    """Make specs `prefix` and `prefix:REST` load through `loader(REST)` (REST is "" for a bare prefix)."""
    if not prefix or ":" in prefix or "/" in prefix:
        raise ValueError(f"policy loader prefix {prefix!r}: must be a non-empty word without ':' or '/'")
    with _LOADERS_LOCK:
        _LOADERS[prefix] = loader


def registered_prefixes() -> list[str]:
    return sorted(_LOADERS)


def _load_heuristic(config: str) -> Policy:
    from agent_rl.agent.heuristic import HeuristicPolicy

    if not config.strip():
        return HeuristicPolicy()
    try:
        options = json.loads(config)
    except json.JSONDecodeError as exc:
        raise PolicyLoadError(f"heuristic policy config is not valid JSON: {exc}") from exc
    if not isinstance(options, dict):
        raise PolicyLoadError("heuristic policy config must be a JSON object, e.g. heuristic:{\"max_searches\": 2}")
    return _construct(HeuristicPolicy, options)


def _construct(cls: type, options: dict[str, Any]) -> Policy:
    """Build a policy from options, accepting either keyword fields or a single typed `config` argument."""
    try:
        return cls(**options)
    except TypeError as first:
        config_cls = getattr(cls, "config_class", None) or getattr(cls, "Config", None)
        if config_cls is not None:
            try:
                return cls(config_cls(**options))
            except Exception as exc:  # the config class says best what was wrong
                raise PolicyLoadError(f"{cls.__name__} config {options}: {exc}") from exc
        raise PolicyLoadError(f"{cls.__name__} config {options}: {first}") from first


def _load_local(path: str) -> Policy:
    from agent_rl.agent.local_policy import LocalPolicy

    checkpoint = Path(path).expanduser()
    if not checkpoint.is_dir():
        raise PolicyLoadError(f"local policy checkpoint {str(checkpoint)!r} is not a directory")
    return LocalPolicy(str(checkpoint))


register_policy_loader("heuristic", _load_heuristic)
register_policy_loader("local", _load_local)


def load_policy(spec: str) -> Policy:
    """A fresh policy for `spec`; raises PolicyLoadError naming the spec when it cannot be loaded."""
    if not isinstance(spec, str) or not spec.strip():
        raise PolicyLoadError("policy spec must be a non-empty string")
    prefix, sep, rest = spec.partition(":")
    with _LOADERS_LOCK:
        loader = _LOADERS.get(prefix)
    if loader is None:
        if spec.startswith(("/", ".", "~")) or Path(spec).expanduser().is_dir():
            loader, rest = _LOADERS["local"], spec
        elif sep:
            raise PolicyLoadError(
                f"policy spec {spec!r}: no loader registered for prefix {prefix!r} "
                f"(known: {', '.join(registered_prefixes())}); add one with register_policy_loader"
            )
        else:
            raise PolicyLoadError(f"policy spec {spec!r}: not a known prefix and not an existing checkpoint directory")
    try:
        return loader(rest)
    except PolicyLoadError:
        raise
    except Exception as exc:
        raise PolicyLoadError(f"policy spec {spec!r}: {type(exc).__name__}: {exc}") from exc


class PolicyCache:
    """Loaded policies by (version, spec); each is loaded once even under concurrent first requests."""

    def __init__(self, loader: Callable[[str], Policy] = load_policy) -> None:
        self._loader = loader
        self._policies: dict[tuple[str, str], Policy] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, version: str, spec: str) -> Policy:
        key = (version, spec)
        policy = self._policies.get(key)
        if policy is not None:
            return policy
        with self._lock:
            key_lock = self._locks.setdefault(key, threading.Lock())
        with key_lock:
            policy = self._policies.get(key)
            if policy is None:
                log.info("loading policy version %s from spec %s", version, spec)
                policy = self._loader(spec)
                # Episodes take their policy_version from the policy: the routing name wins.
                policy.version = version
                self._policies[key] = policy
        return policy

    def retain(self, specs: Mapping[str, str]) -> None:
        """Drop policies no longer routed to, so replaced checkpoints free their memory."""
        keep = set(specs.items())
        with self._lock:
            for key in [k for k in self._policies if k not in keep]:
                del self._policies[key]
                self._locks.pop(key, None)

    def loaded(self) -> list[tuple[str, str]]:
        return sorted(self._policies)

"""Load serving policies from their routing spec, and keep them loaded.

A spec is `PREFIX:REST` for a registered loader prefix (`heuristic`, `heuristic:{"json": "config"}`,
`local:/path`, and whatever the lead registers, e.g. `mlflow:challenger`) or a bare local path to a
checkpoint directory. `register_policy_loader` adds prefixes without touching this module.

This module registers the policies that are configuration (heuristic, teacher, api-sim, local, openai,
vllm-lora). Our models (`base`, `tiny`, `mlflow:`, the aliases, `lora:`) are registered by agent_rl/policy_specs.py,
which builds on this registry: load any spec through `agent_rl.policy_specs` (its `load_policy`, `load_served`).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent_rl.agent.policy import Policy
from agent_rl.arbiter.placement import core_shares, machine_cores
from agent_rl.arbiter.policy_errors import PolicyLoadError

log = logging.getLogger(__name__)

PolicyLoader = Callable[[str], Policy]
# How the arbiter loads a spec it serves beside others: (REST, the vLLM server registered versions go to, or None).
ServedLoader = Callable[[str, Any], Policy]
_LOADERS: dict[str, PolicyLoader] = {}
_SERVED: dict[str, ServedLoader] = {}
_LOADERS_LOCK = threading.Lock()


def register_policy_loader(prefix: str, loader: PolicyLoader, served: ServedLoader | None = None) -> None:
    """Make specs `prefix` and `prefix:REST` load through `loader(REST)` (REST is "" for a bare prefix); `served`,
    where given, is how the arbiter loads them instead (our models as adapters on one shared base)."""
    if not prefix or ":" in prefix or "/" in prefix:
        raise ValueError(f"policy loader prefix {prefix!r}: must be a non-empty word without ':' or '/'")
    with _LOADERS_LOCK:
        _LOADERS[prefix] = loader
        if served is not None:
            _SERVED[prefix] = served
        else:
            _SERVED.pop(prefix, None)


def registered_prefixes() -> list[str]:
    return sorted(_LOADERS)


def _load_heuristic(config: str) -> Policy:
    """`heuristic` or `heuristic:{...}`: the email assistant's rule-based teacher (`teacher:email`) with options."""
    from agent_rl.environments.registry import load_environment

    try:
        options = json.loads(config) if config.strip() else {}
        if not isinstance(options, dict):
            raise ValueError("options must be a JSON object")
        return load_environment("email").teacher(**options)
    except (ValueError, TypeError) as exc:  # a pydantic ValidationError is a ValueError
        raise PolicyLoadError(f"heuristic policy config {config!r} is invalid: {exc}") from exc


def _load_local(location: str) -> Policy:
    """`local:/path/to/checkpoint`, a bare path, or `local:{"model": ..., "adapter": ..., ...}` (LocalPolicyConfig)."""
    from agent_rl.agent.local_policy import LocalPolicy, LocalPolicyConfig

    if location.lstrip().startswith("{"):
        try:
            return LocalPolicy.from_config(LocalPolicyConfig.model_validate_json(location))
        except ValidationError as exc:
            raise PolicyLoadError(f"local policy config {location!r} is invalid: {exc}") from exc
    checkpoint = Path(location).expanduser()
    if not checkpoint.is_dir():
        raise PolicyLoadError(f"local policy checkpoint {str(checkpoint)!r} is not a directory")
    return LocalPolicy(checkpoint)


def _load_api_simulation(name: str) -> Policy:
    """`api-sim:o3`: the rule-based agent playing a named API model with its published latency and cost."""
    from agent_rl.agent.api_models import simulated_api_policy

    try:
        return simulated_api_policy(name)
    except ValueError as exc:
        raise PolicyLoadError(str(exc)) from exc


def _load_teacher(rest: str) -> Policy:
    """`teacher:support`: the rule-based teacher a plug-in environment offers; `teacher:{"environment": "support",
    "success_rate": 0.61}` passes options to it (a simulated imperfect production agent)."""
    from agent_rl.environments.core import EnvironmentError
    from agent_rl.environments.registry import load_environment

    options: dict[str, Any] = {}
    environment = rest
    if rest.lstrip().startswith("{"):
        try:
            options = json.loads(rest)
        except json.JSONDecodeError as exc:
            raise PolicyLoadError(f"teacher spec is not valid JSON: {exc}") from None
        if not isinstance(options, dict) or not isinstance(options.get("environment"), str):
            raise PolicyLoadError('teacher spec needs "environment", e.g. teacher:{"environment": "support"}')
        environment = options.pop("environment")
    try:
        teacher = load_environment(environment).teacher(**options)
    except EnvironmentError as exc:
        raise PolicyLoadError(str(exc)) from exc
    except (TypeError, ValueError) as exc:
        raise PolicyLoadError(f"environment {environment!r}: its teacher does not take {sorted(options)}: {exc}") from exc
    if teacher is None:
        raise PolicyLoadError(f"environment {environment!r} offers no teacher policy")
    teacher.version = f"teacher:{environment}"
    return teacher


register_policy_loader("heuristic", _load_heuristic)
register_policy_loader("teacher", _load_teacher)
register_policy_loader("api-sim", _load_api_simulation)
register_policy_loader("local", _load_local)


def _load_openai(config: str) -> Policy:
    """`openai:{"base_url": ..., "model": ..., "api_key_env": "NAME"}`: an OpenAI-compatible API (upstreams.py)."""
    from agent_rl.arbiter.upstreams import load_openai_upstream

    return load_openai_upstream(config)


register_policy_loader("openai", _load_openai)


def _load_vllm_adapter(config: str) -> Policy:
    """`vllm-lora:{"base_url": ..., "lora_name": ..., "lora_path": ...}`: an adapter on a vLLM server (vllm_lora.py)."""
    from agent_rl.arbiter.vllm_lora import load_vllm_adapter

    return load_vllm_adapter(config)


register_policy_loader("vllm-lora", _load_vllm_adapter)


def shown_spec(spec: str) -> str:
    """A spec as logged: an `api_key` someone put in a JSON spec (refused on load) is not repeated."""
    return re.sub(r'("api_key"\s*:\s*)"(?:[^"\\]|\\.)*"', r'\1"[redacted]"', spec)


def load_policy(spec: str, served: bool = False, vllm: Any = None) -> Policy:
    """A fresh policy for `spec` (the one place a spec is parsed); `served`: as the arbiter serves it, with the
    prefix's served loader where it has one (and `vllm`, the server registered versions go to). Raises
    PolicyLoadError naming the spec when it cannot be loaded."""
    if not isinstance(spec, str) or not spec.strip():
        raise PolicyLoadError("policy spec must be a non-empty string")
    prefix, sep, rest = spec.partition(":")
    with _LOADERS_LOCK:
        loader = _LOADERS.get(prefix)
        shared = _SERVED.get(prefix) if served else None
    if shared is not None:
        loader = lambda rest: shared(rest, vllm)  # noqa: E731 - the served loader, bound to this arbiter's vLLM
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
    """Loaded policies by spec; each is loaded once even under concurrent first requests.

    Versions that share a spec share the policy object: the runner records the routed version
    per episode (EpisodeTask.policy_version), so the object's own `version` is not relied upon.

    Placement (`arrange`): a version on an engine of its own can be given a share of the cores, which the arbiter does
    while a test routes several such versions (agent_rl/arbiter/placement.py). A version loaded on other cores than
    it should be is loaded again on its share in the background; the old policy keeps answering until the new one
    is up, and its engine stops once the batches holding it end.
    """

    def __init__(self, loader: Callable[[str], Policy] = load_policy,
                 may_place: Callable[[str], bool] | None = None, cores: Sequence[int] | None = None) -> None:
        """`may_place(spec)`: whether a spec not loaded yet may come up on an engine of its own (its share is kept
        for it while it loads; None: never, so nothing is placed); `cores`: what is shared out (default: this
        process's)."""
        self._loader = loader
        self._may_place = may_place
        self._all_cores = tuple(cores) if cores is not None else machine_cores()
        self._arranging = threading.Lock()
        self._releasing = threading.Lock()
        self._policies: dict[str, Policy] = {}
        self._cores: dict[str, tuple[int, ...] | None] = {}  # spec -> the cores its loaded policy computes on
        self._wanted: dict[str, tuple[int, ...] | None] = {}  # spec -> the cores it should compute on
        self._moving: dict[str, threading.Thread] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, spec: str) -> Policy:
        key = spec
        policy = self._policies.get(key)
        if policy is not None:
            return policy
        with self._lock:
            key_lock = self._locks.setdefault(key, threading.Lock())
        with key_lock:
            policy = self._policies.get(key)
            if policy is None:
                log.info("loading policy from spec %s", shown_spec(spec))
                cores = self._wanted.get(spec)
                policy = self._load(spec, cores)
                with self._lock:
                    self._policies[key] = policy
                    self._cores[key] = cores if _placeable(policy) else None
        return policy

    def _load(self, spec: str, cores: tuple[int, ...] | None) -> Policy:
        from agent_rl.agent.engine import placed_on

        with placed_on(cores):
            return self._loader(spec)

    def _place(self, wanted: dict[str, tuple[int, ...] | None], routed: Iterable[str] | None = None) -> None:
        """Where each spec should compute from now on (a spec not named: every core). Loaded versions on engines of
        their own that sit elsewhere are moved in the background (`wait_placed` waits for that); only the `routed`
        ones where given (a version the routing dropped is let go, not moved)."""
        with self._lock:
            if self._closed:
                return
            self._wanted = dict(wanted)
            movable = set(self._policies if routed is None else routed)
            for spec, policy in self._policies.items():
                cores = self._wanted.get(spec)
                if (spec in movable and _placeable(policy) and self._cores.get(spec) != cores
                        and spec not in self._moving):
                    mover = threading.Thread(target=self._move, args=(spec, cores), name="policy-placement",
                                             daemon=True)
                    self._moving[spec] = mover
                    mover.start()

    def _move(self, spec: str, cores: tuple[int, ...] | None) -> None:
        with self._lock:
            current = self._policies.get(spec)
        _yield_cpu(current, True)  # the start-up below gets the CPU first; the old engine answers meanwhile
        # Held weakly while the new copy loads: a close or a routing change meanwhile lets the old one go at once.
        old = weakref.ref(current) if current is not None else lambda: None
        del current
        try:
            log.info("placing policy %s on %s", shown_spec(spec), f"cores {list(cores)}" if cores else "every core")
            policy = self._load(spec, cores)
        except Exception as exc:  # the version keeps answering where it is
            if not self._closed:  # at shutdown the engine being started is stopped with the rest: no news
                log.warning("could not place policy %s: %s: %s", shown_spec(spec), type(exc).__name__, exc)
            policy = None
            _yield_cpu(old(), False)
        with self._lock:
            self._moving.pop(spec, None)
            # Closed (or dropped by the routing) while it loaded: the spec is gone, so the new copy is not kept.
            if policy is not None and spec in self._policies:
                # The old policy is dropped here; batches that hold it finish on it, then its engine stops.
                self._policies[spec], self._cores[spec] = policy, cores
            again = spec in self._policies and self._cores.get(spec) != self._wanted.get(spec)
        if again and policy is not None:  # the routing moved on while this one loaded
            self._place(self._wanted, [spec])

    def arrange(self, weights: Mapping[str, float]) -> dict[str, Exception]:
        """Load the routed specs (traffic share by spec) and give each version on an engine of its own its share
        of the cores (agent_rl/arbiter/placement.py), moving loaded ones in the background. A spec that is not
        loaded yet loads on the share it would have, so the version a test adds starts once, where it stays.
        Returns the specs that failed to load, with the error (the caller reports it; no second attempt). Without
        placement nothing is loaded here."""
        if self._may_place is None or self._closed:
            return {}
        failed: dict[str, Exception] = {}
        with self._arranging:
            routed = {spec: weight for spec, weight in weights.items() if weight > 0}
            with self._lock:
                candidates = {spec: weight for spec, weight in routed.items() if (
                    _placeable(self._policies[spec]) if spec in self._policies else self._may_place(spec))}
                self._wanted = dict(core_shares(candidates, self._all_cores))
            for spec in routed:
                try:
                    self.get(spec)
                except Exception as exc:  # requests routed there get the load error themselves
                    log.warning("policy %s did not load: %s: %s", shown_spec(spec), type(exc).__name__, exc)
                    failed[spec] = exc
            with self._lock:
                placed = {spec: weight for spec, weight in routed.items()
                          if spec in self._policies and _placeable(self._policies[spec])}
            self._place(core_shares(placed, self._all_cores), routed)
        return failed

    def wait_placed(self, timeout_s: float | None = None) -> bool:
        """Wait for moves in progress; True when none is left."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._lock:
                movers = list(self._moving.values())
            if not movers:
                return True
            for mover in movers:
                mover.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if deadline is not None and time.monotonic() >= deadline:
                with self._lock:
                    return not self._moving

    def placement(self) -> dict[str, tuple[int, ...] | None]:
        """The cores each loaded spec computes on now (None: every core, or not an engine of its own)."""
        with self._lock:
            return dict(self._cores)

    def retain(self, specs: Iterable[str]) -> None:
        """Drop policies no longer routed to, so replaced checkpoints free their memory: a version on a shared
        base drops its adapter once no batch holds it; one with a `release()` (an adapter on a vLLM server) is
        told to unload; a version on an engine of its own stops it once no batch holds it."""
        keep = set(specs)
        dropped = []
        with self._releasing:  # a retain returns once every release asked for so far is done, whoever asked
            with self._lock:
                for key in [k for k in self._policies if k not in keep]:
                    dropped.append(self._policies.pop(key))
                    self._cores.pop(key, None)
                    self._locks.pop(key, None)
            while dropped:  # each dropped reference goes here, under the lock: an engine of its own stops now,
                _release(dropped.pop())  # before another retain (or the caller) goes on, unless a batch holds it

    def close(self) -> None:
        """Let every policy go (engines of their own stop once no batch holds them) and drop what a move still in
        progress loads when it is up: nothing the cache started outlives it."""
        with self._lock:
            self._closed = True
        self.retain(())

    def is_loaded(self, spec: str) -> bool:
        return spec in self._policies

    def loaded(self) -> list[str]:
        return sorted(self._policies)

    def health(self) -> dict[str, dict[str, Any]]:
        """Each loaded spec whose policy reports its serving state (an engine's: serving, resting after its
        restarts, ...), for /healthz: an operator sees a version that answers 503 and for how long."""
        states = {}
        for spec, policy in list(self._policies.items()):
            health = getattr(policy, "health", None)
            if callable(health):
                states[spec] = health()
        return states


def _release(policy: Policy) -> None:
    """Tell a dropped policy that has a `release()` to unload (an adapter on a vLLM server)."""
    release = getattr(policy, "release", None)
    if callable(release):
        try:
            release()
        except Exception as exc:  # the routing change stands; the server keeps an unused adapter
            log.warning("could not release policy %s: %s: %s", getattr(policy, "version", "?"),
                        type(exc).__name__, exc)


def _yield_cpu(policy: Policy | None, yielding: bool) -> None:
    """Tell a version's engine that its replacement is starting (or failed to): see EnginePolicy.yield_cpu."""
    method = getattr(policy, "yield_cpu", None)
    if callable(method):
        try:
            method(yielding)
        except Exception as exc:  # a priority hint; the move goes on without it
            log.info("policy %s could not yield the CPU: %s: %s", getattr(policy, "version", "?"),
                     type(exc).__name__, exc)


def _placeable(policy: Policy) -> bool:
    """A version on an engine of its own, which may compute on a share of the cores."""
    return bool(getattr(policy, "placeable", False))

"""Choose a policy version for a request from the routing weights: sticky per request key, random otherwise.

The weights are read from the pool and cached for a short time, so the hot path does no database
read; a change made through this arbiter is visible at once, one made elsewhere (another worker
process, another arbiter) within `ttl_s`. With `start_refreshing` a background thread re-reads the
table twice per `ttl_s`, so requests never wait for that read.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError

from agent_rl.pool import PoolRepository, Routing

log = logging.getLogger(__name__)

# A version name a tenant may see as it is: a short name such as `v3`, `mlflow:champion` or `openai:gpt-4o`.
_SHOWN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,79}")


def public_version(version: str) -> str:
    """The name callers see for a version. A version routed by its spec alone (`openai:{"base_url": ...}`,
    `lora:{...}`) would show an upstream's address, a key variable or an adapter path: callers see its kind and
    a fingerprint instead, stable so that responses of one version stay comparable."""
    if _SHOWN_NAME.fullmatch(version):
        return version
    kind = version.split(":", 1)[0] if re.fullmatch(r"[a-z][a-z0-9_]{0,19}:.*", version, re.S) else "version"
    return f"{kind}-{hashlib.sha256(version.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class Split:
    """Cumulative weights over versions in a fixed (sorted) order, so a point in [0, 1) maps to one version."""

    versions: tuple[str, ...]
    bounds: tuple[float, ...]
    specs: Mapping[str, str]
    weights: Mapping[str, float]
    is_default: bool = False

    @classmethod
    def from_weights(cls, weights: Mapping[str, float], specs: Mapping[str, str], is_default: bool = False) -> Split:
        live = sorted((v, w) for v, w in weights.items() if w > 0)
        if not live:
            raise ValueError("routing has no version with a weight above 0")
        total = sum(w for _, w in live)
        bounds, acc = [], 0.0
        for _, w in live:
            acc += w / total
            bounds.append(acc)
        bounds[-1] = 1.0  # guard against float rounding leaving a gap at the top
        return cls(
            versions=tuple(v for v, _ in live),
            bounds=tuple(bounds),
            specs={v: specs.get(v, v) for v in weights},
            weights=dict(weights),
            is_default=is_default,
        )

    def pick(self, point: float) -> str:
        return self.versions[min(bisect.bisect_right(self.bounds, point), len(self.versions) - 1)]


def key_point(request_key: str) -> float:
    """A stable point in [0, 1) for a request key: the same key lands on the same version while weights hold."""
    digest = hashlib.sha256(request_key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class Router:
    """Routes requests by the pool's routing table, falling back to `default_weights` while it is empty."""

    def __init__(self, pool: PoolRepository, default_weights: Mapping[str, float], ttl_s: float = 1.0) -> None:
        self._pool = pool
        self._default = Split.from_weights(default_weights, {}, is_default=True)
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._split: Split | None = None
        self._loaded_at = 0.0
        self._random = random.Random()
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        self._watchers: list[Callable[[Split], None]] = []

    def watch(self, callback: Callable[[Split], None]) -> None:
        """Call `callback(split)` whenever a routing read installs other weights or specs than before (from the
        reading thread, under the router's lock: it must hand work off, not do it)."""
        self._watchers.append(callback)

    def current(self) -> Split:
        now = time.monotonic()
        split = self._split
        if split is not None and now - self._loaded_at < self._ttl_s:
            return split
        with self._lock:
            if self._split is None or time.monotonic() - self._loaded_at >= self._ttl_s:
                try:
                    routing = self._pool.get_routing()
                except SQLAlchemyError as exc:
                    if self._split is None:
                        raise
                    # The pool is down (e.g. a database restart): keep routing by the last split read;
                    # failing the request here would be a 500 for what the episode write reports as 503.
                    log.warning("routing read failed, keeping the last split: %s", type(exc).__name__)
                    self._loaded_at = time.monotonic()  # retry after ttl_s, not on every request
                    return self._split
                self._install(routing)
            return self._split  # type: ignore[return-value]

    def _install(self, routing: Routing) -> None:
        before = self._split
        if any(w > 0 for w in routing.weights.values()):
            self._split = Split.from_weights(routing.weights, routing.specs)
        else:
            self._split = self._default
        self._loaded_at = time.monotonic()
        if before is not None and (before.weights, before.specs) != (self._split.weights, self._split.specs):
            for callback in self._watchers:
                try:
                    callback(self._split)
                except Exception as exc:  # a watcher never stops routing
                    log.warning("routing watcher failed: %s: %s", type(exc).__name__, exc)

    def refresh(self, routing: Routing | None = None) -> Split:
        """Install `routing` (just written) or re-read the table now."""
        with self._lock:
            self._install(routing if routing is not None else self._pool.get_routing())
            return self._split  # type: ignore[return-value]

    def start_refreshing(self) -> None:
        """Keep the routing fresh from a daemon thread (every ttl_s / 2); no-op when ttl_s is 0 (read every time)."""
        if self._ttl_s <= 0 or self._refresher is not None:
            return
        self._stop.clear()
        self._refresher = threading.Thread(target=self._refresh_loop, name="routing-refresh", daemon=True)
        self._refresher.start()

    def stop_refreshing(self) -> None:
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join(10)
            self._refresher = None

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self._ttl_s / 2):
            try:
                self.refresh()
            except Exception as exc:  # the request path retries the read itself when the copy goes stale
                log.warning("routing refresh failed: %s: %s", type(exc).__name__, exc)

    def choose(self, request_key: str | None) -> tuple[str, str]:
        """(policy version, its spec) for one request."""
        split = self.current()
        point = key_point(request_key) if request_key else self._random.random()
        version = split.pick(point)
        return version, split.specs.get(version, version)

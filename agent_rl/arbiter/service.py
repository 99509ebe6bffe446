"""The arbiter's work behind the HTTP layer: route a question, run the episode, log it to the pool.

The environment it serves comes from the registry like any other (`ArbiterConfig.environment`): its replayable
tasks are the references requests may name, its contexts what callers may ask about, and its judge the verdict.
Everything blocking (runner, world reads, pool reads and writes) runs on threads, so the event loop only parses
requests and hands work around.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agent_rl.environments.runner import Play, play_episodes
from agent_rl.agent.engine import EnginePolicy, MixedEnginePolicy
from agent_rl.agent.shared_base import AdapterPolicy, MixedVersionPolicy, resident_bytes, serving_stats
from agent_rl.arbiter.batching import EpisodeBatcher
from agent_rl.arbiter.config import ArbiterConfig
from agent_rl.arbiter.keys import ApiKey, KeyRing
from agent_rl.arbiter.policies import PolicyCache, PolicyLoadError
from agent_rl.policy_specs import load_served, may_run_own_engine
from agent_rl.arbiter.routing import Router, Split
from agent_rl.pool import PoolRepository, Routing
from agent_rl.pool.repository import normalize_weights
from agent_rl.environments.core import Environment, Task
from agent_rl.environments.registry import load_environment, world_options
from agent_rl.records import Episode

log = logging.getLogger(__name__)

CONTEXT_REFRESH_S = 2.0


class PoolUnavailable(RuntimeError):
    """The episode could not be written to the benchmark pool."""


class UnknownContext(LookupError):
    """No context (for the email assistant: a mailbox) by that name in the served environment."""


class UnknownTask(LookupError):
    """No replayable task by that id that the caller may see (one outside its contexts reads the same)."""


class TaskMismatch(ValueError):
    """The named task runs in another context than the one asked about."""


class OutOfScope(PermissionError):
    """The caller's key does not cover the context it asked about."""


def serving_environment(config: ArbiterConfig) -> Environment:
    """The environment /v1/ask serves, from the registry. The world store and tasks file the configuration names
    go to an environment that takes them (`registry.world_options`); others bring their own."""
    return load_environment(config.environment, **world_options(config.environment, config.store_url,
                                                                config.tasks_path))


@dataclass
class Served:
    episode: Episode
    episode_seconds: float


class ArbiterService:
    def __init__(self, config: ArbiterConfig) -> None:
        self.config = config
        self.keys = KeyRing.load(config.api_keys, config.api_keys_file)
        if not len(self.keys):
            log.warning("no API keys configured: /v1/ask and /v1/feedback refuse every request")
        self.pool = PoolRepository(config.pool_url)
        self.router = Router(self.pool, config.default_routing, ttl_s=config.routing_ttl_s)
        # Registered versions and base models share one loaded base per model (agent/shared_base.py).
        self.policies = PolicyCache(lambda spec: load_served(spec, vllm=config.vllm),
                                    may_place=may_run_own_engine if config.split_cores and not config.vllm else None)
        # Its replayable tasks are the references requests may name; its contexts (a mailbox, a store) what callers
        # ask about. Its sessions are opened on the episode threads, so it must take concurrent plays.
        self.environment = serving_environment(config)
        self.tasks: dict[str, Task] = {task.id: task for task in self.environment.world().replayable_tasks()}
        self.executor = ThreadPoolExecutor(config.episode_workers, thread_name_prefix="episode")
        self.batcher = EpisodeBatcher(
            self._run_batch,
            self.executor,
            window_s=config.batch_window_ms / 1000,
            max_batch=config.max_batch,
            max_concurrent=config.episode_workers,
        )
        self._stats_lock = threading.Lock()
        self.episodes_written = 0
        self._contexts: frozenset[str] = frozenset()
        self._contexts_at = float("-inf")
        self._refresh_contexts()
        self._warm_up()
        self.router.watch(self._routing_changed)
        self.router.start_refreshing()  # requests then never wait for a routing read

    def _warm_up(self) -> None:
        """Load the routed policies and the tool schemas now, so the first requests don't pay for imports."""
        self.environment.tool_schemas()  # builds schemas through transformers: seconds on first use
        failed = self.policies.arrange(_routed_specs(self.router.current()))
        for version in self.router.current().versions:
            spec = self.router.current().specs.get(version, version)
            try:
                if spec in failed:
                    raise failed[spec]
                self.policies.get(spec)
            except PolicyLoadError as exc:  # keep serving; requests routed there get a clear 503
                log.error("policy version %s cannot be loaded: %s", version, exc)

    def _routing_changed(self, split: Split) -> None:
        """Whoever wrote the routing (this arbiter, the A/B controller through the pool), the versions it routes
        are loaded and placed, and those it dropped are released, in the background: requests keep flowing."""
        routed = _routed_specs(split)

        def rearrange() -> None:
            self.policies.arrange(routed)
            self.policies.retain(routed)

        threading.Thread(target=rearrange, name="routing-change", daemon=True).start()

    # -- blocking helpers (run on executor threads) -------------------------------------------

    def _refresh_contexts(self) -> None:
        self._contexts = self.environment.world().contexts()
        self._contexts_at = time.monotonic()

    def _run_batch(self, specs: list[str], tasks: list[Play]) -> tuple[list[Episode], float]:
        """Play a batch and commit its episodes in one transaction, on the same thread.

        Writing here (instead of handing episodes to a writer thread) saves a thread hand-off per
        request, which on 2 busy cores costs more than the write; batches grow with load, so
        commits are shared by many requests exactly when it matters. Answers are only sent after
        this commit, so an answered episode is never lost.
        """
        started = time.perf_counter()
        episodes = self._play(specs, tasks)
        played = time.perf_counter() - started
        # An unserved episode (its engine down) is no evidence: not stored; its request is answered 503.
        served = [episode for episode in episodes if episode.unserved is None]
        try:
            self.pool.insert_episodes(served)
        except Exception as exc:
            log.error("pool write of %d episodes failed: %s: %s", len(episodes), type(exc).__name__, exc)
            raise PoolUnavailable(f"the benchmark pool could not store the episode: {type(exc).__name__}") from exc
        if len(served) < len(episodes):
            self._count_unserved(episodes)
        with self._stats_lock:
            self.episodes_written += len(served)
        return episodes, played

    def _count_unserved(self, episodes: list[Episode]) -> None:
        """Record per version the requests it could not serve, for the rollout controller to hold its step on
        (best effort: the requests are answered 503 whether or not the count is written)."""
        failures: dict[str, list[Exception]] = {}
        for episode in episodes:
            if episode.unserved is not None:
                failures.setdefault(episode.policy_version, []).append(episode.unserved)
        for version, seen in failures.items():
            try:
                self.pool.record_serving_failure(version, len(seen), type(seen[0]).__name__)
            except Exception as exc:
                log.error("could not count %d unserved requests of %s: %s", len(seen), version, type(exc).__name__)

    def _run(self, policy: Any, tasks: list[Play]) -> list[Episode]:
        """One runner call: the plays in the served environment."""
        return play_episodes(policy, self.environment, tasks, self.config.runner)

    def _play(self, specs: list[str], tasks: list[Play]) -> list[Episode]:
        """One runner call; tasks of several versions on one shared base decode together (mixed batch)."""
        distinct = list(dict.fromkeys(specs))
        if len(distinct) == 1:
            return self._run(self.policies.get(distinct[0]), tasks)
        policies = {task.policy_version or spec: self.policies.get(spec) for spec, task in zip(specs, tasks)}
        if all(isinstance(p, AdapterPolicy) for p in policies.values()) and \
                len({id(p.base) for p in policies.values()}) == 1:  # type: ignore[attr-defined]
            mixed = MixedVersionPolicy(policies)  # type: ignore[arg-type]
            return self._run(mixed, tasks)
        if all(isinstance(p, EnginePolicy) for p in policies.values()) and \
                len({id(p.engine) for p in policies.values()}) == 1:  # type: ignore[attr-defined]
            return self._run(MixedEnginePolicy(policies), tasks)  # type: ignore[arg-type]
        episodes: list[Episode | None] = [None] * len(tasks)  # a base was reloaded meanwhile: one call per spec
        for spec in distinct:
            indices = [i for i, s in enumerate(specs) if s == spec]
            played = self._run(self.policies.get(spec), [tasks[i] for i in indices])
            for i, episode in zip(indices, played):
                episodes[i] = episode
        return episodes  # type: ignore[return-value]

    def lane_of(self, spec: str) -> str:
        """The batching lane of a spec: the shared base its version is an adapter on, else the spec itself."""
        if not self.policies.is_loaded(spec):
            return spec
        return getattr(self.policies.get(spec), "lane", None) or spec

    def serving_metrics(self) -> dict[str, Any]:
        """Loaded versions, adapter and cache memory, resident memory and queue depth of this worker process."""
        stats = serving_stats()
        stats["policies_loaded"] = self.policies.loaded()
        version_of = {spec: version for version, spec in self.router.current().specs.items()}
        stats["engines"] = {version_of.get(spec, spec): state for spec, state in self.policies.health().items()}
        stats["queue"] = self.batcher.depth()
        stats["resident_bytes"], stats["peak_resident_bytes"] = resident_bytes()
        return stats

    # -- async API used by the HTTP layer ------------------------------------------------------

    async def _blocking(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def check_context(self, context: str) -> None:
        if context in self._contexts:
            return
        # A context added after start-up (a mailbox ingested) becomes servable, but unknown names don't hit the
        # world's store each time.
        if time.monotonic() - self._contexts_at >= CONTEXT_REFRESH_S:
            await self._blocking(self._refresh_contexts)
        if context not in self._contexts:
            raise UnknownContext(context)

    def reference(self, key: ApiKey, context: str, question: str, task_id: str | None) -> Task | None:
        """The task to judge the episode against, or None: then it is live traffic without a reference.

        A judged episode becomes a training label, so a replayable task is honoured only for keys allowed to
        replay, and only with the task's own prompt: anyone else naming a task (or a replay asking something
        else under its id) would otherwise have an answer to their question stored as the reference answer's
        `correct`. Callers that may not replay learn nothing about the tasks.
        """
        if task_id is None or not key.replay:
            return None
        task = self.tasks.get(task_id)
        if task is None or not key.may_use(task.context):
            raise UnknownTask(task_id)
        if task.context != context:
            raise TaskMismatch(task_id)
        return task if question == task.prompt else None

    async def ask(
        self, key: ApiKey, context: str, question: str, task_id: str | None, request_key: str | None
    ) -> Served:
        if not key.may_use(context):  # before any lookup: whether the context exists is not the caller's business
            raise OutOfScope(context)
        await self.check_context(context)
        reference = self.reference(key, context, question, task_id)
        version, spec = self.router.choose(request_key)
        if not self.policies.is_loaded(spec):
            await self._blocking(self.policies.get, spec)  # load once, off the loop; errors name the spec
        task = reference or Task(id=f"live-{uuid.uuid4().hex[:12]}", environment=self.environment.name,
                                 context=context, prompt=question)  # live traffic: nothing to judge it against
        play = Play(task, policy_version=version, tenant=key.tenant)
        episode, seconds = await self.batcher.submit(spec, play, lane=self.lane_of(spec))
        return Served(episode=episode, episode_seconds=seconds)

    async def feedback(self, key: ApiKey, episode_id: str, verdict: str) -> None:
        """Record a verdict on an episode of the key's tenant and contexts (any other reads as unknown)."""
        await self._blocking(
            lambda: self.pool.record_feedback(episode_id, verdict, tenant=key.tenant, contexts=key.context_filter())
        )

    async def routing(self) -> tuple[Routing, bool]:
        """The routing in force and whether it is the configured default (the table is empty)."""
        split = await self._blocking(self.router.refresh)
        return Routing(weights=dict(split.weights), specs=dict(split.specs), updated_at=None), split.is_default

    async def set_routing(
        self,
        weights: Mapping[str, float],
        specs: Mapping[str, str] | None,
        reason: str,
        actor: str,
        stats: Mapping[str, Any] | None,
    ) -> Routing:
        normalize_weights(weights)  # bad weights are reported as such, before any policy is loaded
        current = await self._blocking(self.pool.get_routing)
        # The versions load where the new split will place them (each starts once), then a split that would send
        # traffic to a policy that cannot be loaded is refused.
        routed = {version: (specs or {}).get(version) or current.specs.get(version) or version
                  for version, weight in weights.items() if isinstance(weight, (int, float)) and weight > 0}
        failed = await self._blocking(self.policies.arrange, _shares_by_spec(weights, routed))
        for version, spec in routed.items():
            try:
                if spec in failed:  # arrange tried it already: one attempt (an engine start is a minute)
                    raise failed[spec]
                await self._blocking(self.policies.get, spec)
            except PolicyLoadError as exc:
                self._routing_changed(self.router.current())  # back to where the routing in force places them
                raise PolicyLoadError(f"policy version {version!r}: {exc}") from exc
        routing = await self._blocking(lambda: self.pool.set_routing(weights, specs, reason, actor, stats))
        self.router.refresh(routing)
        self.policies.retain(routing.specs[v] for v, w in routing.weights.items() if w > 0)
        return routing

    def close(self) -> None:
        self.router.stop_refreshing()
        self.executor.shutdown(wait=True)  # running batches finish and commit before the pool closes
        self.policies.close()  # engines of the versions it served stop (they would at exit; now frees them at once)
        self.environment.close()
        self.pool.close()


def _routed_specs(split: Split) -> dict[str, float]:
    return _shares_by_spec(split.weights, split.specs)


def _shares_by_spec(weights: Mapping[str, Any], spec_of: Mapping[str, str]) -> dict[str, float]:
    """Traffic share by spec of the versions with a weight above 0 (versions that share a spec add up)."""
    shares: dict[str, float] = {}
    for version, weight in weights.items():
        if isinstance(weight, (int, float)) and weight > 0:
            spec = spec_of.get(version, version)
            shares[spec] = shares.get(spec, 0.0) + weight
    return shares

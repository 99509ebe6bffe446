"""The gateway's live episodes shared by every worker process: this worker's cache over the pool's copy.

The pool (`gateway_live`, agent_rl/pool/live.py) is authoritative; `SessionIndex` caches what this worker has
seen so that a call whose episode it served last needs no read. Each call writes once after its reply (a
relayed stream found by its transcript also once before):
  - a named session: one UPDATE with increments (any worker, any order; nothing is counted from a stale copy);
  - a conversation found by its transcript: one UPDATE that holds only while the row still has that transcript;
    when it has moved on (another worker extended the same state first) or is gone (ended), the call is a fork
    and becomes an episode of its own, as in one process. A relayed stream's header goes out before its reply
    is recorded, so it asks first (`claim`: the same test, before its upstream is asked, taking the row with a
    token of the call's), then records while the row still has that token;
  - a new episode: one INSERT; a session name another worker took meanwhile makes this call one of its calls.
A lookup reads the pool only when the cache cannot answer: a session this worker has not seen, or a
transcript whose latest reply it did not record.

While the pool cannot be reached (an error marks it down for `DOWN_S`), calls go on from the cache: the
episodes they change are kept in this worker (`local`) and put back into the pool when it answers again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

from agent_rl.arbiter.gateway.sessions import LiveEpisode, SessionIndex
from agent_rl.pool.live import AsyncPostgres, LiveStore
from agent_rl.records import Episode, utcnow

log = logging.getLogger("agent_rl.arbiter.gateway")

DOWN_S = 1.0  # after a failed pool call, the cache alone serves for this long before the pool is tried again
BUSY_S = 10.0  # SQLite: how long a statement waits for another process's write lock before the pool counts as down
_PER_CALL = frozenset({"find_session", "find_prefix", "claim", "release", "insert", "extend", "touch"})


class StoreDown(RuntimeError):
    """The pool did not answer; the caller goes on with this worker's copy."""


@dataclass
class Call:
    """What one answered call adds to its episode."""

    messages: list[dict[str, Any]]  # the request's messages followed by the reply: the transcript so far
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    prefix: str | None  # the transcript's hash (episodes without a session are found by it)
    final_tool: str | None = None
    tools: list[dict[str, Any]] | None = None

    def apply(self, episode: LiveEpisode, counted: dict[str, Any] | None = None) -> None:
        """Bring this worker's copy up to date: with the pool's counters when it recorded the call."""
        episode.messages = self.messages
        if self.final_tool:
            episode.final_tool = self.final_tool
        if self.tools is not None:
            episode.tools = self.tools
        episode.prompt_tokens += self.prompt_tokens
        episode.completion_tokens += self.completion_tokens
        episode.latency_ms += self.latency_ms
        episode.last_active = time.monotonic()
        if counted is None:
            episode.calls += 1
        else:
            episode.calls = counted["calls"]
            episode.row_version = counted["row_version"]
            episode.final_tool = counted["final_tool"]


class SharedSessions:
    """Find, record and end live episodes in the pool, through this worker's cache."""

    def __init__(self, pool: Any, idle_s: float) -> None:
        self.store = LiveStore(pool)
        self.index = SessionIndex()
        self.idle_s = idle_s
        # PostgreSQL: what every call does goes through the asyncio driver, the rest through threads.
        self._async = AsyncPostgres(self.store.engine.url) if self.store.postgres else None
        self._executor = ThreadPoolExecutor(4, thread_name_prefix="gateway-pool") if self._async else None
        self._down_until = 0.0
        self.live_estimate = 0  # live episodes in the pool: counted each background round, kept up in between

    async def close(self) -> None:
        if self._async is not None:
            await self._async.close()
            self._executor.shutdown(wait=True)
        self.store.close()

    # -- the pool, from the event loop ---------------------------------------------------------------

    @property
    def up(self) -> bool:
        return time.monotonic() >= self._down_until

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a pool call (a LiveStore method, or any blocking call on the pool); a database error marks the
        pool down and raises StoreDown.

        SQLite: on the event loop itself (a statement takes ~0.05 ms; a thread would cost more), waiting for
        the write lock with asyncio sleeps. PostgreSQL: the calls every request makes on the asyncio driver,
        the others (ending, sweeping) in a thread."""
        try:
            if self._async is None:
                return await self._sqlite(fn, args, kwargs)
            if getattr(fn, "__self__", None) is self.store and fn.__name__ in _PER_CALL:
                query = getattr(self.store, fn.__name__ + "_q")(*args, **kwargs)
                return query.decode(await self._async.execute(query))
            return await asyncio.get_running_loop().run_in_executor(self._executor, lambda: fn(*args, **kwargs))
        except self.store.errors as exc:
            if self.up:
                log.warning("the pool did not answer (%s); gateway sessions go on from this worker's copies",
                            type(exc).__name__)
            self._down_until = time.monotonic() + DOWN_S
            raise StoreDown(type(exc).__name__) from exc

    async def _sqlite(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        deadline = time.monotonic() + BUSY_S
        wait = 0.0002
        while True:
            try:
                return fn(*args, **kwargs)
            except self.store.errors as exc:
                if not self.store.busy(exc) or time.monotonic() > deadline:
                    raise
            # Another process writes (for well under a millisecond): serve others meanwhile, and look again soon,
            # since SQLite's lock is not fair and a slow poller waits behind every other writer.
            await asyncio.sleep(wait)
            wait = min(wait * 1.5, 0.002)

    async def checkpoint(self) -> None:
        """SQLite: write the WAL back from a thread (its connections leave that to this: it syncs the disk)."""
        if self._async is None:
            try:
                await asyncio.to_thread(self.store.checkpoint)
            except self.store.errors as exc:
                log.debug("WAL checkpoint skipped: %s", type(exc).__name__)

    # -- finding -------------------------------------------------------------------------------------

    async def find(self, tenant: str, context: str, session: str | None,
                   hashes: dict[int, str]) -> tuple[LiveEpisode | None, str | None]:  # fmt: skip
        """The live episode a call continues, and (found by its transcript) the transcript's hash."""
        if session is not None:
            episode = self.index.find_session(tenant, context, session)
            if episode is not None or not self.up:
                return episode, None
            try:
                row = await self.run(self.store.find_session, tenant, context, session)
            except StoreDown:
                return None, None
            return (self.adopt(row) if row is not None else None), None
        if not hashes:
            return None, None
        ordered = [hashes[i] for i in sorted(hashes)]
        episode, digest = self.index.find_prefix(tenant, context, ordered)
        # This worker recorded the episode's latest reply (or holds it alone): no other copy can be newer,
        # unless another worker extended it since, which claiming the transcript finds out.
        if episode is not None and (digest == ordered[-1] or episode.local or not self.up):
            return episode, digest
        try:
            row = await self.run(self.store.find_prefix, tenant, context, ordered)
        except StoreDown:
            return episode, digest
        if row is None:
            return None, None
        return self.adopt(row), row["prefix"]

    async def claim(self, episode: LiveEpisode, matched: str | None) -> tuple[LiveEpisode, str | None]:
        """Whether a call found by its transcript `matched` continues `episode` or is a fork, decided before its
        upstream is asked (a streamed reply's header goes out before the reply is recorded): it continues when it
        takes the transcript in the pool first. Returns the call's episode (`episode`, or a fork of it) and the
        prefix its record expects (this call's token; `matched` when the pool was not asked; None for a fork)."""
        if matched is None or episode.session is not None or episode.row_version is None or episode.local \
                or not self.up:
            return episode, matched  # named (never forks), new, or served from this worker's copy
        token = f"claim-{uuid.uuid4().hex}"  # never a transcript's hash (64 hex digits)
        try:
            version = await self.run(self.store.claim, episode.episode_id, matched, token, utcnow())
        except StoreDown:
            return episode, matched
        if version is None:  # moved on (another worker's call extended this state first) or ended
            return self._fork(episode), None
        episode.row_version, episode.last_active = version, time.monotonic()
        return episode, token

    async def release(self, episode: LiveEpisode, token: str, matched: str) -> None:
        """Give back the transcript a call claimed and got no reply for, so that the conversation continues from
        it on any worker. While the pool is down the token stays: the conversation's next call is a fork."""
        try:
            await self.run(self.store.release, episode.episode_id, token, matched)
        except StoreDown:
            pass

    def adopt(self, row: dict[str, Any]) -> LiveEpisode:
        """This worker's copy of a row read from the pool: the cached one brought up to date, or a new one."""
        episode = self.index.live.get(row["episode_id"])
        if episode is None:
            episode = LiveEpisode.from_row(row)
            self.index.add(episode)
        elif not episode.local and not episode.lock.locked():
            fresh = LiveEpisode.from_row(row)
            for name in ("row_version", "calls", "prompt_tokens", "completion_tokens", "latency_ms", "final_tool",
                         "last_active"):
                setattr(episode, name, getattr(fresh, name))
        if episode.session is None and not episode.lock.locked():
            self.index.touch(episode, row["prefix"])
        return episode

    # -- recording a call ----------------------------------------------------------------------------

    async def record(self, episode: LiveEpisode, matched: str | None, call: Call) -> LiveEpisode:
        """Record an answered call in the pool; returns the episode that holds it (`episode`, or the one a
        fork or a concurrent start made it part of)."""
        if episode.local or not self.up:
            return self._keep_local(episode, call)
        try:
            for _ in range(3):  # a start and an end racing on one session name can each undo the other once
                if episode.row_version is None:
                    joined = await self._insert(episode, call)
                    if joined is None:
                        return episode
                    episode, matched = joined, None
                counted = await self.run(self.store.extend, episode.episode_id, self._values(call),
                                         {"prompt_tokens": call.prompt_tokens,
                                          "completion_tokens": call.completion_tokens,
                                          "latency_ms": call.latency_ms},
                                         expected_prefix=matched if episode.session is None else None)
                if counted is not None:
                    call.apply(episode, counted)
                    self.index.touch(episode, call.prefix)
                    return episode
                # Gone (ended by some worker) or moved on (another call extended the same state first): this
                # call starts an episode of its own.
                episode = self._fork(episode)
            raise StoreDown("no episode took the call")
        except StoreDown:
            return self._keep_local(episode, call)

    async def _insert(self, episode: LiveEpisode, call: Call) -> LiveEpisode | None:
        """Insert a new episode holding its first call (None: done); or the episode another worker started
        under the same session name meanwhile, which this call then extends."""
        row = {**episode.row(), "messages": call.messages, "prefix": call.prefix, "calls": 1,
               "prompt_tokens": call.prompt_tokens, "completion_tokens": call.completion_tokens,
               "latency_ms": call.latency_ms, "final_tool": call.final_tool or episode.final_tool,
               "tools": call.tools if call.tools is not None else episode.tools}
        if await self.run(self.store.insert, row):
            call.apply(episode, {"calls": 1, "row_version": 1, "final_tool": row["final_tool"]})
            self.index.touch(episode, call.prefix)
            self.live_estimate += 1
            return None
        other = None
        if episode.session is not None:
            found = await self.run(self.store.find_session, episode.tenant, episode.context, episode.session)
            if found is not None:
                other = self.adopt(found)
        self.discard(episode)
        if other is None:
            other = self._fork(episode)  # its id was taken: start under a new one
        return other

    def _fork(self, episode: LiveEpisode) -> LiveEpisode:
        """A new episode in place of `episode` (gone or moved on), served by the same version."""
        self.discard(episode)
        fork = LiveEpisode(episode_id=str(uuid.uuid4()), tenant=episode.tenant, context=episode.context,
                           task=episode.task, version=episode.version, spec=episode.spec, session=episode.session,
                           final_tool=episode.final_tool, environment=episode.environment, category=episode.category,
                           tools=episode.tools)
        self.index.add(fork)
        return fork

    @staticmethod
    def _values(call: Call) -> dict[str, Any]:
        values: dict[str, Any] = {"messages": call.messages, "last_active": utcnow(), "prefix": call.prefix}
        if call.final_tool:
            values["final_tool"] = call.final_tool
        if call.tools is not None:
            values["tools"] = call.tools
        return values

    def _keep_local(self, episode: LiveEpisode, call: Call) -> LiveEpisode:
        episode.local = True
        call.apply(episode)
        self.index.touch(episode, call.prefix)
        return episode

    async def sync(self, episode: LiveEpisode) -> None:
        """Put a copy kept while the pool was down back into the pool (raises StoreDown if it still is)."""
        if episode.row_version is not None and await self.run(self.store.replace, episode.row()):
            episode.row_version += 1
            episode.local = False
            return
        if episode.row_version is not None:
            # Ended meanwhile by another worker (which wrote what it had): the rest is an episode of its own.
            self.index.remove(episode)
            episode.episode_id, episode.gone, episode.row_version = str(uuid.uuid4()), False, None
            self.index.add(episode)
        if not await self.run(self.store.insert, episode.row()):
            # Its session name was taken meanwhile: it stays an episode of its own, found by its id.
            self.index.remove(episode)
            episode.gone, episode.session = False, None
            self.index.add(episode)
            if not await self.run(self.store.insert, episode.row()):
                raise StoreDown("episode id taken")
        self.live_estimate += 1
        episode.row_version, episode.local = 1, False

    async def keep_alive(self, episode: LiveEpisode) -> None:
        """Before a call on an episode quiet for over half the idle timeout: mark it active in the pool, so that
        no worker ends it as idle while the upstream answers."""
        if episode.row_version is None or episode.local or not self.up:
            return
        if time.monotonic() - episode.last_active > self.idle_s / 2:
            try:
                await self.run(self.store.touch, episode.episode_id, utcnow())
            except StoreDown:
                pass

    def discard(self, episode: LiveEpisode) -> None:
        """Drop this worker's copy (the pool's stays as it is)."""
        self.index.remove(episode)

    def idle_before(self) -> Any:
        return utcnow() - timedelta(seconds=self.idle_s)


def episode_of_row(row: dict[str, Any]) -> Episode:
    """The record of a live episode read from the pool."""
    return LiveEpisode.from_row(row).record()

"""An OpenAI-compatible gateway: any agent built on the `openai` client runs on the arbiter by changing its base URL.

This module is the gateway's engine: for each call it finds or starts the live episode (sessions.py),
calls the version routing picked, records the reply and writes ended episodes to the pool. The endpoints are
in routes.py, the wire format in wire.py and stream.py, replies in messages.py;
messages reach our policies in the chat template's shape (environments/messages.py).

All calls of an episode go to the version routing picked for its first call (named sessions hash to the
version, so they stay put across workers and restarts). Live episodes are kept in the pool (shared.py,
agent_rl/pool/live.py): any worker process continues any episode, and any worker ends it. The episode id is in the `X-Agent-RL-Episode`
response header and in the body (`agent_rl.episode_id`, also on the final stream chunk).

A relayed stream's header goes out before its reply is recorded, so such a call is given its episode before its
upstream is asked (`_claim`): a conversation found by its transcript continues only if the call takes that
transcript in the pool first; one another worker's call extended first is a fork. Every other reply (a whole
one, or ours streamed whole) is sent after it is recorded, where the same test decides it (one pool write
a call, not two). The header can still name another episode than the last chunk (which names where the call was
recorded) when what decides it comes after the header: the episode ended by another worker while the call is
in flight (an end or feedback sent there, the idle timeout if the call outlasts it; for a named session, which
is not claimed, also `max_live` or that worker's shutdown), whereupon the call is recorded as a new episode; a
named session's first call racing another worker's first call of that name, whereupon it joins that worker's
episode; or a conversation found while the pool could not be reached, which another worker extended before the
call was recorded (a fork).

An episode is written to the pool when it ends, exactly once whichever worker ends it: `POST
/v1/episodes/{id}/end`, a final-tool call, feedback on it, the idle timeout, `max_live` (the least recently
active beyond it), or the arbiter shutting down (each worker ends the episodes whose latest call it recorded;
those of a worker that was killed stay live in the pool until the idle timeout ends them). It holds the messages exactly as the client sent them
followed by the last reply, token counts, upstream latency and the serving version; its outcome is
`unjudged` with no reward, so curation never takes it as a positive. Writes retry with backoff; an
explicit end that still cannot write answers 503 and the episode stays queued (the background flusher
keeps retrying). A request that fails validation or upstream leaves no trace in any episode.

Upstreams: our policies through `Policy.act` (messages and tools converted both ways), or an OpenAI-compatible
API (`openai:{...}` specs, upstreams.py) that gets the request forwarded. Streamed requests (`stream: true`)
to an OpenAI-compatible upstream are relayed chunk by chunk; our policies' replies are produced whole and
then sent as server-sent events. Either way the reply is recorded by the gateway, not by the client's
connection: a client that hangs up mid-stream loses nothing from its episode.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from agent_rl.environments.messages import template_messages, text_of
from agent_rl.agent.policy import Policy
from agent_rl.environments.policy import PolicyUnavailable
from agent_rl.arbiter.gateway.messages import turn_to_message, undeclared_tools, upstream_message
from agent_rl.arbiter.gateway.sessions import (
    DEFAULT_CONTEXT,
    DEFAULT_ENVIRONMENT,
    LiveEpisode,
    call_hashes,
    transcript_hash,
)
from agent_rl.arbiter.gateway.shared import Call, SharedSessions, StoreDown, episode_of_row
from agent_rl.arbiter.gateway.stream import StreamedReply, sse_bytes
from agent_rl.arbiter.gateway.wire import ChatRequest, GatewayError, completion_body, openai_error, usage_counts
from agent_rl.arbiter.keys import ApiKey
from agent_rl.arbiter.policies import PolicyLoadError
from agent_rl.arbiter.routing import public_version
from agent_rl.arbiter.upstreams import OpenAIUpstream, UpstreamError
from agent_rl.finetuning.serving import FINE_TUNED_PREFIX, FineTunedModels
from agent_rl.records import Episode

log = logging.getLogger("agent_rl.arbiter.gateway")

DEFAULT_MAX_TOKENS = 512
# How a call found its episode: the transcript it matched, the prefix its record expects (the token it claimed
# that transcript with, shared.py), and the running hash of its messages (None: a named session).
Found = tuple[str | None, str | None, Any]


class RateLimit:
    """A token bucket per API key: `burst` calls at once, refilled at `per_s` calls a second."""

    def __init__(self, per_s: float, burst: int) -> None:
        self.per_s = per_s
        self.burst = burst
        self._buckets: dict[str, tuple[float, float]] = {}

    def check(self, key: ApiKey) -> None:
        """Take one call from the key's bucket; 429 (with Retry-After) when it is empty."""
        now = time.monotonic()
        tokens, at = self._buckets.get(key.id, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.per_s)
        if tokens < 1:
            wait = (1 - tokens) / self.per_s
            self._buckets[key.id] = (tokens, now)
            raise GatewayError(429, f"rate limit of {self.per_s:g} requests per second for this API key exceeded; "
                                    f"retry after {wait:.1f} s", code="rate_limit_exceeded",
                               headers={"Retry-After": str(max(1, round(wait + 0.5)))})
        self._buckets[key.id] = (tokens - 1, now)


class PoolDown(RuntimeError):
    """The episode could not be written in time; it stays queued and is retried."""


class Gateway:
    """Sessions, routing, upstream calls and episode writes for the OpenAI-compatible endpoints."""

    def __init__(self, service: Any, idle_s: float = 300.0, write_retry_s: float = 3.0,
                 rate_per_s: float = 20.0, rate_burst: int = 40, max_live: int = 10_000,
                 fine_tuned: FineTunedModels | None = None) -> None:  # fmt: skip
        """`fine_tuned`: the tenants' fine-tuned models, each served by its name (`model`) to its own tenant
        instead of by the routing table."""
        self.service = service
        self.fine_tuned = fine_tuned
        self.idle_s = idle_s
        self.write_retry_s = write_retry_s
        self.max_live = max_live
        self.rate = RateLimit(rate_per_s, rate_burst)
        self.shared = SharedSessions(service.pool, idle_s)
        self.index = self.shared.index  # this worker's cache of the live episodes
        self.pending: dict[str, LiveEpisode] = {}  # ended by this worker, not yet in the pool
        self.written = 0
        self._task: asyncio.Task | None = None
        self._pumps: set[asyncio.Task] = set()  # relays of streaming upstreams in flight
        self._writes: set[asyncio.Task] = set()  # background episode writes in flight
        self._flushing = False

    def live_count(self) -> int:
        """Live episodes in the pool, all workers' (as of the last background round, kept up since)."""
        return max(0, self.shared.live_estimate) + sum(
            1 for e in self.index.live.values() if e.local and e.row_version is None)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            self.shared.live_estimate = await self.shared.run(self.shared.store.count)
        except StoreDown:
            pass
        self._task = asyncio.create_task(self._background(), name="gateway-flusher")

    async def close(self) -> None:
        """Write what this worker holds: the episodes it served last (another worker's latest stay live there)."""
        if self._pumps:  # streams in flight finish (and are recorded) first
            await asyncio.wait(list(self._pumps), timeout=30)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._writes:
            await asyncio.wait(list(self._writes), timeout=max(self.write_retry_s, 5.0))
        for episode in list(self.index.live.values()):
            if episode.calls:
                try:
                    await self._end_episode(episode, latest_only=True)
                except PoolDown:
                    pass  # queued: flushed below
        await self._flush(deadline_s=max(self.write_retry_s, 5.0))
        if self.pending:
            # Nothing is dropped silently: the operators learn how many and which.
            log.error("gateway shut down with %d episode(s) not written to the pool: %s",
                      len(self.pending), sorted(self.pending))
        await self.shared.close()
        for policy in self.service.policies._policies.values():  # noqa: SLF001 - close upstream connections
            if isinstance(policy, OpenAIUpstream):
                await policy.aclose()

    async def _background(self) -> None:
        tick = max(0.05, min(1.0, self.idle_s / 4))
        while True:
            await asyncio.sleep(tick)
            try:
                await self._round()
            except Exception:  # keep flushing whatever happens to one round
                log.exception("gateway background round failed")

    async def _round(self) -> None:
        """End idle episodes (this worker's own copies, then any in the pool), put copies kept while the pool
        was down back, write what is queued, recount the live episodes."""
        now = time.monotonic()
        for episode in list(self.index.live.values()):
            if not episode.lock.locked() and now - episode.last_active >= self.idle_s:
                if episode.local:
                    self._end_soon(episode)
                else:
                    self.shared.discard(episode)  # the pool's copy is ended below (by whichever worker)
        if not self.shared.up:
            return
        try:
            before = self.shared.idle_before()
            for episode_id in await self.shared.run(self.shared.store.idle, before):
                cached = self.index.live.get(episode_id)
                if cached is not None and (cached.lock.locked() or cached.local):
                    continue
                if cached is not None:
                    self.shared.discard(cached)
                await self._end_pooled(episode_id, idle_before=before)
            for episode in [e for e in self.index.live.values() if e.local and not e.lock.locked()]:
                await self.shared.sync(episode)
            if self.pending and not self._flushing:
                await self._flush(deadline_s=0)
            self.shared.live_estimate = await self.shared.run(self.shared.store.count)
        except StoreDown:
            pass
        await self.shared.checkpoint()

    # -- episodes ----------------------------------------------------------------------------------

    async def _new(self, key: ApiKey, session: str | None, request: ChatRequest, context: str) -> LiveEpisode:
        request_key = f"gateway\0{key.tenant}\0{session}" if session is not None else None
        spec = self.fine_tuned.pinned(key.tenant, request.model) if self.fine_tuned is not None else None
        if spec is not None:
            version = request.model  # a fine-tuned model asked for by name: that model, whatever the routing says
        elif request.model.startswith(FINE_TUNED_PREFIX):
            raise GatewayError(404, "the requested fine-tuned model does not exist or you do not have access to it",
                               param="model", code="model_not_found")
        else:
            version, spec = self.service.router.choose(request_key)
        metadata = request.metadata or {}
        task = metadata.get("task") or next(
            (text_of(m.content) for m in request.messages if m.role == "user"), "")
        episode = LiveEpisode(episode_id=str(uuid.uuid4()), tenant=key.tenant, context=context, task=task,
                              version=version, spec=spec, session=session,
                              environment=metadata.get("environment", DEFAULT_ENVIRONMENT),
                              category=metadata.get("category") or None)
        if self.shared.live_estimate >= self.max_live or len(self.index.live) >= self.max_live:
            await self._evict()
        self.index.add(episode)
        return episode

    async def _evict(self) -> None:
        """End the least recently active episodes beyond `max_live` (they are written, not dropped)."""
        try:
            if self.shared.up:
                over = await self.shared.run(self.shared.store.count) - self.max_live + 1
                self.shared.live_estimate = over + self.max_live - 1
                if over > 0:
                    log.info("the gateway holds %d live episodes: ending the %d least recently active",
                             self.shared.live_estimate, over)
                for episode_id in (await self.shared.run(self.shared.store.oldest, over)) if over > 0 else ():
                    cached = self.index.live.get(episode_id)
                    if cached is None or not (cached.lock.locked() or cached.local):
                        if cached is not None:
                            self.shared.discard(cached)
                        await self._end_pooled(episode_id)
        except StoreDown:
            pass
        for episode in list(self.index.live.values()):  # this worker's copies: oldest first
            if len(self.index.live) < self.max_live:
                return
            if not episode.lock.locked():
                if episode.local:
                    self._end_soon(episode)
                else:
                    self.shared.discard(episode)

    async def _end_pooled(self, episode_id: str, key: ApiKey | None = None, row_version: int | None = None,
                          idle_before: Any = None) -> Episode | None:  # fmt: skip
        """End a live episode in the pool, whoever served it (with `key`, only one of its tenant and contexts);
        None when there was nothing to end. Raises StoreDown."""
        def build(row: dict[str, Any]) -> Episode | None:
            if key is not None and (row["tenant"] != key.tenant or not key.may_use(row["context"])):
                return None
            return episode_of_row(row)

        record = await self.shared.run(self.shared.store.end, episode_id, build, row_version=row_version,
                                       idle_before=idle_before)
        if record is not None:
            self.written += 1
            self.shared.live_estimate -= 1
        return record

    async def _end_episode(self, episode: LiveEpisode, latest_only: bool = False) -> Episode | None:
        """Take this worker's copy out of serving and write the episode: the pool's row, or this copy when it is
        ahead of the pool (`local`). Raises PoolDown when that fails within the retry budget (it stays queued)."""
        self.shared.discard(episode)
        if episode.calls == 0:
            return None
        if not episode.local:
            try:
                return await self._end_pooled(episode.episode_id,
                                              row_version=episode.row_version if latest_only else None)
            except StoreDown:
                pass
        self.pending[episode.episode_id] = episode
        return await self._write_retrying(episode, self.write_retry_s)

    async def _write(self, episode: LiveEpisode) -> Episode | None:
        if episode.local:
            record = episode.record()
            await self.shared.run(self.shared.store.finish, record)
            self.written += 1
        else:  # ended while the pool was down: end it there now
            record = await self._end_pooled(episode.episode_id)
        self.pending.pop(episode.episode_id, None)
        return record

    async def _write_retrying(self, episode: LiveEpisode, deadline_s: float) -> Episode | None:
        """Write with backoff (0.05 s doubling, at most 1 s apart) until it lands or `deadline_s` passes."""
        deadline = time.monotonic() + deadline_s
        wait = 0.05
        while True:
            try:
                return await self._write(episode)
            except StoreDown as exc:
                if episode.episode_id not in self.pending:
                    return None  # written meanwhile by another path
                if time.monotonic() + wait > deadline:
                    log.warning("episode %s not written to the pool yet (%s); it stays queued", episode.episode_id, exc)
                    raise PoolDown(str(exc)) from exc
                await asyncio.sleep(wait)
                wait = min(wait * 2, 1.0)

    async def _flush(self, deadline_s: float) -> None:
        self._flushing = True
        try:
            for episode in list(self.pending.values()):
                try:
                    await self._write_retrying(episode, deadline_s)
                except PoolDown:
                    return  # the pool is down: try the rest on the next round
        finally:
            self._flushing = False

    def _end_soon(self, episode: LiveEpisode) -> None:
        self.shared.discard(episode)
        task = asyncio.create_task(self._end_background(episode))
        self._writes.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._writes.discard)

    async def _end_background(self, episode: LiveEpisode) -> None:
        try:
            await self._end_episode(episode)
        except PoolDown:
            pass  # queued; the background round retries

    async def end(self, key: ApiKey, episode_id: str) -> tuple[Episode | None, bool]:
        """End a live episode of this key's tenant, whichever worker served it, and write it now. Returns
        (record, found); ending one already written is answered as found, so a retry is safe.

        Raises PoolDown when the write did not land within the retry budget (the episode stays queued).
        """
        episode = self.index.live.get(episode_id)
        if episode is not None and episode.tenant == key.tenant and key.may_use(episode.context):
            async with episode.lock:
                if not episode.gone:
                    record = await self._end_episode(episode)
                    if record is not None:
                        return record, True
        queued = self.pending.get(episode_id)
        if queued is not None and queued.tenant == key.tenant and key.may_use(queued.context):
            record = await self._write_retrying(queued, self.write_retry_s)
            if record is not None:
                return record, True
        try:
            record = await self._end_pooled(episode_id, key=key)
            if record is None:  # not live (anywhere): written already, perhaps, by any worker
                record = await self.shared.run(self.service.pool.get, episode_id)
        except StoreDown as exc:
            raise PoolDown(str(exc)) from exc
        if record is None or record.tenant != key.tenant or not key.may_use(record.context):
            return None, False
        return record, True

    # -- a call --------------------------------------------------------------------------------------

    async def complete(self, key: ApiKey, session: str | None, request: ChatRequest,
                       body: dict[str, Any]) -> tuple[dict[str, Any] | AsyncIterator[bytes], LiveEpisode, float | None]:  # fmt: skip
        """The completion, its episode and the seconds the upstream took; for a streamed request to an
        OpenAI-compatible upstream, the server-sent events relayed as they come (and None for the seconds)."""
        metadata = request.metadata or {}
        context = metadata.get("context", DEFAULT_CONTEXT).strip()
        if not key.may_use(context):
            raise GatewayError(403, "this API key may not use the requested context", param="metadata.context",
                               log_detail=f"key {key.id!r} may not use the requested context")
        messages = body["messages"]
        hashes, digest = call_hashes(messages) if session is None else ({}, None)
        while True:
            episode, matched = await self.shared.find(key.tenant, context, session, hashes)
            if episode is None:
                episode, matched = await self._new(key, session, request, context), None
            await episode.lock.acquire()
            if episode.gone or (matched is not None and episode.prefix != matched):
                episode.lock.release()
                continue  # ended, or extended by a call that had the lock first (this one is a fork): look again
            handed_over = False
            found = (matched, matched, digest)
            try:
                await self.shared.keep_alive(episode)
                policy = await self._policy(episode.spec)
                if request.stream and isinstance(policy, OpenAIUpstream):
                    episode, found = await self._claim(episode, found)
                    relay = await self._start_relay(episode, found, policy, request, body)
                    handed_over = True  # the relay's pump releases the lock when the upstream is done
                    return relay, episode, None
                message, usage, seconds = await self._call_upstream(episode, policy, request, body)
                served = await self._record(episode, found, request, messages, message, usage, seconds)
                ended = self._ends(served, message)
                if ended:
                    self._end_soon(served)
                return completion_body(message, usage, self._meta(served, ended)), served, seconds
            except BaseException:
                await asyncio.shield(self._abandon(episode, found))
                raise
            finally:
                if not handed_over:
                    episode.lock.release()

    async def _claim(self, episode: LiveEpisode, found: Found) -> tuple[LiveEpisode, Found]:
        """Continue `episode` or fork it before the upstream is asked, so that the episode id a relayed stream's
        header carries is the one the call is recorded in. A fork is a new episode, locked in place of the one it
        forks from."""
        matched, _, digest = found
        claimed, expected = await self.shared.claim(episode, matched)
        if claimed is not episode:
            await claimed.lock.acquire()  # nobody else can hold it yet
            episode.lock.release()
            matched = None
        return claimed, (matched, expected, digest)

    async def _abandon(self, episode: LiveEpisode, found: Found) -> None:
        """A call that got no reply leaves no trace: a first call no episode, a claimed transcript given back."""
        matched, expected, _ = found
        if episode.calls == 0 and episode.row_version is None:
            self.shared.discard(episode)
        elif matched is not None and expected != matched:
            await self.shared.release(episode, expected, matched)

    @staticmethod
    def _ends(episode: LiveEpisode, message: dict[str, Any]) -> bool:
        return bool(episode.final_tool) and any(
            call["function"]["name"] == episode.final_tool for call in message.get("tool_calls") or [])

    async def _start_relay(self, episode: LiveEpisode, found: Found, policy: OpenAIUpstream,
                           request: ChatRequest, body: dict[str, Any]) -> AsyncIterator[bytes]:  # fmt: skip
        """Open the upstream's stream (errors before its first byte are answered with a status code), then
        pump it into a queue from a task of its own: a client that hangs up stops reading, never the pump,
        so the reply is recorded whole."""
        forwarded = {k: v for k, v in body.items() if k not in ("metadata", "stream", "stream_options")}
        started = time.perf_counter()
        try:
            response = await policy.open_stream(forwarded)
        except UpstreamError as exc:
            log.error("gateway upstream for version %s: %s", episode.version, exc)
            raise GatewayError(exc.status, exc.client_message, code="upstream_error") from exc
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        include_usage = bool((request.stream_options or {}).get("include_usage"))
        task = asyncio.create_task(self._pump(episode, found, policy, request, body, response, queue, include_usage,
                                              started))
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)

        async def relay() -> AsyncIterator[bytes]:
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield item

        return relay()

    async def _pump(self, episode: LiveEpisode, found: Found, policy: OpenAIUpstream,
                    request: ChatRequest, body: dict[str, Any], response: Any, queue: asyncio.Queue,
                    include_usage: bool, started: float) -> None:  # fmt: skip
        reply = StreamedReply()
        complete = False
        try:
            async for chunk in policy.events(response):
                chunk["model"] = public_version(episode.version)
                if reply.add(chunk):
                    queue.put_nowait(sse_bytes(chunk))
            complete = True
        except Exception as exc:  # noqa: BLE001 - whatever broke, the client gets an error event, nothing is recorded
            log.error("gateway upstream stream for version %s broke: %s", episode.version, type(exc).__name__)
            queue.put_nowait(sse_bytes(openai_error(502, "the upstream model stopped answering mid-stream; try again",
                                                    code="upstream_error")))
        try:
            if complete:
                message, counts = reply.message(), reply.counts()
                served = await self._record(episode, found, request, body["messages"], message, counts,
                                            time.perf_counter() - started)
                ended = self._ends(served, message)
                if ended:
                    self._end_soon(served)
                for item in reply.closing(self._meta(served, ended), counts, include_usage):
                    queue.put_nowait(sse_bytes(item))
            else:
                await self._abandon(episode, found)
        finally:
            queue.put_nowait(b"data: [DONE]\n\n")
            queue.put_nowait(None)
            response.release()
            episode.lock.release()

    async def _record(self, episode: LiveEpisode, found: Found, request: ChatRequest,
                      messages: list[dict[str, Any]], message: dict[str, Any], usage: dict[str, int],
                      seconds: float) -> LiveEpisode:  # fmt: skip
        """Record an answered call (in the pool, shared_sessions.py); returns the episode that holds it."""
        _, expected, digest = found
        tools = [t.model_dump(mode="json", exclude_none=True) for t in request.tools] if request.tools else None
        call = Call(messages=[*messages, message], prompt_tokens=usage["prompt_tokens"],
                    completion_tokens=usage["completion_tokens"], latency_ms=seconds * 1000,
                    prefix=transcript_hash(digest, message) if digest is not None else None,
                    final_tool=(request.metadata or {}).get("final_tool") or None, tools=tools)
        return await self.shared.record(episode, expected, call)

    async def _policy(self, spec: str) -> Policy:
        policies = self.service.policies
        if policies.is_loaded(spec):
            return policies.get(spec)
        try:
            return await asyncio.get_running_loop().run_in_executor(self.service.executor, policies.get, spec)
        except PolicyLoadError as exc:
            log.error("policy cannot be loaded for a gateway request: %s", exc)
            raise GatewayError(503, "the model version chosen for this episode cannot be loaded; try again later",
                               code="model_unavailable") from exc

    async def _call_upstream(self, episode: LiveEpisode, policy: Policy, request: ChatRequest,
                             body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int], float]:  # fmt: skip
        started = time.perf_counter()
        if isinstance(policy, OpenAIUpstream):
            forwarded = {k: v for k, v in body.items() if k not in ("metadata", "stream", "stream_options")}
            try:
                payload = await policy.complete(forwarded)
            except UpstreamError as exc:
                log.error("gateway upstream for version %s: %s", episode.version, exc)
                raise GatewayError(exc.status, exc.client_message, code="upstream_error") from exc
            seconds = time.perf_counter() - started
            usage = payload.get("usage") or {}
            counts = usage_counts(usage.get("prompt_tokens"), usage.get("completion_tokens"))
            message = upstream_message(payload)
            self._check_tools(episode, message, body.get("tools"))
            return message, counts, seconds
        tools = [] if request.tool_choice == "none" else body.get("tools") or []
        conversation = template_messages(body["messages"])
        max_tokens = request.max_completion_tokens or request.max_tokens or DEFAULT_MAX_TOKENS
        try:
            turns = await asyncio.get_running_loop().run_in_executor(
                self.service.executor, policy.act, [conversation], tools, max_tokens)
            turn = turns[0]
        except PolicyUnavailable as exc:  # its engine is down: the client may retry; the cause is for the log
            raise GatewayError(503, "the model version chosen for this episode is unavailable now; try again later",
                               code="model_unavailable", headers=exc.retry_after(), log_detail=str(exc)) from exc
        except Exception as exc:
            log.error("gateway policy for version %s failed: %s: %s", episode.version, type(exc).__name__, exc)
            raise GatewayError(502, "the model failed to answer; try again later", code="upstream_error") from exc
        seconds = time.perf_counter() - started
        message = turn_to_message(turn)
        self._check_tools(episode, message, tools)
        return message, usage_counts(turn.prompt_tokens, turn.completion_tokens), seconds

    @staticmethod
    def _check_tools(episode: LiveEpisode, message: dict[str, Any], tools: list[dict[str, Any]] | None) -> None:
        """Refuse a reply calling a tool the client did not declare (nothing of it is recorded). The caller learns
        how many, not which: the names belong to whatever agent the version was trained for."""
        names = undeclared_tools(message, tools)
        if names:
            log.warning("gateway version %s called undeclared tools %s; reply refused", episode.version, names)
            raise GatewayError(502, f"the version routed for this episode ({public_version(episode.version)}) "
                                    f"answered with {len(names)} tool(s) you did not declare; route a version that "
                                    "knows your tools (PUT /v1/routing)", code="undeclared_tool")

    @staticmethod
    def _meta(episode: LiveEpisode, ended: bool) -> dict[str, Any]:
        """The gateway's own field (`agent_rl`) on a reply: the episode, its version, whether it ended."""
        return {"episode_id": episode.episode_id, "policy_version": public_version(episode.version),
                "episode_ended": ended}

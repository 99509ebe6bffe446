"""Which live episode a gateway call belongs to, and this worker's cache of the live episodes.

Every call belongs to one live episode:
  - named by the caller: the session in the URL (`/s/{session}/v1`, for SDKs that only take a base URL) or
    the `X-Agent-RL-Episode` header (the episode id the gateway returned works too). Names are scoped to
    the key's tenant and the declared context: another tenant's name, or id, starts an episode of its own
    and never touches this one;
  - else grouped by the conversation it extends: a call whose messages start with an episode's whole
    transcript (its last request plus the reply) continues it; anything else starts a new episode.
The transcript is compared as SDKs send it back (`_canonical`), not byte for byte.

Live episodes live in the pool (`gateway_live`, agent_rl/pool/live.py), so any worker process continues any
session and a killed worker loses nothing it had recorded; `SessionIndex` is one worker's cache of them
(shared.py keeps it honest against the pool). While the pool is down a worker serves from its cache
and keeps its own changes (`LiveEpisode.local`) until the pool is back.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agent_rl.environments.messages import text_of
from agent_rl.environments.gateway import GatewayEnvironment
from agent_rl.records import Episode, Outcome, utcnow
from agent_rl.utc import as_utc

DEFAULT_CONTEXT = "gateway"
# Live traffic of an agent that is no plug-in of ours (environments/gateway): curation and SFT take it, GRPO cannot
# run its tools.
DEFAULT_ENVIRONMENT = GatewayEnvironment.name


def _canonical(message: dict[str, Any]) -> list[Any]:
    """What identifies a message when a client sends it back: SDKs add or drop empty fields
    (`refusal: null`, `content: null` vs "") when they re-serialize an assistant reply."""
    calls = [[c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")]
             for c in message.get("tool_calls") or []]
    return [message.get("role"), text_of(message.get("content")), calls, message.get("tool_call_id")]


def prefix_hashes(messages: list[dict[str, Any]]) -> dict[int, str]:
    """Hash of messages[:i + 1] for every assistant message i (where an earlier reply can end)."""
    return call_hashes(messages)[0]


def call_hashes(messages: list[dict[str, Any]]) -> tuple[dict[int, str], Any]:
    """`prefix_hashes` of a call's messages, and the running digest after all of them (`transcript_hash`
    adds the reply to it), so that a call hashes its conversation once."""
    digest = hashlib.sha256()
    out: dict[int, str] = {}
    for index, message in enumerate(messages):
        _feed(digest, message)
        if message.get("role") == "assistant":
            out[index] = digest.hexdigest()
    return out, digest


def transcript_hash(digest: Any, reply: dict[str, Any]) -> str:
    """The hash by which the next call finds the episode: its messages (`digest`) followed by the reply."""
    digest = digest.copy()
    _feed(digest, reply)
    return digest.hexdigest()


def _feed(digest: Any, message: dict[str, Any]) -> None:
    digest.update(json.dumps(_canonical(message), ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    digest.update(b"\x1e")


# -- live episodes -------------------------------------------------------------------------------


@dataclass(eq=False)
class LiveEpisode:
    """One episode while it is served: what it will be stored as, and what serving it needs (its lock)."""

    episode_id: str
    tenant: str
    context: str
    task: str
    version: str
    spec: str
    session: str | None
    final_tool: str | None = None
    environment: str = DEFAULT_ENVIRONMENT
    category: str | None = None  # the caller's task category (curation balances and gates on it)
    tools: list[dict[str, Any]] | None = None  # as the client declared them on its latest call
    created_at: Any = field(default_factory=utcnow)
    messages: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    last_active: float = field(default_factory=time.monotonic)
    prefix: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    gone: bool = False  # ended or discarded: a caller that waited on the lock must look again
    row_version: int | None = None  # the pool's version of it this copy last saw; None: not in the pool
    local: bool = False  # changed while the pool was down: this copy is ahead of the pool's

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> LiveEpisode:
        """This worker's copy of a live episode read from the pool (without its messages, unless read too)."""
        idle_s = max(0.0, (utcnow() - as_utc(row["last_active"])).total_seconds())
        return cls(episode_id=row["episode_id"], tenant=row["tenant"], context=row["context"], task=row["task"],
                   version=row["policy_version"], spec=row["spec"], session=row["session"],
                   final_tool=row["final_tool"], environment=row["environment"], category=row["task_category"],
                   tools=row.get("tools"), created_at=row["created_at"], messages=row.get("messages") or [],
                   calls=row["calls"], prompt_tokens=row["prompt_tokens"],
                   completion_tokens=row["completion_tokens"], latency_ms=row["latency_ms"],
                   last_active=time.monotonic() - idle_s, prefix=row["prefix"], row_version=row["row_version"])

    def row(self) -> dict[str, Any]:
        """What the pool holds of it (gateway_live)."""
        return {"episode_id": self.episode_id, "tenant": self.tenant, "context": self.context,
                "session": self.session, "prefix": self.prefix, "row_version": self.row_version or 1,
                "policy_version": self.version, "spec": self.spec, "environment": self.environment,
                "task_category": self.category, "task": self.task, "final_tool": self.final_tool,
                "tools": self.tools, "messages": self.messages, "calls": self.calls,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "latency_ms": self.latency_ms, "created_at": self.created_at, "last_active": utcnow()}

    def record(self) -> Episode:
        last = self.messages[-1] if self.messages else {}
        answer = text_of(last.get("content")) or None
        if answer is None and self.final_tool:
            for call in last.get("tool_calls") or []:
                if call["function"]["name"] == self.final_tool:
                    answer = call["function"]["arguments"]
        return Episode(
            episode_id=self.episode_id, created_at=self.created_at, tenant=self.tenant, environment=self.environment,
            context=self.context, tools=self.tools, task_category=self.category,
            question=self.task, policy_version=self.version, messages=self.messages, final_answer=answer,
            outcome=Outcome.UNJUDGED, reward=None, turns=self.calls, prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens, latency_ms=round(self.latency_ms, 3),
        )


class SessionIndex:
    """The live episodes, and how a call finds its own: by session name or episode id, or by the conversation
    it extends. Everything is keyed by (tenant, context, ...): a key only ever reaches episodes of its tenant
    in contexts it may use."""

    def __init__(self) -> None:
        self.live: dict[str, LiveEpisode] = {}  # by episode id, ordered by last activity (oldest first)
        self.sessions: dict[tuple[str, str, str], LiveEpisode] = {}
        self.prefixes: dict[tuple[str, str, str], deque[LiveEpisode]] = {}

    def find_session(self, tenant: str, context: str, session: str) -> LiveEpisode | None:
        """The cached episode a caller names: by session name, else by the episode id the gateway returned."""
        episode = self.sessions.get((tenant, context, session))
        if episode is None:
            by_id = self.live.get(session)  # the episode id the gateway returned, echoed back
            if by_id is not None and by_id.tenant == tenant and by_id.context == context:
                episode = by_id
        return episode

    def find_prefix(self, tenant: str, context: str, hashes: list[str]) -> tuple[LiveEpisode | None, str | None]:
        """The cached episode whose transcript is the longest of `hashes` (shortest first), and that hash."""
        for digest in reversed(hashes):
            queue = self.prefixes.get((tenant, context, digest))
            if queue:
                return queue[0], digest
        return None, None

    def add(self, episode: LiveEpisode) -> None:
        self.live[episode.episode_id] = episode
        if episode.session is not None:
            self.sessions[(episode.tenant, episode.context, episode.session)] = episode

    def touch(self, episode: LiveEpisode, prefix: str | None) -> None:
        """After a call (or a read from the pool): the episode becomes the most recently active, and one without
        a session is found by its transcript's hash `prefix`."""
        self.live.pop(episode.episode_id, None)
        self.live[episode.episode_id] = episode  # keep `live` ordered by last activity
        if episode.session is None:
            self._unindex(episode)
            episode.prefix = prefix
            if prefix is not None:
                self.prefixes.setdefault((episode.tenant, episode.context, prefix), deque()).append(episode)

    def remove(self, episode: LiveEpisode) -> None:
        """Take the episode out of serving: no call finds it again, and one waiting on its lock looks again."""
        episode.gone = True
        self.live.pop(episode.episode_id, None)
        where = (episode.tenant, episode.context, episode.session or "")
        if episode.session is not None and self.sessions.get(where) is episode:
            del self.sessions[where]
        self._unindex(episode)

    def _unindex(self, episode: LiveEpisode) -> None:
        if episode.prefix is not None:
            where = (episode.tenant, episode.context, episode.prefix)
            queue = self.prefixes.get(where)
            if queue is not None:
                try:
                    queue.remove(episode)
                except ValueError:
                    pass
                if not queue:
                    del self.prefixes[where]
            episode.prefix = None

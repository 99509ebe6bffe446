"""`GET /v1/episodes` and `GET /v1/episodes/{episode_id}`: a caller reads what the pool recorded of its traffic.

Scoped to the key's tenant and the contexts it may use (pool/tenant_view.py); another tenant's episode answers
404 exactly like a missing one. Versions are shown by their public name (a version routed by its spec would
otherwise show an upstream's address). The listing leaves the transcript out; reading one episode has it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from sqlalchemy.exc import SQLAlchemyError

from agent_rl.arbiter.gateway.wire import GatewayError
from agent_rl.arbiter.keys import ApiKey
from agent_rl.arbiter.routing import public_version
from agent_rl.pool.tenant_view import MAX_PAGE, list_episodes, read_episode
from agent_rl.records import Episode

_SUMMARY = ("episode_id", "created_at", "environment", "context", "task_category", "question", "policy_version",
            "final_answer", "outcome", "reward", "feedback", "turns", "latency_ms")


def episode_view(episode: Episode, full: bool) -> dict[str, Any]:
    """What a caller sees of one of its episodes (the transcript, tools and reward parts only when `full`)."""
    data = episode.model_dump(mode="json")
    shown = {name: data[name] for name in _SUMMARY}
    shown["policy_version"] = public_version(episode.policy_version)
    if full:
        for name in ("messages", "citations", "tools", "reward_components", "prompt_tokens", "completion_tokens"):
            shown[name] = data[name]
    return shown


def _limit_of(request: Request) -> int:
    raw = request.query_params.get("limit", "50")
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_PAGE:
        raise GatewayError(422, f"limit must be a whole number from 1 to {MAX_PAGE}", param="limit",
                           code="invalid_limit")
    return limit


async def _read(pool: Any, fn: Callable[[Any], Any]) -> Any:
    """`fn(pool)` off the event loop (blocking SQL; not on the episode threads, which may be busy with models)."""
    try:
        return await asyncio.to_thread(fn, pool)
    except SQLAlchemyError as exc:
        raise GatewayError(503, "the benchmark pool is unavailable; try again later", code="pool_unavailable",
                           log_detail=f"pool read failed: {type(exc).__name__}") from exc


def add_episode_read_routes(app: FastAPI, require_key: Callable[[Request], ApiKey],
                            pool_of: Callable[[Request], Any]) -> None:
    """Mount the read endpoints; `require_key` authenticates, `pool_of` gives the arbiter's pool."""

    @app.get("/v1/episodes")
    async def list_own(request: Request) -> dict[str, Any]:
        key = require_key(request)
        limit = _limit_of(request)
        cursor = request.query_params.get("cursor") or None
        context = request.query_params.get("context") or None
        try:
            page = await _read(pool_of(request), lambda pool: list_episodes(
                pool, key.tenant, key.context_filter(), limit=limit, cursor=cursor, context=context))
        except ValueError as exc:  # a cursor that no page returned
            raise GatewayError(422, str(exc), param="cursor", code="invalid_cursor") from exc
        return {"object": "list", "data": [episode_view(e, full=False) for e in page.episodes],
                "next_cursor": page.cursor}

    @app.get("/v1/episodes/{episode_id}")
    async def read_own(request: Request, episode_id: str) -> dict[str, Any]:
        key = require_key(request)
        episode = await _read(pool_of(request), lambda pool: read_episode(pool, episode_id, key.tenant, key.context_filter()))
        if episode is None:
            raise GatewayError(404, "no such episode among yours", param="episode_id", code="unknown_episode",
                               log_detail="an episode outside the key's scope or missing")
        return episode_view(episode, full=True)

"""What one caller may read of the pool: the episodes of its own tenant, in the contexts its key may use.

A user of the gateway needs to see what was recorded of their agent's traffic (what it asked, what was
answered, the feedback attached) without opening the pool's database, and must never see another tenant's:
every query here is filtered by tenant and contexts in SQL, and an episode outside them reads exactly like a
missing one. Newest first, paged by a cursor (created_at, episode_id) so a page never repeats or skips a row
while traffic keeps arriving.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import and_, or_, select

from agent_rl.pool import schema
from agent_rl.pool.repository import ExportCursor, PoolRepository, _row_episode
from agent_rl.records import Episode

MAX_PAGE = 200


@dataclass(frozen=True)
class TenantPage:
    """One page of a tenant's episodes, newest first; `cursor` asks for the next (older) page, None at the end."""

    episodes: list[Episode]
    cursor: str | None


def _scope(tenant: str, contexts: Collection[str] | None) -> list:
    c = schema.episodes.c
    where = [c.tenant == tenant]
    if contexts is not None:
        where.append(c.context.in_(sorted(contexts)))
    return where


def list_episodes(pool: PoolRepository, tenant: str, contexts: Collection[str] | None, *, limit: int = 50,
                  cursor: str | None = None, context: str | None = None) -> TenantPage:
    """The tenant's episodes, newest first, at most `limit` (1..MAX_PAGE); `contexts` None means every context;
    `context` narrows to one (outside the key's contexts it simply matches nothing)."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    c = schema.episodes.c
    where = _scope(tenant, contexts)
    if context is not None:
        where.append(c.context == context)
    if cursor is not None:
        try:  # the export's cursor: the same (created_at, episode_id) position, walked the other way
            after = ExportCursor.from_token(cursor)
        except ValueError as exc:
            raise ValueError("cursor: expected the value a previous page returned") from exc
        where.append(or_(c.created_at < after.created_at,
                         and_(c.created_at == after.created_at, c.episode_id < after.episode_id)))
    stmt = (select(schema.episodes).where(*where)
            .order_by(c.created_at.desc(), c.episode_id.desc()).limit(limit + 1))
    with pool.engine.connect() as conn:
        rows = conn.execute(stmt).mappings().all()
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = ExportCursor(rows[-1]["created_at"], rows[-1]["episode_id"]).to_token() if more else None
    return TenantPage(episodes=[_row_episode(row) for row in rows], cursor=next_cursor)


def read_episode(pool: PoolRepository, episode_id: str, tenant: str, contexts: Collection[str] | None) -> Episode | None:
    """One episode of the tenant in its contexts, or None (also for another tenant's: nothing tells them apart)."""
    stmt = select(schema.episodes).where(schema.episodes.c.episode_id == episode_id, *_scope(tenant, contexts))
    with pool.engine.connect() as conn:
        row = conn.execute(stmt).mappings().first()
    return _row_episode(row) if row is not None else None

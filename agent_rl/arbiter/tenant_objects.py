"""What the Files API (file_routes.py) and the fine-tuning jobs API (job_routes.py) answer alike about a tenant's
objects: one object by its id, a page of them as OpenAI's list object, and the store they live in, opened on first
use. Written once so both APIs keep answering a missing object and another tenant's the same way."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from fastapi import Request

from agent_rl.arbiter.gateway.wire import GatewayError

T = TypeVar("T")


def opened_once(request: Request, attribute: str, lock: threading.Lock, open_store: Callable[[], T]) -> T:
    """The store the app's state keeps as `attribute`, opened by the first request that needs it (once per worker
    process, checked again under `lock`), so building the app opens nothing."""
    store = getattr(request.app.state, attribute, None)
    if store is None:
        with lock:
            store = getattr(request.app.state, attribute, None)
            if store is None:
                store = open_store()
                setattr(request.app.state, attribute, store)
    return store


async def found_or_404(object_id: str, is_id: Callable[[str], bool], read: Callable[[], Awaitable[T | None]],
                       not_found: Callable[[str], GatewayError]) -> T:
    """What `read()` finds for the caller's tenant (an object, or True from a delete); an id not of our shape is
    never looked up, and nothing found (None, False) is the same 404 whether the id is missing or another tenant's."""
    found = await read() if is_id(object_id) else None
    if not found:
        raise not_found(object_id)
    return found


def listing(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's list object (`GET /v1/files`, `GET /v1/fine_tuning/jobs`, a job's events and checkpoints)."""
    return {"object": "list", "data": items, "has_more": has_more,
            "first_id": items[0]["id"] if items else None, "last_id": items[-1]["id"] if items else None}


async def page_or_400(read: Callable[[], Awaitable[T]], unknown_after: type[Exception], whose: str) -> T:
    """The page `read()` returns; `after` naming none of `whose` objects (a missing id and another tenant's read the
    same) is a 400 on the `after` parameter."""
    try:
        return await read()
    except unknown_after as exc:
        raise GatewayError(400, f"after must be the id of one of {whose}", param="after") from exc


def page_limit(query: Mapping[str, str], default: int, most: int) -> int:
    """The `limit` query parameter (`default` when absent), a whole number from 1 to `most`, else a 400."""
    raw = query.get("limit", str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise GatewayError(400, f"limit must be a whole number from 1 to {most}", param="limit")
    return int(raw)

"""The gateway's HTTP endpoints, mounted on the arbiter's app by app.py.

`POST /v1/chat/completions` (also `/s/{session}/v1/chat/completions`), `GET /v1/models` (also under
`/s/{session}`) and `POST /v1/episodes/{episode_id}/end`. Callers authenticate with their arbiter API key
(keys.py); every error is OpenAI's shape `{"error": {"message", "type", "param", "code"}}`, also for the
app's own errors on these paths (`is_gateway_path`). A caller names its episode with the session in the URL
(for SDKs that only take a base URL) or the `X-Agent-RL-Episode` header; the episode id comes back in that
header on every reply. The handlers only authenticate, parse and shape replies: what a call does is
`Gateway.complete` (service.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agent_rl.arbiter.gateway.service import Gateway, PoolDown
from agent_rl.arbiter.gateway.stream import sse_events, stream_chunks
from agent_rl.arbiter.gateway.wire import ChatRequest, GatewayError, parse_chat_request
from agent_rl.arbiter.keys import ApiKey
from agent_rl.arbiter.routing import public_version

EPISODE_HEADER = "X-Agent-RL-Episode"
GATEWAY_PATH_PREFIXES = ("/v1/chat/", "/v1/models", "/v1/episodes/", "/s/")
SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def is_gateway_path(path: str) -> bool:
    """Whether `path` is one of the gateway's (errors there are answered in OpenAI's shape)."""
    return path.startswith(GATEWAY_PATH_PREFIXES)


def _session_of(request: Request, path_session: str | None) -> str | None:
    """The episode the caller names (the session in the URL or the header; both must agree), or None."""
    header = request.headers.get(EPISODE_HEADER)
    if header is not None:
        header = header.strip()
    for where, value in (("the session in the URL", path_session), (f"the {EPISODE_HEADER} header", header)):
        if value is not None and not SESSION_RE.fullmatch(value):
            raise GatewayError(400, f"{where} must be 1 to 128 letters, digits, '.', '_', ':' or '-', "
                                    "starting with a letter or digit", param="session")
    if path_session is not None and header is not None and header != path_session:
        raise GatewayError(400, f"the {EPISODE_HEADER} header and the session in the URL name different episodes",
                           param="session")
    return path_session if path_session is not None else header


def add_gateway_routes(app: FastAPI, require_key: Callable[[Request], ApiKey],
                       gateway_of: Callable[[Request], Gateway]) -> None:  # fmt: skip
    """Mount the gateway's endpoints; `require_key` authenticates (raising the app's 401/403)."""

    async def chat(request: Request, session: str | None) -> Any:
        key = require_key(request)
        gateway = gateway_of(request)
        gateway.rate.check(key)
        session = _session_of(request, session)
        parsed, body = parse_chat_request(await request.body(), request.headers.get("content-type"))
        response, episode, upstream_seconds = await gateway.complete(key, session, parsed, body)
        headers = {EPISODE_HEADER: episode.episode_id}
        if not isinstance(response, dict):  # relayed from a streaming upstream as it comes
            return StreamingResponse(response, media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        request.state.episode_ms = upstream_seconds * 1000  # Server-Timing: the rest of `total` is the gateway's
        if parsed.stream:
            include_usage = bool((parsed.stream_options or {}).get("include_usage"))
            return StreamingResponse(sse_events(stream_chunks(response, include_usage)), media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        return JSONResponse(response, headers=headers)

    async def models(request: Request) -> dict[str, Any]:
        key = require_key(request)
        gateway = gateway_of(request)
        split = gateway.service.router.current()
        now = int(time.time())
        names = ["agent-rl", *(public_version(v) for v in split.versions)]
        if gateway.fine_tuned is not None:  # the caller's own fine-tuned models, asked for by name
            names += gateway.fine_tuned.names(key.tenant)
        return {"object": "list", "data": [{"id": name, "object": "model", "created": now, "owned_by": "agent-rl"}
                                           for name in names]}

    body_schema = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": ChatRequest.model_json_schema()}}}}  # the handler parses the body itself

    @app.post("/v1/chat/completions", tags=["gateway"], openapi_extra=body_schema)
    async def chat_completions(request: Request) -> Any:
        return await chat(request, None)

    @app.post("/s/{session}/v1/chat/completions", tags=["gateway"], openapi_extra=body_schema)
    async def session_chat_completions(request: Request, session: str) -> Any:
        return await chat(request, session)

    @app.get("/v1/models", tags=["gateway"])
    async def list_models(request: Request) -> dict[str, Any]:
        return await models(request)

    @app.get("/s/{session}/v1/models", tags=["gateway"])
    async def session_models(request: Request, session: str) -> dict[str, Any]:
        return await models(request)

    @app.post("/v1/episodes/{episode_id}/end", tags=["gateway"])
    async def end_episode(request: Request, episode_id: str) -> dict[str, Any]:
        key = require_key(request)
        gateway = gateway_of(request)
        if not SESSION_RE.fullmatch(episode_id):
            raise GatewayError(404, "no live episode with this id", param="episode_id")
        try:
            record, found = await gateway.end(key, episode_id)
        except PoolDown as exc:
            raise GatewayError(503, "the benchmark pool is unavailable; the episode is kept and will be written "
                                    "when it is back (ending it again is safe)", code="pool_unavailable",
                               headers={"Retry-After": "2"}) from exc
        if not found:
            raise GatewayError(404, "no live episode with this id", param="episode_id")
        return {"episode_id": episode_id, "ended": True, "written": True,
                "policy_version": public_version(record.policy_version) if record else None,
                "turns": record.turns if record else 0}

"""The arbiter's HTTP API (FastAPI): answer questions with the routed policy, log every episode, take feedback.

Callers of /v1/ask and /v1/feedback authenticate with an API key (`Authorization: Bearer <key>`,
see keys.py) that limits them to their contexts; routing changes take the separate admin token.
Every error is JSON `{"error": ..., "detail": ...}` (on the OpenAI-compatible gateway's paths, gateway/routes.py,
OpenAI's `{"error": {"message", "type", "param", "code"}}` instead); bad requests are 4xx and logged (without
bodies, credentials or the addresses asked about), a pool that cannot be written is 503; a body nested more than
`json_walk.MAX_JSON_DEPTH` levels deep (a verdict written as JSON counts on its own) is a 400 before anything
reads it. An error names only what the caller sent or may see: a context outside the key's scope is a bare 403,
and a task outside it reads as unknown. Each response carries a `Server-Timing` header (`total` and
`episode` milliseconds) so the routing and logging overhead can be measured from outside.
"""

from __future__ import annotations

import gc
import hmac
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_rl.arbiter.config import ArbiterConfig
from agent_rl.arbiter.gateway.service import Gateway, PoolDown
from agent_rl.arbiter.episode_routes import add_episode_read_routes
from agent_rl.arbiter.file_routes import add_file_routes, is_files_path, upload_body_limit
from agent_rl.arbiter.gateway.routes import add_gateway_routes, is_gateway_path
from agent_rl.arbiter.gateway.wire import GatewayError, openai_error, too_deep_message
from agent_rl.arbiter.job_routes import add_job_routes, is_jobs_path
from agent_rl.arbiter.keys import KEYS_ENV, KEYS_FILE_ENV, ApiKey
from agent_rl.arbiter.metrics import prometheus_text
from agent_rl.arbiter.policies import PolicyLoadError
from agent_rl.environments.policy import PolicyUnavailable
from agent_rl.arbiter.routing import public_version
from agent_rl.arbiter.service import (
    ArbiterService,
    OutOfScope,
    PoolUnavailable,
    TaskMismatch,
    UnknownContext,
    UnknownTask,
)
from agent_rl.arbiter.text_checks import storable_keys_and_values, storable_text, visible_text
from agent_rl.finetuning.serving import FineTunedModels
from agent_rl.curation.live import check_feedback
from agent_rl.json_walk import too_deep
from agent_rl.pool import UnknownEpisodeError

log = logging.getLogger("agent_rl.arbiter")

__all__ = ["ArbiterConfig", "create_app"]


# -- request and response bodies ----------------------------------------------------------------


class AskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    # `inbox` and `scenario_id` are the email assistant's first names for `context` and `task_id`: still accepted.
    context: str = Field(validation_alias=AliasChoices("context", "inbox"), min_length=1, max_length=320,
                         description="the environment's context to answer in (the email assistant: the mailbox's "
                                     "address; the support agent: the store)")
    question: str = Field(min_length=1, max_length=4000)
    task_id: str | None = Field(
        None, validation_alias=AliasChoices("task_id", "scenario_id"), min_length=1, max_length=200,
        description="judge against this task of the environment (keys allowed to replay only)"
    )
    request_key: str | None = Field(None, min_length=1, max_length=200, description="same key, same policy version")

    _check_text = field_validator("context", "question", "task_id", "request_key")(storable_text)
    _check_visible = field_validator("question")(visible_text)


class AskResponse(BaseModel):
    answer: str | None
    sources: list[str]
    episode_id: str
    policy_version: str
    outcome: str
    reward: float | None


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    episode_id: str = Field(min_length=1, max_length=64)
    verdict: str = Field(min_length=1, max_length=2000, description="'up', 'down' (or 'correct', 'wrong', ...), or "
                                                                   "a reward in [-1, 1] such as '0.5'")

    _check_text = field_validator("episode_id", "verdict")(storable_text)
    _check_visible = field_validator("verdict")(visible_text)
    _check_verdict = field_validator("verdict")(check_feedback)


# A JSON number in [0, 1]: strict, so `true`, "1" or "0.5" are refused instead of moving traffic.
Weight = Annotated[float, Field(strict=True, ge=0, le=1, allow_inf_nan=False)]


class RoutingUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    weights: dict[str, Weight] = Field(min_length=1, description="share of traffic per policy version, each in [0, 1]")
    specs: dict[str, str] | None = None
    reason: str = Field(min_length=1, max_length=2000)
    actor: str = Field("admin", min_length=1, max_length=200)
    stats: dict[str, Any] | None = None

    _check_text = field_validator("reason", "actor")(storable_text)
    _check_visible = field_validator("reason", "actor")(visible_text)
    _check_names = field_validator("weights", "specs")(storable_keys_and_values)


class RoutingView(BaseModel):
    weights: dict[str, float]
    specs: dict[str, str]
    default: bool
    updated_at: datetime | None = None


# -- errors -------------------------------------------------------------------------------------


class ApiError(StarletteHTTPException):
    """An HTTP error with a short `error` and a longer `detail`; `log_detail` replaces the detail in the
    log where the detail echoes what the caller sent (an email address is personal data)."""

    def __init__(
        self, status: int, error: str, detail: Any = None, headers: dict[str, str] | None = None, log_detail: Any = None
    ) -> None:
        super().__init__(status_code=status, detail=detail, headers=headers)
        self.error = error
        self.log_detail = detail if log_detail is None else log_detail


def _openai_path(path: str) -> bool:
    return is_gateway_path(path) or is_files_path(path) or is_jobs_path(path)


def _error_response(
    request: Request, status: int, error: str, detail: Any, headers: dict[str, str] | None = None, log_detail: Any = None
) -> JSONResponse:
    level = logging.ERROR if status >= 500 else logging.WARNING
    # Only method, path and the message: bodies may hold personal data, headers hold the token.
    log.log(level, "%s %s -> %d %s: %s", request.method, request.url.path, status, error,
            detail if log_detail is None else log_detail)
    if _openai_path(request.url.path):
        return JSONResponse(openai_error(status, _gateway_message(error, detail)), status_code=status, headers=headers)
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


def _gateway_message(error: str, detail: Any) -> str:
    if isinstance(detail, str) and detail:
        return detail
    if isinstance(detail, list) and detail:
        return "; ".join(f"{'.'.join(d.get('loc', []))}: {d.get('msg', '')}" for d in detail if isinstance(d, dict))
    return error


async def _on_gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
    level = logging.ERROR if exc.status >= 500 else logging.WARNING
    log.log(level, "%s %s -> %d: %s", request.method, request.url.path, exc.status, exc.log_detail)
    return JSONResponse(openai_error(exc.status, exc.message, exc.param, exc.code), status_code=exc.status,
                        headers=exc.headers)


def _validation_detail(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # The input values are left out on purpose (they can be huge or personal).
    return [{"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", "")} for e in errors]


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    content_type = request.headers.get("content-type", "")
    if "json" not in content_type and any(tuple(e.get("loc", ())) == ("body",) for e in errors):
        return _error_response(request, 415, "unsupported media type", "send the body as JSON with 'Content-Type: application/json'")
    if any(e.get("type") == "json_invalid" for e in errors):
        return _error_response(request, 400, "malformed JSON", "the request body is not valid JSON")
    return _error_response(request, 422, "invalid request", _validation_detail(errors))


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if isinstance(exc, ApiError):
        return _error_response(request, exc.status_code, exc.error, exc.detail, exc.headers, exc.log_detail)
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        # FastAPI's wording for a body that is not even text (e.g. invalid UTF-8).
        return _error_response(request, 400, "malformed JSON", "the request body is not valid UTF-8 JSON")
    error = {404: "not found", 405: "method not allowed"}.get(exc.status_code, "request refused")
    return _error_response(request, exc.status_code, error, exc.detail, getattr(exc, "headers", None))


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    if _openai_path(request.url.path):
        return JSONResponse(openai_error(500, f"internal error ({type(exc).__name__}); see the arbiter log"), status_code=500)
    return JSONResponse(
        {"error": "internal error", "detail": f"{type(exc).__name__}; see the arbiter log"}, status_code=500
    )


class RequestGuard:
    """Pure ASGI middleware: refuses bodies over the limit (413) and adds the Server-Timing header.

    The gateway's paths have their own (larger) limit: whole conversations travel in each request; so do the Files
    API's (file_routes.py): an upload of up to `FilesConfig.max_upload_bytes`; and the fine-tuning jobs API's
    (job_routes.py): a python grader's source travels in a create request.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, gateway_max_body_bytes: int | None = None,
                 files_max_body_bytes: int | None = None, jobs_max_body_bytes: int | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.gateway_max_body_bytes = gateway_max_body_bytes or max_body_bytes
        self.files_max_body_bytes = files_max_body_bytes or max_body_bytes
        self.jobs_max_body_bytes = jobs_max_body_bytes or max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        path = scope.get("path", "")
        limit = (self.files_max_body_bytes if is_files_path(path) else
                 self.gateway_max_body_bytes if is_gateway_path(path) else
                 self.jobs_max_body_bytes if is_jobs_path(path) else self.max_body_bytes)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.isdigit() or int(value) > limit:
                    await self._refuse(scope, send, f"the request body is over {limit} bytes")
                    return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # chunked bodies have no Content-Length to check up front
                    raise ApiError(413, "request body too large", f"the request body is over {limit} bytes")
            return message

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                total_ms = (time.perf_counter() - started) * 1000
                timing = f"total;dur={total_ms:.3f}"
                if "episode_ms" in state:
                    timing += f", episode;dur={state['episode_ms']:.3f}"
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(b"server-timing", timing.encode())]
            await send(message)

        await self.app(scope, limited_receive, timed_send)

    async def _refuse(self, scope: Scope, send: Send, detail: str) -> None:
        log.warning("%s %s -> 413 request body too large: %s", scope.get("method"), scope.get("path"), detail)
        if _openai_path(scope.get("path", "")):
            response = JSONResponse(openai_error(413, detail, code="request_too_large"), status_code=413)
        else:
            response = JSONResponse({"error": "request body too large", "detail": detail}, status_code=413)
        await response(scope, _drain, send)


async def _drain() -> Message:
    return {"type": "http.disconnect"}


# -- the app ------------------------------------------------------------------------------------


def _bearer(request: Request, what: str) -> str:
    """The token of an `Authorization: Bearer` header; 401 when there is none."""
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise ApiError(401, "authentication required", f"send 'Authorization: Bearer <{what}>'", {"WWW-Authenticate": "Bearer"})
    return given.strip()


def _is_admin_token(given: str, token_env: str) -> bool:
    """Whether `given` is the configured admin token (compared in constant time); False when none is configured."""
    expected = os.environ.get(token_env)
    return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())


def _require_admin(request: Request, token_env: str) -> None:
    if not os.environ.get(token_env):
        raise ApiError(403, "routing changes are disabled", f"no admin token is configured: set {token_env} on the arbiter")
    if not _is_admin_token(_bearer(request, "admin token"), token_env):
        raise ApiError(403, "forbidden", "the admin token is wrong")


def _require_reader(request: Request, service: ArbiterService, token_env: str) -> ApiKey | None:
    """Who may read the arbiter's state (routing, metrics, health details): the admin (None) or any valid API
    key (the key); 401 for anyone else. Strangers learn neither the versions nor the traffic."""
    given = _bearer(request, "API key or admin token")
    if _is_admin_token(given, token_env):
        return None
    key = service.keys.find(given) if len(service.keys) else None
    if key is None:
        raise ApiError(401, "invalid credentials", "send an API key or the admin token",
                       {"WWW-Authenticate": 'Bearer error="invalid_token"'})
    return key


def _shown_serving(stats: dict[str, Any], key: ApiKey | None) -> dict[str, Any]:
    """Serving figures as the reader may see them: a key sees versions and bases by their public names (a spec
    or a model path names upstream addresses, key variables and the operator's files)."""
    if key is None:
        return stats
    bases = [{**base, "base": public_version(base["base"]), "versions": [public_version(v) for v in base["versions"]]}
             for base in stats.get("bases", [])]
    engines = {public_version(spec): state for spec, state in stats.get("engines", {}).items()}
    return {**stats, "policies_loaded": [public_version(v) for v in stats.get("policies_loaded", [])], "bases": bases,
            "engines": engines}


def _require_key(request: Request, service: ArbiterService) -> ApiKey:
    """The caller's API key; 401 without a valid one. The admin token is not an API key."""
    if not len(service.keys):
        raise ApiError(403, "API access is disabled",
                       f"no API keys are configured: set {KEYS_FILE_ENV} or {KEYS_ENV} on the arbiter")
    key = service.keys.find(_bearer(request, "API key"))
    if key is None:
        raise ApiError(401, "invalid API key", "the API key is not valid", {"WWW-Authenticate": 'Bearer error="invalid_token"'})
    return key


Body = TypeVar("Body", bound=BaseModel)


async def _read_body(request: Request, model: type[Body], invalid: str = "invalid request") -> Body:
    """Parse the body as `model` (after authentication: strangers learn nothing about the format)."""
    content_type = request.headers.get("content-type")
    if content_type is not None and "json" not in content_type.lower():
        raise ApiError(415, "unsupported media type", "send the body as JSON with 'Content-Type: application/json'")
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, "malformed JSON", "the request body is not valid UTF-8 JSON") from exc
    try:
        # The standard parser, not pydantic's: it keeps escapes like "\ud800" for the text checks to
        # name (pydantic's rejects the whole body as malformed).
        data = json.loads(text)
    except RecursionError:  # nested past what the parser takes
        raise ApiError(400, "nested too deep", too_deep_message("body")) from None
    except ValueError as exc:  # bad JSON or an integer past the digit limit
        raise ApiError(400, "malformed JSON", "the request body is not valid JSON") from exc
    # A verdict written as JSON is parsed again by curation: nothing deeper than its readers walk is stored.
    deep = too_deep(data)
    if deep:
        raise ApiError(400, "nested too deep", too_deep_message(deep))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(422, invalid, _validation_detail(exc.errors())) from exc


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a body the handler parses itself."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


def _service_of(request: Request) -> ArbiterService:
    return request.app.state.service


def _gateway_of(request: Request) -> Gateway:
    return request.app.state.gateway


def _lifespan(config: ArbiterConfig) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start the service and the gateway with the app; on shutdown, write what they hold and stop them."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = ArbiterService(config)
        app.state.service = service
        # Start-up imported transformers (tool schemas) and loaded the routed policies after the server froze
        # the heap: freeze again, else full collections walk all of it and stall requests by 100+ ms.
        gc.collect()
        gc.freeze()
        gateway = Gateway(service, idle_s=config.gateway_idle_s, write_retry_s=config.gateway_write_retry_s,
                          rate_per_s=config.gateway_rate_per_s, rate_burst=config.gateway_rate_burst,
                          max_live=config.gateway_max_live, fine_tuned=FineTunedModels(config.jobs))
        app.state.gateway = gateway
        await gateway.start()
        log.info("arbiter ready: pool %s, routing %s", service.pool.engine.url.render_as_string(hide_password=True),
                 dict(service.router.current().weights))
        try:
            yield
        finally:
            try:
                await gateway.close()  # ends live gateway episodes and writes them
            finally:
                service.close()  # waits for running batches: every answered episode is committed

    return lifespan


def _add_status_routes(app: FastAPI, config: ArbiterConfig) -> None:
    """/healthz and /metrics: this worker's serving figures, for the admin or any API key."""

    @app.get("/healthz")
    async def healthz(request: Request) -> dict[str, Any]:
        service = _service_of(request)
        if "authorization" not in request.headers:  # open to probes, and minimal: alive, which worker
            return {"status": "ok", "worker": os.getpid()}
        key = _require_reader(request, service, config.admin_token_env)
        serving = _shown_serving(service.serving_metrics(), key)
        gateway = _gateway_of(request)
        # episodes_written counts this worker process's episodes; `worker` tells the processes apart.
        return {
            "status": "ok",
            "policies_loaded": serving["policies_loaded"],
            "episodes_written": service.episodes_written,
            "gateway": {"live_episodes": gateway.live_count(),
                        "unwritten_episodes": len(gateway.pending),
                        "episodes_written": gateway.written},
            "worker": os.getpid(),
            "serving": serving,
        }

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(request: Request) -> PlainTextResponse:
        """The serving figures of /healthz in Prometheus text format (this worker process); scrapers send the
        admin token or an API key as a bearer token (Prometheus: `authorization: {credentials: ...}`)."""
        key = _require_reader(request, _service_of(request), config.admin_token_env)
        return PlainTextResponse(prometheus_text(_shown_serving(_service_of(request).serving_metrics(), key)),
                                 media_type="text/plain; version=0.0.4")


def _add_episode_routes(app: FastAPI) -> None:
    """/v1/ask and /v1/feedback: the arbiter's own API, for an environment whose tools run on our side."""

    @app.post("/v1/ask", response_model=AskResponse, openapi_extra=_json_body(AskRequest))
    async def ask(request: Request) -> AskResponse:
        service = _service_of(request)
        key = _require_key(request, service)
        body = await _read_body(request, AskRequest)
        try:
            served = await service.ask(key, body.context, body.question, body.task_id, body.request_key)
        except OutOfScope as exc:
            raise ApiError(403, "forbidden", "this API key may not use the requested context",
                           log_detail=f"key {key.id!r} may not use the requested context") from exc
        except UnknownContext as exc:
            raise ApiError(404, "unknown context", f"context {body.context!r} is not served by this arbiter",
                           log_detail="the requested context is not in the environment's world") from exc
        except UnknownTask as exc:
            raise ApiError(404, "unknown task", f"task {body.task_id!r} is not known to this arbiter") from exc
        except TaskMismatch as exc:
            raise ApiError(422, "task does not match context",
                           f"task {body.task_id!r} belongs to another context than the one asked about") from exc
        except PolicyLoadError as exc:
            # Which policy failed, and why, is for the operators (it names specs and paths): the log has it.
            log.error("policy cannot be loaded for a request: %s", exc)
            raise ApiError(503, "policy unavailable", "the policy chosen for this request cannot be loaded; try again later") from exc
        except PolicyUnavailable as exc:  # its engine is down (resting after its restarts): nothing was stored
            raise ApiError(503, "policy unavailable", "the policy chosen for this request is unavailable now; try "
                           "again later", exc.retry_after(), log_detail=str(exc)) from exc
        except PoolUnavailable as exc:
            raise ApiError(503, "benchmark pool unavailable", str(exc)) from exc
        request.state.episode_ms = served.episode_seconds * 1000
        episode = served.episode
        return AskResponse(
            answer=episode.final_answer,
            sources=episode.sources,
            episode_id=episode.episode_id,
            policy_version=public_version(episode.policy_version),
            outcome=str(episode.outcome),
            reward=episode.reward,
        )

    @app.post("/v1/feedback", openapi_extra=_json_body(FeedbackRequest))
    async def feedback(request: Request) -> dict[str, str]:
        service = _service_of(request)
        key = _require_key(request, service)
        body = await _read_body(request, FeedbackRequest)
        try:
            # A live gateway episode ends with feedback on it: it is written first, then the verdict recorded.
            await _gateway_of(request).end(key, body.episode_id)
        except PoolDown as exc:
            raise ApiError(503, "benchmark pool unavailable", "the episode could not be written yet; try again") from exc
        try:
            await service.feedback(key, body.episode_id, body.verdict)
        except UnknownEpisodeError as exc:  # also an episode outside the key's tenant or contexts
            raise ApiError(404, "unknown episode", f"no episode {body.episode_id!r} in the benchmark pool") from exc
        except ValueError as exc:
            raise ApiError(422, "invalid feedback", str(exc)) from exc
        except Exception as exc:
            raise ApiError(503, "benchmark pool unavailable", f"{type(exc).__name__} while recording feedback") from exc
        return {"episode_id": body.episode_id, "feedback": body.verdict.strip()}


def _add_routing_routes(app: FastAPI, config: ArbiterConfig) -> None:
    """/v1/routing: the split between versions, read by the admin or any API key, changed by the admin."""

    @app.get("/v1/routing", response_model=RoutingView)
    async def get_routing(request: Request) -> RoutingView:
        """The split: the admin sees each version's spec, an API key only the version names and their shares
        (a spec names an upstream's address and key variable, which no tenant needs)."""
        key = _require_reader(request, _service_of(request), config.admin_token_env)
        try:
            routing, is_default = await _service_of(request).routing()
        except Exception as exc:
            raise ApiError(503, "benchmark pool unavailable", f"{type(exc).__name__} while reading routing") from exc
        if key is None:
            return RoutingView(weights=routing.weights, specs=routing.specs, default=is_default)
        return RoutingView(weights={public_version(v): w for v, w in routing.weights.items()}, specs={},
                           default=is_default)

    @app.put("/v1/routing", response_model=RoutingView, openapi_extra=_json_body(RoutingUpdate))
    async def put_routing(request: Request) -> RoutingView:
        _require_admin(request, config.admin_token_env)
        update = await _read_body(request, RoutingUpdate, "invalid routing")
        try:
            routing = await _service_of(request).set_routing(
                update.weights, update.specs, update.reason, update.actor, update.stats
            )
        except PolicyLoadError as exc:
            raise ApiError(422, "policy cannot be loaded", str(exc)) from exc
        except ValueError as exc:
            raise ApiError(422, "invalid routing", str(exc)) from exc
        log.info("routing changed by %s (%s): %s", update.actor, update.reason, routing.weights)
        return RoutingView(weights=routing.weights, specs=routing.specs, default=False, updated_at=routing.updated_at)


def create_app(config: ArbiterConfig | None = None) -> FastAPI:
    """The arbiter as an ASGI app; its pool, world connections and episode threads live for the app's lifespan."""
    config = config or ArbiterConfig()
    app = FastAPI(title="agent-rl arbiter", lifespan=_lifespan(config))
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(GatewayError, _on_gateway_error)
    app.add_exception_handler(Exception, _on_unexpected)
    app.add_middleware(RequestGuard, max_body_bytes=config.max_body_bytes,
                       gateway_max_body_bytes=config.gateway_max_body_bytes,
                       files_max_body_bytes=upload_body_limit(config.files),
                       jobs_max_body_bytes=config.jobs.max_request_bytes)
    _add_status_routes(app, config)
    _add_episode_routes(app)
    add_gateway_routes(app, lambda request: _require_key(request, _service_of(request)), _gateway_of)
    add_episode_read_routes(app, lambda request: _require_key(request, _service_of(request)),
                            lambda request: _service_of(request).pool)
    add_file_routes(app, lambda request: _require_key(request, _service_of(request)), config.files)
    add_job_routes(app, lambda request: _require_key(request, _service_of(request)), config.files, config.jobs)
    _add_routing_routes(app, config)
    return app

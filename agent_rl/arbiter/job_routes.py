"""OpenAI's fine-tuning jobs API on the arbiter, mounted by app.py: `POST /v1/fine_tuning/jobs`,
`GET /v1/fine_tuning/jobs`, `GET /v1/fine_tuning/jobs/{id}`, `POST /v1/fine_tuning/jobs/{id}/cancel`,
`GET /v1/fine_tuning/jobs/{id}/events` and `GET /v1/fine_tuning/jobs/{id}/checkpoints` (pause and resume answer a
400: not supported).

The official `openai` SDK pointed at the arbiter creates and follows jobs unchanged: replies are OpenAI's objects
and every error is OpenAI's shape `{"error": {"message", "type", "param", "code"}}`. A key sees only its tenant's
jobs; another tenant's job id answers 404 exactly like a missing one, and another tenant's file id is refused
exactly like an unknown one.

Create checks everything before anything is written (agent_rl/finetuning/checks.py): the parameters, the model
(one of the base models we serve), the method with its hyperparameters and grader, both files (the caller's, of
purpose fine-tune, rows of the method's kind, every row readable by the job's environment) and the grader against
the first training row. Only then does the job store (agent_rl/finetuning/jobs.py) write the job's folder and row,
queued for the runner. The stores' blocking work runs in threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request

from agent_rl.arbiter.file_routes import file_store_of
from agent_rl.arbiter.files import FileRecord, FilesConfig, FileStore, StoreUnavailable, is_file_id
from agent_rl.arbiter.gateway.wire import GatewayError, object_not_found, store_unavailable, too_deep_message
from agent_rl.arbiter.keys import ApiKey
from agent_rl.arbiter.tenant_objects import found_or_404, listing, opened_once, page_limit, page_or_400
from agent_rl.environments.openai_jobs.rows import JobRow, Method
from agent_rl.finetuning.checks import (
    JobRequest,
    JobRequestError,
    check_job_file,
    file_kind_matches,
    grader_problems,
    parse_job_request,
)
from agent_rl.finetuning.jobs import (
    MAX_PAGE,
    FineTuningJob,
    JobInputMissing,
    JobNotFound,
    JobsConfig,
    JobStateError,
    JobStore,
    JobStoreUnavailable,
    UnknownAfter,
    is_job_id,
)
from agent_rl.json_walk import too_deep

log = logging.getLogger("agent_rl.arbiter")

JOBS_PATH = "/v1/fine_tuning/jobs"


def is_jobs_path(path: str) -> bool:
    return path == JOBS_PATH or path.startswith(JOBS_PATH + "/")


def served_models() -> tuple[str, ...]:
    """The base models a job may fine-tune: the ones the arbiter serves on a shared base (policy_specs)."""
    from agent_rl.policy_specs import _SHARED_BASE_SPECS

    return tuple(_SHARED_BASE_SPECS)


def _unavailable(exc: Exception) -> GatewayError:
    return store_unavailable("job store", exc)


def _not_found(job_id: str) -> GatewayError:
    return object_not_found("fine-tuning job", job_id, is_job_id(job_id), param="fine_tuning_job_id",
                            code="job_not_found")


def _refused(exc: JobRequestError) -> GatewayError:
    return GatewayError(exc.status, exc.message, param=exc.param, code=exc.code)


async def _json_object(request: Request) -> Any:
    content_type = request.headers.get("content-type")
    if content_type is not None and "json" not in content_type.lower():
        raise GatewayError(415, "send the body as JSON with 'Content-Type: application/json'",
                           code="unsupported_media_type")
    raw = await request.body()
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_not_json)
    except RecursionError:
        raise GatewayError(400, too_deep_message("body"), code="json_too_deep") from None
    except ValueError:  # not UTF-8, not JSON, NaN/Infinity, an integer past the digit limit
        raise GatewayError(400, "the request body is not valid JSON", code="invalid_json") from None
    deep = too_deep(body)
    if deep:
        raise GatewayError(400, too_deep_message(deep), code="json_too_deep")
    return body


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _page_params(request: Request, default_limit: int) -> tuple[str | None, int]:
    query = request.query_params
    for name in query:
        if name == "metadata" or name.startswith("metadata["):
            raise GatewayError(400, "filtering jobs by metadata is not supported here", param="metadata",
                               code="unsupported_parameter")
    limit = page_limit(query, default_limit, MAX_PAGE)
    return query.get("after") or None, limit


def _checked_file(files: FileStore, tenant: str, file_id: str | None, param: str, method: Method) -> \
        tuple[FileRecord, JobRow] | None:
    """The caller's file for `param`, read as the job's environment will read it, and its first row."""
    if file_id is None:
        return None
    unknown = JobRequestError(f"invalid {param}: {file_id if is_file_id(file_id) else 'not a file id'} is not a file "
                              "of yours (upload it with purpose fine-tune first)", param=param,
                              code=f"invalid_{param}")
    record = files.get(tenant, file_id) if is_file_id(file_id) else None
    if record is None:
        raise unknown
    if record.purpose != "fine-tune":
        raise JobRequestError(f"invalid {param}: {file_id} was uploaded with purpose {record.purpose}, not fine-tune",
                              param=param, code=f"invalid_{param}")
    file_kind_matches(record.kind, method, param)
    try:
        with open(files.content_dir / record.id, "rb") as lines:
            first = check_job_file(lines, method, param)
    except FileNotFoundError:  # deleted since the lookup
        raise unknown from None
    return record, first


def _create(files: FileStore, jobs: JobStore, config: JobsConfig, tenant: str, request: JobRequest) -> FineTuningJob:
    """Every check that reads a file, then the job (blocking: run in a thread)."""
    method = request.method_type
    training = _checked_file(files, tenant, request.training_file, "training_file", method)
    validation = _checked_file(files, tenant, request.validation_file, "validation_file", method)
    assert training is not None
    if request.grader is not None:
        grader_problems(request.grader, training[1], config.grader_context())
    try:
        return jobs.create(tenant, model=request.model, training_file_path=files.content_dir / training[0].id,
                           validation_file_path=files.content_dir / validation[0].id if validation else None,
                           method=request.method, seed=request.seed, suffix=request.suffix,
                           metadata=request.metadata, training_file=training[0].id,
                           validation_file=validation[0].id if validation else None)
    except JobInputMissing as exc:  # the file was deleted between the check and the copy
        raise JobRequestError(f"invalid {exc.param}: the file was deleted", param=exc.param,
                              code=f"invalid_{exc.param}") from None


def add_job_routes(app: FastAPI, require_key: Callable[[Request], ApiKey], files_config: FilesConfig,
                   config: JobsConfig) -> None:
    """Mount the fine-tuning jobs API; `require_key` authenticates (raising the app's 401/403). The job store opens
    on first use, once per worker process; the files come from the Files API's store."""
    lock = threading.Lock()

    def jobs_of(request: Request) -> JobStore:
        return opened_once(request, "job_store", lock, lambda: JobStore.from_config(config))

    async def store_call(request: Request, fn: Callable[[JobStore], Any]) -> Any:
        try:
            return await asyncio.to_thread(lambda: fn(jobs_of(request)))
        except JobStoreUnavailable as exc:
            raise _unavailable(exc) from exc

    @app.post(JOBS_PATH, tags=["fine-tuning"])
    async def create_job(request: Request) -> dict[str, Any]:
        key = require_key(request)
        body = await _json_object(request)
        try:
            job_request = parse_job_request(body, served_models(), allow_python_graders=config.allow_python_graders)
            job: FineTuningJob = await asyncio.to_thread(
                lambda: _create(file_store_of(request, files_config), jobs_of(request), config, key.tenant,
                                job_request))
        except JobRequestError as exc:
            raise _refused(exc) from exc
        except (JobStoreUnavailable, StoreUnavailable) as exc:
            raise _unavailable(exc) from exc
        return job.to_openai()

    @app.get(JOBS_PATH, tags=["fine-tuning"])
    async def list_jobs(request: Request) -> dict[str, Any]:
        key = require_key(request)
        after, limit = _page_params(request, 20)
        found, has_more = await page_or_400(lambda: store_call(
            request, lambda jobs: jobs.list(key.tenant, after, limit)), UnknownAfter, "your fine-tuning jobs")
        return listing([job.to_openai() for job in found], has_more)

    @app.get(JOBS_PATH + "/{job_id}", tags=["fine-tuning"])
    async def retrieve_job(request: Request, job_id: str) -> dict[str, Any]:
        key = require_key(request)
        job = await found_or_404(job_id, is_job_id, lambda: store_call(
            request, lambda jobs: jobs.get(key.tenant, job_id)), _not_found)
        return job.to_openai()

    @app.post(JOBS_PATH + "/{job_id}/cancel", tags=["fine-tuning"])
    async def cancel_job(request: Request, job_id: str) -> dict[str, Any]:
        key = require_key(request)
        if not is_job_id(job_id):
            raise _not_found(job_id)
        try:
            job = await store_call(request, lambda jobs: jobs.cancel(key.tenant, job_id))
        except JobNotFound as exc:
            raise _not_found(job_id) from exc
        except JobStateError as exc:
            raise GatewayError(400, str(exc), param="fine_tuning_job_id", code="job_not_cancellable") from exc
        return job.to_openai()

    def add_unsupported(action: str) -> None:
        @app.post(JOBS_PATH + "/{job_id}/" + action, tags=["fine-tuning"], name=f"{action}_job")
        async def unsupported(request: Request, job_id: str) -> dict[str, Any]:
            key = require_key(request)
            await found_or_404(job_id, is_job_id, lambda: store_call(
                request, lambda jobs: jobs.get(key.tenant, job_id)), _not_found)
            raise GatewayError(400, f"jobs cannot be {action}d here; cancel the job and create it again instead",
                               param="fine_tuning_job_id", code="unsupported_operation")

    add_unsupported("pause")
    add_unsupported("resume")

    def add_listing(suffix: str, what: str, default_limit: int, read: str) -> None:
        @app.get(JOBS_PATH + "/{job_id}/" + suffix, tags=["fine-tuning"], name=f"list_job_{suffix}")
        async def list_of_job(request: Request, job_id: str) -> dict[str, Any]:
            key = require_key(request)
            after, limit = _page_params(request, default_limit)
            if not is_job_id(job_id):
                raise _not_found(job_id)
            try:
                found, has_more = await page_or_400(lambda: store_call(
                    request, lambda jobs: getattr(jobs, read)(key.tenant, job_id, after, limit)), UnknownAfter,
                    f"this job's {what}")
            except JobNotFound as exc:
                raise _not_found(job_id) from exc
            return listing([item.to_openai() for item in found], has_more)

    add_listing("events", "events", 20, "events")
    add_listing("checkpoints", "checkpoints", 10, "checkpoints")

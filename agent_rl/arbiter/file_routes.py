"""OpenAI's Files API on the arbiter: `POST /v1/files`, `GET /v1/files`, `GET /v1/files/{file_id}`,
`GET /v1/files/{file_id}/content` and `DELETE /v1/files/{file_id}`, mounted by app.py.

The official `openai` SDK pointed at the arbiter (`base_url=<arbiter>/v1`, `api_key=<arbiter API key>`) uploads
and reads files unchanged: replies are OpenAI's objects and every error is OpenAI's shape
`{"error": {"message", "type", "param", "code"}}` (app.py answers its own errors on these paths so too). A key
sees only its tenant's files; another tenant's id answers 404 exactly like a missing one.

An upload is parsed as it streams in (python-multipart's push parser) and its file part written straight into
the store's `tmp/` (files.py), so a 512 MB file never sits in memory and one over the limit is cut off with a
413 as soon as it passes it, leaving nothing behind. The store's blocking work runs in threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

from agent_rl.arbiter.files import (
    MAX_PAGE,
    PURPOSES,
    BadTrainingFile,
    BadUpload,
    FileRecord,
    FilesConfig,
    FileStore,
    FileTooLarge,
    Staged,
    StoreUnavailable,
    is_file_id,
)
from agent_rl.arbiter.gateway.wire import GatewayError, object_not_found, store_unavailable
from agent_rl.arbiter.keys import ApiKey
from agent_rl.arbiter.tenant_objects import found_or_404, listing, opened_once, page_limit, page_or_400

log = logging.getLogger("agent_rl.arbiter")

FILES_PATH = "/v1/files"
# Room in a request body beyond the file itself: the multipart boundaries and headers, and the small fields.
MULTIPART_SLACK = 64 * 1024
_MAX_FIELD = 1024  # bytes of a form field other than the file (purpose, expires_after[...])
_MAX_FIELDS = 16  # form fields besides the file: OpenAI's upload has three
_CHUNK = 1024 * 1024
_EXPIRY_RANGE = (3600, 30 * 24 * 3600)  # OpenAI's bounds on expires_after.seconds


def is_files_path(path: str) -> bool:
    return path == FILES_PATH or path.startswith(FILES_PATH + "/")


def upload_body_limit(config: FilesConfig) -> int:
    """The request body limit app.py's guard applies to these paths: the largest file plus multipart framing."""
    return config.max_upload_bytes + MULTIPART_SLACK


def _unavailable(exc: StoreUnavailable) -> GatewayError:
    return store_unavailable("file store", exc)


def _not_found(file_id: str) -> GatewayError:
    return object_not_found("File object", file_id, is_file_id(file_id), param="id", code="file_not_found")


class _MultipartUpload:
    """The callbacks of one upload's multipart body: the `file` part goes to `staged`, other fields are kept
    as text (bounded). Raises from the callbacks stop the parser (FileTooLarge, GatewayError)."""

    def __init__(self, store: FileStore) -> None:
        self.store = store
        self.staged: Staged | None = None
        self.filename = "upload"
        self.fields: dict[str, str] = {}
        self.file_done = self.body_done = False
        self.pending: list[bytes] = []  # file bytes parsed but not yet written (written off the event loop)
        self._pending_size = 0
        self._header_name = self._header_value = self._disposition = b""
        self._name: str | None = None
        self._in_file = False
        self._field = bytearray()

    def callbacks(self) -> dict[str, Callable[..., None]]:
        return {"on_part_begin": self._part_begin, "on_header_field": self._header_field,
                "on_header_value": self._header_value_part, "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
                "on_part_end": self._part_end, "on_end": self._end}

    def _part_begin(self) -> None:
        self._disposition, self._name, self._in_file, self._field = b"", None, False, bytearray()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_value_part(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if self._header_name.strip().lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name = self._header_value = b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        name = options.get(b"name", b"").decode("utf-8", "replace")
        self._name = name
        if name != "file":
            return
        if self.staged is not None:
            raise GatewayError(400, "send one file, as the `file` field", param="file")
        self._in_file = True
        raw = options.get(b"filename")
        self.filename = raw.decode("utf-8", "replace") if raw else "upload"
        self.staged = self.store.stage()

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._in_file:
            assert self.staged is not None
            self._pending_size += end - start
            if self.staged.size + self._pending_size > self.staged.limit:
                self.staged.discard()
                raise FileTooLarge(self.staged.limit)
            self.pending.append(data[start:end])
        elif self._name:
            self._field += data[start:end]
            if len(self._field) > _MAX_FIELD:
                name = self._name[:100]
                raise GatewayError(400, f"the form field `{name}` is longer than {_MAX_FIELD} bytes", param=name)

    def _part_end(self) -> None:
        if self._in_file:
            self.file_done, self._in_file = True, False
        elif self._name:
            self.fields[self._name] = self._field.decode("utf-8", "replace")
            if len(self.fields) > _MAX_FIELDS:
                raise GatewayError(400, f"the upload has more than {_MAX_FIELDS} form fields")
            if self._name == "purpose":  # refused before a large file is read, when the purpose comes first
                _check_purpose(self.fields["purpose"])

    def _end(self) -> None:
        self.body_done = True

    def take_pending(self) -> bytes:
        data = b"".join(self.pending)
        self.pending.clear()
        self._pending_size = 0
        return data


def _check_purpose(purpose: str) -> None:
    if purpose not in PURPOSES:
        raise GatewayError(400, f"purpose must be one of {', '.join(PURPOSES)}", param="purpose",
                           code="invalid_purpose")


def _expires_at(fields: dict[str, str], created_at: int) -> int | None:
    """OpenAI's `expires_after[anchor]` / `expires_after[seconds]` form fields as a time, or None."""
    anchor, seconds = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise GatewayError(400, "expires_after[anchor] must be \"created_at\"", param="expires_after[anchor]")
    low, high = _EXPIRY_RANGE
    if seconds is None or not seconds.isdigit() or not low <= int(seconds) <= high:
        raise GatewayError(400, f"expires_after[seconds] must be a whole number from {low} to {high}",
                           param="expires_after[seconds]")
    return created_at + int(seconds)


async def _receive_upload(request: Request, upload: _MultipartUpload) -> None:
    """Stream the multipart body into the store's tmp/ (the caller discards `upload.staged` when this fails)."""
    content_type, options = parse_options_header(request.headers.get("content-type"))
    if content_type != b"multipart/form-data" or not options.get(b"boundary"):
        raise GatewayError(400, "send the upload as multipart/form-data with the fields `file` and `purpose`",
                           code="invalid_content_type")
    parser = MultipartParser(options[b"boundary"], upload.callbacks())  # type: ignore[arg-type]
    try:
        async for chunk in request.stream():
            parser.write(chunk)
            if upload.pending:
                assert upload.staged is not None
                await asyncio.to_thread(upload.staged.write, upload.take_pending())
        parser.finalize()
    except FormParserError as exc:
        raise GatewayError(400, "the multipart body is malformed", code="invalid_multipart",
                           log_detail=f"multipart parse error: {type(exc).__name__}") from exc
    except ClientDisconnect as exc:
        raise GatewayError(400, "the upload was cut off before its end", code="upload_incomplete") from exc
    if not upload.body_done:
        raise GatewayError(400, "the multipart body ends before its closing boundary", code="upload_incomplete")
    if upload.staged is None or not upload.file_done:
        raise GatewayError(400, "the upload has no `file` part", param="file")
    if "purpose" not in upload.fields:
        raise GatewayError(400, "the upload has no `purpose` field", param="purpose")


def _page_params(request: Request) -> tuple[str | None, int, str | None, str]:
    query = request.query_params
    limit = page_limit(query, MAX_PAGE, MAX_PAGE)
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise GatewayError(400, "order must be \"asc\" or \"desc\"", param="order")
    return query.get("purpose") or None, limit, query.get("after") or None, order


async def _stream(stream: Any) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(stream.read, _CHUNK):
            yield chunk
    finally:
        stream.close()


_store_lock = threading.Lock()


def file_store_of(request: Request, config: FilesConfig) -> FileStore:
    """The app's file store, opened on first use, once per worker process (its directory is created then, not when
    the app is built); the fine-tuning job routes read the same one."""
    return opened_once(request, "file_store", _store_lock, lambda: FileStore.from_config(config))


def add_file_routes(app: FastAPI, require_key: Callable[[Request], ApiKey], config: FilesConfig) -> None:
    """Mount the Files API; `require_key` authenticates (raising the app's 401/403)."""

    def store_of(request: Request) -> FileStore:
        return file_store_of(request, config)

    async def store_call(request: Request, fn: Callable[[FileStore], Any]) -> Any:
        try:
            store = store_of(request)
            return await asyncio.to_thread(fn, store)
        except StoreUnavailable as exc:
            raise _unavailable(exc) from exc

    async def tenant_file(request: Request, file_id: str, read: Callable[[FileStore, str], Any]) -> Any:
        """`read(store, tenant)` for the caller's file `file_id`, or the file's 404 when it finds nothing."""
        key = require_key(request)
        return await found_or_404(file_id, is_file_id, lambda: store_call(
            request, lambda store: read(store, key.tenant)), _not_found)

    upload_body = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file", "purpose"],
        "properties": {"file": {"type": "string", "format": "binary"},
                       "purpose": {"type": "string", "enum": list(PURPOSES)}}}}}}}

    @app.post(FILES_PATH, tags=["files"], openapi_extra=upload_body)
    async def create_file(request: Request) -> JSONResponse:
        key = require_key(request)
        store = await store_call(request, lambda store: store)
        upload = _MultipartUpload(store)
        try:
            await _receive_upload(request, upload)
            assert upload.staged is not None
            purpose = upload.fields["purpose"]
            _check_purpose(purpose)
            expires_at = _expires_at(upload.fields, int(store.clock()))
            staged, filename = upload.staged, upload.filename
            record: FileRecord = await asyncio.to_thread(store.commit, staged, key.tenant, filename, purpose, expires_at)
        except FileTooLarge as exc:
            raise GatewayError(413, str(exc), param="file", code="file_too_large") from exc
        except BadTrainingFile as exc:
            raise GatewayError(400, f"invalid training file: {exc}", param="file", code="invalid_file_format") from exc
        except BadUpload as exc:
            raise GatewayError(400, str(exc), param=exc.param) from exc
        except StoreUnavailable as exc:
            raise _unavailable(exc) from exc
        finally:
            # A refused or broken upload leaves nothing behind (a committed one was renamed away: a no-op).
            if upload.staged is not None:
                upload.staged.discard()
        log.info("file %s stored for tenant %r: %d bytes, purpose %s", record.id, key.tenant, record.bytes, purpose)
        return JSONResponse(record.openai())

    @app.get(FILES_PATH, tags=["files"])
    async def list_files(request: Request) -> dict[str, Any]:
        key = require_key(request)
        purpose, limit, after, order = _page_params(request)
        # The store's KeyError: `after` names no file of this tenant's.
        page = await page_or_400(lambda: store_call(
            request, lambda store: store.list(key.tenant, purpose, limit, after, order)), KeyError, "your files")
        return listing([record.openai() for record in page.records], page.has_more)

    @app.get(FILES_PATH + "/{file_id}", tags=["files"])
    async def retrieve_file(request: Request, file_id: str) -> dict[str, Any]:
        record = await tenant_file(request, file_id, lambda store, tenant: store.get(tenant, file_id))
        return record.openai()

    @app.get(FILES_PATH + "/{file_id}/content", tags=["files"])
    async def file_content(request: Request, file_id: str) -> StreamingResponse:
        record, stream = await tenant_file(request, file_id, lambda store, tenant: store.open(tenant, file_id))
        quoted = urllib.parse.quote(record.filename, safe="")
        headers = {"Content-Length": str(record.bytes),
                   "Content-Disposition": f"attachment; filename*=UTF-8''{quoted}"}
        return StreamingResponse(_stream(stream), media_type="application/octet-stream", headers=headers)

    @app.delete(FILES_PATH + "/{file_id}", tags=["files"])
    async def delete_file(request: Request, file_id: str) -> dict[str, Any]:
        key = require_key(request)
        await found_or_404(file_id, is_file_id, lambda: store_call(
            request, lambda store: store.delete(key.tenant, file_id)), _not_found)
        log.info("file %s deleted by tenant %r", file_id, key.tenant)
        return {"id": file_id, "object": "file", "deleted": True}

"""The arbiter's file store: what OpenAI's Files API (`/v1/files`, file_routes.py) uploads, lists and serves.

Where: under `FilesConfig.root`, by default `$AGENT_RL_HOME/files/` (beside the pool's SQLite), holding
`content/<file-id>` (the bytes exactly as uploaded), `tmp/` (uploads being received) and `index.db` (the metadata).

The index is SQLite, not a JSON file: the arbiter runs several worker processes (server.py) that upload and delete
at once, and SQLite gives them cross-process locking, atomic commits and an indexed, paginated listing per tenant
without rewriting a whole index on every upload (a JSON index would need a lock file and a rewrite per write).

Crash safety: an upload is streamed into `tmp/` (never held in memory), flushed and fsynced, checked, then renamed
into `content/` (atomic on one filesystem) and only then given its index row. Every read goes through the index,
so a file is visible only once complete; what a crash leaves (a `tmp/` part, content without a row) is invisible
and swept later. A delete marks the row first, then removes the content.

Tenancy: every row carries the tenant of the key that uploaded it (keys.py) and every query names the caller's
tenant, so another tenant's file id reads exactly like a missing one.
"""

from __future__ import annotations

import logging
import os
import secrets
import sqlite3
import string
import time
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from agent_rl import settings
from agent_rl.arbiter.file_checks import BadTrainingFile, check_training_file
from agent_rl.disk import fsync_path, older_than, open_wal_database

log = logging.getLogger(__name__)

__all__ = ["BadTrainingFile", "BadUpload", "FileRecord", "FileStore", "FileTooLarge", "FilesConfig", "PURPOSES",
           "StoreUnavailable"]

# What a caller may upload (the SDK's FilePurpose); "fine-tune" files are checked line by line (file_checks.py).
PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
MAX_PAGE = 10_000  # OpenAI's list limit (and default)
_ID_ALPHABET = string.ascii_letters + string.digits
_ID_CHARS = 24  # ~143 random bits, like OpenAI's `file-` ids
_MAX_FILENAME = 255
# Sweeping (on open and at most hourly): parts of uploads older than a day are abandoned (a slow 512 MB upload
# takes minutes); content without a row older than an hour was orphaned by a crash between rename and insert
# (younger content may be another worker's upload about to be inserted); tombstones (kept so that `after=` a
# deleted file still pages on) are dropped after a week.
STALE_PART_S = 24 * 3600
ORPHAN_GRACE_S = 3600
TOMBSTONE_KEEP_S = 7 * 24 * 3600
SWEEP_EVERY_S = 3600


class FilesConfig(BaseModel):
    """Where files are kept and how large they may be (ArbiterConfig.files)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    root: Path | None = Field(None, description="directory of the file store; default $AGENT_RL_HOME/files")
    max_upload_bytes: PositiveInt = Field(512 * 1024 * 1024, description="larger uploads are refused with 413")
    max_line_bytes: PositiveInt = Field(16 * 1024 * 1024, description="longest line of a fine-tune file")


class FileTooLarge(Exception):
    """The upload passed `limit` bytes; whatever was received is already gone."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the file is larger than the upload limit of {limit} bytes")
        self.limit = limit


class BadUpload(ValueError):
    """An upload refused before any content check (empty, bad purpose or filename); `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class StoreUnavailable(RuntimeError):
    """The store's disk or index cannot be used right now (full disk, locked index); a retry may work."""


@dataclass(frozen=True)
class FileRecord:
    """One stored file's metadata; `rows` and `kind` are known for checked (fine-tune) files only."""

    id: str
    tenant: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int | None = None
    rows: int | None = None
    kind: str | None = None

    def openai(self) -> dict[str, Any]:
        """OpenAI's File object (the SDK's FileObject)."""
        return {"object": "file", "id": self.id, "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "expires_at": self.expires_at, "status_details": None}


@dataclass(frozen=True)
class FilePage:
    records: list[FileRecord]
    has_more: bool


def new_file_id() -> str:
    return "file-" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_CHARS))


def is_file_id(text: str) -> bool:
    """Whether `text` could be one of our ids (anything else is answered like a missing file)."""
    return text.startswith("file-") and 0 < len(text) - 5 <= 64 and all(c in _ID_ALPHABET for c in text[5:])


def clean_filename(name: str) -> str:
    """The name shown for an upload: its last path component without control characters (never used as a path)."""
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if unicodedata.category(c)[0] != "C").strip()
    if len(name) > _MAX_FILENAME:
        raise BadUpload(f"the filename is longer than {_MAX_FILENAME} characters", "file")
    return name or "upload"


class Staged:
    """An upload being received: bytes appended to a private file in the store's `tmp/`, size-limited.

    Use it as a context manager: leaving it without `FileStore.commit` removes the part, so a refused or broken
    upload leaves nothing behind."""

    def __init__(self, tmp_dir: Path, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.path = tmp_dir / f"{secrets.token_hex(16)}.part"
        self._file: BinaryIO | None = open(self.path, "xb")  # noqa: SIM115  (closed by finish/discard)

    def write(self, data: bytes) -> None:
        if self.size + len(data) > self.limit:
            self.discard()
            raise FileTooLarge(self.limit)
        assert self._file is not None, "write after finish"
        self._file.write(data)
        self.size += len(data)

    def finish(self) -> None:
        """Flush to disk (fsync): after this the bytes survive a crash."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def discard(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> Staged:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()  # a no-op once committed: the part was renamed away


_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    row_count INTEGER,
    kind TEXT,
    deleted_at INTEGER
);
CREATE INDEX IF NOT EXISTS files_by_tenant ON files (tenant, created_at, seq);
"""
_COLUMNS = "id, tenant, filename, purpose, bytes, created_at, expires_at, row_count, kind"
_LIVE = "deleted_at IS NULL AND (expires_at IS NULL OR expires_at > :now)"


def _record(row: tuple[Any, ...]) -> FileRecord:
    return FileRecord(*row)


class FileStore:
    """Files per tenant: content on disk, metadata in SQLite. Thread- and process-safe; methods block (call them
    off the event loop)."""

    def __init__(self, root: Path, max_upload_bytes: int = FilesConfig().max_upload_bytes,
                 max_line_bytes: int = FilesConfig().max_line_bytes, clock: Callable[[], float] = time.time) -> None:
        self.root = Path(root)
        self.content_dir, self.tmp_dir = self.root / "content", self.root / "tmp"
        self.max_upload_bytes, self.max_line_bytes = max_upload_bytes, max_line_bytes
        self.clock = clock
        open_wal_database(self.root / "index.db", _SCHEMA, 10, (self.content_dir, self.tmp_dir), "file store",
                          StoreUnavailable)
        self._swept = 0.0
        self.sweep()

    @classmethod
    def from_config(cls, config: FilesConfig) -> FileStore:
        return cls(config.root or settings.home() / "files", config.max_upload_bytes, config.max_line_bytes)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A connection for one operation, its writes one transaction (committed on leaving, rolled back on error)."""
        with closing(sqlite3.connect(self.root / "index.db", timeout=10)) as db:
            db.execute("PRAGMA synchronous=FULL")  # an answered upload survives a power cut
            with db:
                yield db

    def _now(self) -> int:
        return int(self.clock())

    # -- writing ----------------------------------------------------------------------------------

    def stage(self) -> Staged:
        """A new upload to write into (then `commit` it, or leave it to be removed)."""
        try:
            return Staged(self.tmp_dir, self.max_upload_bytes)
        except OSError as exc:
            raise StoreUnavailable(f"cannot start an upload: {exc.strerror or exc}") from exc

    def commit(self, staged: Staged, tenant: str, filename: str, purpose: str,
               expires_at: int | None = None) -> FileRecord:
        """Check the staged bytes and publish them as a new file of `tenant`. BadUpload or BadTrainingFile when
        refused; StoreUnavailable when the disk or index fails. Whatever happens, the part is gone afterwards."""
        try:
            return self._commit(staged, tenant, filename, purpose, expires_at)
        finally:
            staged.discard()  # renamed away when published; else this removes it

    def _commit(self, staged: Staged, tenant: str, filename: str, purpose: str, expires_at: int | None) -> FileRecord:
        if purpose not in PURPOSES:
            raise BadUpload(f"purpose must be one of {', '.join(PURPOSES)}", "purpose")
        filename = clean_filename(filename)
        try:
            staged.finish()
        except OSError as exc:
            raise StoreUnavailable(f"cannot write the upload: {exc.strerror or exc}") from exc
        if staged.size == 0:
            raise BadUpload("the file is empty", "file")
        rows = kind = None
        if purpose == "fine-tune":
            with open(staged.path, "rb") as stream:
                summary = check_training_file(stream, self.max_line_bytes)
            rows, kind = summary.rows, summary.kind
        record = FileRecord(new_file_id(), tenant, filename, purpose, staged.size, self._now(), expires_at, rows, kind)
        target = self.content_dir / record.id
        try:
            self._publish(staged.path, target)
            self._insert(record)
        except (OSError, sqlite3.Error) as exc:
            target.unlink(missing_ok=True)
            raise StoreUnavailable(f"cannot store the upload: {exc}") from exc
        if self._now() - self._swept >= SWEEP_EVERY_S:
            self.sweep()
        return record

    def add(self, tenant: str, filename: str, purpose: str, data: bytes) -> FileRecord:
        """Store `data` as a new file of `tenant` (for files the arbiter itself writes, and tests)."""
        with self.stage() as staged:
            staged.write(data)
            return self.commit(staged, tenant, filename, purpose)

    def _publish(self, part: Path, target: Path) -> None:
        os.replace(part, target)
        fsync_path(self.content_dir)  # the rename itself survives a crash

    def _insert(self, record: FileRecord) -> None:
        with self._db() as db:
            db.execute(f"INSERT INTO files ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (record.id, record.tenant, record.filename, record.purpose, record.bytes, record.created_at,
                        record.expires_at, record.rows, record.kind))

    def delete(self, tenant: str, file_id: str) -> bool:
        """Remove a file of `tenant`; False when it has none by that id. The row stays as a tombstone (no filename)
        so that listing `after` it still works for a week."""
        try:
            with self._db() as db:
                gone = db.execute(f"UPDATE files SET deleted_at = :now, filename = '' WHERE id = :id AND "
                                  f"tenant = :tenant AND {_LIVE}",
                                  {"now": self._now(), "id": file_id, "tenant": tenant}).rowcount
            if gone:
                (self.content_dir / file_id).unlink(missing_ok=True)
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(f"cannot delete the file: {exc}") from exc
        return bool(gone)

    # -- reading ----------------------------------------------------------------------------------

    def get(self, tenant: str, file_id: str) -> FileRecord | None:
        try:
            with self._db() as db:
                row = db.execute(f"SELECT {_COLUMNS} FROM files WHERE id = :id AND tenant = :tenant AND {_LIVE}",
                                 {"id": file_id, "tenant": tenant, "now": self._now()}).fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot read the file index: {exc}") from exc
        return _record(row) if row else None

    def open(self, tenant: str, file_id: str) -> tuple[FileRecord, BinaryIO] | None:
        """A file of `tenant` and its content opened for reading (the caller closes it); None when it has none."""
        record = self.get(tenant, file_id)
        if record is None:
            return None
        try:
            return record, open(self.content_dir / record.id, "rb")  # noqa: SIM115
        except FileNotFoundError:  # deleted since the lookup
            return None
        except OSError as exc:
            raise StoreUnavailable(f"cannot read the file: {exc.strerror or exc}") from exc

    def list(self, tenant: str, purpose: str | None = None, limit: int = MAX_PAGE, after: str | None = None,
             order: Literal["asc", "desc"] = "desc") -> FilePage:
        """A page of `tenant`'s files by creation time (`desc`: newest first), after the file `after` (which may
        since have been deleted). KeyError when `after` is no file of `tenant`'s."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be from 1 to {MAX_PAGE}")
        params: dict[str, Any] = {"tenant": tenant, "now": self._now(), "limit": limit + 1, "purpose": purpose}
        where = [f"tenant = :tenant AND {_LIVE}"]
        if purpose is not None:
            where.append("purpose = :purpose")
        direction, compare = ("DESC", "<") if order == "desc" else ("ASC", ">")
        try:
            with self._db() as db:
                if after is not None:
                    mark = db.execute("SELECT created_at, seq FROM files WHERE id = :id AND tenant = :tenant",
                                      {"id": after, "tenant": tenant}).fetchone()
                    if mark is None:
                        raise KeyError(after)
                    params["at"], params["seq"] = mark
                    where.append(f"(created_at, seq) {compare} (:at, :seq)")
                rows = db.execute(f"SELECT {_COLUMNS} FROM files WHERE {' AND '.join(where)} "
                                  f"ORDER BY created_at {direction}, seq {direction} LIMIT :limit", params).fetchall()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot read the file index: {exc}") from exc
        return FilePage([_record(r) for r in rows[:limit]], has_more=len(rows) > limit)

    # -- housekeeping -----------------------------------------------------------------------------

    def sweep(self) -> None:
        """Remove what nobody can see any more: expired files, abandoned upload parts, content orphaned by a crash
        between rename and insert, old tombstones. Safe while other workers upload (see the grace periods)."""
        now = self._now()
        self._swept = now
        try:
            with self._db() as db:
                expired = [r[0] for r in db.execute(
                    "SELECT id FROM files WHERE deleted_at IS NULL AND expires_at <= :now", {"now": now})]
                db.execute("UPDATE files SET deleted_at = :now, filename = '' WHERE deleted_at IS NULL AND "
                           "expires_at <= :now", {"now": now})
                db.execute("DELETE FROM files WHERE deleted_at < :old", {"old": now - TOMBSTONE_KEEP_S})
                live = {r[0] for r in db.execute("SELECT id FROM files WHERE deleted_at IS NULL")}
            for file_id in expired:
                (self.content_dir / file_id).unlink(missing_ok=True)
            for path in self.content_dir.iterdir():
                if path.name not in live and older_than(path, now - ORPHAN_GRACE_S):
                    path.unlink(missing_ok=True)
            for path in self.tmp_dir.glob("*.part"):
                if older_than(path, now - STALE_PART_S):
                    path.unlink(missing_ok=True)
        except (OSError, sqlite3.Error) as exc:  # housekeeping only: the next sweep tries again
            log.warning("file store sweep failed: %s", exc)

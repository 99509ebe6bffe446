"""Fine-tuning jobs (OpenAI's `/v1/fine_tuning/jobs`): the arbiter's routes create, list and cancel them; the runner
claims a queued job, runs it (a Dagster run, outside this library) and finishes it.

Where: under `JobsConfig.root`, by default `$AGENT_RL_HOME/jobs/`: `jobs.db` (SQLite: the jobs, their events and
checkpoints), one folder per job, `<job-id>/` (`job.json`, `train.jsonl`, `validation.jsonl`: what
`OpenAIJobEnvironment` reads), and `tmp/` (job folders being written).

Several processes share the store at once: the arbiter's workers (server.py) create and cancel, the runner claims
and finishes. SQLite in WAL mode with a busy timeout; every write is one `BEGIN IMMEDIATE` transaction, so two
claimers never get the same job, and a cancel racing a finish ends as exactly one of them.

Nothing is half-created: a job's folder is written in `tmp/`, fsynced and renamed into place, and only then are
the job's row and its first event inserted, in one transaction; on any failure the folder is removed. What a crash
leaves (a folder in `tmp/`, a job folder without a row) is invisible and swept after an hour.

Tenancy: every row carries the tenant of the key that created it, and every API-side method names the caller's
tenant, so another tenant's job reads exactly like a missing one. The runner's methods take a job id alone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import sqlite3
import string
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing, contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from agent_rl import settings
from agent_rl.chat_client import ChatEndpoint
from agent_rl.disk import fsync_path, older_than, open_wal_database
from agent_rl.finetuning.checks import (
    BASE_HYPERPARAMETERS,
    JobRequestError,
    check_metadata,
    check_seed,
    check_suffix,
    method_grader,
    method_hyperparameters,
    normalize_method,
)
from agent_rl.graders import GraderContext, PythonSandboxConfig

log = logging.getLogger(__name__)

__all__ = ["FineTuningJob", "JobCheckpoint", "JobEvent", "JobInputMissing", "JobNotFound", "JobRequestError",
           "JobStateError",
           "JobStatus", "JobStore", "JobStoreUnavailable", "JobsConfig", "UnknownAfter", "checkpoint_model_name",
           "default_root", "fine_tuned_model_name", "is_job_id"]

JOB_FILE, TRAIN_FILE, VALIDATION_FILE = "job.json", "train.jsonl", "validation.jsonl"  # as the environment reads them
MAX_PAGE = 1000
_ID_ALPHABET = string.ascii_letters + string.digits
_ID_CHARS = 24
STALE_TMP_S = 3600  # a job folder is written in seconds; one in tmp/ this old was abandoned by a crash
ORPHAN_GRACE_S = 3600  # a job folder without a row younger than this may be another worker's, about to be inserted
SWEEP_EVERY_S = 3600


def default_root() -> Path:
    """Where jobs are kept unless configured: `$AGENT_RL_HOME/jobs`, beside the file store's `$AGENT_RL_HOME/files`."""
    return settings.home() / "jobs"


class JobsConfig(BaseModel):
    """Where fine-tuning jobs are kept and what a job may bring (ArbiterConfig.jobs; the runner reads the same)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    root: Path | None = Field(None, description="directory of the job store; default $AGENT_RL_HOME/jobs")
    allow_python_graders: bool = Field(
        False, description="accept jobs whose grader runs python (the job's own code, in the grader sandbox)")
    score_model_endpoint: ChatEndpoint | None = Field(
        None, description="OpenAI-compatible endpoint for score_model graders; without one they are refused")
    max_request_bytes: PositiveInt = Field(
        1024 * 1024, description="largest create request (a python grader's source travels in it)")

    def resolved_root(self) -> Path:
        return Path(self.root) if self.root is not None else default_root()

    def grader_context(self) -> GraderContext:
        """The operator's side of grading for these jobs: what create checks graders against, and the runner grades
        with."""
        return GraderContext(python=PythonSandboxConfig(enabled=self.allow_python_graders),
                             chat_endpoint=self.score_model_endpoint)


class JobStatus(str, Enum):
    """OpenAI's job statuses. We check files before answering create, so a job starts `queued`."""

    VALIDATING_FILES = "validating_files"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class JobNotFound(LookupError):
    """No job by that id (for that tenant: another tenant's job is not found either)."""


class UnknownAfter(LookupError):
    """`after` names no job (event, checkpoint) the caller may see."""


class JobStateError(ValueError):
    """The job's status does not allow the change (cancelling or finishing a finished job)."""

    def __init__(self, message: str, status: JobStatus) -> None:
        super().__init__(message)
        self.status = status


class JobInputMissing(ValueError):
    """A file the job was to copy is gone (deleted since it was checked); `param` is training_file or
    validation_file."""

    def __init__(self, param: str) -> None:
        super().__init__(f"the {param.replace('_', ' ')} is gone")
        self.param = param


class JobStoreUnavailable(RuntimeError):
    """The store's disk or database cannot be used right now (full disk, locked database); a retry may work."""


class FineTuningJob(BaseModel):
    """One job as stored; `to_openai()` is OpenAI's FineTuningJob object."""

    model_config = ConfigDict(frozen=True)

    id: str
    tenant: str
    model: str
    status: JobStatus
    created_at: int
    finished_at: int | None = None
    training_file: str
    validation_file: str | None = None
    method: dict[str, Any] = Field(description='normalized: {"type": t, t: {"hyperparameters": {...}, "grader": ...}}')
    hyperparameters: dict[str, Any] = Field(description="the method's hyperparameters as given, 'auto' where not")
    fine_tuned_model: str | None = None
    error: dict[str, Any] | None = Field(None, description='None, or {"code", "message", "param"}')
    seed: int
    suffix: str | None = None
    trained_tokens: int | None = None
    metadata: dict[str, str] | None = None
    estimated_finish: int | None = None
    result_files: list[str] = Field(default_factory=list)

    @property
    def method_type(self) -> str:
        return str(self.method["type"])

    @property
    def grader(self) -> dict[str, Any] | None:
        return method_grader(self.method)

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's `fine_tuning.job` object (the SDK's FineTuningJob); `organization_id` is the tenant."""
        return {
            "object": "fine_tuning.job", "id": self.id, "created_at": self.created_at, "error": self.error,
            "fine_tuned_model": self.fine_tuned_model, "finished_at": self.finished_at,
            "hyperparameters": {k: self.hyperparameters.get(k, "auto") for k in BASE_HYPERPARAMETERS},
            "model": self.model, "organization_id": self.tenant, "result_files": list(self.result_files),
            "seed": self.seed, "status": self.status.value, "trained_tokens": self.trained_tokens,
            "training_file": self.training_file, "validation_file": self.validation_file,
            "estimated_finish": self.estimated_finish, "integrations": [], "metadata": self.metadata,
            "method": self.method,
        }


class JobEvent(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    job_id: str
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    data: dict[str, Any] | None = None
    type: Literal["message", "metrics"] = "message"

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's `fine_tuning.job.event` object."""
        return {"object": "fine_tuning.job.event", "id": self.id, "created_at": self.created_at, "level": self.level,
                "message": self.message, "data": self.data if self.data is not None else {}, "type": self.type}


class JobCheckpoint(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    job_id: str
    created_at: int
    step_number: int
    metrics: dict[str, Any]
    fine_tuned_model_checkpoint: str

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's `fine_tuning.job.checkpoint` object."""
        return {"object": "fine_tuning.job.checkpoint", "id": self.id, "created_at": self.created_at,
                "fine_tuned_model_checkpoint": self.fine_tuned_model_checkpoint, "fine_tuning_job_id": self.job_id,
                "metrics": {**self.metrics, "step": self.metrics.get("step", self.step_number)},
                "step_number": self.step_number}


def _new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_CHARS))


def is_job_id(text: str) -> bool:
    """Whether `text` could be one of our job ids (anything else is answered like a missing job)."""
    return text.startswith("ftjob-") and 0 < len(text) - 6 <= 64 and all(c in _ID_ALPHABET for c in text[6:])


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _name_part(text: str) -> str:
    return _UNSAFE.sub("-", text).strip("-")[:64]


def fine_tuned_model_name(job: FineTuningJob) -> str:
    """OpenAI's style, `ft:<model>:<tenant>:<suffix>:<short id>` (`ft:tiny:acme::Ab3dE5gH` without a suffix): each
    part only letters, digits, '.', '_' and '-' (anything else becomes '-'), so the name is safe in a URL path."""
    return f"ft:{_name_part(job.model)}:{_name_part(job.tenant)}:{_name_part(job.suffix or '')}:{job.id[6:14]}"


def checkpoint_model_name(job: FineTuningJob, step: int) -> str:
    """A checkpoint's model name, as OpenAI names them: `<fine-tuned model name>:ckpt-step-<step>`."""
    return f"{fine_tuned_model_name(job)}:ckpt-step-{int(step)}"


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    model TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    finished_at INTEGER,
    training_file TEXT NOT NULL,
    validation_file TEXT,
    method TEXT NOT NULL,
    hyperparameters TEXT NOT NULL,
    fine_tuned_model TEXT,
    error TEXT,
    seed INTEGER NOT NULL,
    suffix TEXT,
    trained_tokens INTEGER,
    metadata TEXT,
    estimated_finish INTEGER,
    result_files TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS jobs_by_tenant ON jobs (tenant, seq);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, seq);
CREATE INDEX IF NOT EXISTS jobs_by_model ON jobs (tenant, fine_tuned_model);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    job_id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    level TEXT NOT NULL,
    message TEXT NOT NULL,
    data TEXT,
    type TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id, seq);
CREATE TABLE IF NOT EXISTS checkpoints (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    job_id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    step_number INTEGER NOT NULL,
    metrics TEXT NOT NULL,
    fine_tuned_model_checkpoint TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS checkpoints_by_job ON checkpoints (job_id, seq);
"""
_JOB_COLUMNS = ("id, tenant, model, status, created_at, finished_at, training_file, validation_file, method, "
                "hyperparameters, fine_tuned_model, error, seed, suffix, trained_tokens, metadata, estimated_finish, "
                "result_files")
_JSON_COLUMNS = ("method", "hyperparameters", "error", "metadata", "result_files")


def _dumps(value: Any) -> str | None:
    # ASCII JSON: any string (a lone surrogate included) is stored and read back as it was given.
    return None if value is None else json.dumps(value, sort_keys=True)


def _job(row: sqlite3.Row) -> FineTuningJob:
    values = {key: row[key] for key in row.keys()}  # noqa: SIM118 (sqlite3.Row)
    for key in _JSON_COLUMNS:
        if values[key] is not None:
            values[key] = json.loads(values[key])
    return FineTuningJob.model_validate(values)


def _event(row: sqlite3.Row) -> JobEvent:
    return JobEvent(id=row["id"], job_id=row["job_id"], created_at=row["created_at"], level=row["level"],
                    message=row["message"], data=json.loads(row["data"]) if row["data"] else None, type=row["type"])


def _checkpoint(row: sqlite3.Row) -> JobCheckpoint:
    return JobCheckpoint(id=row["id"], job_id=row["job_id"], created_at=row["created_at"],
                         step_number=row["step_number"], metrics=json.loads(row["metrics"]),
                         fine_tuned_model_checkpoint=row["fine_tuned_model_checkpoint"])


class JobStore:
    """Fine-tuning jobs per tenant: SQLite rows and one folder per job. Thread- and process-safe; methods block
    (the arbiter calls them off its event loop)."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.time, busy_timeout_s: float = 30.0) -> None:
        self.root = Path(root)
        self.tmp_dir = self.root / "tmp"
        self.clock = clock
        self.busy_timeout_s = busy_timeout_s
        open_wal_database(self.root / "jobs.db", _SCHEMA, busy_timeout_s, (self.tmp_dir,), "job store",
                          JobStoreUnavailable)
        self._swept = 0.0
        self.sweep()

    @classmethod
    def from_config(cls, config: JobsConfig) -> JobStore:
        return cls(config.resolved_root())

    # -- plumbing ---------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.root / "jobs.db", timeout=self.busy_timeout_s, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA synchronous=FULL")  # an answered create survives a power cut
        return db

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        try:
            with closing(self._connect()) as db:
                yield db
        except sqlite3.Error as exc:
            raise JobStoreUnavailable(f"cannot read the job store: {exc}") from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken with the write lock at once (BEGIN IMMEDIATE): committed on leaving,
        rolled back on any error."""
        try:
            with closing(self._connect()) as db:
                db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise JobStoreUnavailable(f"cannot write the job store: {exc}") from exc

    def _now(self) -> int:
        return int(self.clock())

    def _insert_event(self, db: sqlite3.Connection, job_id: str, message: str, level: str = "info",
                      data: Mapping[str, Any] | None = None, event_type: str = "message") -> JobEvent:
        event = JobEvent(id=_new_id("ftevent-"), job_id=job_id, created_at=self._now(), level=level,  # type: ignore[arg-type]
                         message=message, data=dict(data) if data is not None else None, type=event_type)  # type: ignore[arg-type]
        db.execute("INSERT INTO events (id, job_id, created_at, level, message, data, type) VALUES (?, ?, ?, ?, ?, ?, ?)",
                   (event.id, job_id, event.created_at, event.level, event.message, _dumps(event.data), event.type))
        return event

    def _fetch(self, db: sqlite3.Connection, job_id: str, tenant: str | None = None) -> FineTuningJob | None:
        sql, params = f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", [job_id]
        if tenant is not None:
            sql, params = sql + " AND tenant = ?", [job_id, tenant]
        row = db.execute(sql, params).fetchone()
        return _job(row) if row else None

    # -- the API side -----------------------------------------------------------------------------

    def create(self, tenant: str, *, model: str, training_file_path: Path, validation_file_path: Path | None = None,
               method: Mapping[str, Any] | None = None, seed: int | None = None, suffix: str | None = None,
               metadata: Mapping[str, str] | None = None, training_file: str | None = None,
               validation_file: str | None = None) -> FineTuningJob:
        """A new queued job of `tenant` with its folder (job.json, train.jsonl and validation.jsonl copied from the
        given paths) and a first event. `training_file`/`validation_file` are the file ids the job shows (default:
        the paths' names). `method` is OpenAI's (normalized here: checks.normalize_method). Nothing is left of a
        create that fails: JobRequestError (bad method, seed, suffix, metadata), JobInputMissing (a file is gone),
        JobStoreUnavailable."""
        method = normalize_method(dict(method) if method is not None else None)
        job = FineTuningJob(
            id=_new_id("ftjob-"), tenant=tenant, model=model, status=JobStatus.QUEUED, created_at=self._now(),
            training_file=training_file or Path(training_file_path).name,
            validation_file=(validation_file or Path(validation_file_path).name) if validation_file_path else None,
            method=method, hyperparameters=method_hyperparameters(method), seed=check_seed(seed),
            suffix=check_suffix(suffix), metadata=check_metadata(dict(metadata) if metadata is not None else None))
        folder = self._write_folder(job, Path(training_file_path),
                                    Path(validation_file_path) if validation_file_path else None)
        try:
            with self._write() as db:
                values = job.model_dump(mode="json")
                db.execute(f"INSERT INTO jobs ({_JOB_COLUMNS}) VALUES ({', '.join('?' * 18)})",
                           [_dumps(values[c]) if c in _JSON_COLUMNS else values[c]
                            for c in (c.strip() for c in _JOB_COLUMNS.split(","))])
                self._insert_event(db, job.id, "Created fine-tuning job")
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if self._now() - self._swept >= SWEEP_EVERY_S:
            self.sweep()
        log.info("fine-tuning job %s created for tenant %r: %s on %s", job.id, tenant, job.method_type, model)
        return job

    def _write_folder(self, job: FineTuningJob, training: Path, validation: Path | None) -> Path:
        """The job's folder, written in tmp/ and renamed into place; removed again on any failure."""
        part = self.tmp_dir / f"{job.id}.{secrets.token_hex(8)}"
        target = self.job_dir(job.id)
        try:
            part.mkdir()
            for source, name, param in ((training, TRAIN_FILE, "training_file"),
                                        (validation, VALIDATION_FILE, "validation_file")):
                if source is None:
                    continue
                try:
                    shutil.copyfile(source, part / name)
                except FileNotFoundError:
                    raise JobInputMissing(param) from None
            spec = {"id": job.id, "method": job.method_type, "grader": job.grader,
                    "hyperparameters": job.hyperparameters, "model": job.model, "seed": job.seed}
            (part / JOB_FILE).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            for path in part.iterdir():
                fsync_path(path)
            fsync_path(part)
            os.rename(part, target)
            fsync_path(self.root)  # the rename itself survives a crash
        except BaseException as exc:
            shutil.rmtree(part, ignore_errors=True)
            shutil.rmtree(target, ignore_errors=True)
            if isinstance(exc, OSError):
                raise JobStoreUnavailable(f"cannot write the job's folder: {exc.strerror or exc}") from exc
            raise
        return target

    def get(self, tenant: str, job_id: str) -> FineTuningJob | None:
        """`tenant`'s job by id; None for a missing job and for another tenant's alike."""
        with self._read() as db:
            return self._fetch(db, job_id, tenant)

    def list(self, tenant: str, after: str | None = None, limit: int = 20) -> tuple[list[FineTuningJob], bool]:
        """A page of `tenant`'s jobs, newest first, after the job `after`; and whether more follow. UnknownAfter when
        `after` is no job of `tenant`'s."""
        _check_limit(limit)
        with self._read() as db:
            rows, more = _newest_after(db, "jobs", _JOB_COLUMNS, "tenant", tenant, after, limit)
        return [_job(r) for r in rows], more

    def cancel(self, tenant: str, job_id: str) -> FineTuningJob:
        """Cancel `tenant`'s queued or running job (the runner sees `is_cancelled` and stops). JobNotFound for a
        missing or foreign job; JobStateError when it has finished (cancelled included)."""
        with self._write() as db:
            job = self._fetch(db, job_id, tenant)
            if job is None:
                raise JobNotFound(job_id)
            if job.status.finished:
                raise JobStateError(f"Job has already finished ({job.status.value}): {job_id}; only a queued or "
                                    "running job can be cancelled", job.status)
            db.execute("UPDATE jobs SET status = ?, finished_at = ?, estimated_finish = NULL WHERE id = ?",
                       (JobStatus.CANCELLED.value, self._now(), job_id))
            self._insert_event(db, job_id, "Fine-tuning job cancelled")
            job = self._fetch(db, job_id)
        assert job is not None
        log.info("fine-tuning job %s cancelled by tenant %r", job_id, tenant)
        return job

    def events(self, tenant: str, job_id: str, after: str | None = None,
               limit: int = 20) -> tuple[list[JobEvent], bool]:
        """A page of the job's events, newest first, after the event `after`. JobNotFound for a missing or foreign
        job, UnknownAfter for an event not of this job."""
        return self._page(tenant, job_id, "events", after, limit, _event)

    def checkpoints(self, tenant: str, job_id: str, after: str | None = None,
                    limit: int = 10) -> tuple[list[JobCheckpoint], bool]:
        """A page of the job's checkpoints, newest first, after the checkpoint `after` (as events)."""
        return self._page(tenant, job_id, "checkpoints", after, limit, _checkpoint)

    def _page(self, tenant: str, job_id: str, table: str, after: str | None, limit: int,
              make: Callable[[sqlite3.Row], Any]) -> tuple[list[Any], bool]:
        _check_limit(limit)
        with self._read() as db:
            if self._fetch(db, job_id, tenant) is None:
                raise JobNotFound(job_id)
            rows, more = _newest_after(db, table, "*", "job_id", job_id, after, limit)
        return [make(r) for r in rows], more

    # -- the runner side --------------------------------------------------------------------------

    def claim_next(self) -> FineTuningJob | None:
        """The oldest queued job, now running (with the event "Fine-tuning job started"); None when none is queued.
        Atomic across processes: two claimers never get the same job."""
        with self._write() as db:
            row = db.execute("SELECT id FROM jobs WHERE status = ? ORDER BY seq LIMIT 1",
                             (JobStatus.QUEUED.value,)).fetchone()
            if row is None:
                return None
            db.execute("UPDATE jobs SET status = ? WHERE id = ? AND status = ?",
                       (JobStatus.RUNNING.value, row["id"], JobStatus.QUEUED.value))
            self._insert_event(db, row["id"], "Fine-tuning job started")
            job = self._fetch(db, row["id"])
        log.info("fine-tuning job %s claimed", row["id"])
        return job

    def job(self, job_id: str) -> FineTuningJob | None:
        """A job by id, whatever its tenant (the runner's view)."""
        with self._read() as db:
            return self._fetch(db, job_id)

    def tenant_of(self, job_id: str) -> str:
        """The tenant that created the job; JobNotFound for an unknown id."""
        job = self.job(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job.tenant

    def is_cancelled(self, job_id: str) -> bool:
        """Whether the runner should stop: the job was cancelled (or is gone)."""
        job = self.job(job_id)
        return job is None or job.status is JobStatus.CANCELLED

    def add_event(self, job_id: str, message: str, level: Literal["info", "warn", "error"] = "info",
                  data: Mapping[str, Any] | None = None,
                  event_type: Literal["message", "metrics"] = "message") -> JobEvent:
        """Record an event the tenant sees in the job's events (`event_type` "metrics" for a step's numbers)."""
        if level not in ("info", "warn", "error"):
            raise ValueError(f"level must be info, warn or error, not {level!r}")
        with self._write() as db:
            if self._fetch(db, job_id) is None:
                raise JobNotFound(job_id)
            return self._insert_event(db, job_id, message, level, data, event_type)

    def add_checkpoint(self, job_id: str, step: int, metrics: Mapping[str, Any],
                       fine_tuned_model_checkpoint: str) -> JobCheckpoint:
        """Record a checkpoint the tenant sees in the job's checkpoints (metrics as OpenAI's: train_loss, ...)."""
        checkpoint = JobCheckpoint(id=_new_id("ftckpt-"), job_id=job_id, created_at=self._now(), step_number=int(step),
                                   metrics=dict(metrics), fine_tuned_model_checkpoint=fine_tuned_model_checkpoint)
        with self._write() as db:
            if self._fetch(db, job_id) is None:
                raise JobNotFound(job_id)
            db.execute("INSERT INTO checkpoints (id, job_id, created_at, step_number, metrics, "
                       "fine_tuned_model_checkpoint) VALUES (?, ?, ?, ?, ?, ?)",
                       (checkpoint.id, job_id, checkpoint.created_at, checkpoint.step_number,
                        _dumps(checkpoint.metrics), checkpoint.fine_tuned_model_checkpoint))
        return checkpoint

    def set_estimated_finish(self, job_id: str, at: int | None) -> None:
        """When a running job expects to finish (Unix seconds), shown as `estimated_finish`."""
        with self._write() as db:
            db.execute("UPDATE jobs SET estimated_finish = ? WHERE id = ? AND status = ?",
                       (at, job_id, JobStatus.RUNNING.value))

    def add_result_file(self, job_id: str, file_id: str) -> None:
        """A file (in the Files API, of the job's tenant) the job's `result_files` lists."""
        with self._write() as db:
            row = db.execute("SELECT result_files FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFound(job_id)
            files = [*json.loads(row["result_files"]), file_id]
            db.execute("UPDATE jobs SET result_files = ? WHERE id = ?", (_dumps(files), job_id))

    def finish(self, job_id: str, status: JobStatus | str, fine_tuned_model: str | None = None,
               error: Mapping[str, Any] | None = None, trained_tokens: int | None = None) -> FineTuningJob:
        """End a queued or running job as `status` (succeeded, failed or cancelled), with an event. A succeeded job
        without `fine_tuned_model` is named by `fine_tuned_model_name`; a failed one without `error` gets a generic
        one. A job cancelled meanwhile stays cancelled (returned as it is); finishing a job that succeeded or failed
        is a JobStateError; JobNotFound for an unknown id."""
        status = JobStatus(status)
        if not status.finished:
            raise ValueError(f"finish takes succeeded, failed or cancelled, not {status.value}")
        with self._write() as db:
            job = self._fetch(db, job_id)
            if job is None:
                raise JobNotFound(job_id)
            if job.status is JobStatus.CANCELLED:
                return job
            if job.status.finished:
                raise JobStateError(f"job {job_id} has already finished ({job.status.value})", job.status)
            now = self._now()
            if status is JobStatus.SUCCEEDED:
                name = fine_tuned_model or fine_tuned_model_name(job)
                db.execute("UPDATE jobs SET status = ?, finished_at = ?, fine_tuned_model = ?, trained_tokens = ?, "
                           "estimated_finish = NULL WHERE id = ?", (status.value, now, name, trained_tokens, job_id))
                self._insert_event(db, job_id, f"New fine-tuned model created: {name}")
                self._insert_event(db, job_id, "The job has successfully completed")
            elif status is JobStatus.FAILED:
                shown = {"code": "job_failed", "message": "the fine-tuning job failed", "param": None,
                         **(dict(error) if error else {})}
                db.execute("UPDATE jobs SET status = ?, finished_at = ?, error = ?, trained_tokens = ?, "
                           "estimated_finish = NULL WHERE id = ?",
                           (status.value, now, _dumps(shown), trained_tokens, job_id))
                self._insert_event(db, job_id, f"The job failed: {shown['message']}", level="error")
            else:
                db.execute("UPDATE jobs SET status = ?, finished_at = ?, estimated_finish = NULL WHERE id = ?",
                           (status.value, now, job_id))
                self._insert_event(db, job_id, "Fine-tuning job cancelled")
            job = self._fetch(db, job_id)
        assert job is not None
        log.info("fine-tuning job %s finished: %s", job_id, status.value)
        return job

    def job_dir(self, job_id: str) -> Path:
        """The job's folder (job.json, train.jsonl, validation.jsonl): what OpenAIJobEnvironment(job_dir=...) reads."""
        if not is_job_id(job_id):
            raise ValueError("not a fine-tuning job id")
        return self.root / job_id

    def find_model(self, tenant: str, fine_tuned_model: str) -> FineTuningJob | None:
        """`tenant`'s succeeded job that made the model `fine_tuned_model`; None for any other tenant's."""
        with self._read() as db:
            row = db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE tenant = ? AND fine_tuned_model = ? AND status = ? "
                             "ORDER BY seq DESC LIMIT 1",
                             (tenant, fine_tuned_model, JobStatus.SUCCEEDED.value)).fetchone()
        return _job(row) if row else None

    def fine_tuned_model_name(self, job: FineTuningJob) -> str:
        return fine_tuned_model_name(job)

    # -- housekeeping -----------------------------------------------------------------------------

    def sweep(self) -> None:
        """Remove what a crash left: folders in tmp/ older than an hour, job folders without a row older than an
        hour (younger ones may be another worker's create about to insert its row)."""
        now = self._now()
        self._swept = now
        try:
            with self._read() as db:
                known = {r["id"] for r in db.execute("SELECT id FROM jobs")}
            for path in self.tmp_dir.iterdir():
                if older_than(path, now - STALE_TMP_S):
                    shutil.rmtree(path, ignore_errors=True)
            for path in self.root.iterdir():
                if is_job_id(path.name) and path.name not in known and older_than(path, now - ORPHAN_GRACE_S):
                    shutil.rmtree(path, ignore_errors=True)
        except (OSError, JobStoreUnavailable) as exc:  # housekeeping only: the next sweep tries again
            log.warning("job store sweep failed: %s", exc)


def _newest_after(db: sqlite3.Connection, table: str, columns: str, owner_column: str, owner: str,
                  after: str | None, limit: int) -> tuple[list[sqlite3.Row], bool]:
    """One page of `owner`'s rows of `table`, newest first, after the row whose id is `after` (OpenAI's `after`
    cursor), and whether more follow. UnknownAfter when `after` is no row of that owner's."""
    where, params = f"{owner_column} = ?", [owner]
    if after is not None:
        mark = db.execute(f"SELECT seq FROM {table} WHERE id = ? AND {owner_column} = ?", (after, owner)).fetchone()
        if mark is None:
            raise UnknownAfter(after)
        where, params = where + " AND seq < ?", [owner, mark["seq"]]
    rows = db.execute(f"SELECT {columns} FROM {table} WHERE {where} ORDER BY seq DESC LIMIT ?",
                      [*params, limit + 1]).fetchall()
    return rows[:limit], len(rows) > limit


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be from 1 to {MAX_PAGE}")

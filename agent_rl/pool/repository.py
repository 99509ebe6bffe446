"""Read and write the benchmark pool: episodes, feedback, the routing table and the quarantine.

One `PoolRepository` per process is enough: it holds a thread-safe SQLAlchemy engine (SQLite in
WAL mode with a busy timeout, or PostgreSQL through psycopg 3), so the arbiter's worker threads
can share it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from sqlalchemy import Connection, Engine, and_, create_engine, delete, event, func, inspect, or_, select, update
from sqlalchemy import text as sql_text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool

from agent_rl import settings
from agent_rl.disk import use_wal
from agent_rl.pool import migrations, schema
from agent_rl.records import Episode, utcnow
from agent_rl.spec_credentials import credential_problem
from agent_rl.utc import as_utc, parse_utc

MAX_VERSION_LENGTH = 200
MAX_FEEDBACK_LENGTH = 2000
SQLITE_BUSY_TIMEOUT_S = 30.0


class SchemaVersionError(RuntimeError):
    """The pool was written by a newer agent-rl; opening it could corrupt it."""


class UnknownEpisodeError(KeyError):
    """No episode with this id in the pool."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else "unknown episode"


@dataclass(frozen=True, order=True)
class ExportCursor:
    """Position after the last exported row; ordering by (created_at, episode_id) is total and stable."""

    created_at: datetime
    episode_id: str

    def to_token(self) -> str:
        """A string to keep between runs (e.g. a Dagster cursor)."""
        return f"{self.created_at.astimezone(timezone.utc).isoformat()}|{self.episode_id}"

    @classmethod
    def from_token(cls, token: str) -> ExportCursor:
        stamp, sep, episode_id = token.partition("|")
        if not sep or not episode_id:
            raise ValueError(f"export cursor {token!r}: expected 'ISO-TIMESTAMP|EPISODE_ID'")
        return cls(parse_utc(stamp, f"export cursor {token!r}: its timestamp"), episode_id)


@dataclass
class ExportPage:
    """One page of an export. `cursor` is where the next page starts (unchanged when the page is empty)."""

    episodes: list[Episode]
    cursor: ExportCursor | None
    exhausted: bool


class Routing(BaseModel):
    """The traffic split: normalized weights per policy version and where each version is loaded from."""

    weights: dict[str, float]
    specs: dict[str, str]
    updated_at: datetime | None = None


class RoutingChange(BaseModel):
    id: int
    changed_at: datetime
    actor: str
    reason: str
    old_weights: dict[str, float]
    new_weights: dict[str, float]
    specs: dict[str, str]
    stats: dict[str, Any] | None = None


class QuarantinedRow(BaseModel):
    id: int
    episode_id: str | None
    payload: str
    reasons: list[str]
    partition: str
    created_at: datetime


def _json_dumps(value: Any) -> str:
    # Tool results may carry datetimes or other objects; the pool keeps their text form.
    return json.dumps(value, default=str, ensure_ascii=False)


# Database errors quote their statement, and by default its parameters: questions, answers and messages,
# which would then reach whatever logs the error. hide_parameters keeps them out of every error's text.
POSTGRES_ENGINE_OPTIONS: dict[str, Any] = {
    "json_serializer": _json_dumps, "pool_size": 8, "max_overflow": 8, "hide_parameters": True,
}


def _make_engine(url: str) -> Engine:
    url = settings.sqlalchemy_url(url)
    if url.startswith("sqlite"):
        in_memory = url in ("sqlite://", "sqlite:///:memory:") or "mode=memory" in url
        kwargs: dict[str, Any] = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False}}
        if in_memory:
            kwargs["poolclass"] = StaticPool  # one shared connection, else every thread sees an empty DB
        else:
            path = url.split("///", 1)[-1].split("?", 1)[0]
            if path:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, json_serializer=_json_dumps, hide_parameters=True, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            if not in_memory:
                use_wal(dbapi_conn, SQLITE_BUSY_TIMEOUT_S)
                # NORMAL is durable against process crashes in WAL mode; only a power cut loses the last commits.
                cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            cursor.close()

        return engine
    if url.startswith("postgresql"):
        return create_engine(url, pool_pre_ping=True, **POSTGRES_ENGINE_OPTIONS)
    raise ValueError(f"pool URL {url!r}: expected sqlite:///PATH or postgresql://HOST/DB")


def _make_writer(engine: Engine) -> Engine | None:
    """PostgreSQL: a second engine for episode inserts, in autocommit mode and without pre-ping (see
    `PoolRepository._insert_autocommit`). SQLite commits locally, so it needs none."""
    if engine.dialect.name != "postgresql":
        return None
    return create_engine(engine.url, isolation_level="AUTOCOMMIT", **POSTGRES_ENGINE_OPTIONS)


def _episode_row(episode: Episode) -> dict[str, Any]:
    row = episode.model_dump(mode="python")
    row["created_at"] = as_utc(episode.created_at)
    row["outcome"] = str(episode.outcome)
    row["task_category"] = str(episode.task_category) if episode.task_category is not None else None
    return row


def _row_episode(row: Mapping[str, Any]) -> Episode:
    data = dict(row)
    data.pop("feedback_at", None)
    return Episode.model_validate(data)


class PoolRepository:
    """The benchmark pool at `url` (default: AGENT_RL_POOL_URL or a SQLite file under AGENT_RL_HOME)."""

    def __init__(self, url: str | None = None, *, engine: Engine | None = None) -> None:
        self.url = settings.sqlalchemy_url(url or settings.pool_url())
        self.engine = engine or _make_engine(self.url)
        self._insert = postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert
        self._writer = _make_writer(self.engine) if engine is None else None  # a given engine is used as is
        self._ensure_schema()

    # -- schema -------------------------------------------------------------------------------

    def _ensure_schema(self) -> None:
        """Create a new pool, or upgrade one written by an earlier release in place (migrations.py)."""
        where = self.engine.url.render_as_string(hide_password=True)
        found = None
        if inspect(self.engine).has_table("schema_version"):
            with self.engine.connect() as conn:
                found = conn.execute(select(func.max(schema.schema_version.c.version))).scalar()
            if found is not None and found > schema.SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"benchmark pool at {where} has schema version {found}, but this agent-rl "
                    f"supports up to {schema.SCHEMA_VERSION}; upgrade agent-rl instead of opening it"
                )
        if found is not None and found < schema.SCHEMA_VERSION:
            with self.engine.begin() as conn:
                if conn.dialect.name == "postgresql":  # two processes opening an old pool upgrade it once
                    conn.execute(sql_text("LOCK TABLE schema_version IN EXCLUSIVE MODE"))
                    found = conn.execute(select(func.max(schema.schema_version.c.version))).scalar()
                migrations.upgrade(conn, int(found), schema.SCHEMA_VERSION, self._record_version)
        schema.metadata.create_all(self.engine, checkfirst=True)
        with self.engine.begin() as conn:
            self._record_version(conn, schema.SCHEMA_VERSION)

    def _record_version(self, conn: Connection, version: int) -> None:
        stmt = self._insert(schema.schema_version).values(version=version, applied_at=utcnow())
        conn.execute(stmt.on_conflict_do_nothing(index_elements=["version"]))

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.max(schema.schema_version.c.version))).scalar() or 0)

    def ping(self) -> None:
        """Raise if the database cannot be reached."""
        with self.engine.connect() as conn:
            conn.execute(select(1))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.dispose()
        self.engine.dispose()

    # -- episodes -----------------------------------------------------------------------------

    def insert_episodes(self, episodes: Iterable[Episode | Mapping[str, Any]]) -> int:
        """Store episodes; ones already present (same episode_id) are skipped. Returns how many were new."""
        rows: dict[str, dict[str, Any]] = {}
        for i, item in enumerate(episodes):
            try:
                episode = item if isinstance(item, Episode) else Episode.model_validate(item)
            except ValidationError as exc:
                raise ValueError(f"episode #{i}: not a valid Episode record: {exc}") from exc
            if episode.unserved is not None:  # no turn of the model's: stored, it would score the model for an outage
                raise ValueError(f"episode #{i}: unserved (the policy was unavailable); it is no evidence to store")
            rows.setdefault(episode.episode_id, _episode_row(episode))
        if not rows:
            return 0
        stmt = (
            self._insert(schema.episodes)
            .on_conflict_do_nothing(index_elements=["episode_id"])
            .returning(schema.episodes.c.episode_id)
        )
        if self._writer is not None and len(rows) <= self._writer.dialect.insertmanyvalues_page_size:
            return self._insert_autocommit(stmt, list(rows.values()))
        with self.engine.begin() as conn:
            inserted = conn.execute(stmt, list(rows.values())).all()
        return len(inserted)

    def _insert_autocommit(self, stmt: Any, rows: list[dict[str, Any]]) -> int:
        """Send the insert as one autocommitted statement, retried once on a dropped connection.

        One INSERT is atomic by itself and durable when it returns (synchronous commit), so the
        transaction adds nothing but round trips: this is 1 instead of 4 (ping, BEGIN, INSERT,
        COMMIT), 0.9 vs 1.4 ms per arbiter batch here. Without the ping, a connection the server
        closed (restart, idle timeout) shows up as an error on use; retrying is safe because the
        insert skips episode_ids already stored.
        """
        try:
            return self._insert_once(stmt, rows)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            return self._insert_once(stmt, rows)

    def _insert_once(self, stmt: Any, rows: list[dict[str, Any]]) -> int:
        with self._writer.connect() as conn:
            return len(conn.execute(stmt, rows).all())

    def get(self, episode_id: str) -> Episode | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(schema.episodes).where(schema.episodes.c.episode_id == episode_id)
            ).mappings().first()
        return _row_episode(row) if row is not None else None

    def _filters(
        self,
        start: datetime | None,
        end: datetime | None,
        policy_version: str | None = None,
        task_id: str | None = None,
        environments: Sequence[str] | None = None,
    ) -> list[Any]:
        c = schema.episodes.c
        where: list[Any] = []
        if environments is not None:
            where.append(c.environment.in_(list(environments)))
        if start is not None:
            where.append(c.created_at >= as_utc(start))
        if end is not None:
            where.append(c.created_at < as_utc(end))
        if policy_version is not None:
            where.append(c.policy_version == policy_version)
        if task_id is not None:
            where.append(c.task_id == task_id)
        return where

    def export(
        self,
        start: datetime | None = None,
        end: datetime | None = None,
        after_cursor: ExportCursor | str | None = None,
        limit: int = 1000,
        environments: Sequence[str] | None = None,
    ) -> ExportPage:
        """Episodes with start <= created_at < end, after `after_cursor`, oldest first, at most `limit`; with
        `environments`, only the episodes of those environments (one agent's week in a pool several agents share)."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if isinstance(after_cursor, str):
            after_cursor = ExportCursor.from_token(after_cursor)
        c = schema.episodes.c
        where = self._filters(start, end, environments=environments)
        if after_cursor is not None:
            stamp = as_utc(after_cursor.created_at)
            where.append(or_(c.created_at > stamp, and_(c.created_at == stamp, c.episode_id > after_cursor.episode_id)))
        stmt = select(schema.episodes).where(*where).order_by(c.created_at, c.episode_id).limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).mappings().all()
        episodes = [_row_episode(row) for row in rows]
        cursor = ExportCursor(rows[-1]["created_at"], rows[-1]["episode_id"]) if rows else after_cursor
        return ExportPage(episodes=episodes, cursor=cursor, exhausted=len(rows) < limit)

    def iter_export(
        self,
        start: datetime | None = None,
        end: datetime | None = None,
        after_cursor: ExportCursor | str | None = None,
        page_size: int = 1000,
        environments: Sequence[str] | None = None,
    ) -> Iterator[ExportPage]:
        """Every page of an export, until the range is exhausted."""
        while True:
            page = self.export(start, end, after_cursor, page_size, environments=environments)
            if page.episodes:
                yield page
            if page.exhausted:
                return
            after_cursor = page.cursor

    def count(
        self,
        start: datetime | None = None,
        end: datetime | None = None,
        policy_version: str | None = None,
        task_id: str | None = None,
    ) -> int:
        stmt = select(func.count()).select_from(schema.episodes).where(
            *self._filters(start, end, policy_version, task_id)
        )
        with self.engine.connect() as conn:
            return int(conn.execute(stmt).scalar() or 0)

    def count_by_environment(self, start: datetime | None = None, end: datetime | None = None) -> dict[str, int]:
        """Episodes per environment in a window: what a week's export of one agent leaves to the others."""
        c = schema.episodes.c
        stmt = select(c.environment, func.count()).where(*self._filters(start, end)).group_by(c.environment)
        with self.engine.connect() as conn:
            return {environment: int(n) for environment, n in conn.execute(stmt)}

    def count_by_version(self, start: datetime | None = None, end: datetime | None = None) -> dict[str, int]:
        c = schema.episodes.c
        stmt = select(c.policy_version, func.count()).where(*self._filters(start, end)).group_by(c.policy_version)
        with self.engine.connect() as conn:
            return {version: int(n) for version, n in conn.execute(stmt)}

    def record_feedback(
        self, episode_id: str, verdict: str, tenant: str | None = None, contexts: Collection[str] | None = None
    ) -> None:
        """Attach a user's verdict to an episode (a later verdict replaces an earlier one).

        With `tenant` and/or `contexts` only an episode of that tenant and those contexts qualifies;
        any other is reported exactly like a missing one, so a caller learns nothing outside its scope.
        """
        if not isinstance(verdict, str) or not verdict.strip():
            raise ValueError("feedback verdict must be a non-empty string")
        if len(verdict) > MAX_FEEDBACK_LENGTH:
            raise ValueError(f"feedback verdict is {len(verdict)} characters; at most {MAX_FEEDBACK_LENGTH}")
        c = schema.episodes.c
        where = [c.episode_id == episode_id]
        if tenant is not None:
            where.append(c.tenant == tenant)
        if contexts is not None:
            where.append(c.context.in_(sorted(contexts)))
        stmt = update(schema.episodes).where(*where).values(feedback=verdict.strip(), feedback_at=utcnow())
        with self.engine.begin() as conn:
            if conn.execute(stmt).rowcount == 0:
                raise UnknownEpisodeError(f"no episode {episode_id!r} in the benchmark pool")

    # -- routing ------------------------------------------------------------------------------

    def get_routing(self) -> Routing:
        """The current split; empty weights when no routing was ever set."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(schema.routing).order_by(schema.routing.c.policy_version)).mappings().all()
        return Routing(
            weights={r["policy_version"]: r["weight"] for r in rows},
            specs={r["policy_version"]: r["spec"] for r in rows},
            updated_at=max((r["updated_at"] for r in rows), default=None),
        )

    def set_routing(
        self,
        weights: Mapping[str, float],
        specs: Mapping[str, str] | None = None,
        reason: str = "",
        actor: str = "",
        stats: Mapping[str, Any] | None = None,
    ) -> Routing:
        """Replace the split with `weights` (normalized to sum 1) and record who changed it and why.

        A version's spec defaults to its previous spec, else to the version name itself
        (so `{"heuristic": 1.0}` needs no spec).
        """
        normalized = normalize_weights(weights)
        if specs is not None and not isinstance(specs, Mapping):
            raise ValueError("specs must be a mapping of policy version to spec string")
        for version, spec in (specs or {}).items():
            if version not in normalized:
                raise ValueError(f"specs[{version!r}]: no weight given for this policy version")
            if not isinstance(spec, str) or not spec.strip():
                raise ValueError(f"specs[{version!r}] must be a non-empty string")
            problem = credential_problem(spec)
            if problem:  # whatever its weight: a stored spec is shown to whoever reads the routing
                raise ValueError(f"specs[{version!r}] {problem}; nothing was stored")
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("reason must be a non-empty string saying why the routing changes")
        if not isinstance(actor, str) or not actor.strip():
            raise ValueError("actor must be a non-empty string naming who changes the routing")
        if stats is not None and not isinstance(stats, Mapping):
            raise ValueError("stats must be a JSON object (mapping) or None")
        stats_json = json.loads(_json_dumps(dict(stats))) if stats is not None else None
        with self._routing_change() as conn:
            now = utcnow()
            old = {r.policy_version: (r.weight, r.spec) for r in conn.execute(select(schema.routing))}
            new_specs = {
                v: (specs or {}).get(v) or (old[v][1] if v in old else v) for v in normalized
            }
            conn.execute(delete(schema.routing))
            conn.execute(
                schema.routing.insert(),
                [{"policy_version": v, "weight": w, "spec": new_specs[v], "updated_at": now} for v, w in normalized.items()],
            )
            conn.execute(
                schema.routing_history.insert().values(
                    changed_at=now,
                    actor=actor.strip(),
                    reason=reason.strip(),
                    old_weights={v: w for v, (w, _) in old.items()},
                    new_weights=normalized,
                    specs=new_specs,
                    stats=stats_json,
                )
            )
        return Routing(weights=normalized, specs=new_specs, updated_at=now)

    @contextmanager
    def _routing_change(self) -> Iterator[Connection]:
        """A transaction that holds the routing write lock from its first statement until commit.

        set_routing reads the old weights and writes the new ones plus a history record; two
        changes interleaving there would both record the same old weights, and the history would
        stop being a chain. pysqlite begins its own (deferred) transaction only at the first write,
        so the read would run outside it: SQLite takes the database write lock up front with BEGIN
        IMMEDIATE (on a connection whose driver leaves transactions to us). PostgreSQL locks the
        routing table in a mode that conflicts with itself but not with plain reads, so serving
        keeps reading the split while a change waits.
        """
        if self.engine.dialect.name == "sqlite":
            with self.engine.connect() as raw:
                conn = raw.execution_options(isolation_level="AUTOCOMMIT")
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.exec_driver_sql("ROLLBACK")
                    raise
                conn.exec_driver_sql("COMMIT")
            return
        with self.engine.begin() as conn:
            conn.execute(sql_text(f"LOCK TABLE {self._quoted(schema.routing)} IN SHARE ROW EXCLUSIVE MODE"))
            yield conn

    def _quoted(self, table: Any) -> str:
        return self.engine.dialect.identifier_preparer.format_table(table)

    def routing_history(self, limit: int | None = None) -> list[RoutingChange]:
        """Routing changes, oldest first (the latest `limit` of them when given)."""
        h = schema.routing_history
        stmt = select(h).order_by(h.c.id.desc())
        if limit is not None:
            stmt = stmt.limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).mappings().all()
        return [RoutingChange.model_validate(dict(r)) for r in reversed(rows)]

    # -- serving failures ---------------------------------------------------------------------

    def record_serving_failure(self, policy_version: str, requests: int, kind: str,
                               at: datetime | None = None) -> None:
        """Count `requests` that `policy_version` could not serve (an outage, not the model's answers)."""
        if requests < 1:
            raise ValueError(f"requests must be at least 1, got {requests}")
        with self.engine.begin() as conn:
            conn.execute(schema.serving_failures.insert().values(
                at=as_utc(at) if at is not None else utcnow(), policy_version=policy_version, requests=requests,
                kind=kind[:64]))

    def serving_failures(self, since: datetime) -> dict[str, int]:
        """Requests each version could not serve at or after `since`."""
        f = schema.serving_failures
        stmt = (select(f.c.policy_version, func.sum(f.c.requests)).where(f.c.at >= as_utc(since))
                .group_by(f.c.policy_version))
        with self.engine.connect() as conn:
            return {version: int(total) for version, total in conn.execute(stmt)}

    # -- quarantine ---------------------------------------------------------------------------

    def quarantine(self, rows: Iterable[tuple[Any, Iterable[str]] | Mapping[str, Any]], partition: str) -> int:
        """Park rejected rows with their reasons; `rows` are (payload, reasons) pairs or {"payload", "reasons"}.

        The payload may be anything (a dict, an Episode, raw text); it is stored as JSON text.
        Quarantining the same payload for the same partition again is a no-op. Returns how many were new.
        """
        if not isinstance(partition, str) or not partition.strip():
            raise ValueError("quarantine partition must be a non-empty string")
        now = utcnow()
        records: dict[str, dict[str, Any]] = {}
        for i, item in enumerate(rows):
            try:
                if isinstance(item, Mapping):
                    payload, reasons = item["payload"], item["reasons"]
                else:
                    payload, reasons = item
            except (TypeError, ValueError, KeyError) as exc:
                raise ValueError(
                    f"quarantine row #{i}: expected a (payload, reasons) pair or a mapping with those keys"
                ) from exc
            reasons = [reasons] if isinstance(reasons, str) else [str(r) for r in reasons]
            if not reasons:
                raise ValueError(f"quarantine row #{i}: give at least one reason")
            if isinstance(payload, BaseModel):
                payload = payload.model_dump(mode="json")
            text = payload if isinstance(payload, str) else _json_dumps(payload)
            episode_id = payload.get("episode_id") if isinstance(payload, Mapping) else None
            key = hashlib.sha256(f"{partition}\0{text}".encode("utf-8", "surrogatepass")).hexdigest()
            records.setdefault(
                key,
                {
                    "row_key": key,
                    "episode_id": str(episode_id)[:200] if episode_id is not None else None,
                    # Lone surrogates cannot be stored by either database: keep them as escapes.
                    "payload": text.encode("utf-8", "backslashreplace").decode("utf-8"),
                    "reasons": reasons,
                    "partition": partition,
                    "created_at": now,
                },
            )
        if not records:
            return 0
        stmt = (
            self._insert(schema.quarantine)
            .on_conflict_do_nothing(index_elements=["row_key"])
            .returning(schema.quarantine.c.id)
        )
        with self.engine.begin() as conn:
            return len(conn.execute(stmt, list(records.values())).all())

    def quarantined(self, partition: str | None = None) -> list[QuarantinedRow]:
        q = schema.quarantine
        stmt = select(q).order_by(q.c.id)
        if partition is not None:
            stmt = stmt.where(q.c.partition == partition)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).mappings().all()
        return [
            QuarantinedRow.model_validate({k: v for k, v in r.items() if k != "row_key"}) for r in rows
        ]


def normalize_weights(weights: Any) -> dict[str, float]:
    """Weights divided by their sum; ValueError naming the bad entry when they cannot be a split."""
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError("weights must be a non-empty mapping of policy version to weight")
    clean: dict[str, float] = {}
    for version, weight in weights.items():
        if not isinstance(version, str) or not version.strip() or len(version) > MAX_VERSION_LENGTH:
            raise ValueError(f"weights: policy version {version!r} must be a non-empty string of at most {MAX_VERSION_LENGTH} characters")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"weights[{version!r}] must be a finite number, got {weight!r}")
        if weight < 0:
            raise ValueError(f"weights[{version!r}] must be >= 0, got {weight}")
        clean[version] = float(weight)
    total = sum(clean.values())
    if total <= 0:
        raise ValueError("weights must sum to more than 0 (at least one version needs traffic)")
    return {v: w / total for v, w in clean.items()}

"""The gateway's episodes while they are served, in the pool's `gateway_live` table (schema.py).

Every arbiter worker process reads and extends the same rows, so a conversation continues wherever its next
call lands; this is the authoritative copy, a worker's memory only a cache of it. Concurrency is settled by
the database, never by a lock held across an upstream call:
  - a call extending a conversation it found by its transcript updates the row only if the row still holds
    that transcript (`prefix`): of two calls extending the same state, the second finds it moved on and
    becomes an episode of its own (a fork), as in one process. A relayed stream, whose header goes out before
    its reply is recorded, makes that test before its upstream is asked: it claims the row (`prefix` goes from
    the transcript to a token of the call's, only if it still holds the transcript), records its reply only
    while the row still holds its token, and gives the transcript back when it gets no reply;
  - a call naming its session updates the row with increments (`calls = calls + 1`, ...) in one statement,
    so calls that race from two workers are both counted and neither works from a stale copy;
  - ending reads the row under a write lock (SELECT ... FOR UPDATE on PostgreSQL, BEGIN IMMEDIATE on
    SQLite), inserts the episode and deletes the row in one transaction: whoever ends it, it is written once.

What every call does (find, insert, extend) goes to the driver as fixed SQL: building and compiling a
SQLAlchemy statement costs more than the database's own work here (~0.05 ms for a SQLite update), and the
gateway's budget is a few milliseconds a call. The rare paths (ending, sweeping) use SQLAlchemy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Engine, bindparam, create_engine, delete, event, func, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import StaticPool

from agent_rl.pool import schema
from agent_rl.pool.repository import PoolRepository, _episode_row, _json_dumps
from agent_rl.records import Episode
from agent_rl.utc import as_utc, parse_utc

_T = schema.gateway_live
_JSON_COLUMNS = ("messages", "tools")
_TIME_COLUMNS = ("created_at", "last_active")
# What finding an episode needs: everything but its transcript and tools (the call brings its own).
LIGHT = [c.name for c in _T.c if c.name not in _JSON_COLUMNS]
_COUNTERS = ("prompt_tokens", "completion_tokens", "latency_ms")

_END_SELECT = select(_T).where(_T.c.episode_id == bindparam("episode_id"))
_REPLACE = update(_T).where(_T.c.episode_id == bindparam("b_episode_id"))
_IDLE = (select(_T.c.episode_id).where(_T.c.last_active < bindparam("before"))
         .order_by(_T.c.last_active).limit(bindparam("n")))
_OLDEST = select(_T.c.episode_id).order_by(_T.c.last_active).limit(bindparam("n"))
_COUNT = select(func.count()).select_from(_T)


class Query:
    """One statement of what every call does, ready for a driver: its SQL, parameters, whether rows come back
    and how to read them. LiveStore runs it on a pooled connection; a caller with an asynchronous driver
    connection (arbiter/gateway/shared.py, PostgreSQL) runs it there instead."""

    __slots__ = ("sql", "params", "fetch", "decode")

    def __init__(self, sql: str, params: Mapping[str, Any], fetch: bool = False,
                 decode: Callable[[Any], Any] = lambda rows: rows) -> None:  # fmt: skip
        self.sql, self.params, self.fetch, self.decode = sql, params, fetch, decode


# SQLite's busy and locked codes: LiveStore's SQLite connections do not wait for the write lock, so that the
# caller can wait without blocking its event loop (SQLite's own wait sleeps a millisecond or more at a time).
_SQLITE_BUSY = (5, 6)


class LiveStore:
    """Live gateway episodes in the pool at `pool` (SQLite or PostgreSQL); thread-safe like the pool itself.

    On SQLite its connections never wait for the write lock: a busy database raises at once (`busy` says so)
    and the caller tries again when it suits it."""

    def __init__(self, pool: PoolRepository) -> None:
        self.pool = pool
        self.postgres = pool.engine.dialect.name == "postgresql"
        self.engine = pool.engine if self.postgres else _no_wait_engine(pool.engine)
        # PostgreSQL: the pool's autocommit engine (one round trip a statement); SQLite commits locally.
        self._direct = pool._writer if pool._writer is not None else self.engine  # noqa: SLF001
        insert = pool._insert  # noqa: SLF001 - the dialect's INSERT (ON CONFLICT)
        self._insert_episode = insert(schema.episodes).on_conflict_do_nothing(index_elements=["episode_id"])
        self.errors: tuple[type[BaseException], ...] = (SQLAlchemyError, self.engine.dialect.loaded_dbapi.Error)
        self._sql = {name: self._dialect_sql(text) for name, text in _SQL.items()}

    def close(self) -> None:
        if self.engine is not self.pool.engine:
            self.engine.dispose()

    @staticmethod
    def busy(exc: BaseException) -> bool:
        """Whether `exc` is SQLite's "database is locked" (nothing was done: trying again is safe)."""
        orig = getattr(exc, "orig", exc)
        return getattr(orig, "sqlite_errorcode", None) in _SQLITE_BUSY or "database is locked" in str(orig)

    def _dialect_sql(self, text: str) -> str:
        if not self.postgres:
            return text
        text = re.sub(r":(j_\w+)", r"CAST(%(\1)s AS JSON)", text)
        return re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", text)

    # -- the driver, directly ------------------------------------------------------------------------

    def execute(self, query: Query) -> Any:
        """Run a Query on a pooled driver connection; commit (SQLite) or autocommit (PostgreSQL)."""
        connection = self._direct.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute(query.sql, query.params)
            rows = cursor.fetchall() if query.fetch else None
            cursor.close()
            if not self.postgres:
                connection.commit()
        except BaseException:
            if self.postgres:  # a connection the server dropped (restart, outage) must not be handed out again
                connection.invalidate()
                self._direct.pool.dispose()
            raise
        finally:
            connection.close()
        return query.decode(rows)

    def _bind(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """Driver parameters for a row: JSON as text, times as the pool stores them."""
        out: dict[str, Any] = {}
        for name, value in row.items():
            if name in _JSON_COLUMNS:
                out["j_" + name] = _json_dumps(value)
            elif name in _TIME_COLUMNS or name == "now":
                out[name] = self._time(value)
            else:
                out[name] = value
        return out

    def _time(self, value: datetime) -> Any:
        if self.postgres:
            return as_utc(value)
        # SQLAlchemy's SQLite DATETIME text (UTCDateTime stores naive UTC), so that comparisons stay exact.
        return as_utc(value).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S.%f")

    @staticmethod
    def _light(values: Sequence[Any]) -> dict[str, Any]:
        row = dict(zip(LIGHT, values))
        for name in _TIME_COLUMNS:
            row[name] = parse_utc(row[name], name)
        return row

    # -- what every call does -------------------------------------------------------------------------

    def find_session_q(self, tenant: str, context: str, name: str) -> Query:
        """The episode named `name` in this tenant and context: by its session name, else by its episode id."""
        def decode(rows: Any) -> dict[str, Any] | None:
            found = sorted((self._light(r) for r in rows), key=lambda r: r["session"] != name)
            return found[0] if found else None

        return Query(self._sql["find_session"], {"tenant": tenant, "context": context, "name": name}, True, decode)

    def find_prefix_q(self, tenant: str, context: str, hashes: Sequence[str]) -> Query:
        """The episode whose transcript is the longest of `hashes` (ordered shortest first, at least one); of
        several with the same transcript, the one that has had it longest."""
        rank = {h: i for i, h in enumerate(hashes)}

        def decode(rows: Any) -> dict[str, Any] | None:
            best = None
            for row in map(self._light, rows):  # oldest first: keep the first of the longest transcript
                if best is None or rank[row["prefix"]] > rank[best["prefix"]]:
                    best = row
            return best

        names = ", ".join(_param(self.postgres, f"h{i}") for i in range(len(hashes)))
        params = {"tenant": tenant, "context": context, **{f"h{i}": h for i, h in enumerate(hashes)}}
        return Query(self._sql["find_prefix"].replace("__IN__", names), params, True, decode)

    def insert_q(self, row: Mapping[str, Any]) -> Query:
        """Add a live episode: gives False when its id or its session name (in its tenant and context) is taken."""
        return Query(self._sql["insert"], self._bind(row), True, bool)

    def extend_q(self, episode_id: str, values: Mapping[str, Any], added: Mapping[str, float],
                 expected_prefix: str | None = None) -> Query:  # fmt: skip
        """Record one more call: set `values` (messages, prefix, last_active; final_tool and tools when not
        None), add `added` to the counters (and one to calls); with `expected_prefix`, only while the row still
        holds that transcript. Gives the row's version, calls, final tool and session after the change, or
        None when the row is gone or has moved on."""
        params = self._bind({"now": values["last_active"], "messages": values["messages"],
                             "tools": values.get("tools")})
        params.update(episode_id=episode_id, prefix=values.get("prefix"), final_tool=values.get("final_tool"),
                      expected=expected_prefix, set_tools=values.get("tools") is not None,
                      **{name: added.get(name, 0) for name in _COUNTERS})
        name = "extend_prefix" if expected_prefix is not None else "extend"
        return Query(self._sql[name], params, True, _counted)

    def claim_q(self, episode_id: str, expected: str, token: str, now: datetime) -> Query:
        """Take the transcript `expected` for one call: the row then holds `token` (no call finds it by that
        transcript meanwhile) and counts as active. Gives the row's version after the change, or None when the
        row is gone or has moved on."""
        params = {"episode_id": episode_id, "expected": expected, "token": token, "now": self._time(now)}
        return Query(self._sql["claim"], params, True, lambda rows: rows[0][0] if rows else None)

    def release_q(self, episode_id: str, token: str, prefix: str) -> Query:
        """Give a claimed transcript back (the call got no reply): the row holds `prefix` again."""
        return Query(self._sql["release"], {"episode_id": episode_id, "token": token, "prefix": prefix})

    def touch_q(self, episode_id: str, now: datetime) -> Query:
        """Mark the episode active (a call on it is starting), so that no worker ends it as idle meanwhile."""
        return Query(self._sql["touch"], {"episode_id": episode_id, "now": self._time(now)})

    def find_session(self, tenant: str, context: str, name: str) -> dict[str, Any] | None:
        return self.execute(self.find_session_q(tenant, context, name))

    def find_prefix(self, tenant: str, context: str, hashes: Sequence[str]) -> dict[str, Any] | None:
        return self.execute(self.find_prefix_q(tenant, context, hashes)) if hashes else None

    def insert(self, row: Mapping[str, Any]) -> bool:
        return self.execute(self.insert_q(row))

    def extend(self, episode_id: str, values: Mapping[str, Any], added: Mapping[str, float],
               expected_prefix: str | None = None) -> dict[str, Any] | None:  # fmt: skip
        return self.execute(self.extend_q(episode_id, values, added, expected_prefix))

    def claim(self, episode_id: str, expected: str, token: str, now: datetime) -> int | None:
        return self.execute(self.claim_q(episode_id, expected, token, now))

    def release(self, episode_id: str, token: str, prefix: str) -> None:
        self.execute(self.release_q(episode_id, token, prefix))

    def touch(self, episode_id: str, now: datetime) -> None:
        self.execute(self.touch_q(episode_id, now))

    def get(self, episode_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(_END_SELECT, {"episode_id": episode_id}).mappings().first()
        return dict(row) if row is not None else None

    # -- rarer writes -------------------------------------------------------------------------------

    def replace(self, row: Mapping[str, Any]) -> bool:
        """Overwrite a live episode with a worker's own copy (one it kept while the pool was down); False when
        it is no longer live."""
        values = {k: v for k, v in row.items() if k not in ("episode_id", "row_version")}
        stmt = _REPLACE.values(**values, row_version=_T.c.row_version + 1)
        with self.engine.begin() as conn:
            return conn.execute(stmt, {"b_episode_id": row["episode_id"]}).rowcount > 0

    # -- ending --------------------------------------------------------------------------------------

    def end(self, episode_id: str, build: Callable[[dict[str, Any]], Episode | None], *,
            row_version: int | None = None, idle_before: datetime | None = None) -> Episode | None:  # fmt: skip
        """End a live episode: build its record from the row (`build` may refuse with None: another tenant's),
        then, in one short transaction, delete the row if it is still at the version read (compare-and-set)
        and insert the record. Whoever ends it, it is written once; a call that extended it meanwhile makes
        this read it again.

        With `row_version`, only if the row is at that version; with `idle_before`, only if its last activity
        was before then. Returns the record written, or None when nothing was (gone, moved on, active again,
        refused)."""
        for _ in range(8):
            row = self.get(episode_id)
            if row is None or (row_version is not None and row["row_version"] != row_version):
                return None
            if idle_before is not None and row["last_active"] >= idle_before:
                return None
            record = build(row)
            if record is None:
                return None
            if self._swap(episode_id, row["row_version"], record):
                return record
            if row_version is not None:
                return None
        return None

    def finish(self, record: Episode) -> None:
        """Write an episode a worker ended from its own copy, and take its row (if any) out of the live ones,
        in one transaction; writing it again is harmless."""
        self._swap(record.episode_id, None, record)

    def _swap(self, episode_id: str, row_version: int | None, record: Episode) -> bool:
        """Delete the live row (only at `row_version`, when given) and insert `record`, in one transaction that
        holds SQLite's write lock only for those two statements. False when the row had moved on."""
        if self.postgres:
            with self.engine.begin() as conn:
                where = [_T.c.episode_id == episode_id]
                if row_version is not None:
                    where.append(_T.c.row_version == row_version)
                if conn.execute(delete(_T).where(*where)).rowcount == 0 and row_version is not None:
                    return False
                conn.execute(self._insert_episode, [_episode_row(record)])
            return True
        params = self._episode_params(record)  # prepared before the lock is taken
        connection = self.engine.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            try:
                cursor.execute(_SQL["delete"] + (" AND row_version = :row_version" if row_version is not None else ""),
                               {"episode_id": episode_id, "row_version": row_version})
                moved = cursor.rowcount == 0 and row_version is not None
                if not moved:
                    cursor.execute(_SQL["insert_episode"], params)
            except BaseException:
                connection.rollback()
                raise
            connection.commit()
            cursor.close()
        finally:
            connection.close()
        return not moved

    def _episode_params(self, record: Episode) -> dict[str, Any]:
        row = _episode_row(record)
        out = {}
        for name in _EPISODE_COLUMNS:
            value = row.get(name)
            if name in _EPISODE_JSON:
                value = _json_dumps(value)
            elif name in _EPISODE_TIMES and value is not None:
                value = self._time(value)
            out[name] = value
        return out

    # -- sweeping -----------------------------------------------------------------------------------

    def idle(self, before: datetime, limit: int = 200) -> list[str]:
        """Episodes without a call since `before`, least recently active first."""
        with self.engine.connect() as conn:
            return list(conn.execute(_IDLE, {"before": before, "n": limit}).scalars())

    def oldest(self, n: int) -> list[str]:
        """The `n` least recently active episodes."""
        with self.engine.connect() as conn:
            return list(conn.execute(_OLDEST, {"n": n}).scalars())

    def checkpoint(self) -> None:
        """SQLite: write the WAL back into the database (what its connections leave to this); blocks."""
        if not self.postgres and self.engine is not self.pool.engine:
            with self.pool.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    def count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(_COUNT).scalar() or 0)


def _no_wait_engine(engine: Engine) -> Engine:
    """An engine on the same SQLite database whose connections raise at once when it is locked (the pool's own
    engine when the database is in memory: one shared connection, never locked by another process)."""
    if isinstance(engine.pool, StaticPool):
        return engine
    url = engine.url.render_as_string(hide_password=False)
    fast = create_engine(url, json_serializer=_json_dumps, hide_parameters=True,
                         connect_args={"timeout": 0, "check_same_thread": False})

    @event.listens_for(fast, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA synchronous=NORMAL")  # as the pool's (WAL is the database's own setting)
        cursor.execute("PRAGMA busy_timeout=0")
        # A checkpoint writes the WAL back and syncs the file: tens of milliseconds on a busy disk, which an
        # event loop must not wait for. LiveStore.checkpoint does it, from a thread.
        cursor.execute("PRAGMA wal_autocheckpoint=0")
        cursor.close()

    return fast


def _param(postgres: bool, name: str) -> str:
    return f"%({name})s" if postgres else f":{name}"


_COLUMNS = [c.name for c in _T.c]
_EPISODE_COLUMNS = [c.name for c in schema.episodes.c]
_EPISODE_JSON = {c.name for c in schema.episodes.c if isinstance(c.type, JSON)}
_EPISODE_TIMES = {c.name for c in schema.episodes.c if isinstance(c.type, schema.UTCDateTime)}
_RETURNING = "RETURNING row_version, calls, final_tool, session"
_EXTEND = (
    "UPDATE gateway_live SET messages = :j_messages, prefix = :prefix, last_active = :now, "
    "final_tool = COALESCE(:final_tool, final_tool), "
    "tools = CASE WHEN :set_tools THEN :j_tools ELSE tools END, "
    "prompt_tokens = prompt_tokens + :prompt_tokens, completion_tokens = completion_tokens + :completion_tokens, "
    "latency_ms = latency_ms + :latency_ms, calls = calls + 1, row_version = row_version + 1 "
    "WHERE episode_id = :episode_id")
# Written as SQLite's named parameters; PostgreSQL's are derived from them (LiveStore._dialect_sql).
_SQL = {
    "find_session": f"SELECT {', '.join(LIGHT)} FROM gateway_live WHERE tenant = :tenant AND context = :context "
                    "AND (session = :name OR episode_id = :name) LIMIT 2",
    "find_prefix": f"SELECT {', '.join(LIGHT)} FROM gateway_live WHERE tenant = :tenant AND context = :context "
                   "AND prefix IN (__IN__) ORDER BY last_active, episode_id",
    "insert": f"INSERT INTO gateway_live ({', '.join(_COLUMNS)}) VALUES "
              f"({', '.join((':j_' if c in _JSON_COLUMNS else ':') + c for c in _COLUMNS)}) "
              "ON CONFLICT DO NOTHING RETURNING episode_id",
    "extend": f"{_EXTEND} {_RETURNING}",
    "extend_prefix": f"{_EXTEND} AND prefix = :expected {_RETURNING}",
    "claim": "UPDATE gateway_live SET prefix = :token, last_active = :now, row_version = row_version + 1 "
             "WHERE episode_id = :episode_id AND prefix = :expected RETURNING row_version",
    "release": "UPDATE gateway_live SET prefix = :prefix WHERE episode_id = :episode_id AND prefix = :token",
    "touch": "UPDATE gateway_live SET last_active = :now WHERE episode_id = :episode_id",
    "delete": "DELETE FROM gateway_live WHERE episode_id = :episode_id",
    "insert_episode": f"INSERT INTO episodes ({', '.join(_EPISODE_COLUMNS)}) VALUES "
                      f"({', '.join(':' + c for c in _EPISODE_COLUMNS)}) ON CONFLICT (episode_id) DO NOTHING",
}


def _counted(rows: Any) -> dict[str, Any] | None:
    return dict(zip(("row_version", "calls", "final_tool", "session"), rows[0])) if rows else None


class AsyncPostgres:
    """Connections of psycopg's asyncio driver to the pool's PostgreSQL server (autocommit) that run Query
    objects: an event loop waits for the server without handing the call to a thread (which, in a process
    whose loop keeps the CPU busy, waits milliseconds for the interpreter lock to come back)."""

    def __init__(self, url: Any, size: int = 8) -> None:
        self.conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.size = size
        self._idle: list[Any] = []

    async def execute(self, query: Query) -> Any:
        import psycopg

        conn = self._idle.pop() if self._idle else await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, connect_timeout=5)
        try:
            async with conn.cursor() as cursor:
                await cursor.execute(query.sql, query.params)
                rows = await cursor.fetchall() if query.fetch else None
        except BaseException:
            await conn.close()  # whatever state it was left in (an error, a cancelled call), it is not reused
            raise
        if len(self._idle) < self.size:
            self._idle.append(conn)
        else:
            await conn.close()
        return rows

    async def close(self) -> None:
        while self._idle:
            await self._idle.pop().close()

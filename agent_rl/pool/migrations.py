"""In-place upgrades of a benchmark pool written by an earlier release (SQLite and PostgreSQL).

Each step takes the pool from version N to N + 1 inside one transaction together with its
`schema_version` row, so a pool is either fully at the old version or fully at the new one: an
interrupted upgrade is simply run again on the next open. Nothing is copied out and back: columns
are added and renamed where they are, so no episode, routing entry or quarantined row is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import Connection, inspect
from sqlalchemy import text as sql_text

from agent_rl.pool.schema import gateway_live, serving_failures

log = logging.getLogger(__name__)


def _v1_to_v2(conn: Connection) -> None:
    """Environments as plug-ins: episodes get `environment` ('email': all earlier episodes came from the
    email assistant), `inbox_id` -> `context`, `sources` -> `citations`, categories up to 64 characters, and `tools` (the schemas
    a gateway episode was offered)."""
    columns = {c["name"] for c in inspect(conn).get_columns("episodes")}
    if "environment" not in columns:
        conn.execute(sql_text("ALTER TABLE episodes ADD COLUMN environment VARCHAR(64) NOT NULL DEFAULT 'email'"))
    if "inbox_id" in columns:
        conn.execute(sql_text("ALTER TABLE episodes RENAME COLUMN inbox_id TO context"))
    if "sources" in columns:
        conn.execute(sql_text("ALTER TABLE episodes RENAME COLUMN sources TO citations"))
    if "tools" not in columns:
        conn.execute(sql_text("ALTER TABLE episodes ADD COLUMN tools JSON"))
    if conn.dialect.name == "postgresql":  # SQLite does not enforce VARCHAR lengths
        conn.execute(sql_text("ALTER TABLE episodes ALTER COLUMN task_category TYPE VARCHAR(64)"))
    conn.execute(sql_text("CREATE INDEX IF NOT EXISTS ix_episodes_environment ON episodes (environment)"))


def _v2_to_v3(conn: Connection) -> None:
    """The gateway on several workers: live gateway episodes move from one process's memory to `gateway_live`
    (a new table; nothing existing changes)."""
    gateway_live.create(conn, checkfirst=True)


def _v3_to_v4(conn: Connection) -> None:
    """The loop's names: `scenario_id` (the email assistant's) -> `task_id`, with its index."""
    columns = {c["name"] for c in inspect(conn).get_columns("episodes")}
    if "scenario_id" in columns and "task_id" not in columns:
        conn.execute(sql_text("DROP INDEX IF EXISTS ix_episodes_scenario_id"))
        conn.execute(sql_text("ALTER TABLE episodes RENAME COLUMN scenario_id TO task_id"))
    conn.execute(sql_text("CREATE INDEX IF NOT EXISTS ix_episodes_task_id ON episodes (task_id)"))


def _v4_to_v5(conn: Connection) -> None:
    """An outage is not evidence: requests a version could not serve are counted in `serving_failures` (a new
    table; nothing existing changes)."""
    serving_failures.create(conn, checkfirst=True)


# STEPS[n] upgrades a pool from version n to n + 1.
STEPS: dict[int, Callable[[Connection], None]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5}


def upgrade(conn: Connection, found: int, target: int, record: Callable[[Connection, int], None]) -> None:
    """Apply every step from `found` to `target`, recording each new version with `record` in the same
    transaction as the step."""
    for version in range(found, target):
        step = STEPS.get(version)
        if step is None:
            raise RuntimeError(f"no migration from pool schema version {version} to {version + 1}")
        log.info("upgrading the benchmark pool from schema version %d to %d", version, version + 1)
        step(conn)
        record(conn, version + 1)

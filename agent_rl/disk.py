"""Small facts about files on disk that the stores written crash-safe need (the file store, the job store), and
WAL mode for the SQLite files several processes share (the pool, the world store, those stores)."""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path


def older_than(path: Path, cutoff: float) -> bool:
    """Whether `path` was last modified before `cutoff` (Unix seconds); a file gone meanwhile is not."""
    try:
        return path.stat().st_mtime < cutoff
    except FileNotFoundError:
        return False


def fsync_path(path: Path) -> None:
    """Flush a file or a directory to disk (a directory: the renames in it survive a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def use_wal(db: sqlite3.Connection, wait_s: float = 30.0) -> None:
    """Put the file in WAL mode, once: asked again on a file already in WAL it takes no lock. Several processes
    opening one file together (an arbiter's workers at start-up) were seen to fail at once with "database is
    locked" on the switch, the connection's busy timeout notwithstanding: retry for up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def open_wal_database(db: Path, schema: str, timeout_s: float, dirs: tuple[Path, ...], what: str,
                      unavailable: type[Exception]) -> None:
    """Make `dirs` and the SQLite database `db` in WAL mode with its tables (`schema`: idempotent DDL), the way
    both stores open: they are shared by several processes, so WAL lets readers go on while one writes. Any
    failure is raised as `unavailable` ("the <what> at <folder> cannot be opened: ..."), the store's own error."""
    try:
        for folder in dirs:
            folder.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(db, timeout=timeout_s)) as conn:
            use_wal(conn, timeout_s)
            conn.executescript(schema)
    except (OSError, sqlite3.Error) as exc:
        raise unavailable(f"the {what} at {db.parent} cannot be opened: {exc}") from exc

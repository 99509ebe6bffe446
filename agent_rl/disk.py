"""Small facts about files on disk that the stores written crash-safe need (the file store, the job store)."""

from __future__ import annotations

import os
import sqlite3
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


def open_wal_database(db: Path, schema: str, timeout_s: float, dirs: tuple[Path, ...], what: str,
                      unavailable: type[Exception]) -> None:
    """Make `dirs` and the SQLite database `db` in WAL mode with its tables (`schema`: idempotent DDL), the way
    both stores open: they are shared by several processes, so WAL lets readers go on while one writes. Any
    failure is raised as `unavailable` ("the <what> at <folder> cannot be opened: ..."), the store's own error."""
    try:
        for folder in dirs:
            folder.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(db, timeout=timeout_s)) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(schema)
    except (OSError, sqlite3.Error) as exc:
        raise unavailable(f"the {what} at {db.parent} cannot be opened: {exc}") from exc

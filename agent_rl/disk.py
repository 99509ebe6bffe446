"""Small facts about files on disk that the stores written crash-safe need (the file store, the job store)."""

from __future__ import annotations

import os
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

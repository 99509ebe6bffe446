"""The processes a signal test started: everything of one session (the command was started as its leader)."""

from __future__ import annotations

import os
from pathlib import Path


def session_processes(sid: int) -> list[int]:
    """Live processes of session `sid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text(errors="replace").rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry))
    return found

"""Long commands stop on SIGTERM as on Ctrl-C: a process manager (systemd, Kubernetes, a CI runner) stops things
with SIGTERM, and Python's default for it is to die on the spot without a word.

`install()` makes the first SIGTERM or SIGINT raise `Stopped` where the main thread is, so the command leaves
through its `finally` blocks (an engine it started is stopped; an engine outliving it dies with it anyway,
PR_SET_PDEATHSIG), says what stopped it and exits 128 + the signal; a second signal exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any


class Stopped(BaseException):  # noqa: N818 - not an error of the command: the operator's request
    """Raised in the main thread by the first SIGTERM or SIGINT. A BaseException, so no `except Exception` swallows
    it and the CLI framework passes it through."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_received: list[int] = []


def _handler(signum: int, frame: Any) -> None:
    if _received:  # the second signal: no more waiting on finally blocks
        os._exit(128 + signum)
    _received.append(signum)
    raise Stopped(signum)


def install() -> None:
    """Route SIGTERM and SIGINT to `Stopped` (main thread only: signal handlers live there)."""
    _received.clear()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _handler)


def run(command: Callable[[], Any], name: str) -> None:
    """Run `command` with the handlers installed; a signal ends the process with 128 + the signal and a line on
    stderr naming it (server commands that handle signals themselves, like uvicorn's, replace the handlers)."""
    install()
    try:
        command()
    except Stopped as stopped:
        try:
            from agent_rl.agent.engine import stop_engines

            stop_engines()
        finally:
            print(f"{name}: stopped by {stopped.args[0]}; nothing more was started", file=sys.stderr, flush=True)
        sys.exit(128 + stopped.signum)

"""How the demo driver stops when a process manager (systemd, Kubernetes, a CI runner) or Ctrl-C asks it to.

SIGTERM and SIGINT mean "nothing more": the first one raises `Stopped` where the driver is (a Dagster step sees an
interrupt, ends its trainer and marks its run), and every step boundary checks `check()` again, because a job run
with raise_on_error=False swallows the interrupt and returns a failed result. While Dagster runs a job it installs
its own handler for both signals (it records them, and raises only at its own checkpoints), so the signals are
counted below Python's handlers, from the wakeup file descriptor the interpreter writes every signal's number to. The driver then leaves through its
`finally` blocks (the arbiter stopped, engines stopped at exit), starts nothing, changes neither routing nor the
registry, says what it stopped and exits 128 + the signal's number. A second signal forces: every child process
group is killed and the driver exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import dataclass


class Stopped(KeyboardInterrupt):
    """The driver was asked to stop (KeyboardInterrupt: Dagster treats it as an interrupt, not a step error)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class StopState:
    signum: int | None = None  # the first stop signal
    received: int = 0  # stop signals counted (the second forces)
    raised: bool = False  # Stopped was raised by our handler already
    doing: str = "starting"
    dagster_run: str | None = None  # the job run in progress or last started


STATE = StopState()


def _handler(signum: int, frame) -> None:
    STATE.signum = STATE.signum or signum
    if STATE.raised:
        return  # the watcher counts signals and forces on the second
    STATE.raised = True
    raise Stopped(signum)


def _watch(read_fd: int) -> None:
    """Count stop signals whatever Python handler is installed (ours or Dagster's), and force on the second."""
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            if signum not in (signal.SIGTERM, signal.SIGINT):
                continue
            STATE.received += 1
            STATE.signum = STATE.signum or signum
            if STATE.received == 1:
                print(f"\n{signal.Signals(signum).name}: stopping ({STATE.doing}); nothing more will start "
                      "(a second signal forces)", file=sys.stderr, flush=True)
            else:
                _force(signum)


def _force(signum: int) -> None:
    from agent_rl.agent.engine import engine_process_groups

    for group in engine_process_groups():
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:  # our own children (the arbiter, a trainer) share our process group when started from a shell
        for child in _children():
            os.kill(child, signal.SIGKILL)
    finally:
        os._exit(128 + signum)


def _children() -> list[int]:
    """This process's child pids (from /proc; empty where it is not readable)."""
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            found.append(int(entry))
    return found


def install() -> None:
    """Handle SIGTERM and SIGINT as above (in the main thread, before any work starts)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_fd,), name="stop-signals", daemon=True).start()
    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)


def doing(what: str) -> None:
    """Name the phase in progress (the stop message says which one was stopped)."""
    check()
    STATE.doing = what


def check() -> None:
    """Raise Stopped if a signal came (a job that swallowed the interrupt returned meanwhile)."""
    if STATE.signum is not None:
        raise Stopped(STATE.signum)

"""Local server processes for the browser test: start one on a free loopback port, wait until it answers, stop it.

Every process writes its output to a log file kept beside the screenshots, so a failure shows why a
server did not come up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    name: str
    process: subprocess.Popen
    log_path: Path
    url: str

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start(name: str, command: list[str], *, env: dict[str, str], cwd: Path, url: str, log_dir: Path) -> Server:
    """Start `command` in its own process group (so stopping it also stops the children it spawns)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    return Server(name, process, log_path, url)


def wait_until(server: Server, ready: Callable[[httpx.Client], bool], timeout_s: float) -> None:
    """Poll `ready` until it is true; fail with the server's log when it exits or the time is up."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=10) as client:
        while True:
            if server.process.poll() is not None:
                raise RuntimeError(f"{server.name} exited with code {server.process.returncode}:\n{server.log_tail()}")
            try:
                if ready(client):
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{server.name} did not answer at {server.url} within {timeout_s:.0f} s:\n"
                                   f"{server.log_tail()}")
            time.sleep(0.5)


def _signal(server: Server, sig: int) -> None:
    try:
        os.killpg(server.process.pid, sig)
    except ProcessLookupError:
        pass


def stop(*servers: Server, grace_s: float = 10) -> None:
    """SIGTERM each server's process group (all at once, so their shutdowns overlap), then SIGKILL what is
    left after `grace_s`."""
    running = [s for s in servers if s.process.poll() is None]
    for server in running:
        _signal(server, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for server in running:
        try:
            server.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(server, signal.SIGKILL)
            server.process.wait(timeout=10)

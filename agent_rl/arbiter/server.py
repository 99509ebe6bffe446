"""Run the arbiter under uvicorn: in the foreground (`agent-rl arbiter serve`) or in a thread (tests, demos)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from agent_rl.arbiter.app import create_app
from agent_rl.arbiter.config import ArbiterConfig


def uvicorn_config(
    config: ArbiterConfig, host: str, port: int, log_level: str = "info", access_log: bool = False, own_logging: bool = True
) -> uvicorn.Config:
    """uvicorn settings; with own_logging=False uvicorn leaves the process's logging setup alone (tests capture it)."""
    extra = {} if own_logging else {"log_config": None}
    # httptools + uvloop when installed (they are): the HTTP layer is most of the per-request cost.
    return uvicorn.Config(
        create_app(config),
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        loop="auto",
        http="auto",
        timeout_graceful_shutdown=30,
        **extra,
    )


def serve(config: ArbiterConfig, host: str = "127.0.0.1", port: int = 8700, log_level: str = "info", access_log: bool = False) -> None:
    """Serve until interrupted; on shutdown every answered episode is already in the pool."""
    uvicorn.Server(uvicorn_config(config, host, port, log_level, access_log)).run()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextmanager
def running_arbiter(
    config: ArbiterConfig, host: str = "127.0.0.1", port: int | None = None, log_level: str = "info", access_log: bool = True
) -> Iterator[str]:
    """Start the arbiter on a loopback port in a background thread; yields its base URL, stops it on exit.

    Logging goes through the process's own handlers (so pytest's caplog sees the access log too).
    """
    port = port or free_port(host)
    server = uvicorn.Server(uvicorn_config(config, host, port, log_level, access_log, own_logging=False))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # not the main thread
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except BaseException as exc:  # surfaced to the caller below
            errors.append(exc)

    thread = threading.Thread(target=run, name="arbiter", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if errors or not thread.is_alive():
            raise RuntimeError(f"arbiter failed to start: {errors[0] if errors else 'server exited'}")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError("arbiter did not start within 60 s")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(60)

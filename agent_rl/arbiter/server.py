"""Run the arbiter under uvicorn: in the foreground (`agent-rl arbiter serve`) or in a thread (tests, demos).

In the foreground it can run several worker processes on one listening socket (pre-fork), so
episodes, which are CPU-bound Python, use every core. Workers share nothing but the pool and the
world store: routing is a hash of the request key (sticky across workers), each worker re-reads
the routing table within `routing_ttl_s`, and the gateway's live episodes are rows of the pool
(agent_rl/pool/live.py), so any worker continues any session.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from agent_rl.arbiter.app import create_app
from agent_rl.arbiter.config import ArbiterConfig

log = logging.getLogger("agent_rl.arbiter")

# A worker that dies sooner than this after starting failed to start (bad URL, policy, port):
# restarting it would only loop, so the whole server stops instead.
_MIN_WORKER_LIFE_S = 10.0


def uvicorn_config(
    config: ArbiterConfig, host: str, port: int, log_level: str = "info", access_log: bool = False, own_logging: bool = True
) -> uvicorn.Config:
    """uvicorn settings; with own_logging=False uvicorn leaves the process's logging setup alone (tests capture it)."""
    extra = {} if own_logging else {"log_config": None}
    # httptools + uvloop when installed (they are): the HTTP layer is most of the per-request cost.
    uv_config = uvicorn.Config(
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
    # After uvicorn.Config, which (re)configures the uvicorn loggers; forked workers inherit the filter.
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, QueryStringRedactor) for f in access.filters):
        access.addFilter(QueryStringRedactor())
    return uv_config


class QueryStringRedactor(logging.Filter):
    """Cuts query strings out of access-log lines: the API takes none, so one there is a client's mistake
    (an admin token sent as `?token=...`, say) that must not end up in the logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn's access record: (client, method, path with query, http version, status)
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?[query redacted]", *args[3:])
        return True


def default_workers() -> int:
    """One worker process per usable CPU (at most 8): each runs episodes on one core."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def serve(
    config: ArbiterConfig,
    host: str = "127.0.0.1",
    port: int = 8700,
    log_level: str = "info",
    access_log: bool = False,
    workers: int = 1,
) -> None:
    """Serve until interrupted (SIGINT/SIGTERM); on shutdown every answered episode is already in the pool.

    With `workers` > 1 that many processes serve one socket; a policy that holds a model in
    memory then holds it once per worker.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if workers == 1:
        uv_config = uvicorn_config(config, host, port, log_level, access_log)
        _freeze_heap()
        uvicorn.Server(uv_config).run()
        return
    _serve_workers(config, host, port, log_level, access_log, workers)


def _freeze_heap() -> None:
    """Exempt everything alive now (imported libraries, mostly) from garbage collection.

    A full collection walks every tracked object; with transformers, SQLAlchemy and FastAPI
    loaded that pause lands on some requests as tens of milliseconds. Frozen objects are never
    walked again (and stay shared copy-on-write between forked workers).
    """
    gc.collect()
    gc.freeze()


def _serve_workers(config: ArbiterConfig, host: str, port: int, log_level: str, access_log: bool, workers: int) -> None:
    from agent_rl.environments.registry import load_environment
    from agent_rl.pool import PoolRepository

    # Create the pool's tables once here: workers starting together would race on CREATE TABLE.
    PoolRepository(config.pool_url).close()
    # The transformers import, done once and shared copy-on-write by the forked workers.
    load_environment(config.environment).tool_schemas()
    uv_config = uvicorn_config(config, host, port, log_level, access_log)
    sock = uv_config.bind_socket()
    sock.listen(uv_config.backlog)  # connections queue from now on, while workers start
    _freeze_heap()
    # fork, not spawn: workers inherit policy loaders registered at run time (register_policy_loader).
    context = multiprocessing.get_context("fork")
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def start() -> tuple[multiprocessing.process.BaseProcess, float]:
        process = context.Process(target=_run_worker, args=(uv_config, sock), name="arbiter-worker", daemon=False)
        process.start()
        return process, time.monotonic()

    failed = False
    procs = [start() for _ in range(workers)]
    log.info("arbiter serving with %d worker processes: %s", workers, [p.pid for p, _ in procs])
    try:
        while not stop.wait(0.5):
            for index, (process, started) in enumerate(procs):
                if process.is_alive():
                    continue
                if time.monotonic() - started < _MIN_WORKER_LIFE_S:
                    log.error("arbiter worker %s exited with %s during start-up; stopping", process.pid, process.exitcode)
                    failed = True
                    stop.set()
                    break
                log.error("arbiter worker %s exited with %s; starting another", process.pid, process.exitcode)
                procs[index] = start()
    finally:
        for process, _ in procs:
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)  # graceful: each worker drains and commits
        for process, _ in procs:
            process.join((uv_config.timeout_graceful_shutdown or 30) + 30)
            if process.is_alive():
                log.error("arbiter worker %s did not stop in time; killing it", process.pid)
                process.kill()
                process.join()
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed:
        raise SystemExit(1)


def _run_worker(uv_config: uvicorn.Config, sock: socket.socket) -> None:
    # The parent's handlers are inherited through fork; uvicorn installs its own while serving and
    # re-raises the signal when done, which must then simply end this process.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    uvicorn.Server(uv_config).run(sockets=[sock])


def wait_until_serving(url: str, process: Any, timeout_s: float = 120.0) -> None:
    """Return once the arbiter at `url` (started as `process`, a Popen) answers /healthz; RuntimeError when the
    process exits first, TimeoutError when `timeout_s` passes. For whoever starts `agent-rl arbiter serve` as a
    process of its own (the demo, tests, benches)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the arbiter exited with {process.returncode} before serving")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the arbiter did not answer /healthz within {timeout_s:g} s")
        time.sleep(0.2)


def stop_arbiter(process: Any, timeout_s: float = 60.0) -> None:
    """SIGTERM (the arbiter drains: answered episodes are written before it exits), then kill after `timeout_s`."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)


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

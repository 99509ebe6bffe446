"""The demo driver stops when asked: SIGTERM (a process manager) or SIGINT (Ctrl-C) at a phase of the fast demo
ends it within seconds with 128 + the signal, leaves no process of its session behind (the arbiter, a trainer),
and changes neither production's routing nor the registry after the signal."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_rl.pool.repository import PoolRepository
from tests.reliability.processes import session_processes

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def registry_state(home: Path) -> tuple:
    db = home / "mlflow.db"
    if not db.exists():
        return (), ()
    with sqlite3.connect(db) as conn:
        try:
            versions = conn.execute("SELECT name, version FROM model_versions ORDER BY 1, 2").fetchall()
            aliases = conn.execute("SELECT alias, version FROM registered_model_aliases ORDER BY 1").fetchall()
        except sqlite3.OperationalError:  # tables not created yet
            return (), ()
    return tuple(versions), tuple(aliases)


def mlflow_statuses(home: Path) -> list[str]:
    db = home / "mlflow.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        try:
            return [status for (status,) in conn.execute("SELECT status FROM runs")]
        except sqlite3.OperationalError:
            return []


def routing_state(home: Path) -> tuple:
    pool = PoolRepository(f"sqlite:///{home / 'pool.db'}")
    try:
        routing = pool.get_routing()
        return tuple(sorted(routing.weights.items())), tuple(sorted(routing.specs.items()))
    finally:
        pool.close()


@pytest.mark.parametrize(("marker", "signum"), [
    ("=== week 1: ", signal.SIGTERM),  # serving a week of production traffic
    ("  > sft_adapter", signal.SIGINT),  # training (a trainer subprocess runs)
    ("  > evaluation_report", signal.SIGTERM),  # evaluating on the held-out tasks
    ("=== week 1: A/B test", signal.SIGINT),  # the A/B test: sensors and replayed traffic
])
def test_a_signal_stops_the_demo_where_it_is(tmp_path, marker, signum):
    home, dagster_home = tmp_path / "home", tmp_path / "dagster"
    dagster_home.mkdir()
    env = {**os.environ, "AGENT_RL_HOME": str(home), "DAGSTER_HOME": str(dagster_home), "AGENT_RL_ENGINE": "torch",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    demo = subprocess.Popen([sys.executable, "-m", "demos.demo", "--fast", "--port", str(free_port())],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 600
        for line in demo.stdout:
            lines.append(line)
            if line.startswith(marker):
                break
            assert time.monotonic() < deadline, "the demo did not reach the phase in 10 minutes"
        else:
            pytest.fail("the demo ended before the phase:\n" + "".join(lines[-30:]))
        time.sleep(1.0)  # inside the phase
        demo.send_signal(signum)
        routing, registry = routing_state(home), registry_state(home)
        signalled = time.monotonic()
        # Stopping takes seconds alone (the arbiter and a trainer ended, their runs marked); the bound is wide
        # because the suite runs two workers, and the other may be training on the same cores.
        rest, _ = demo.communicate(timeout=90)
        assert demo.returncode == 128 + signum, "".join(lines[-20:]) + rest
        assert f"stopped by {signal.Signals(signum).name} during" in rest
        # No process of the demo's session is left a few seconds after it exited (the arbiter, a trainer).
        while session_processes(demo.pid) and time.monotonic() - signalled < 30:
            time.sleep(0.5)
        assert session_processes(demo.pid) == [], "processes of the demo outlived it"
        assert routing_state(home) == routing, "routing changed after the signal"
        assert registry_state(home) == registry, "the registry changed after the signal:\n" + "".join(lines[-15:]) + rest
        # The stopped retraining run's MLflow runs (parent and the stage whose process died) end as KILLED.
        statuses = mlflow_statuses(home)
        assert "RUNNING" not in statuses, statuses
        if marker.startswith("  > ") and statuses:  # the run had begun tracking when it was stopped
            assert "KILLED" in statuses, statuses
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()

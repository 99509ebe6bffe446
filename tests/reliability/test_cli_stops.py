"""A long `agent-rl` command stops when asked: SIGTERM (a process manager) or SIGINT (Ctrl-C) during an
evaluation ends it within seconds with 128 + the signal and a line saying so, and leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.processes import session_processes
from tests.reliability.slow_environment import OPENING

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_long_cli_command(tmp_path, signum):
    env = {**os.environ, "AGENT_RL_HOME": str(tmp_path), "AGENT_RL_ENGINE": "torch", "PYTHONPATH": str(ROOT),
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-c", "from agent_rl.cli import main; main()", "eval", "--policy", "tiny",
               "--env", "tests.reliability.slow_environment:SlowEnvironment", "--n", "0", "--json"]
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        seen = b""
        deadline = time.monotonic() + 120
        while OPENING.encode() not in seen:  # the model is loaded and the evaluation is under way
            chunk = process.stdout.read1(4096)
            assert chunk and time.monotonic() < deadline, seen.decode(errors="replace")[-2000:]
            seen += chunk
        time.sleep(1.0)
        process.send_signal(signum)
        signalled = time.monotonic()
        rest, _ = process.communicate(timeout=30)
        output = (seen + rest).decode(errors="replace")
        assert process.returncode == 128 + signum, output[-2000:]
        assert f"stopped by {signal.Signals(signum).name}" in output
        assert '"outcomes"' not in output  # it stopped before finishing the evaluation
        while session_processes(process.pid) and time.monotonic() - signalled < 30:
            time.sleep(0.5)
        assert session_processes(process.pid) == []
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

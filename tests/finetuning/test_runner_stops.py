"""The fine-tuning runner stops when asked: SIGTERM while a job runs stops the job's run (its process group) and
fails the job with the reason, instead of leaving a run nobody watches and a job 'running' for ever."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_rl.finetuning.jobs import JobStatus, JobStore
from tests.reliability.processes import session_processes

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "openai_job"
pytestmark = pytest.mark.slow


def test_sigterm_to_the_runner_stops_the_jobs_run_and_fails_the_job(tmp_path):
    env = {**os.environ, "AGENT_RL_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path), "AGENT_RL_ENGINE": "torch"}
    env.pop("MLFLOW_TRACKING_URI", None)
    store = JobStore(tmp_path / "home" / "jobs")
    grader = json.loads((EXAMPLE / "grader.json").read_text())
    job = store.create("acme", model="tiny", training_file_path=EXAMPLE / "train.jsonl",
                       method={"type": "reinforcement", "reinforcement": {"grader": grader}})
    runner = subprocess.Popen([sys.executable, "-m", "pipelines.fine_tuning", "--jobs-root", str(store.root)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (store.job_dir(job.id) / "home" / "pool.db").exists():  # the job's run is under way
            assert time.monotonic() < deadline and runner.poll() is None, "the job's run did not start"
            time.sleep(0.5)
        time.sleep(1.0)
        runner.send_signal(signal.SIGTERM)
        out, _ = runner.communicate(timeout=60)
        assert runner.returncode == 128 + signal.SIGTERM, out
        assert "stopped by SIGTERM" in out
        finished = store.job(job.id)
        assert finished.status == JobStatus.FAILED and finished.error["code"] == "runner_stopped"
        assert session_processes(runner.pid) == []
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()

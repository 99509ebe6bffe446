"""A reinforcement fine-tuning job brought from OpenAI, end to end: the example's SDK script (official `openai`
client only) uploads the files, creates the job with its multi grader, waits while the runner
(`python -m pipelines.fine_tuning`) runs it as a Dagster run of the loop on the fast profile (tiny model), reads the
events and checkpoints, and asks the fine-tuned model a question through the gateway by the name the job reports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from agent_rl.arbiter.config import ArbiterConfig
from agent_rl.arbiter.server import running_arbiter
from tests.arbiter.arbiter_fixtures import api_key

ROOT = Path(__file__).resolve().parents[2]
TOKEN, OTHER = "sdk-job-key-a-5f21", "sdk-job-key-b-77e0"
pytestmark = pytest.mark.slow


@pytest.fixture()
def home(tmp_path, monkeypatch):
    for name, value in {"AGENT_RL_HOME": tmp_path / "home", "DAGSTER_HOME": tmp_path / "dagster"}.items():
        value.mkdir()
        monkeypatch.setenv(name, str(value))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def test_an_openai_reinforcement_job_runs_here_unchanged_and_its_model_answers(home, capsys):
    sys.path.insert(0, str(ROOT / "examples" / "openai_job"))
    try:
        import run_job
    finally:
        sys.path.pop(0)
    keys = (api_key(TOKEN, "sdk-a", "acme"), api_key(OTHER, "sdk-b", "globex"))
    config = ArbiterConfig(pool_url=f"sqlite:///{home / 'home' / 'pool.db'}", api_keys=keys)
    runner = subprocess.Popen([sys.executable, "-m", "pipelines.fine_tuning"], cwd=ROOT, env=dict(os.environ),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        with running_arbiter(config, log_level="warning") as url:
            status = run_job.main(["--base-url", f"{url}/v1", "--api-key", TOKEN, "--timeout", "900"])
            out = capsys.readouterr().out
            assert status == 0, out + runner_log(runner, home)
            print(out)  # the job's events, shown with -rP
            job = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN).fine_tuning.jobs.list().data[0]
            assert job.status == "succeeded" and job.fine_tuned_model.startswith("ft:tiny:acme:")
            assert "Validation: mean reward" in out and "checkpoint at step" in out
            assert f"{job.fine_tuned_model} answers:" in out  # served through the gateway by its name
            mine = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN)
            assert job.fine_tuned_model in [m.id for m in mine.models.list()]
            # Another tenant's key neither lists the model nor may use it: it does not exist for that tenant.
            other = openai.OpenAI(base_url=f"{url}/v1", api_key=OTHER, max_retries=0)
            assert job.fine_tuned_model not in [m.id for m in other.models.list()]
            with pytest.raises(openai.NotFoundError):
                other.chat.completions.create(model=job.fine_tuned_model, messages=[{"role": "user", "content": "hi"}])
    finally:
        os.killpg(runner.pid, signal.SIGTERM)
        runner.wait(timeout=60)


def runner_log(runner: subprocess.Popen, home: Path) -> str:
    logs = sorted((home / "home" / "jobs").glob("ftjob-*/run.log"))
    return "\n--- run.log ---\n" + "".join(p.read_text(errors="replace")[-6000:] for p in logs)

"""Many agents, one home: `make demo-fast`, `make demo-fast ENV=support` and the timetable example in a row, in
one AGENT_RL_HOME and one Dagster instance, each run its own week to a decision and print their own figures.
Before, the support week exported the email agent's episodes too and stopped at the clean-ratio gate ("50.0% of
10800 exported episodes are clean") while its summary printed the email week's evaluation table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_rl.arbiter.server import free_port

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ("email", "support", "examples.timetable:TimetableEnvironment")


@pytest.mark.slow
def test_three_agents_run_their_own_weeks_in_one_home(tmp_path):
    env = {**os.environ, "AGENT_RL_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster"),
           "MLFLOW_TRACKING_URI": "", "AGENT_RL_POOL_URL": "", "AGENT_RL_ENV": ""}
    (tmp_path / "dagster").mkdir()
    outputs = {}
    for agent in AGENTS:
        done = subprocess.run([sys.executable, "-m", "demos.demo", "--fast", "--env", agent,
                               "--port", str(free_port())], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=1200)
        outputs[agent] = done.stdout
        assert done.returncode == 0, f"{agent}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    for agent, out in outputs.items():
        summary = out.split("================ summary ================")[1]
        assert "check failed: validated_episodes.clean_ratio" not in out, f"{agent} counted others' episodes"
        assert re.search(r"loop health over 1 retraining runs", summary), f"{agent}: loop health mixed agents"
        week = re.search(r"^\s+1 \| (.*)$", summary, re.M).group(1)
        assert "not registered: the run stopped before validation" not in week
        # Routing lines are this run's only: never another agent's production version.
        routing = [line for line in summary.splitlines() if line.startswith("routing ")]
        others = {"email": "gpt-4o-sim", "support": "'teacher'", AGENTS[2]: "gpt-4o-sim"}
        assert routing and not any(others[agent] in line for line in routing), routing
    assert "incumbent = production's gpt-4o-sim" in outputs["support"]
    assert "A/B test started: v1" in outputs["support"]  # its v1 is not the email model's v1
    assert "held-out evaluation, week 1: incumbent = production's teacher" in outputs[AGENTS[2]]

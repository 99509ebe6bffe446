"""Many agents, one home: `make demo-fast`, `make demo-fast ENV=support` and the timetable example in a row, in
one AGENT_RL_HOME and one Dagster instance, each ship their own v0, run their own week to a decision against it
and print their own figures.
Before, the support week exported the email agent's episodes too and stopped at the clean-ratio gate ("50.0% of
10800 exported episodes are clean") while its summary printed the email week's evaluation table."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ("email", "support", "examples.timetable:TimetableEnvironment")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_three_agents_run_their_own_weeks_in_one_home(tmp_path):
    env = {**os.environ, "AGENT_RL_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster"),
           "MLFLOW_TRACKING_URI": "", "AGENT_RL_POOL_URL": "", "AGENT_RL_ENV": ""}
    (tmp_path / "dagster").mkdir()
    outputs = {}
    for agent in AGENTS:
        done = subprocess.run([sys.executable, "-m", "pipelines.demo", "--fast", "--env", agent,
                               "--port", str(_free_port()), "--ab-rounds", "2"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=1200)
        outputs[agent] = done.stdout
        assert done.returncode == 0, f"{agent}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    for agent, out in outputs.items():
        summary = out.split("================ summary ================")[1]
        assert "check failed: validated_episodes.clean_ratio" not in out, f"{agent} counted others' episodes"
        # v0's run and the week's: never another agent's.
        assert re.search(r"loop health over 2 retraining runs", summary), f"{agent}: loop health mixed agents"
        week = re.search(r"^\s+1 \| (.*)$", summary, re.M).group(1)
        assert "not registered: the run stopped before validation" not in week
        # Routing lines are this run's only: never another agent's production version.
        routing = [line for line in summary.splitlines() if line.startswith("routing ")]
        others = {"email": "gpt-4o-sim", "support": "'teacher'", AGENTS[2]: "gpt-4o-sim"}
        assert routing and not any(others[agent] in line for line in routing), routing
    # Each agent's production starts on a model of its own (v0: version 1 of its registered model, shipped after
    # the API model's traffic), and its week's candidate is tested against it.
    for agent, name in (("email", "agent-rl-email"), ("support", "agent-rl-support"),
                        (AGENTS[2], "agent-rl-examples-timetable-TimetableEnvironment")):
        assert f"production now runs v1 (v0), the registered champion of {name}" in outputs[agent], agent
        assert "held-out evaluation, week 1: incumbent = production's v1 (mlflow:v1)" in outputs[agent], agent
        assert "A/B test started: v2 at 10% against v1" in outputs[agent], agent  # not the email model's v2
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    for name in ("agent-rl-email", "agent-rl-support"):
        v0 = client.get_model_version_by_alias(name, "champion")
        assert v0.version == "1" and v0.tags["rollout"] == "shipped as v0" and v0.tags["started_from"] == "base"
        assert v0.tags["dagster_run_id"]  # lineage: the Dagster run that trained and measured it
        week = client.get_model_version(name, "2")
        assert week.tags["started_from"] == "v1" and week.tags["incumbent_at_validation"] == "v1"

"""`make demo-fast ENV=gateway`, shortened: the outside agent (its own process, the official openai client) talks to
the demo's arbiter gateway, simulated users rate a share of its conversations, the retraining job labels, curates,
trains SFT, validates by replay and registers, the A/B sensors route the gateway, and the summary shows rows from
ratings and from labels and the labeler's agreement with the hidden truth. Also: bad options are refused by name."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_rl.arbiter.server import free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_week_of_an_outside_agent_end_to_end(tmp_path):
    env = {**os.environ, "AGENT_RL_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster"),
           "MLFLOW_TRACKING_URI": "", "AGENT_RL_POOL_URL": "", "AGENT_RL_ENV": ""}
    (tmp_path / "dagster").mkdir()
    # Fewer users than the demo's 3000, a larger rating share so that the labeler is fitted and measured.
    done = subprocess.run([sys.executable, "-m", "demos.demo", "--fast", "--env", "gateway", "--port",
                           str(free_port()), "--users", "500", "--rated-share", "0.3", "--ab-max-users", "100"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    out = done.stdout
    assert done.returncode == 0, f"exit {done.returncode}\n{out[-4000:]}\n{done.stderr[-3000:]}"
    summary = out.split("================ summary (gateway: an outside agent's week) ================")[1]
    assert re.search(r"users: 500 in \d+ s \(\d+ model calls through the gateway\)", summary)
    assert re.search(r"ratings: \d+ \(\d+ up\)", summary)
    rows = re.search(r"SFT rows: \d+ \(good episodes they come from: (\d+) rated by users, (\d+) labeled", summary)
    assert rows and int(rows.group(1)) > 0, summary
    assert re.search(r"labeler check \(bars AUC >= 0.76, ECE <= 0.05 beyond sampling noise, the profile's\): "
                     r"out of fold on \d+ rated: AUC 0\.\d{3}, ECE 0\.\d{3} \(sampling noise alone ~0\.\d{3}, "
                     r"beyond it 0\.\d{3}\)", summary)
    assert re.search(r"labeler vs the hidden truth on \d+ unrated episodes: AUC 0\.\d{3}, ECE 0\.\d{3}", summary)
    assert "validation: replay of" in summary and re.search(r"incumbent +accuracy", summary)
    assert "A/B test started: v1 at 10% against teacher" in out  # the fast gate is open: registered, then routed
    # The A/B traffic in chunks, a look after each, until the test decides or its bound of 100 users stops it.
    assert re.search(r"A/B look 1: \+25 users \(25 in all, [\d.]+ min\): teacher: \d+ users", summary)
    traffic = re.search(r"A/B traffic: (the decision needed|undecided, stopped after) (\d+) users in [\d.]+ min "
                        r"\((\d+) looks\)", summary)
    assert traffic and int(traffic.group(2)) <= 100, summary
    assert traffic.group(1) == "the decision needed" or "the bound of 100 A/B users was reached" in summary
    assert "skipped: GRPO" in summary
    # The hidden truth never leaves the simulation's file: no question text in the console.
    assert "questions.jsonl" not in out


def test_the_gateway_demo_refuses_what_it_cannot_run():
    from demos.demo import wants_gateway
    from demos.gateway import parse_args

    assert wants_gateway(["--fast", "--env", "gateway"]) and not wants_gateway(["--env", "email"])
    assert parse_args(["--fast"]).users == 3000 and parse_args([]).production == "api-sim:o3"
    for bad in (["--weeks", "2"], ["--incumbent", "ours"], ["--noise", "loud"], ["--rated-share", "0"],
                ["--users", "0"]):
        with pytest.raises(SystemExit):
            parse_args(bad)

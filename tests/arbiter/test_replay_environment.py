"""`agent-rl traffic replay` sends the served environment's replayable tasks (issue 44): a scenarios file only to an
environment that reads one, and a clear error when there is nothing to send."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from agent_rl.arbiter.cli import traffic_app


def _invoke(*args: str, **env: str):
    root = typer.Typer()
    root.add_typer(traffic_app, name="traffic")
    return CliRunner().invoke(root, ["traffic", "replay", "--url", "http://127.0.0.1:9", *args],
                              env={"AGENT_RL_API_KEY": "k", **env})


def test_a_tasks_file_is_refused_by_an_environment_that_reads_none(tmp_path):
    # `--scenarios`, the option's first name, still means `--tasks`.
    for option in ("--tasks", "--scenarios"):
        result = _invoke("--env", "support", option, str(tmp_path / "s.jsonl"))
        assert result.exit_code == 2 and "reads no tasks file" in result.output


def test_email_without_scenarios_says_what_to_give(tmp_path):
    result = _invoke("--env", "email", AGENT_RL_HOME=str(tmp_path))
    assert result.exit_code == 2 and "no tasks to replay" in result.output and "--tasks" in result.output

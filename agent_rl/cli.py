"""The `agent-rl` command: mounts each concern's sub-commands; the work happens in the library."""

from __future__ import annotations

import typer

from agent_rl.agent.model_cli import app as model_app
from agent_rl.arbiter.cli import app as arbiter_app
from agent_rl.arbiter.cli import traffic_app
from agent_rl.arbiter.episodes_cli import app as episodes_app
from agent_rl.evaluate.cli import eval_command
from agent_rl.environments.registry import environment_commands
from agent_rl.stop_signals import run

app = typer.Typer(help="Continuous RL for tool-using LLM agents.", no_args_is_help=True)
app.add_typer(model_app, name="model", help="Prepare policy models (offline).")
for _name, _commands, _help in environment_commands():  # each environment's own commands (the email assistant's)
    app.add_typer(_commands, name=_name, help=_help)
app.add_typer(arbiter_app, name="arbiter", help="Serve the traffic-splitting arbiter.")
app.add_typer(traffic_app, name="traffic", help="Replay an environment's tasks through a running arbiter.")
app.add_typer(episodes_app, name="episodes", help="Read your own recorded episodes from a running arbiter.")
app.command("eval")(eval_command)


def main() -> None:
    """The `agent-rl` entry point: SIGTERM and SIGINT stop any command within seconds (agent_rl/stop_signals.py)."""
    run(app, "agent-rl")


if __name__ == "__main__":
    main()

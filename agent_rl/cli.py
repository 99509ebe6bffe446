"""The `agent-rl` command: mounts each concern's sub-commands; the work happens in the library."""

from __future__ import annotations

import typer

from agent_rl.agent.model_cli import app as model_app
from agent_rl.arbiter.cli import app as arbiter_app
from agent_rl.arbiter.cli import traffic_app
from agent_rl.evaluate.cli import eval_command
from agent_rl.environments.email.inbox.cli import app as inbox_app

app = typer.Typer(help="Continuous RL for tool-using LLM agents.", no_args_is_help=True)
app.add_typer(model_app, name="model", help="Prepare policy models (offline).")
app.add_typer(inbox_app, name="inbox", help="Build, ingest and search email inboxes.")
app.add_typer(arbiter_app, name="arbiter", help="Serve the traffic-splitting arbiter.")
app.add_typer(traffic_app, name="traffic", help="Replay scenarios through a running arbiter.")
app.command("eval")(eval_command)


if __name__ == "__main__":
    app()

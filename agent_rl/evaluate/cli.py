"""`agent-rl eval`: the held-out evaluation of any policy spec, as a table or one JSON object."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from agent_rl.records import Split


def eval_command(
    policy: Annotated[str, typer.Option("--policy", help="base | heuristic | tiny | a checkpoint path | champion | challenger | mlflow:vN")],
    split: Annotated[Split, typer.Option("--split")] = Split.TEST,
    n: Annotated[Optional[int], typer.Option("--n", help="scenarios to sample (default 60; 0 = all)")] = 60,
    seed: Annotated[int, typer.Option(help="sampling seed: same seed, same questions")] = 0,
    scenarios: Annotated[Optional[str], typer.Option(help="scenarios JSONL (default: the scenarios asset's)")] = None,
    db: Annotated[Optional[str], typer.Option("--db", help="inbox store URL")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    env: Annotated[str, typer.Option("--env", help="environment: a built-in name (email), an installed plug-in's "
                                     "name or an import path package.module:Class (docs/environments.md)")] = "email",
) -> None:
    """Evaluate a policy on held-out scenarios (fixed seed)."""
    if env != "email":
        return _eval_environment(env, policy, split, n, seed, as_json)
    from agent_rl.evaluate.harness import EvalConfig, evaluate_policy
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.policy_specs import load_policy
    from agent_rl.environments.email.scenarios.demo import load_default_scenarios

    try:
        items = load_default_scenarios(scenarios)
        loaded = load_policy(policy)
    except Exception as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    store = open_inbox_store(db)
    try:
        config = EvalConfig(split=split, max_scenarios=n or None, seed=seed)
        result = evaluate_policy(loaded, items, store, config, version=policy)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    finally:
        store.close()
    metrics = result.metrics.model_dump()
    if as_json:
        typer.echo(json.dumps({"policy": policy, "split": split.value, "n": result.metrics.n, "metrics": metrics}))
        return
    typer.echo(f"policy {policy} on {result.metrics.n} {split.value} scenarios")
    for key, value in metrics.items():
        typer.echo(f"  {key:22} {value}")


def _eval_environment(spec: str, policy: str, split: Split, n: int | None, seed: int, as_json: bool) -> None:
    """The same evaluation on a plug-in environment's tasks (agent_rl/environments)."""
    import random

    from agent_rl.agent.runner import Play, play_episodes
    from agent_rl.environments import EnvironmentError
    from agent_rl.environments.registry import load_environment
    from agent_rl.evaluate.metrics import compute_metrics
    from agent_rl.policy_specs import load_policy

    try:
        environment = load_environment(spec)
        tasks = environment.tasks(split)
        loaded = load_policy(policy)
    except Exception as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if not tasks:
        typer.echo(f"error: environment {environment.name!r} has no {split.value} tasks", err=True)
        raise typer.Exit(2)
    if n and n < len(tasks):
        tasks = random.Random(seed).sample(tasks, n)
    try:
        episodes = play_episodes(loaded, environment, [Play(t, policy_version=policy) for t in tasks])
    except EnvironmentError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    metrics = compute_metrics(episodes, tool_names=environment.tool_names()).model_dump()
    if as_json:
        typer.echo(json.dumps({"policy": policy, "environment": environment.name, "split": split.value,
                               "n": len(episodes), "metrics": metrics}))
        return
    typer.echo(f"policy {policy} on {len(episodes)} {split.value} tasks of {environment.name}")
    for key, value in metrics.items():
        typer.echo(f"  {key:22} {value}")

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
) -> None:
    """Evaluate a policy on held-out scenarios (fixed seed)."""
    from agent_rl.evaluate.harness import EvalConfig, evaluate_policy
    from agent_rl.inbox.store import open_inbox_store
    from agent_rl.policy_specs import load_policy
    from agent_rl.scenarios.demo import load_default_scenarios

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

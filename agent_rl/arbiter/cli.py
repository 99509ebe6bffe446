"""`agent-rl arbiter serve` and `agent-rl traffic replay`: thin commands over the arbiter library."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(help="The traffic-splitting arbiter (HTTP).", no_args_is_help=True)
traffic_app = typer.Typer(help="Send an environment's tasks as traffic through a running arbiter.", no_args_is_help=True)


@app.callback()
def _arbiter() -> None:
    """Serve the arbiter."""  # a callback keeps `serve` a sub-command even though it is the only one


@traffic_app.callback()
def _traffic() -> None:
    """Replay traffic."""


@app.command("serve")
def serve_command(
    host: Annotated[str, typer.Option(help="Interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8700,
    pool_url: Annotated[Optional[str], typer.Option("--pool-url", help="Benchmark pool; default AGENT_RL_POOL_URL or AGENT_RL_HOME/pool.db")] = None,
    store_url: Annotated[Optional[str], typer.Option(
        "--store-url", "--inbox-url", help="The environment's store, where it keeps one (email: its inboxes); default "
        "AGENT_RL_STORE_URL or SQLite under AGENT_RL_HOME")] = None,
    tasks_path: Annotated[Optional[Path], typer.Option("--tasks", "--scenarios", help="Tasks JSONL of an environment that reads one (email: scenarios), for judging requests that name a task_id")] = None,
    env: Annotated[str, typer.Option("--env", envvar="AGENT_RL_ENV", help="Environment /v1/ask serves: email, support, or a plug-in import path 'package.module:Class'")] = "email",
    default_routing: Annotated[Optional[str], typer.Option("--default-routing", help='Weights while the routing table is empty, JSON, e.g. \'{"heuristic": 1}\'')] = None,
    batch_window_ms: Annotated[float, typer.Option(help="Wait this long to batch requests of one policy")] = 0.0,
    log_level: Annotated[str, typer.Option(help="uvicorn/arbiter log level")] = "info",
    access_log: Annotated[bool, typer.Option("--access-log/--no-access-log", help="Log every request line")] = False,
    workers: Annotated[Optional[int], typer.Option(help="Worker processes sharing the port; default one per CPU (a model policy is loaded once per worker)")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", help="Generation limit per assistant turn (default: RunnerConfig's)")] = None,
    api_keys: Annotated[Optional[Path], typer.Option("--api-keys", help="JSON file of API key entries (see `arbiter new-key`); default $AGENT_RL_API_KEYS_FILE, else the JSON in $AGENT_RL_API_KEYS")] = None,
    gateway_idle_s: Annotated[float, typer.Option("--gateway-idle-s", help="A gateway episode without calls for this long ends and is written")] = 300.0,
    gateway_rate_per_s: Annotated[float, typer.Option("--gateway-rate-per-s", help="Gateway requests per second per API key")] = 20.0,
    vllm: Annotated[Optional[str], typer.Option("--vllm", help='Serve registered versions as adapters on a vLLM server, JSON: \'{"base_url": "http://gpu:8000/v1", "adapter_dir": "/shared/adapters"}\' (vllm_lora.VllmServing)')] = None,
) -> None:
    """Serve POST /v1/ask, POST /v1/feedback, GET|PUT /v1/routing, GET /healthz, GET /metrics and the
    OpenAI-compatible gateway (POST /v1/chat/completions, GET /v1/models, POST /v1/episodes/{id}/end; see
    gateway/)."""
    from pydantic import ValidationError

    from agent_rl.arbiter.config import ArbiterConfig
    from agent_rl.arbiter.keys import KeyConfigError, KeyRing
    from agent_rl.arbiter.server import default_workers, serve

    options: dict = {"pool_url": pool_url, "store_url": store_url, "tasks_path": tasks_path, "environment": env,
                     "batch_window_ms": batch_window_ms, "api_keys_file": api_keys,
                     "gateway_idle_s": gateway_idle_s, "gateway_rate_per_s": gateway_rate_per_s,
                     "gateway_rate_burst": max(1, int(2 * gateway_rate_per_s))}
    if vllm:
        try:
            options["vllm"] = json.loads(vllm)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"not valid JSON: {exc}", param_hint="--vllm") from exc
    if default_routing:
        try:
            options["default_routing"] = json.loads(default_routing)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"not valid JSON: {exc}", param_hint="--default-routing") from exc
    try:
        if max_new_tokens is not None:
            from agent_rl.environments.runner import RunnerConfig

            options["runner"] = RunnerConfig(max_new_tokens=max_new_tokens)
        config = ArbiterConfig(**options)
    except ValidationError as exc:
        typer.echo(f"error: invalid arbiter configuration: {exc}", err=True)
        raise typer.Exit(2) from exc
    if workers is not None and workers < 1:
        raise typer.BadParameter(f"{workers}: give at least 1", param_hint="--workers")
    try:  # checked here, before binding: a worker failing on it would only say that it exited
        KeyRing.load(config.api_keys, config.api_keys_file)
    except KeyConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(config, host=host, port=port, log_level=log_level, access_log=access_log, workers=workers or default_workers())


@app.command("new-key")
def new_key_command(
    key_id: Annotated[str, typer.Option("--id", help="Name of the key, shown in logs (never the token)")],
    tenant: Annotated[str, typer.Option(help="Tenant recorded on every episode the key causes")],
    context: Annotated[list[str], typer.Option(help="A context the key may use (email: an inbox address); repeat it, or '*' for all")],
    keys_file: Annotated[Path, typer.Option("--keys-file", help="JSON key file to add the hashed entry to (created if missing)")],
    replay: Annotated[bool, typer.Option("--replay/--no-replay", help="May name tasks, whose episodes are judged and become training labels")] = False,
) -> None:
    """Create an API key: add its hashed entry to a key file and print its token (once) on stdout."""
    from pydantic import ValidationError

    from agent_rl.arbiter.keys import ApiKey, KeyConfigError, add_key

    try:
        token, entry = ApiKey.create(key_id, tenant, context, replay=replay)
        add_key(keys_file, entry)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_input=False))
        typer.echo(f"error: invalid key: {problems}", err=True)
        raise typer.Exit(2) from exc
    except KeyConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"added key {entry.id!r} to {keys_file}; its token follows, shown only now", err=True)
    typer.echo(token)


@app.command("revoke-key")
def revoke_key_command(
    key_id: Annotated[str, typer.Option("--id", help="Name of the key to revoke (as `new-key --id` gave it)")],
    keys_file: Annotated[Path, typer.Option("--keys-file", help="JSON key file the key is in")],
) -> None:
    """Revoke an API key: remove it from the key file; a running arbiter refuses it within a second (no restart)."""
    from agent_rl.arbiter.keys import KeyConfigError, revoke_key

    try:
        entry = revoke_key(keys_file, key_id)
    except KeyConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"revoked key {entry.id!r} (tenant {entry.tenant!r}) in {keys_file}; running arbiters that read this "
               "file refuse it from now on", err=True)


@traffic_app.command("replay")
def replay_command(
    url: Annotated[str, typer.Option(help="Base URL of the arbiter, e.g. http://127.0.0.1:8700")],
    split: Annotated[Optional[str], typer.Option(help="Only tasks of this split: train or test")] = None,
    n: Annotated[Optional[int], typer.Option(help="Number of requests (cycles through the tasks); default one per task")] = None,
    concurrency: Annotated[int, typer.Option(help="Requests in flight at once")] = 16,
    rate: Annotated[Optional[float], typer.Option(help="Requests per second arriving on their own (a Poisson process), as independent users' do; default: each of --concurrency senders sends when its answer is back")] = None,
    tasks_path: Annotated[Optional[Path], typer.Option("--tasks", "--scenarios", help="Tasks JSONL of an environment that reads one (email: scenarios); default the scenarios asset's (AGENT_RL_HOME/artifacts/scenarios/all/scenarios.jsonl)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the summary as JSON")] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar")] = True,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="AGENT_RL_API_KEY", show_envvar=True, help="API key allowed to replay tasks (better given through the environment)")] = None,
    env: Annotated[str, typer.Option("--env", envvar="AGENT_RL_ENV", help="Environment whose replayable tasks are sent: email, support, or a plug-in import path 'package.module:Class'")] = "email",
) -> None:
    """Send an environment's replayable tasks (the email assistant's scenarios) to a running arbiter and print a
    summary (sent, ok, errors by status, per-version counts)."""
    from tqdm import tqdm

    from agent_rl.arbiter.replay import replay, select_tasks
    from agent_rl.environments.core import EnvironmentError
    from agent_rl.records import Split

    if split is not None and split not in {s.value for s in Split}:
        raise typer.BadParameter(f"{split!r}: choose train or test", param_hint="--split")
    if rate is not None and not rate > 0:
        raise typer.BadParameter(f"{rate}: a positive number of requests per second", param_hint="--rate")
    try:
        chosen = select_tasks(_replayable_tasks(env, tasks_path), split, n)
    except (EnvironmentError, OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc

    if not api_key:
        typer.echo("error: no API key: set AGENT_RL_API_KEY (or give --api-key) to a key allowed to replay", err=True)
        raise typer.Exit(2)
    bar = tqdm(total=len(chosen), unit="req", disable=not progress or as_json)
    summary = asyncio.run(replay(url, chosen, concurrency=concurrency, on_done=lambda ok: bar.update(1), api_key=api_key,
                                 rate=rate))
    bar.close()
    report = summary.as_dict()
    if as_json:
        typer.echo(json.dumps(report))
    else:
        typer.echo(
            f"sent {report['sent']}, ok {report['ok']} in {report['elapsed_s']} s ({report['requests_per_s']} req/s)"
        )
        typer.echo(f"per version: {report['per_version']}")
        typer.echo(f"outcomes: {report['outcomes']}")
        if report["errors_by_status"]:
            typer.echo(f"errors by status: {report['errors_by_status']}")
    if summary.ok < summary.sent:
        raise typer.Exit(1)


def _replayable_tasks(env: str, tasks_path: Path | None) -> list:
    """The tasks of `env` a replay may send, from the tasks file when one is named (an environment that reads
    none refuses it rather than sending something else)."""
    from agent_rl.environments.core import EnvironmentError
    from agent_rl.environments.registry import load_environment, world_options

    options = world_options(env, tasks_path=tasks_path)
    if tasks_path and not options:
        raise EnvironmentError(env, "reads no tasks file (--tasks): it brings its own tasks")
    environment = load_environment(env, **options)
    try:
        tasks = environment.world().replayable_tasks()
    finally:
        environment.close()
    if not tasks:
        raise ValueError(f"environment {env!r} has no tasks to replay (give --tasks FILE, or write the "
                         "scenarios asset first)")
    return tasks

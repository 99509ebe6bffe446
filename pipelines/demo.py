"""`make demo` / `make demo-fast`: the whole loop on embedded defaults, as a user would run it.

Prepare the model, build the environment, start the arbiter, seed the pool through it with teacher
traffic, materialize the retraining job, then let the A/B sensors decide on replayed traffic, and
print what happened. Everything lands in the same Dagster instance (.dagster/) and MLflow store
(.data/mlflow.db) that `make ui` opens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

STEPS: list[tuple[str, float]] = []


def step(name: str):
    """Print and time one stage of the demo."""

    @contextmanager
    def timer():
        print(f"\n=== {name}", flush=True)
        started = time.perf_counter()
        yield
        STEPS.append((name, time.perf_counter() - started))
        print(f"--- {name}: {STEPS[-1][1]:.1f} s", flush=True)

    return timer()


@contextmanager
def arbiter_process(port: int, scenarios: Path, token: str):
    """The arbiter as its own process, like production; stopped (SIGTERM, drained) on exit.

    It admits one API key made here (every inbox, may replay scenarios): its hashed entry goes to the
    arbiter in $AGENT_RL_API_KEYS, its token to replay() in this process's $AGENT_RL_API_KEY.
    """
    from agent_rl.arbiter.keys import ApiKey

    api_token, api_key = ApiKey.create("demo-replay", "demo", ["*"], replay=True)
    env = {**os.environ, "AGENT_RL_ADMIN_TOKEN": token, "AGENT_RL_API_KEYS": json.dumps([api_key.model_dump(mode="json")])}
    os.environ["AGENT_RL_API_KEY"] = api_token
    # 128 tokens per turn: the trained agent's turns are under 90 (a tool call or an answer with sources), while
    # the prompted base model, champion until one is registered, rambles on to the limit without calling a tool.
    command = [sys.executable, "-m", "agent_rl.cli", "arbiter", "serve", "--port", str(port), "--workers", "1",
               "--scenarios", str(scenarios), "--log-level", "warning", "--max-new-tokens", "128"]
    process = subprocess.Popen(command, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the arbiter did not start (exit code {process.poll()})")
            time.sleep(0.5)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def put_routing(url: str, token: str, weights: dict[str, float], specs: dict[str, str]) -> None:
    response = httpx.put(f"{url}/v1/routing", json={"weights": weights, "specs": specs, "reason": "demo setup"},
                         headers={"Authorization": f"Bearer {token}"}, timeout=600)
    if response.status_code != 200:
        raise RuntimeError(f"routing change refused: {response.status_code} {response.text}")


def wait_for_routing(url: str, pool, timeout_s: float = 30.0) -> None:
    """Until the arbiter routes by what the sensors just wrote to the pool (it re-reads it every second)."""
    wanted = pool.get_routing().weights
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(f"{url}/v1/routing", timeout=10).json().get("weights") == wanted:
            return
        time.sleep(0.3)
    raise RuntimeError(f"the arbiter did not pick up routing {wanted} within {timeout_s:.0f} s")


def replay(url: str, scenarios, n: int, concurrency: int, key_prefix: str):
    from agent_rl.arbiter.replay import replay as replay_async
    from agent_rl.arbiter.replay import select_scenarios

    chosen = select_scenarios(scenarios, None, n)
    summary = asyncio.run(replay_async(url, chosen, concurrency=concurrency, timeout_s=900, key_prefix=key_prefix))
    print(f"replayed {summary.sent}: ok {summary.ok}, per version {summary.per_version}, "
          f"outcomes {summary.outcomes}, errors {summary.errors_by_status}", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="the tiny random model: the loop's mechanics in minutes")
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--seed-requests", type=int, default=None, help="teacher episodes to seed the pool with")
    parser.add_argument("--ab-rounds", type=int, default=12, help="most rounds of A/B traffic before giving up")
    parser.add_argument("--model-share", type=float, default=None,
                        help="share of seeding traffic served by the base model (default: 0.1 fast, 0.002 full: a 135M model on CPU answers ~1 request in 5 s)")
    args = parser.parse_args(argv)
    profile = "fast" if args.fast else "demo"
    os.environ["AGENT_RL_PROFILE"] = profile
    os.environ.setdefault("DAGSTER_HOME", str(Path(".dagster").resolve()))
    os.environ.setdefault("AGENT_RL_HOME", str(Path(".data").resolve()))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    import dagster as dg

    from agent_rl import settings
    from agent_rl.agent.models import resolve_model
    from agent_rl.pool.repository import PoolRepository
    from agent_rl.scenarios.demo import load_default_scenarios
    from assets.partitions import weekly
    from pipelines.definitions import defs
    from pipelines.sensors import challenger_sensor, rollout_sensor

    instance = dg.DagsterInstance.get()
    resources = defs.resources
    base_model = resources["training"].base_model
    seed_requests = args.seed_requests or (resources["curation"].min_points + 400)

    with step(f"prepare the policy model ({base_model})"):
        print(f"model at {resolve_model(base_model)}")

    with step("environment: inbox and scenarios (Dagster job environment_job)"):
        result = defs.resolve_job_def("environment_job").execute_in_process(instance=instance)
        assert result.success, "environment_job failed"
        scenarios = load_default_scenarios()
        train = [s for s in scenarios if s.split.value == "train"]
        test = [s for s in scenarios if s.split.value == "test"]
        print(f"{len(scenarios)} scenarios: {len(train)} train, {len(test)} test")

    token = secrets.token_urlsafe(16)
    pool = PoolRepository(settings.pool_url())
    partition = weekly.get_partition_keys()[-1]
    with arbiter_process(args.port, settings.artifact_dir("scenarios") / "scenarios.jsonl", token) as url:
        share = args.model_share if args.model_share is not None else (0.1 if args.fast else 0.002)
        with step(f"seed the pool through the arbiter: {seed_requests} requests, teacher + {share:.1%} base model"):
            weights = {"teacher": 1.0 - share, "base": share} if share > 0 else {"teacher": 1.0}
            specs = {"teacher": "heuristic", "base": base_model}
            put_routing(url, token, weights, {v: specs[v] for v in weights})
            replay(url, train, seed_requests, concurrency=16, key_prefix=f"seed-{int(time.time())}")
            print(f"pool holds {pool.count()} episodes")

        with step(f"retraining job on partition {partition} (curation → SFT → GRPO → validation → registry)"):
            result = defs.resolve_job_def("retraining_job").execute_in_process(
                instance=instance, partition_key=partition, raise_on_error=False)
            failed_checks = [e for e in result.get_asset_check_evaluations() if not e.passed]
            for check in failed_checks:
                print(f"check failed: {check.asset_key.to_user_string()}.{check.check_name}: {check.description}")
                for line in _flagged_examples(check.metadata):
                    print(f"    {line}")
            registered = any(e.asset_key.to_user_string() == "registered_model"
                             for e in result.get_asset_materialization_events())
            print(f"retraining run {result.run_id}: {'success' if result.success else 'FAILED'}; "
                  f"challenger registered: {registered}")
            # A failed gate is the loop working (nothing registered); a crashed step is the demo failing.
            check_steps = {f"{c.asset_key.to_python_identifier()}_{c.check_name}" for c in failed_checks}
            crashed = [e.step_key for e in result.get_step_failure_events() if e.step_key not in check_steps]

        decision = None
        if registered:
            with step("A/B test: sensors route traffic, decide on replayed test traffic"):
                context = dg.build_sensor_context(instance=instance, resources=resources)
                print(challenger_sensor(context))
                for round_number in range(args.ab_rounds):
                    wait_for_routing(url, pool)
                    replay(url, test, 100, concurrency=16, key_prefix=f"ab-{round_number}-{int(time.time())}")
                    outcome = rollout_sensor(dg.build_sensor_context(instance=instance, resources=resources))
                    message = getattr(outcome, "skip_message", str(outcome))
                    print(f"round {round_number + 1}: {message}", flush=True)
                    decision = message
                    if message.startswith(("promote", "rollback")):
                        break

    print_summary(pool, partition, decision, started)
    if crashed:
        print(f"FAILED steps: {', '.join(crashed)} (see the run in the Dagster UI)")
        return 1
    return 0


def print_summary(pool, partition: str, decision: str | None, started: float) -> None:
    from agent_rl import settings

    print("\n================ summary ================")
    report_file = settings.artifact_dir("evaluation_report", partition) / "report.json"
    if report_file.exists():
        report = json.loads(report_file.read_text())
        columns = ("accuracy", "source_accuracy", "hallucination_rate", "valid_tool_call_rate", "avg_turns")
        print(f"{'model':12}" + "".join(f"{c:>22}" for c in columns))
        for name, metrics in report["metrics"].items():
            print(f"{name:12}" + "".join(f"{metrics[c]:>22.3f}" for c in columns))
        for name, gate in report["gates"].items():
            print(f"gate {name}: {'passed' if gate['passed'] else 'FAILED'} - {gate['message']}")
    print(f"A/B decision: {decision or 'none (no challenger under test)'}")
    for change in pool.routing_history()[-4:]:
        print(f"routing {change.changed_at:%H:%M:%S} by {change.actor or '-'}: {change.new_weights} ({change.reason})")
    for name, seconds in STEPS:
        print(f"{seconds:8.1f} s  {name}")
    print(f"{time.perf_counter() - started:8.1f} s  total")
    print("Open the UIs: `make ui` (Dagster http://127.0.0.1:3000, MLflow http://127.0.0.1:5000)")


def _flagged_examples(metadata: dict, per_finding: int = 2) -> list[str]:
    """A failed check's example episodes (findings that carry `examples`), one line each, so the summary shows
    why without opening the UI."""
    lines = []
    for name, value in (metadata or {}).items():
        data = getattr(value, "data", value)
        if not isinstance(data, dict) or not data.get("triggered"):
            continue
        for example in (data.get("examples") or [])[:per_finding]:
            lines.append(f"{name}: {example.get('why')} | Q: {str(example.get('question'))[:90]!r} | "
                         f"A: {str(example.get('final_answer'))[:60]!r}")
    return lines


if __name__ == "__main__":
    sys.exit(main())

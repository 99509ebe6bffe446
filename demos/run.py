"""What every demo driver shares: its plan and run, timed steps, the arbiter process and its routing, Dagster jobs
with the demo's console, the retraining run and its report, and who production is before training.

The email / plug-in demo (demos/demo.py, `make demo`) and the outside agent's week through the gateway
(demos/gateway.py, `make demo ENV=gateway`, which demo.py hands the command line to) both run on these; a
module of its own so that the gateway's driver does not import demo.py, which imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

from demos import stopping


STEPS: list[tuple[str, float]] = []


def step(name: str):
    """Print and time one stage of the demo."""

    @contextmanager
    def timer():
        stopping.doing(name)
        print(f"\n=== {name}", flush=True)
        started = time.perf_counter()
        yield
        STEPS.append((name, time.perf_counter() - started))
        print(f"--- {name}: {STEPS[-1][1]:.1f} s", flush=True)

    return timer()


def arbiter_command(port: int, tasks: Path | None, extra_args: tuple[str, ...] = ()) -> list[str]:
    """`arbiter serve` as the demo runs it. Turns get the runner's own token limit, the one the held-out evaluation
    and GRPO give the model: a lower one (128 tokens once) cuts the trained agent's three parallel reads (~140
    tokens) into format errors that validation never saw (docs/experiments.md, 2026-11-28)."""
    return [sys.executable, "-m", "agent_rl.cli", "arbiter", "serve", "--port", str(port), "--workers", "1",
            *(["--tasks", str(tasks)] if tasks is not None else []), "--log-level", "warning", *extra_args]


@contextmanager
def arbiter_process(port: int, tasks: Path | None, token: str, extra_keys: tuple = (),
                    extra_args: tuple[str, ...] = ()):
    """The arbiter as its own process, like production; stopped (SIGTERM, drained) on exit.

    `tasks`: the tasks file the arbiter judges replayed requests by (None: the environment's own, where it keeps one).
    It admits one API key made here (every context, may replay tasks): its hashed entry goes to the
    arbiter in $AGENT_RL_API_KEYS, its token to replay() in this process's $AGENT_RL_API_KEY. `extra_keys`:
    more `ApiKey` entries it admits (their tokens stay with the caller); `extra_args`: more `arbiter serve` options.
    """
    from agent_rl.arbiter.keys import ApiKey
    from agent_rl.arbiter.server import stop_arbiter, wait_until_serving

    api_token, api_key = ApiKey.create("demo-replay", "demo", ["*"], replay=True)
    keys = [api_key.model_dump(mode="json")] + [key.model_dump(mode="json") for key in extra_keys]
    env = {**os.environ, "AGENT_RL_ADMIN_TOKEN": token, "AGENT_RL_API_KEYS": json.dumps(keys)}
    os.environ["AGENT_RL_API_KEY"] = api_token
    process = subprocess.Popen(arbiter_command(port, tasks, extra_args), env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, process)
        yield url
    finally:
        stop_arbiter(process)


def week_changes(ours: bool, fast: bool) -> dict[str, dict]:
    """What a week's run changes in the profile: against an API model the question is the distillation's, as good at
    a fraction of the cost (gate non_inferiority); the fast profile's tiny model keeps its open gate."""
    return {} if ours or fast else {"evaluation": {"gate": "non_inferiority"}}


def put_routing(url: str, token: str, weights: dict[str, float], specs: dict[str, str],
                reason: str = "demo setup") -> None:
    stopping.check()
    response = httpx.put(f"{url}/v1/routing", json={"weights": weights, "specs": specs, "reason": reason},
                         headers={"Authorization": f"Bearer {token}"}, timeout=600)
    if response.status_code != 200:
        raise RuntimeError(f"routing change refused: {response.status_code} {response.text}")


def reader_auth() -> dict[str, str]:
    """The demo's API key (set by arbiter_process): reading the routing and the serving figures needs one."""
    key = os.environ.get("AGENT_RL_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def wait_for_routing(url: str, pool, timeout_s: float = 30.0) -> None:
    """Until the arbiter routes by what the sensors just wrote to the pool (it re-reads it every second)."""
    wanted = pool.get_routing().weights
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(f"{url}/v1/routing", headers=reader_auth(), timeout=10).json().get("weights") == wanted:
            return
        time.sleep(0.3)
    raise RuntimeError(f"the arbiter did not pick up routing {wanted} within {timeout_s:.0f} s")


@contextmanager
def output_to(log_file: Path):
    """Everything this process and its children write (Dagster, training subprocesses, progress bars) goes to
    `log_file`; the block gets a stream to the real console for the lines meant for a person."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    console = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    with open(log_file, "a", encoding="utf-8") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield console
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            console.close()


def run_job(defs, name: str, instance, log_file: Path, max_steps: dict[str, int], resources: dict | None = None,
            **kwargs):
    """A job of the code location with the demo's console logger (progress on screen, full log in the file);
    `resources`: field values that replace the profile's for this run only ({"evaluation": {"gate": "open"}})."""
    from dagster._core.utils import make_new_run_id

    from demos.console import console_logger
    from pipelines.profiles import resource_config

    with output_to(log_file) as console:
        job = defs.resolve_job_def(name).with_logger_defs(
            {"demo_console": console_logger(log_file, max_steps, out=console)})
        # Logger definitions take effect only when the run config selects them.
        run_config = {"loggers": {"demo_console": {}}, "resources": resource_config(defs, resources or {})}
        run_id = kwargs.pop("run_id", None) or make_new_run_id()
        stopping.STATE.dagster_run = run_id  # a stop ends this run's MLflow runs as KILLED
        result = job.execute_in_process(instance=instance, run_config=run_config, run_id=run_id, **kwargs)
    stopping.check()  # a run with raise_on_error=False returns after an interrupt: go no further
    return result


@dataclass
class DemoPlan:
    """What the command line asked for, checked: the environment loaded, production's agent chosen."""

    args: argparse.Namespace
    environment: Any  # the loaded Environment (email included)
    production_spec: str
    production: str  # its routing name
    ours: bool  # production starts on v0, a model of ours
    profile: str


def prepare_home(plan: DemoPlan) -> Path:
    """The demo's environment variables, home and log file (the resources, the arbiter and `make ui` read them)."""
    os.environ["AGENT_RL_PROFILE"] = plan.profile
    os.environ["AGENT_RL_ENV"] = plan.args.env  # the resources (EnvironmentResource, model name) and the arbiter
    os.environ.setdefault("DAGSTER_HOME", str(Path(".dagster").resolve()))
    os.environ.setdefault("AGENT_RL_HOME", str(Path(".data").resolve()))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    home = Path(os.environ["AGENT_RL_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    # `make ui` runs the sensors with the profile the demo used (its A/B thresholds, its base model).
    (home / "profile").write_text(plan.profile + "\n")
    log_file = home / "logs" / f"demo-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    weeks = plan.args.weeks
    print(f"agent-rl demo ({plan.profile} profile, environment {plan.args.env}, {weeks} week{'s' * (weeks > 1)}); "
          f"full Dagster log: {log_file}", flush=True)
    return log_file


@dataclass
class DemoRun:
    """What every stage of the demo shares once the code location is loaded."""

    plan: DemoPlan
    defs: Any
    instance: Any
    log_file: Path
    max_steps: dict[str, int]
    partition: str
    pool: Any
    url: str = ""
    token: str = ""
    crashed: list[str] = field(default_factory=list)

    def job(self, name: str, max_steps: dict[str, int] | None = None, **kwargs):
        """Run a job of the code location; `max_steps` replaces the profile's for its progress lines."""
        return run_job(self.defs, name, self.instance, self.log_file, max_steps or self.max_steps, **kwargs)


def retrain(run: DemoRun, resources: dict[str, dict] | None = None, max_steps: dict[str, int] | None = None):
    """The week's retraining run and its failed checks; a crashed step (not a failed gate) marks the demo failed.
    `resources`: more field changes for this run, beside the week's (resource name -> fields); `max_steps`: the
    stages' step counts for the progress lines, where the changes alter the profile's."""
    from pipelines.sensors import end_mlflow_parent_run

    changes = week_changes(run.plan.ours, run.plan.args.fast)
    for name, fields in (resources or {}).items():
        changes[name] = {**changes.get(name, {}), **fields}
    result = run.job("retraining_job", max_steps, resources=changes, partition_key=run.partition,
                     raise_on_error=False)
    with output_to(run.log_file):  # MLflow's own INFO lines belong in the log, not on the console
        end_mlflow_parent_run(run.defs.resources["mlflow"].uri(), result.run_id, result.success)
    failed_checks = [e for e in result.get_asset_check_evaluations() if not e.passed]
    for check in failed_checks:
        print(f"check failed: {check.asset_key.to_user_string()}.{check.check_name}: {check.description}")
        for line in _flagged_examples(check.metadata):
            print(f"    {line}")
    # A failed gate is the loop working (nothing registered); a crashed step is the demo failing.
    check_steps = {f"{c.asset_key.to_python_identifier()}_{c.check_name}" for c in failed_checks}
    run.crashed += [e.step_key for e in result.get_step_failure_events() if e.step_key not in check_steps]
    return result, failed_checks


def not_registered(report: dict | None, failed_checks: list) -> str:
    """Why a week's run registered nothing: the gates it failed, or the check that stopped it before validation."""
    if report:
        return "not registered: " + "; ".join(
            f"{name} {gate['message']}" for name, gate in report["gates"].items() if not gate["passed"])
    if failed_checks:
        return "stopped before validation by " + "; ".join(
            f"{c.asset_key.to_user_string()}.{c.check_name}: {c.description}" for c in failed_checks)
    return "not registered: the run stopped before validation"


def registered_by(result) -> bool:
    """Whether a retraining run registered a model (its gates passed and registered_model materialized)."""
    return any(e.asset_key.to_user_string() == "registered_model" for e in result.get_asset_materialization_events())


def another_agents_test(pool, model_name: str) -> str | None:
    """'<model>'s test of <version>' when the A/B test running on the pool's routing table is another agent's."""
    from agent_rl.ab.controller import latest_state

    state = latest_state(pool)
    if state is None or state.finished or state.model_name in (None, model_name):
        return None
    return f"{state.model_name}'s test of {state.challenger}"


# What stands for production before training in a plug-in's demo: its teacher failing the share of requests a named
# model fails on a public benchmark (a simulation, said so wherever it is shown; the accuracy is measured).
SIMULATED_PRODUCTION: dict[str, tuple[str, str]] = {
    "email": ("api-sim:o3", "o3 (described by its profile in agent/api_models.toml)"),
    "support": ('teacher:{"environment": "support", "success_rate": 0.612}',
                "gpt-4o on tau-bench retail: SIMULATED by the support teacher failing 38.8% of requests (it answers "
                "without acting), after gpt-4o's published pass^1 of 61.2% (Yao et al. 2024, tau-bench, "
                "arXiv:2406.12045); accuracy measured"),
}


# The fast demo's production for the email assistant: its rule-based reader without the simulated errors.
FAST_PRODUCTION: dict[str, str] = {"email": "heuristic"}


def production_version(spec: str) -> str:
    """The routing name of the production agent's spec: `api-sim:o3` -> `o3-sim`, `heuristic` -> `teacher`."""
    if spec.startswith("api-sim:"):
        return f"{spec.split(':', 1)[1]}-sim"
    if spec.startswith("heuristic"):
        return "teacher"
    if spec == SIMULATED_PRODUCTION["support"][0]:
        return "gpt-4o-sim"
    if spec.startswith("teacher"):
        return "teacher"
    return "production"


def read_report(partition: str, run_id: str) -> dict | None:
    """The evaluation report that run `run_id` wrote; None when that run did not reach validation (what the
    partition's folder holds then is an earlier run's, maybe another agent's)."""
    from agent_rl import settings

    report_file = settings.artifact_dir("evaluation_report", partition) / "report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else None
    return report if report and report.get("dagster_run_id") == run_id else None


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

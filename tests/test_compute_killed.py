"""A training subprocess killed by a signal (the out-of-memory killer, an eviction) runs once more and says why; one
that failed on its own is not retried. Real Dagster runs and real subprocesses speaking Dagster Pipes; the stage is
a small script in place of `python -m agent_rl.train` (no model), so each case takes seconds."""

import sys
from pathlib import Path

import dagster as dg
from resources.compute import TrainingCompute

STAGE = """
import os, signal, sys
from pathlib import Path
from dagster_pipes import open_dagster_pipes

attempts = Path(os.environ["ATTEMPTS"])
attempts.write_text(attempts.read_text() + "x" if attempts.exists() else "x")
mode = os.environ["MODE"]
if mode == "always" or (mode == "once" and len(attempts.read_text()) == 1):
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "error":
    raise SystemExit("bad config: no rows")
with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"steps": 7})
"""


def run_stage(tmp_path: Path, monkeypatch, mode: str) -> tuple[dg.ExecuteInProcessResult, int, dict]:
    script = tmp_path / "stage.py"
    script.write_text(STAGE)
    attempts = tmp_path / "attempts"
    monkeypatch.setenv("ATTEMPTS", str(attempts))
    monkeypatch.setenv("MODE", mode)
    monkeypatch.setattr(TrainingCompute, "_local_command", lambda self, stage: [sys.executable, str(script)])
    seen = {}

    @dg.asset
    def adapter(context: dg.AssetExecutionContext, compute: TrainingCompute):
        seen["result"] = compute.run(context, "sft", {"out_dir": str(tmp_path / "out")})
        return dg.MaterializeResult(metadata=seen["result"])

    result = dg.materialize([adapter], resources={"compute": TrainingCompute()}, raise_on_error=False)
    return result, len(attempts.read_text()), seen


def test_a_stage_killed_once_runs_again_and_succeeds(tmp_path, monkeypatch):
    result, attempts, seen = run_stage(tmp_path, monkeypatch, "once")
    assert result.success and attempts == 2
    assert seen["result"] == {"steps": 7}
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(retries) == 1 and "killed by SIGKILL" in str(retries[0].event_specific_data.error.cause)


def test_a_stage_killed_every_time_fails_after_one_retry_naming_the_signal(tmp_path, monkeypatch):
    result, attempts, _ = run_stage(tmp_path, monkeypatch, "always")
    assert not result.success and attempts == 2
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "out-of-memory killer" in str(failure.event_specific_data.error)


def test_a_stage_that_fails_on_its_own_is_not_retried(tmp_path, monkeypatch):
    result, attempts, _ = run_stage(tmp_path, monkeypatch, "error")
    assert not result.success and attempts == 1
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]


def test_the_demo_console_names_the_signal_not_only_that_the_step_failed(tmp_path, monkeypatch):
    import io

    from demos.console import ConsoleProgress

    result, _, _ = run_stage(tmp_path, monkeypatch, "always")
    out = io.StringIO()
    console = ConsoleProgress(out, {})
    for event in result.all_events:
        if event.event_type_value in ("STEP_UP_FOR_RETRY", "STEP_FAILURE"):
            console._event("adapter", event, event.message or "")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("  retrying adapter (") and "killed by SIGKILL" in lines[0]
    assert lines[1].startswith("  FAILED adapter: ") and "out-of-memory killer" in lines[1]

"""Time the demo loops: `make demo-fast` (tiny model, target < 5 min) and, with --full, `make demo`
(SmolLM2-135M on CPU, target < 30 min of compute after install). Each runs in a fresh AGENT_RL_HOME and
DAGSTER_HOME; the prepared models are linked in so model preparation is not timed twice.

Prints the stage timings the demo reports and, last, one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS_S = {"fast": 300.0, "full": 1800.0}


def run_demo(profile: str, port: int) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"demo-{profile}-"))
    (home / ".dagster").mkdir()
    shutil.copy(ROOT / "dagster.yaml", home / ".dagster" / "dagster.yaml")
    models = ROOT / ".data" / "models"
    if models.is_dir():
        (home / ".data").mkdir()
        (home / ".data" / "models").symlink_to(models, target_is_directory=True)
    env = {**os.environ, "AGENT_RL_HOME": str(home / ".data"), "DAGSTER_HOME": str(home / ".dagster"),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "demos.demo", "--port", str(port)] + (["--fast"] if profile == "fast" else [])
    started = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    stages = {m.group(2).strip(): float(m.group(1)) for m in re.finditer(r"^\s*([\d.]+) s  (.+)$", result.stdout, re.M)}
    decision = re.search(r"^A/B decision: (.+)$", result.stdout, re.M)
    log = Path(tempfile.gettempdir()) / f"agent-rl-demo-{profile}.log"  # the printed summary, kept for reading
    log.write_text(result.stdout + "\n--- stderr ---\n" + result.stderr[-20000:])
    failed = result.returncode != 0 or "FAILED" in result.stdout
    if failed:  # keep the run's storage (rollouts, check results, Dagster logs) for reading
        print(f"{profile}: the run failed; its storage is kept in {home}")
    else:
        shutil.rmtree(home, ignore_errors=True)
    return {"profile": profile, "seconds": round(seconds, 1), "exit_code": result.returncode, "stages": stages,
            "decision": decision.group(1) if decision else None, "target_s": TARGETS_S[profile], "log": str(log),
            "stdout_tail": result.stdout[-1500:] if result.returncode else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also time the full SmolLM2 demo (about 30 min)")
    parser.add_argument("--skip-fast", action="store_true", help="with --full: time only the full demo")
    args = parser.parse_args()
    runs = [] if args.full and args.skip_fast else [run_demo("fast", 8721)]
    if args.full:
        runs.append(run_demo("full", 8722))
    for run in runs:
        print(f"{run['profile']}: {run['seconds']} s (target {run['target_s']} s), exit {run['exit_code']}")
    ok = all(r["exit_code"] == 0 and r["seconds"] <= r["target_s"] for r in runs)
    load = os.getloadavg()[0]
    print(json.dumps({"runs": runs, "load_average_1m": round(load, 2), "meets_target": ok}))


if __name__ == "__main__":
    main()

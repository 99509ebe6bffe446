"""Load and outage figures for the arbiter (heuristic policy, real server processes on loopback).

1. SQLite pool: N requests at bounded concurrency; requests/s, status counts, episodes lost or duplicated.
2. PostgreSQL pool on a private server (own port, initdb'd here, never the shared one) restarted mid-run:
   errors during the outage (all 503 JSON?), time to recover, episodes lost; then the same with clients
   that retry 503s.
The target: every request answered or refused with a clear error, 0 answered episodes lost, 0 duplicates,
the arbiter serving again after the restart without being restarted itself, and >= 300 requests/s on SQLite.

    OMP_NUM_THREADS=1 .venv/bin/python bench/load.py [--n 10000] [--concurrency 32] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "reliability"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import httpx  # noqa: E402

from reliability_support import (  # noqa: E402
    API_TOKEN,
    arbiter_process,
    build_world,
    drive,
    drive_async,
    pool_episode_ids,
    postgres_bin,
    private_postgres,
)

TARGET_RPS = 300.0


def _integrity(report, stored) -> dict:
    answered = set(report.answered_ids)
    return {"answered": len(answered), "lost": len(answered - set(stored)),
            "duplicates": sum(n - 1 for n in stored.values() if n > 1), "unclear": len(report.unclear())}


def sqlite_run(world, root: Path, n: int, concurrency: int, workers: int) -> dict:
    pool_url = f"sqlite:///{root / 'pool.db'}"
    with arbiter_process(world, pool_url, root / "arbiter-sqlite.log", workers=workers, log_level="warning") as arbiter:
        report = drive(arbiter.host, arbiter.port, world.ask_bodies(n), concurrency)
    return {"requests": n, "rps": round(report.rps, 1), "statuses": report.statuses,
            **_integrity(report, pool_episode_ids(pool_url))}


def outage_run(world, root: Path, n: int, concurrency: int, retries: int, outage_s: float) -> dict:
    with private_postgres() as pg:
        log = root / f"arbiter-pg-{retries}.log"
        with arbiter_process(world, pg.url, log, workers=1) as arbiter:
            result: dict = {}

            def traffic() -> None:
                result["report"] = asyncio.run(drive_async(arbiter.host, arbiter.port, world.ask_bodies(n), concurrency,
                                                           retries=retries, retry_pause_s=0.5))

            thread = threading.Thread(target=traffic)
            thread.start()
            while sum(pool_episode_ids(pg.url).values()) < n // 6:
                time.sleep(0.1)
            pg.stop("fast")
            time.sleep(outage_s)
            pg.start()
            restarted = time.monotonic()
            recovered_s = None
            while recovered_s is None and time.monotonic() - restarted < 120:
                probe = httpx.post(f"{arbiter.url}/v1/ask", content=world.ask_bodies(1)[0], timeout=30,
                                   headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_TOKEN}"})
                if probe.status_code == 200:
                    recovered_s = time.monotonic() - restarted
                else:
                    time.sleep(0.05)
            thread.join()
            report = result["report"]
            after = drive(arbiter.host, arbiter.port, world.ask_bodies(100), 8)
            same_process = arbiter.process.poll() is None
        stored = pool_episode_ids(pg.url)
    refused = [o for o in report.outcomes if not o.answered]
    return {
        "requests": n, "retries_per_request": retries, "outage_s": outage_s, "statuses": report.statuses,
        "errors_during_outage": len(refused),
        "errors_all_503_json": all(o.status == 503 and o.clear_error for o in refused),
        "retried_requests": sum(1 for o in report.outcomes if o.attempts > 1),
        "recovered_after_s": round(recovered_s, 3) if recovered_s is not None else None,
        "after_restart_statuses": after.statuses, "arbiter_not_restarted": same_process,
        **_integrity(report, {k: v for k, v in stored.items()}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--outage-n", type=int, default=1500)
    parser.add_argument("--outage-s", type=float, default=3.0)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="agent-rl-bench-load-"))
    os.environ.setdefault("AGENT_RL_HOME", str(root / "home"))
    try:
        report = run_all(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _print_summary(report, args)


def run_all(args: argparse.Namespace, root: Path) -> dict:
    world = build_world(root / "world")
    report: dict = {"sqlite": sqlite_run(world, root, args.n, args.concurrency, args.workers)}
    print(json.dumps({"sqlite": report["sqlite"]}), flush=True)
    if postgres_bin() is not None:
        report["postgres_restart"] = outage_run(world, root, args.outage_n, 16, retries=0, outage_s=args.outage_s)
        print(json.dumps({"postgres_restart": report["postgres_restart"]}), flush=True)
        report["postgres_restart_with_retries"] = outage_run(world, root, args.outage_n, 16, retries=40, outage_s=args.outage_s)
        print(json.dumps({"postgres_restart_with_retries": report["postgres_restart_with_retries"]}), flush=True)
    return report


def _print_summary(report: dict, args: argparse.Namespace) -> None:
    runs = list(report.values())
    outage_runs = [r for k, r in report.items() if k.startswith("postgres")]
    meets = (
        all(r["lost"] == 0 and r["duplicates"] == 0 and r["unclear"] == 0 for r in runs)
        and report["sqlite"]["statuses"] == {"200": args.n}
        and report["sqlite"]["rps"] >= TARGET_RPS
        and all(r["errors_all_503_json"] and r["arbiter_not_restarted"] and r["after_restart_statuses"] == {"200": 100}
                for r in outage_runs)
        and (not outage_runs or report["postgres_restart_with_retries"]["statuses"] == {"200": args.outage_n})
    )
    target = {"sqlite_rps": TARGET_RPS, "lost": 0, "duplicates": 0, "unclear_errors": 0,
              "outage_errors": "503 JSON only", "retrying_clients": "all answered"}
    print(json.dumps({**report, "target": target, "meets_target": bool(meets)}))


if __name__ == "__main__":
    main()

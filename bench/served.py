"""A model of ours serving held-out requests through the arbiter, as `make demo` serves production: requests/s,
median latency and outcomes, per serving configuration, on the same requests in one run.

Each configuration is a fresh arbiter process (`demos.run.arbiter_command`, one worker) routing all traffic
to the adapter on the shared base, replayed at the demo's concurrency (16 for production, 32 in the A/B test). Configurations vary what the demo
controls: where the model generates ($AGENT_RL_ENGINE: `torch`, our own decoder, or `vllm`, the serving engine of
agent/engine.py), torch threads of the arbiter (OMP_NUM_THREADS), the conversations decoded together
($AGENT_RL_SERVING_BATCH) and the token limit of a turn (`--max-new-tokens`; default the runner's, the one the
held-out evaluation uses). The first configuration is the baseline of the ratios. `start_up_s` is the first two
requests' time (loading the version, and starting the engine where there is one): paid once per process.

    .venv/bin/python bench/served.py --home HOME --adapter DIR [--requests 48]

HOME is a demo home (`make demo`, or `environment_job` alone: the inbox and scenarios); the adapter any trained
one (`bench/quality.py --home H` leaves H/sft/adapter). Last line: JSON report; target >= 1 request/s.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_REQUESTS_PER_S = 1.2  # issue "the loop closes on a laptop": the engine through the arbiter, 2 cores
CONFIGS = {  # name: (engine, torch threads, serving batch, turn token limit or None for the runner's, in flight)
    "torch, 1 thread, batch 16 (the demo's arbiter before the engine)": ("torch", 1, 16, None, 16),
    "torch, 2 threads, batch 16": ("torch", 2, 16, None, 16),
    "vllm engine (every core), one engine per version": ("vllm", 1, 16, None, 16),
    "vllm engine, 32 in flight (the demo's A/B test)": ("vllm", 1, 32, None, 32),
}


def serve(adapter: str, requests: list, engine: str, threads: int, batch: int, limit: int | None, in_flight: int,
          port: int) -> dict:
    import httpx

    from demos.demo import replay
    from demos.run import arbiter_process, put_routing, reader_auth

    os.environ.update(OMP_NUM_THREADS=str(threads), AGENT_RL_SERVING_BATCH=str(batch), AGENT_RL_ENGINE=engine)
    spec = "lora:" + json.dumps({"base": "base", "adapters": [adapter], "version": "served"})
    token = secrets.token_urlsafe(16)
    extra = ("--max-new-tokens", str(limit)) if limit else ()
    with tempfile.TemporaryDirectory() as pool_dir:
        os.environ["AGENT_RL_POOL_URL"] = f"sqlite:///{pool_dir}/pool.db"
        from agent_rl.environments.email.scenarios.demo import scenarios_path

        with arbiter_process(port, scenarios_path(), token, extra_args=extra) as url:
            put_routing(url, token, {"served": 1.0}, {"served": spec})
            started = time.perf_counter()
            replay(url, requests[:2], 2, concurrency=2, key_prefix=f"warm-{port}", quiet=True)  # loads, warms up
            start_up = time.perf_counter() - started
            started = time.perf_counter()
            summary = replay(url, requests, len(requests), concurrency=in_flight,
                             key_prefix=f"bench-{port}-{time.time()}", quiet=True)
            seconds = time.perf_counter() - started
            health = httpx.get(f"{url}/healthz", headers=reader_auth(), timeout=10).json()
        from agent_rl.pool.repository import PoolRepository

        pool = PoolRepository(os.environ["AGENT_RL_POOL_URL"])
        latencies = [e.latency_ms for e in pool.export(limit=1000).episodes[2:] if e.latency_ms is not None]
        pool.close()
    return {"start_up_s": round(start_up, 1), "seconds": round(seconds, 1), "requests_per_s": round(len(requests) / seconds, 3),
            "ok": summary.ok, "outcomes": dict(summary.outcomes),
            "median_latency_s": round(statistics.median(latencies) / 1000, 1) if latencies else None,
            "episodes_written": health.get("episodes_written")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a demo home: inbox.db and artifacts/scenarios")
    parser.add_argument("--adapter", required=True, help="a trained adapter directory")
    parser.add_argument("--requests", type=int, default=48, help="held-out requests per configuration")
    parser.add_argument("--only", action="append", default=None, choices=list(CONFIGS),
                        help="a configuration name (repeatable; default: all, the first being the ratios' baseline)")
    args = parser.parse_args(argv)
    os.environ["AGENT_RL_HOME"] = str(args.home.resolve())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    adapter = str(Path(args.adapter).resolve())
    if not (Path(adapter) / "adapter_config.json").is_file():
        raise SystemExit(f"--adapter {args.adapter}: not a PEFT adapter directory (no adapter_config.json)")
    from agent_rl.environments.email.scenarios.demo import load_default_scenarios

    sys.path.insert(0, str(ROOT / "bench"))
    from heldout import machine

    test = [s for s in load_default_scenarios() if s.split.value == "test"][: args.requests]
    runs = {}
    for index, (name, (engine, threads, batch, limit, in_flight)) in enumerate(CONFIGS.items()):
        if args.only and name not in args.only:
            continue
        runs[name] = serve(adapter, test, engine, threads, batch, limit, in_flight, 8760 + index)
        print(json.dumps({"config": name, **runs[name]}), flush=True)
    first = next(iter(runs.values()))["requests_per_s"]
    best = max(r["requests_per_s"] for r in runs.values())
    print(json.dumps({"benchmark": "served", "machine": machine(), "requests": len(test), "runs": runs,
                      "ratios_to_first": {n: round(r["requests_per_s"] / first, 3) for n, r in runs.items()},
                      "target_requests_per_s": TARGET_REQUESTS_PER_S, "meets_target": best >= TARGET_REQUESTS_PER_S}))


if __name__ == "__main__":
    main()

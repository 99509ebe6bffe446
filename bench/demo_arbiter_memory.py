"""The arbiter's memory during the demo's A/B test: the prompted base model as champion and the demo's trained
adapter as challenger, served the way the arbiter served them before (each version its own merged model with its
own caches, `local:` specs) and the way it serves them now (one shared base, the challenger as an adapter, one cache
budget). Same arbiter process setup as `make demo` (its own process, one worker), same replayed held-out traffic.

    .venv/bin/python bench/demo_arbiter_memory.py --adapter .data/artifacts/sft_adapter/<week>/adapter [--requests 200]

Run it after `make demo` (it uses the demo's inbox store and scenarios under AGENT_RL_HOME, and writes its
episodes to a pool of its own). Reports the arbiter's peak and final resident memory for both ways from /healthz;
target: the shared base at most 1.3x of serving the champion alone would be, i.e. at most the old way's. Last line:
JSON report.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demos.demo import arbiter_memory, replay  # noqa: E402
from demos.run import arbiter_process, put_routing, reader_auth  # noqa: E402


def serve(specs: dict[str, str], weights: dict[str, float], requests: int, port: int) -> dict:
    import os
    import secrets

    from agent_rl.environments.email.scenarios.demo import load_default_scenarios, scenarios_path

    test = [s for s in load_default_scenarios() if s.split.value == "test"]
    token = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory() as pool_dir:
        os.environ["AGENT_RL_POOL_URL"] = f"sqlite:///{pool_dir}/pool.db"
        with arbiter_process(port, scenarios_path(), token) as url:
            put_routing(url, token, weights, specs)
            started = time.perf_counter()
            replay(url, (test * (requests // len(test) + 1))[:requests], requests, concurrency=16,
                   key_prefix=f"mem-{port}-{int(time.time())}", quiet=True)
            seconds = time.perf_counter() - started
            memory = arbiter_memory(url)
            served = httpx.get(f"{url}/healthz", headers=reader_auth(), timeout=10).json().get("episodes_written")
    return {**(memory or {}), "seconds": round(seconds, 1), "episodes_written": served}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", required=True, help="the demo's trained adapter directory (challenger)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--challenger-share", type=float, default=0.5)
    args = parser.parse_args()
    adapter = str(Path(args.adapter).resolve())
    weights = {"base": 1 - args.challenger_share, "challenger": args.challenger_share}
    merged = {"base": "local:" + json.dumps({"model": "base"}),
              "challenger": "local:" + json.dumps({"model": "base", "adapter": adapter})}
    before = serve(merged, weights, args.requests, 8791)
    after = serve({"base": "base", "challenger": "lora:" + json.dumps({"base": "base", "adapters": [adapter]})},
                  weights, args.requests, 8792)
    ratio = round(after["peak_mb"] / before["peak_mb"], 3) if before.get("peak_mb") else None
    print(json.dumps({"benchmark": "demo_arbiter_memory", "requests": args.requests, "weights": weights,
                      "merged_versions": before, "shared_base": after, "peak_ratio_shared_vs_merged": ratio,
                      "target": "shared base peak <= merged peak", "meets_target": ratio is not None and ratio <= 1.0}))


if __name__ == "__main__":
    main()

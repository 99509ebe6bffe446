"""The A/B test's two versions served side by side on one machine's cores: how to share them between the two
engines. Each version has an engine of its own (`agent/engine.py`, merged checkpoints, as the demo's arbiter serves
an A/B test); traffic is held-out email episodes played whole (tools included) by 32 concurrent users, each user
routed to one version in proportion to the split, for a fixed time. Compared on the same traffic:

  * `single`: one engine on every core serving both groups of users (one version alone: the baseline);
  * `shared`: each engine computes on every core (the default: one engine serving alone gets the whole machine);
  * `split`: the cores divided between the engines, each engine's processes kept on its own (as the arbiter places
    them);
  * `split-threads`: the same division, but only vLLM's compute threads bound (its front end and engine core free
    to run on either share: how engines were placed before 2026-11-30, late);
  * `overlap`: A's engine on every core, B's on the last one only (B's traffic takes turns with A's threads there).

    .venv/bin/python bench/ab_engines.py --home HOME [--model-b DIR] [--seconds 150] [--splits 0.5,0.1]

HOME is a demo home (`AGENT_RL_HOME`, e.g. a clone's `.data` after `make demo`: the inbox store and scenarios).
Version A is the base model; version B `--model-b` (a merged checkpoint) or, by default, the same weights under
another path (its own engine). Reported per mode and split: episodes/s of both versions together and of each, the
ratio of `split` to `shared`, and at an even split version B's p95 latency over A's; `meets_target`: split >= 1.10x
shared at every split and, with the same weights on both engines, B's p95 within the latency guardrail's 20% of A's
under `split`. Last line: JSON report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from heldout import machine  # noqa: E402  (this folder is on sys.path when a bench runs as a script)

# What would pay for splitting: a champion's engine serving alone has every core, so splitting means restarting it
# on half of them when a test starts (~60-100 s) and again at promotion; 10% more throughput at every split.
TARGET_RATIO = 1.10
GUARDRAIL = 1.2  # the A/B test's latency guardrail: the challenger's p95 at most 20% over the champion's
USERS = 32  # the demo's A/B rounds keep 32 requests in flight (demos/demo.py IN_FLIGHT)


def serve_for(policies: dict[str, object], environment, tasks: list, share_b: float, seconds: float) -> dict:
    """USERS threads, each playing one episode after another on its version until `seconds` have passed."""
    from agent_rl.environments.runner import Play, RunnerConfig, play_episodes

    users_b = max(1, round(USERS * share_b)) if share_b > 0 else 0
    done: dict[str, int] = {"a": 0, "b": 0}
    latencies: dict[str, list[float]] = {"a": [], "b": []}
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds
    config = RunnerConfig(batch_size=1, in_flight=False, timeout_s=None)

    def user(index: int) -> None:
        version = "b" if index < users_b else "a"
        step = 0
        while True:
            task = tasks[(index * 7 + step * USERS) % len(tasks)]
            step += 1
            [episode] = play_episodes(policies[version], environment, [Play(task)], config)
            if time.perf_counter() > deadline:
                return  # an episode that ended after the deadline is not counted
            with lock:
                done[version] += 1
                latencies[version].append(episode.latency_ms / 1000)

    threads = [threading.Thread(target=user, args=(i,)) for i in range(USERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"users_b": users_b, "episodes_a": done["a"], "episodes_b": done["b"],
            "episodes_per_s": round((done["a"] + done["b"]) / seconds, 3),
            "episodes_per_s_a": round(done["a"] / seconds, 3), "episodes_per_s_b": round(done["b"] / seconds, 3),
            **{f"latency_s_{v}": latency_summary(latencies[v]) for v in ("a", "b")}}


def latency_summary(seconds: list[float]) -> dict[str, float] | None:
    """Mean and p95 of one version's episode latencies, the p95 as the A/B test's latency guardrail computes it
    (numpy's, agent_rl/ab/stats.py)."""
    if not seconds:
        return None
    return {"mean": round(float(np.mean(seconds)), 2), "p95": round(float(np.percentile(seconds, 95)), 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a demo home (inbox store and scenarios)")
    parser.add_argument("--model", default=str(ROOT / ".data" / "models" / "smollm2-135m-instruct"))
    parser.add_argument("--model-b", default=None, help="version B's checkpoint (default: A's weights, own engine)")
    parser.add_argument("--seconds", type=float, default=150.0, help="traffic per mode and split, after warm-up")
    parser.add_argument("--splits", default="0.5,0.1", help="version B's shares of the users, comma-separated")
    parser.add_argument("--modes", default="shared,split")
    args = parser.parse_args(argv)
    os.environ["AGENT_RL_HOME"] = str(args.home.resolve())

    from transformers import AutoTokenizer

    from agent_rl.agent.engine import EngineConfig, EnginePolicy, EngineServer, engine_dtype
    from agent_rl.environments.email.environment import EmailEnvironment
    from agent_rl.records import Split

    environment = EmailEnvironment()
    tasks = environment.tasks(Split.TEST)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    scratch = tempfile.TemporaryDirectory(prefix="ab-engines-")
    model_b = args.model_b
    if model_b is None:  # the same weights under another path: an engine of its own, as a second version has
        model_b = str(Path(scratch.name) / "version-b")
        shutil.copytree(args.model, model_b, symlinks=True)
    cores = os.cpu_count() or 1
    results: dict[str, dict] = {}
    for mode in args.modes.split(","):
        if mode == "shared":
            options = [{"threads": cores}, {"threads": cores}]
        elif mode in ("split", "split-threads"):
            half = max(1, cores // 2)
            options = [{"cores": tuple(range(half))}, {"cores": tuple(range(half, cores)) or (0,)}]
        elif mode == "overlap":
            options = [{"cores": tuple(range(cores))}, {"cores": (cores - 1,)}]
        elif mode == "single":
            options = [{"threads": cores}]
        else:
            raise SystemExit(f"--modes: unknown mode {mode!r} (single, shared, split, split-threads, overlap)")
        started = time.perf_counter()
        server = type("Server", (EngineServer,), {"confine": mode != "split-threads"})
        engines = [server(EngineConfig(model=m, lora=False, dtype=engine_dtype(), **o)).start()
                   for m, o in zip((args.model, model_b), options)]
        startup = time.perf_counter() - started
        policies = {"a": EnginePolicy(engines[0], tokenizer, version="a"),
                    "b": EnginePolicy(engines[-1], tokenizer, version="b")}
        try:
            serve_for(policies, environment, tasks, 0.5, 20.0)  # warm-up: compiled shapes, prefix caches
            for share in (float(x) for x in args.splits.split(",")):
                key = f"{mode}, B {share:.0%}"
                results[key] = {"mode": mode, "share_b": share, "startup_s": round(startup, 1),
                                **serve_for(policies, environment, tasks, share, args.seconds)}
                print(json.dumps({"config": key, **results[key]}), flush=True)
        finally:
            for engine in engines:
                engine.stop()
    environment.close()
    scratch.cleanup()
    ratios = {}
    for share in (float(x) for x in args.splits.split(",")):
        shared, split = results.get(f"shared, B {share:.0%}"), results.get(f"split, B {share:.0%}")
        if shared and split and shared["episodes_per_s"]:
            ratios[f"split/shared, B {share:.0%}"] = round(split["episodes_per_s"] / shared["episodes_per_s"], 3)
    # With the same weights on both engines (the default), a fair arrangement serves both versions alike: the
    # latency guardrail (p95 at most 20% over the champion's) must not fire on the arrangement.
    p95_b_over_a = {key: round(run["latency_s_b"]["p95"] / run["latency_s_a"]["p95"], 3) for key, run in results.items()
                    if run["share_b"] == 0.5 and run["latency_s_a"] and run["latency_s_b"]}
    fair = args.model_b is not None or all(ratio <= GUARDRAIL for key, ratio in p95_b_over_a.items()
                                           if key.startswith("split,"))
    print(json.dumps({"benchmark": "ab_engines", "machine": machine(), "users": USERS, "seconds": args.seconds,
                      "runs": results, "ratios": ratios, "p95_b_over_a": p95_b_over_a,
                      "target_ratio": TARGET_RATIO, "guardrail": GUARDRAIL,
                      "meets_target": bool(ratios) and min(ratios.values()) >= TARGET_RATIO and fair}))


if __name__ == "__main__":
    main()

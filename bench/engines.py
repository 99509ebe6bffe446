"""The serving engines side by side on the same held-out episodes: our own decoder (`LocalPolicy`, torch) against
vLLM for CPU (`agent/engine.py`), one trained SmolLM2-135M version, the demo's inbox and test questions.

    .venv/bin/python bench/engines.py --home HOME [--adapter DIR] [--eval-n 94] [--engines torch,vllm-waves,vllm]

HOME is a `bench/quality.py --home HOME` directory (its inbox.db and SFT adapter HOME/sft/adapter). Each engine
plays the same seeded held-out sample, alone on the machine (one after the other, the previous one freed), with
every core: torch as the evaluation runs it (the adapter merged, waves of 16, fp32), vLLM as the evaluation and the
arbiter serve with it (bf16, prefix caching) with 32 episodes in flight (`vllm`: each asks for its next turn as soon
as its tools answered) or in waves of 32 (`vllm-waves`: every turn waits for the wave's slowest). Reported per engine: start-up
(loading the model, or starting the engine process), held-out episodes/s, accuracy, format errors, and per question
whether both engines agree on the outcome (paired: same questions). Target: >= 1.5 held-out episodes/s per model.

OpenVINO GenAI is not in this bench: turning our checkpoints into OpenVINO IR needs optimum-intel, whose releases
pin transformers < 5.6 (we run 5.17), and its continuous-batching pipeline applies one LoRA adapter to every row
of a batch, so it cannot serve an A/B test's two versions on one base (docs/experiments.md, 2026-11-28).
Last line: JSON report.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_EPISODES_PER_S = 1.5

from heldout import machine  # noqa: E402  (this folder is on sys.path when a bench runs as a script)


def load(engine: str, model: str, adapter: str, threads: int, engine_batch: int = 32):
    """The policy of `engine` (torch, or vllm / vllm-waves: the same engine, episodes in flight or in waves)."""
    if engine == "torch":
        import torch

        from agent_rl.policy_specs import load_stacked

        torch.set_num_threads(threads)
        policy = load_stacked(model, [adapter], version="torch")
        return policy, 16
    from agent_rl.agent.engine import engine_policy

    return engine_policy(model, [adapter], version="vllm"), engine_batch


def play(engine: str, model: str, adapter: str, environment, tasks, eval_n: int, threads: int,
         engine_batch: int = 32) -> dict:
    from agent_rl.evaluate.harness import EvalConfig, evaluate_tasks
    from agent_rl.records import Split

    started = time.perf_counter()
    policy, batch = load(engine, model, adapter, threads, engine_batch)
    startup = time.perf_counter() - started
    config = EvalConfig(split=Split.TEST, max_tasks=eval_n, seed=0, batch_size=batch,
                        in_flight=engine != "vllm-waves")
    started = time.perf_counter()
    result = evaluate_tasks(policy, environment, tasks, config)
    wall = time.perf_counter() - started
    episodes = result.episodes
    outcomes = {e.task_id or str(i): e.outcome == "correct" for i, e in enumerate(episodes)}
    if engine.startswith("vllm"):
        from agent_rl.agent.engine import stop_engines

        stop_engines()
    del policy
    gc.collect()
    return {"engine": engine, "batch": batch, "startup_s": round(startup, 1), "episodes": len(episodes),
            "wall_s": round(wall, 1), "episodes_per_s": round(len(episodes) / wall, 3),
            "turns": sum(e.turns for e in episodes), "completion_tokens": sum(e.completion_tokens for e in episodes),
            "accuracy": result.metrics.accuracy, "format_error_rate": result.metrics.format_error_rate,
            "_outcomes": outcomes}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a bench/quality.py --home directory")
    parser.add_argument("--model", default=str(ROOT / ".data" / "models" / "smollm2-135m-instruct"))
    parser.add_argument("--adapter", default=None, help="adapter directory (default: HOME/sft/adapter)")
    parser.add_argument("--eval-n", type=int, default=94, help="held-out questions (the demo evaluates 94)")
    parser.add_argument("--engines", default="torch,vllm-waves,vllm",
                        help="comma-separated; the first is the baseline")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--engine-batch", type=int, default=32, help="episodes the engine plays at once")
    args = parser.parse_args(argv)
    os.environ["AGENT_RL_HOME"] = str(args.home.resolve())  # the scenarios file lives there

    from agent_rl.environments.email.environment import EmailEnvironment, scenario_task
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.environments.email.scenarios.demo import build_demo_environment

    adapter = args.adapter or str(args.home / "sft" / "adapter")
    if not Path(adapter).is_dir():
        raise SystemExit(f"--adapter {adapter}: no adapter directory there (train one with bench/quality.py)")
    store = open_inbox_store(f"sqlite:///{args.home / 'inbox.db'}")
    world = build_demo_environment(store)
    environment = EmailEnvironment(store, world.scenarios)
    tasks = [scenario_task(s) for s in world.scenarios]

    rows = []
    for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
        row = play(engine, args.model, adapter, environment, tasks, args.eval_n, args.threads, args.engine_batch)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.startswith("_")}), flush=True)
    base = rows[0]
    paired = {}
    for row in rows[1:]:
        common = base["_outcomes"].keys() & row["_outcomes"].keys()
        paired[row["engine"]] = {
            "questions": len(common),
            "only_baseline_right": sum(base["_outcomes"][k] and not row["_outcomes"][k] for k in common),
            "only_this_right": sum(row["_outcomes"][k] and not base["_outcomes"][k] for k in common)}
    rates = {r["engine"]: r["episodes_per_s"] for r in rows}
    best = max(rates.values())
    report = {"benchmark": "engines", "machine": machine(), "threads": args.threads, "eval_n": args.eval_n,
              "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
              "episodes_per_s": rates, "startup_s": {r["engine"]: r["startup_s"] for r in rows},
              "accuracy": {r["engine"]: r["accuracy"] for r in rows},
              "ratios_to_first": {e: round(rate / rates[base["engine"]], 3) for e, rate in rates.items()},
              "paired_outcomes_vs_first": paired, "target_episodes_per_s": TARGET_EPISODES_PER_S,
              "meets_target": best >= TARGET_EPISODES_PER_S}
    print(json.dumps(report))


if __name__ == "__main__":
    main()

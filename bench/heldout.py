"""Held-out episodes per second of one served model: the demo's evaluation (its inbox, its test questions, its
runner budgets) played by SmolLM2-135M with a trained adapter, the figure that decides how long validation, an
A/B test and a week of production served by a model of ours take on a machine.

    OMP_NUM_THREADS=2 .venv/bin/python bench/heldout.py --home HOME [--adapter DIR] [--eval-n 94]
        [--batch 16] [--compare-batch 48] [--compare-padded] [--repeats 1]

HOME is a `bench/quality.py --home HOME` directory (its inbox.db and, by default, its SFT adapter HOME/sft/adapter):
the model has to be trained for the figure to mean anything, since an untrained model's episodes end at their
first malformed turn. Each configuration plays the same seeded held-out sample from a fresh policy (cold caches:
what a new evaluation costs); with `--compare-batch` both batch sizes run in the same process, alternating, and
the report gives their ratio; `--compare-padded` runs the same batch with one padded prompt pass per turn (the
way before agent/ragged_prefill.py) next to the grouped one. Where the time goes is reported per configuration: seconds inside the policy (the
model) against the environment's tools, turns, prompt tokens the model computed (the rest came from caches) and
completion tokens. Target: >= 1 held-out episode/s on 2 cores. Last line: JSON report.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_EPISODES_PER_S = 1.0


class Timed:
    """Wraps a policy to count the seconds and tokens of its `act` calls (everything else is the runner and the
    environment)."""

    def __init__(self, policy) -> None:
        self.policy, self.seconds, self.calls, self.rows = policy, 0.0, 0, 0
        self.version = policy.version

    def act(self, conversations, tools, max_new_tokens=256):
        started = time.perf_counter()
        try:
            return self.policy.act(conversations, tools, max_new_tokens)
        finally:
            self.seconds += time.perf_counter() - started
            self.calls += 1
            self.rows += len(conversations)

    def __getattr__(self, name):
        return getattr(self.policy, name)


def machine() -> str:
    from agent_rl.agent.precision import _cpu_flags

    name = "unknown CPU"
    try:
        name = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    extras = [f for f in ("amx_tile", "avx512_bf16") if f in _cpu_flags()]
    return f"{name}, {os.cpu_count()} cores" + (f", {'+'.join(extras)}" if extras else "")


def play(model: str, adapter: str | None, batch: int, environment, tasks, eval_n: int, padded: bool = False) -> dict:
    from agent_rl.agent import ragged_prefill
    from agent_rl.evaluate.harness import EvalConfig, evaluate_tasks
    from agent_rl.policy_specs import load_stacked
    from agent_rl.records import Split

    policy = load_stacked(model, [adapter] if adapter else [], version=f"batch{batch}")
    policy.config = policy.config.model_copy(update={"batch_size": batch})
    timed = Timed(policy)
    config = EvalConfig(split=Split.TEST, max_tasks=eval_n, seed=0, batch_size=batch)
    threshold = ragged_prefill.MIN_BATCH_PADDING
    ragged_prefill.MIN_BATCH_PADDING = 1.0 if padded else threshold  # 1.0: every batch one padded pass
    started = time.perf_counter()
    try:
        result = evaluate_tasks(timed, environment, tasks, config)
    finally:
        ragged_prefill.MIN_BATCH_PADDING = threshold
    wall = time.perf_counter() - started
    episodes = result.episodes
    completion = sum(e.completion_tokens for e in episodes)
    prompt = sum(e.prompt_tokens for e in episodes)
    del policy
    return {"config": f"batch {batch}" + (", padded prompt pass" if padded else ""), "episodes": len(episodes), "wall_s": round(wall, 1),
            "episodes_per_s": round(len(episodes) / wall, 3), "policy_s": round(timed.seconds, 1),
            "act_calls": timed.calls, "turns": sum(e.turns for e in episodes),
            "prompt_tokens_billed": prompt, "completion_tokens": completion,
            "completion_tokens_per_s": round(completion / max(timed.seconds, 1e-9), 1),
            "accuracy": result.metrics.accuracy, "format_error_rate": result.metrics.format_error_rate}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a bench/quality.py --home directory")
    parser.add_argument("--model", default=str(ROOT / ".data" / "models" / "smollm2-135m-instruct"))
    parser.add_argument("--adapter", default=None, help="adapter directory (default: HOME/sft/adapter)")
    parser.add_argument("--eval-n", type=int, default=94, help="held-out questions (the demo evaluates 94)")
    parser.add_argument("--batch", type=int, default=16, help="episodes played together (the demo's default)")
    parser.add_argument("--compare-batch", type=int, default=None, help="a second batch size, same run")
    parser.add_argument("--compare-padded", action="store_true", help="also one padded prompt pass per turn")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    os.environ["AGENT_RL_HOME"] = str(args.home.resolve())  # the scenarios file lives there

    import torch

    from agent_rl.environments.email.environment import EmailEnvironment, scenario_task
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.environments.email.scenarios.demo import build_demo_environment

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    adapter = args.adapter or str(args.home / "sft" / "adapter")
    if not Path(adapter).is_dir():
        raise SystemExit(f"--adapter {adapter}: no adapter directory there (train one with bench/quality.py)")
    store = open_inbox_store(f"sqlite:///{args.home / 'inbox.db'}")
    world = build_demo_environment(store)
    environment = EmailEnvironment(store, world.scenarios)
    tasks = [scenario_task(s) for s in world.scenarios]

    configs = [(args.batch, False)] + ([(args.compare_batch, False)] if args.compare_batch else []) \
        + ([(args.batch, True)] if args.compare_padded else [])
    runs: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        for batch, padded in configs:
            row = play(args.model, adapter, batch, environment, tasks, args.eval_n, padded)
            runs.setdefault(row["config"], []).append(row)
            print(json.dumps(row), flush=True)
    rates = {name: statistics.median(r["episodes_per_s"] for r in rows) for name, rows in runs.items()}
    first = next(iter(rates))
    report = {"benchmark": "heldout", "machine": machine(), "threads": torch.get_num_threads(),
              "eval_n": args.eval_n, "runs": runs, "episodes_per_s": rates,
              "ratios_to_first": {name: round(rate / rates[first], 3) for name, rate in rates.items()},
              "target_episodes_per_s": TARGET_EPISODES_PER_S,
              "meets_target": max(rates.values()) >= TARGET_EPISODES_PER_S}
    print(json.dumps(report))


if __name__ == "__main__":
    main()

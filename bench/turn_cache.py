"""Held-out evaluation with and without the turn cache (agent/turn_cache.py): same policy, same scenarios.

Each turn of an episode re-sends the conversation so far; with the turn cache a turn computes only its new
tokens. This plays the evaluation (`evaluate_policy`, greedy) twice per setting, alternating the order, and
prints the wall time of each, the speed-up, the prompt tokens the cache did not recompute and whether the
episodes came out the same (in bf16 a resumed cache can differ from a recomputed one in the last bits, so a
greedy tie may break the other way; in fp32 they are identical, see tests/agent/test_turn_cache.py).

    OMP_NUM_THREADS=2 .venv/bin/python bench/turn_cache.py [--adapter DIR ...] [--n 32] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def evaluate_email(policy, scenarios, store, config, version=None):
    """The held-out evaluation validation runs, on the email assistant's scenarios in `store`."""
    from agent_rl.environments.email.environment import EmailEnvironment, scenario_task
    from agent_rl.evaluate.harness import evaluate_tasks

    environment = EmailEnvironment(store, scenarios)
    return evaluate_tasks(policy, environment, [scenario_task(s) for s in scenarios], config, version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base", help="model spec or checkpoint (default: the prepared SmolLM2)")
    parser.add_argument("--adapter", action="append", default=[], help="adapter directories merged in order")
    parser.add_argument("--n", type=int, default=32, help="held-out test scenarios")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    from agent_rl.evaluate.harness import EvalConfig
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.policy_specs import load_stacked
    from agent_rl.records import Split
    from agent_rl.environments.email.scenarios.demo import build_demo_environment

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    work = Path(tempfile.mkdtemp(prefix="bench-turn-cache-"))
    store = open_inbox_store(f"sqlite:///{work / 'inbox.db'}")
    scenarios = build_demo_environment(store).scenarios
    config = EvalConfig(split=Split.TEST, max_tasks=args.n, seed=0)
    policy = load_stacked(args.model, args.adapter, version="bench")
    policy.config = policy.config.model_copy(update={"batch_size": 16})
    budget = policy.turn_cache.max_tokens

    seconds: dict[str, list[float]] = {"cached": [], "recomputed": []}
    episodes: dict[str, list] = {}
    reused = prompt_tokens = 0
    for repeat in range(args.repeats):
        for name in (("cached", "recomputed") if repeat % 2 == 0 else ("recomputed", "cached")):
            policy.clear_prefix_cache()
            policy.turn_cache.max_tokens = budget if name == "cached" else 0
            before = policy.turn_cache.stats.reused_tokens
            started = time.perf_counter()
            result = evaluate_email(policy, scenarios, store, config, version=name)
            seconds[name].append(time.perf_counter() - started)
            episodes[name] = result.episodes
            if name == "cached":
                reused = policy.turn_cache.stats.reused_tokens - before
                prompt_tokens = sum(e.prompt_tokens for e in result.episodes)
    store.close()
    same = sum(a.messages == b.messages for a, b in zip(episodes["cached"], episodes["recomputed"]))
    best = {name: min(values) for name, values in seconds.items()}
    print(json.dumps({
        "benchmark": "turn_cache",
        "model": args.model, "adapters": args.adapter, "scenarios": len(episodes["cached"]),
        "threads": torch.get_num_threads(), "dtype": str(policy.model.dtype),
        "seconds": {name: [round(v, 1) for v in values] for name, values in seconds.items()},
        "speedup": round(best["recomputed"] / best["cached"], 2),
        "prompt_tokens": prompt_tokens, "reused_tokens": reused,
        "reused_share": round(reused / max(prompt_tokens, 1), 3),
        "identical_episodes": same,
        "avg_turns": round(sum(e.turns for e in episodes["cached"]) / max(len(episodes["cached"]), 1), 2),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

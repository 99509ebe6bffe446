"""Customer-support agent quality before and after training, on held-out support tasks (one JSON line).

The teacher plays the training tasks; SFT (SmolLM2-135M, the library defaults) learns from its successful
episodes; GRPO continues in the support environment, judged by the resulting database. Teacher, prompted base
model, SFT and SFT + GRPO are then played on the same held-out tasks and measured the way tau-bench's retail
domain is: task success (database state and reply both right), valid tool calls, wrong writes (the database
changed in a way the task did not ask for), refusals done right (the policy-refusal and unknown-customer
categories), average turns; and pass^k of the trained model (k sampled tries of a task all succeed).
Target after training on CPU within the demo budget: >= 70% success, >= 95% valid tool calls, <= 5% wrong writes.

    python bench/support_quality.py [--eval-n 60] [--sft-steps N] [--grpo-steps 2] [--pass-tasks 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = {"success": 0.70, "valid_tool_calls": 0.95, "wrong_writes": 0.05}


def measure(episodes, environment) -> dict:
    """The support figures of a set of episodes."""
    from agent_rl.evaluate.metrics import compute_metrics

    n = len(episodes)
    metrics = compute_metrics(episodes, tool_names=environment.tool_names())
    refusal = [e for e in episodes if e.task_category in environment.refusal_categories]
    wrong_writes = sum(1 for e in episodes if (e.reward_components or {}).get("wrong_write", 0.0) < 0)
    return {"n": n, "success": round(sum(e.outcome.value == "correct" for e in episodes) / n, 4),
            "valid_tool_calls": round(metrics.valid_tool_call_rate, 4),
            "wrong_writes": round(wrong_writes / n, 4),
            "refusals_right": round(sum(e.outcome.value == "correct" for e in refusal) / len(refusal), 4)
            if refusal else None,
            "format_errors": round(metrics.format_error_rate, 4), "avg_turns": round(metrics.avg_turns, 2),
            "by_category": {c: round(v.get("correct", 0.0), 3) for c, v in metrics.by_category.items()}}


def pass_k(policy_factory, environment, tasks, k: int) -> dict:
    """pass^1 and pass^k over `k` sampled tries of each task (tau-bench's reliability measure; with exactly k
    tries, pass^k is the share of tasks all of whose tries succeed)."""
    from agent_rl.environments.runner import Play, RunnerConfig, play_episodes

    policy = policy_factory()
    plays = [Play(t, policy_version="sampled") for t in tasks for _ in range(k)]
    episodes = play_episodes(policy, environment, plays, RunnerConfig(batch_size=16))
    wins = [e.outcome.value == "correct" for e in episodes]
    per_task = [wins[i * k:(i + 1) * k] for i in range(len(tasks))]
    return {"pass^1": round(sum(wins) / len(wins), 4), f"pass^{k}": round(sum(all(t) for t in per_task) / len(tasks), 4),
            "tasks": len(tasks), "tries": k}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--model", default="base", help="base model spec (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--eval-n", type=int, default=60, help="held-out tasks per evaluation (all 60 by default)")
    parser.add_argument("--base-n", type=int, default=20, help="held-out tasks for the prompted base model")
    parser.add_argument("--sft-steps", type=int, default=None, help="override SFTSettings.max_steps")
    parser.add_argument("--grpo-steps", type=int, default=2, help="GRPO steps (the demo's)")
    parser.add_argument("--skip-grpo", action="store_true")
    parser.add_argument("--pass-tasks", type=int, default=20, help="held-out tasks sampled 4 times for pass^k")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    home = args.home or Path(tempfile.mkdtemp(prefix="support-quality-"))
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("AGENT_RL_HOME", str(home))

    import random

    from agent_rl.agent.local_policy import LocalPolicy
    from agent_rl.agent.models import resolve_model
    from agent_rl.environments.runner import Play, RunnerConfig, play_episodes
    from agent_rl.curation.datasets import save_jsonl, sft_rows
    from agent_rl.environments.support import SupportEnvironment
    from agent_rl.records import Split
    from agent_rl.train.config import GRPOSettings, PromptFilterSettings, SFTSettings
    from agent_rl.train.grpo import train_grpo
    from agent_rl.train.plugin_rollouts import task_rows
    from agent_rl.train.sft import MANIFEST, train_sft

    started = time.perf_counter()
    env = SupportEnvironment()
    train, test = env.tasks(Split.TRAIN), env.tasks(Split.TEST)
    held_out = sorted(test, key=lambda t: t.id)
    if args.eval_n < len(held_out):
        held_out = random.Random(0).sample(held_out, args.eval_n)
    runner = RunnerConfig(batch_size=16)
    model = resolve_model(args.model)
    seconds: dict[str, float] = {}

    def evaluate(policy, tasks) -> dict:
        episodes = play_episodes(policy, env, [Play(t) for t in tasks], runner)
        return measure(episodes, env)

    rows: dict[str, dict] = {"teacher": evaluate(env.teacher(), held_out)}
    teacher_episodes = play_episodes(env.teacher(), env, [Play(t, policy_version="teacher") for t in train], runner)
    sft_data = sft_rows([e.model_dump(mode="json") for e in teacher_episodes], min_quality=0.8,
                        tools=env.tool_schemas(), max_idk_share=None)
    save_jsonl(sft_data, home / "sft.jsonl")
    if args.base_n:
        mark = time.perf_counter()
        rows["base"] = evaluate(LocalPolicy(model, batch_size=16, version="base"), held_out[: args.base_n])
        seconds["base_eval"] = round(time.perf_counter() - mark, 1)

    mark = time.perf_counter()
    sft_settings = SFTSettings(**({"max_steps": args.sft_steps} if args.sft_steps else {}))
    sft = train_sft(model, home / "sft.jsonl", home / "sft", sft_settings)
    seconds["sft"] = round(time.perf_counter() - mark, 1)
    mark = time.perf_counter()
    rows["sft"] = evaluate(LocalPolicy(model, adapter=sft.adapter_dir, batch_size=16, version="sft"), held_out)
    seconds["sft_eval"] = round(time.perf_counter() - mark, 1)
    final_adapters = [sft.adapter_dir]

    if not args.skip_grpo:
        save_jsonl(task_rows(env, train), home / "grpo.jsonl")
        mark = time.perf_counter()
        grpo = train_grpo(model, sft.adapter_dir, home / "grpo.jsonl", None, home / "grpo",
                          GRPOSettings(max_steps=args.grpo_steps, prompt_filter=PromptFilterSettings(mode="none")),
                          environment=env)
        seconds["grpo"] = round(time.perf_counter() - mark, 1)
        adapters = json.loads((grpo.adapter_dir / MANIFEST).read_text())["adapters"]
        from agent_rl.policy_specs import load_stacked

        mark = time.perf_counter()
        rows["sft_grpo"] = evaluate(load_stacked(str(model), adapters, version="sft+grpo"), held_out)
        seconds["grpo_eval"] = round(time.perf_counter() - mark, 1)
        rows["sft_grpo"]["grpo_outcomes"] = grpo.outcomes
        final_adapters = adapters

    trained = "sft_grpo" if "sft_grpo" in rows and rows["sft_grpo"]["success"] >= rows["sft"]["success"] else "sft"
    if trained == "sft":
        final_adapters = [sft.adapter_dir]
    mark = time.perf_counter()

    def sampled():
        """The trained model with sampling on (merged once when GRPO stacked a second adapter)."""
        if len(final_adapters) == 1:
            return LocalPolicy(model, adapter=final_adapters[0], batch_size=16, temperature=0.7, seed=0)
        from transformers import AutoTokenizer

        from agent_rl.agent.precision import load_merged

        merged = load_merged(model, final_adapters, "float32").eval()
        return LocalPolicy.from_model(merged, AutoTokenizer.from_pretrained(str(model)), version="sampled",
                                      batch_size=16, temperature=0.7, seed=0)

    reliability = pass_k(sampled, env, held_out[: args.pass_tasks], 4) if args.pass_tasks else {}
    seconds["pass_k"] = round(time.perf_counter() - mark, 1)
    best = rows[trained]
    result = {
        "bench": "support_quality", "model": str(args.model), "sft_rows": len(sft_data),
        "sft_steps": sft.steps, "grpo_steps": args.grpo_steps if not args.skip_grpo else 0,
        "rows": rows, "trained": trained, "reliability": reliability, "seconds": seconds,
        "total_seconds": round(time.perf_counter() - started, 1), "target": TARGET,
        "meets_target": bool(best["success"] >= TARGET["success"] and best["valid_tool_calls"] >= TARGET["valid_tool_calls"]
                             and best["wrong_writes"] <= TARGET["wrong_writes"]),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The quality bar of issue 5, end to end on CPU: does SFT + GRPO make SmolLM2-135M-Instruct good at the inbox task?

Builds the demo environment in a scratch AGENT_RL_HOME, plays the heuristic teacher (no oracle) on the train
scenarios, turns its good episodes into SFT rows and the train scenarios into GRPO prompts, then trains with the
default SFTSettings / GRPOSettings (what the Dagster demo uses) and evaluates on held-out test scenarios: the
prompted base model, the teacher, after SFT and after SFT+GRPO. Reports accuracy, valid tool-call rate,
hallucination rate and average turns side by side, training time (wall and CPU) with tokens/s next to the
machine's fp32 matmul roofline, and the load average next to every timing (the 2 cores are shared).
Last line: one JSON object with the table, timings, targets and "meets_target".

    OMP_NUM_THREADS=1 .venv/bin/python bench/quality.py [--eval-n 48] [--sft-steps N] [--grpo-steps N]
        [--home DIR] [--model DIR] [--base-n 16] [--skip-base] [--skip-grpo] [--sft JSON] [--grpo JSON]
        [--sft-from EARLIER_HOME] [--teacher JSON] [--device cuda] [--eval-batch 16] [--grpo-seconds S]

On a GPU: `--device cuda` evaluates there, and `--sft`/`--grpo` with {"compute": {"use_cpu": false, "bf16": true}}
train there; `--grpo-seconds` ends GRPO after its first optimizer step past that wall time (a time-boxed run
still saves and evaluates its adapter).

The trained rows' evaluation episodes are saved as HOME/episodes_after_*.jsonl. Every trained row also gets
the evaluation's forgetting probe (general questions, no tools) next to the base model's, as the demo's
forgetting gate compares them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = {"accuracy_min": 0.70, "valid_tool_call_rate_min": 0.95, "hallucination_rate_max": 0.10,
           "avg_turns_max": 3.0, "train_minutes_max": 20.0}
DEFAULT_MODEL = Path(__file__).resolve().parents[1] / ".data" / "models" / "smollm2-135m-instruct"
TIMINGS: dict[str, dict[str, float]] = {}


def evaluate_email(policy, scenarios, store, config, version=None):
    """The held-out evaluation validation runs, on the email assistant's scenarios in `store`."""
    from agent_rl.environments.email.environment import EmailEnvironment, scenario_task
    from agent_rl.evaluate.harness import evaluate_tasks

    environment = EmailEnvironment(store, scenarios)
    return evaluate_tasks(policy, environment, [scenario_task(s) for s in scenarios], config, version)


def load() -> float:
    return round(os.getloadavg()[0], 2)


@contextmanager
def timed(name: str):
    """Wall and CPU seconds of a stage with the 1-minute load average before and after (shared cores)."""
    before, wall, cpu = load(), time.perf_counter(), time.process_time()
    print(f"=== {name} (load {before})", flush=True)
    record: dict[str, float] = {}
    yield record
    record.update(wall_s=round(time.perf_counter() - wall, 1), cpu_s=round(time.process_time() - cpu, 1),
                  load_before=before, load_after=load())
    TIMINGS[name] = record
    print(f"--- {name}: {record}", flush=True)


def matmul_gflops(seconds: float = 2.0) -> float:
    """Single-thread fp32 matmul speed (the training roofline: ~6 x parameters FLOPs per trained token)."""
    import torch

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        n += 1
    return 2 * 1024**3 * n / (time.perf_counter() - started) / 1e9


def row_of(metrics) -> dict[str, float]:
    return {"accuracy": metrics.accuracy, "valid_tool_call_rate": metrics.valid_tool_call_rate,
            "hallucination_rate": metrics.hallucination_rate, "idk_rate": metrics.idk_rate,
            "format_error_rate": metrics.format_error_rate, "source_accuracy": metrics.source_accuracy,
            "avg_turns": metrics.avg_turns, "avg_tokens": metrics.avg_tokens, "n": metrics.n,
            "by_category": metrics.by_category}


def trained_row(policy, name: str, scenarios, store, eval_config, home: Path) -> dict[str, float]:
    """A trained policy's table row with its forgetting probe; its episodes go to HOME/episodes_<name>.jsonl,
    what to read when a number looks wrong."""
    from agent_rl.curation.datasets import save_jsonl
    from agent_rl.evaluate.harness import forgetting_probe

    result = evaluate_email(policy, scenarios, store, eval_config)
    save_jsonl([e.model_dump(mode="json") for e in result.episodes], home / f"episodes_{name}.jsonl")
    return {**row_of(result.metrics), "forgetting_probe": forgetting_probe(policy)}


def wall_budget(seconds: float | None) -> list:
    """A trainer callback list that stops training at the first step end `seconds` after this call (none without
    a budget): the budget covers the whole stage, model loading included."""
    if not seconds:
        return []
    from transformers import TrainerCallback

    class _Budget(TrainerCallback):
        def __init__(self) -> None:
            self.deadline = time.perf_counter() + seconds

        def on_step_end(self, args, state, control, **kwargs):
            if time.perf_counter() > self.deadline:
                control.should_training_stop = True
            return control

    return [_Budget()]


def batched(policy, batch_size: int):
    """`policy` generating `batch_size` conversations together."""
    policy.config = policy.config.model_copy(update={"batch_size": batch_size})
    return policy


def outcome_changes(before: Path, after: Path) -> dict[str, int]:
    """How many held-out questions moved from one outcome to another between two evaluations ("correct->wrong": 5):
    a GRPO run that nets +1 can hide 9 changes, and the changes say what it learned."""
    def outcomes(path: Path) -> dict[str, str]:
        with path.open(encoding="utf-8") as handle:
            return {e.get("task_id") or e["scenario_id"]: e["outcome"] for e in map(json.loads, handle)}

    first, second = outcomes(before), outcomes(after)
    moves = Counter(f"{first[sid]}->{second[sid]}" for sid in first if sid in second and first[sid] != second[sid])
    return dict(sorted(moves.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=None, help="scratch AGENT_RL_HOME (default: a temp dir)")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="prepared SmolLM2 checkpoint directory")
    parser.add_argument("--eval-n", type=int, default=48, help="held-out test scenarios per evaluation")
    parser.add_argument("--sft-steps", type=int, default=None, help="override SFTSettings.max_steps")
    parser.add_argument("--grpo-steps", type=int, default=None, help="override GRPOSettings.max_steps")
    parser.add_argument("--sft", type=str, default="{}", help="JSON overrides of SFTSettings")
    parser.add_argument("--grpo", type=str, default="{}", help="JSON overrides of GRPOSettings")
    parser.add_argument("--base-n", type=int, default=16,
                        help="test scenarios for the prompted base model (it writes up to 256 tokens of prose per "
                             "episode and never calls a tool: a small sample says as much)")
    parser.add_argument("--teacher", type=str, default="{}",
                        help="JSON overrides of HeuristicConfig for the teacher (its SFT data and its table row)")
    parser.add_argument("--max-idk-share", type=float, default=None,
                        help="cap on SFT rows answering \"I don't know\" (default: the curation default)")
    parser.add_argument("--skip-base", action="store_true", help="do not evaluate the prompted base model")
    parser.add_argument("--skip-grpo", action="store_true", help="stop after SFT")
    parser.add_argument("--sft-from", type=Path, default=None,
                        help="HOME of an earlier run: reuse its SFT adapter and table row, train only GRPO (tuning "
                             "GRPO without paying for SFT again; its training time is taken from that run's JSON)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the evaluations generate")
    parser.add_argument("--eval-batch", type=int, default=16, help="conversations generated together in evaluations")
    parser.add_argument("--grpo-seconds", type=float, default=None,
                        help="wall-time budget of GRPO: it stops after the first optimizer step past it")
    args = parser.parse_args(argv)

    earlier = None
    if args.sft_from:  # checked before any work: a wrong path should not cost the environment and teacher stages
        if not (args.sft_from / "quality.json").is_file() or not (args.sft_from / "sft" / "adapter").is_dir():
            raise SystemExit(f"--sft-from {args.sft_from}: no quality.json and sft/adapter there (an earlier run's HOME)")
        earlier = json.loads((args.sft_from / "quality.json").read_text())
        if earlier["eval_n"] != args.eval_n:
            raise SystemExit(f"--sft-from {args.sft_from}: evaluated on {earlier['eval_n']} scenarios, not {args.eval_n}")

    home = args.home or Path(tempfile.mkdtemp(prefix="agent-rl-quality-"))
    home.mkdir(parents=True, exist_ok=True)
    os.environ["AGENT_RL_HOME"] = str(home)
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"--model {args.model}: no prepared checkpoint there (run `agent-rl model prepare`)")

    import torch

    from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
    from agent_rl.agent.local_policy import LocalPolicy
    from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
    from agent_rl.curation.datasets import save_jsonl, sft_rows
    from agent_rl.environments.email.grpo_rows import grpo_rows
    from agent_rl.evaluate.harness import EvalConfig, forgetting_probe
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.policy_specs import load_stacked
    from agent_rl.records import Split
    from agent_rl.environments.email.scenarios.demo import build_demo_environment
    from agent_rl.train.adapters import adapter_stack
    from agent_rl.train.config import GRPOSettings, SFTSettings
    from agent_rl.train.grpo import train_grpo
    from agent_rl.train.sft import tokenize_rows, train_sft

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    sft_settings = SFTSettings(**{**json.loads(args.sft), **({"max_steps": args.sft_steps} if args.sft_steps else {})})
    grpo_settings = GRPOSettings(**{**json.loads(args.grpo),
                                    **({"max_steps": args.grpo_steps} if args.grpo_steps else {})})
    eval_config = EvalConfig(split=Split.TEST, max_tasks=args.eval_n, seed=0)
    table: dict[str, dict[str, float]] = {}
    figures: dict[str, object] = {"home": str(home), "eval_n": args.eval_n, "threads": torch.get_num_threads(),
                                  "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                                  "eval_batch": args.eval_batch,
                                  "sft_settings": sft_settings.model_dump(mode="json"),
                                  "grpo_settings": grpo_settings.model_dump(mode="json", exclude={"rubric"})}

    teacher_config = HeuristicConfig(**json.loads(args.teacher))
    figures["teacher_settings"] = teacher_config.model_dump(mode="json", exclude={"scenarios"})
    gflops = matmul_gflops()
    params = sum(p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(
        str(args.model), dtype=torch.float32).parameters())
    figures["matmul_gflops_1thread"] = round(gflops, 1)
    figures["roofline_tokens_per_s"] = round(gflops * 1e9 / (6 * params), 1)

    store_url = f"sqlite:///{home / 'inbox.db'}"
    store = open_inbox_store(store_url)
    with timed("environment"):
        env = build_demo_environment(store)
    train = [s for s in env.scenarios if s.split == Split.TRAIN]

    with timed("teacher data"):
        teacher = HeuristicPolicy(teacher_config, store=store)
        episodes = run_episodes(teacher, [EpisodeTask.from_scenario(s) for s in train], store)
        cap = {} if args.max_idk_share is None else {"max_idk_share": args.max_idk_share}
        rows = sft_rows([e.model_dump(mode="json") for e in episodes], **cap)
        save_jsonl(rows, home / "sft.jsonl")
        save_jsonl(grpo_rows(train), home / "grpo.jsonl")
    from transformers import AutoTokenizer

    tokenized = tokenize_rows(AutoTokenizer.from_pretrained(str(args.model)), rows, sft_settings.max_length)
    figures["sft_rows"] = len(rows)
    figures["sft_tokens_per_row"] = round(tokenized.total_tokens / max(1, len(tokenized.input_ids)), 1)
    figures["sft_trained_tokens_per_row"] = round(tokenized.trained_tokens / max(1, len(tokenized.input_ids)), 1)
    figures["sft_rows_cut"] = len(tokenized.dropped)

    with timed("eval teacher"):
        table["heuristic_teacher"] = row_of(evaluate_email(HeuristicPolicy(teacher_config, store=store),
                                                            env.scenarios, store, eval_config).metrics)
    with timed("eval base"):
        base = LocalPolicy(str(args.model), batch_size=args.eval_batch, version="base", device=args.device)
        figures["base_forgetting_probe"] = forgetting_probe(base)  # what the trained rows' probe is held to
        if not args.skip_base:
            base_config = eval_config.model_copy(update={"max_tasks": min(args.base_n, args.eval_n)})
            table["prompted_base"] = row_of(evaluate_email(base, env.scenarios, store, base_config).metrics)
            table["prompted_base"]["forgetting_probe"] = figures["base_forgetting_probe"]
        del base

    if earlier:
        sft_dir, train_seconds = args.sft_from / "sft" / "adapter", earlier["figures"]["sft"]["seconds"]
        figures["sft"] = {**earlier["figures"]["sft"], "reused_from": str(args.sft_from)}
        figures["sft_settings"] = earlier["figures"]["sft_settings"]  # what trained the reused adapter
        table["after_sft"] = earlier["table"]["after_sft"]
    else:
        with timed("train sft") as sft_timing:
            sft = train_sft(args.model, home / "sft.jsonl", home / "sft", sft_settings)
        figures["sft"] = {"steps": sft.steps, "rows_used": sft.rows_used, "cut_rows": sft.cut_rows,
                          "tokens_this_run": round(sft.tokens_per_second * sft.seconds), "seconds": round(sft.seconds, 1),
                          "tokens_per_s_wall": round(sft.tokens_per_second, 1),
                          "tokens_per_s_cpu": round(sft.tokens_per_second * sft.seconds / max(sft_timing["cpu_s"], 1e-9), 1),
                          "first_loss": sft.losses[0] if sft.losses else None, "last_loss": sft.losses[-1] if sft.losses else None,
                          "static_prefix_tokens": sft.static_prefix_tokens, "static_prefix_passes": sft.static_prefix_passes}
        with timed("eval sft"):
            policy = batched(load_stacked(str(args.model), [sft.adapter_dir], version="sft", device=args.device),
                             args.eval_batch)
            table["after_sft"] = trained_row(policy, "after_sft", env.scenarios, store, eval_config, home)
            del policy
        sft_dir, train_seconds = sft.adapter_dir, sft.seconds
    if not args.skip_grpo:
        with timed("train grpo") as grpo_timing:
            grpo = train_grpo(args.model, sft_dir, home / "grpo.jsonl", store_url, home / "grpo", grpo_settings,
                              callbacks=wall_budget(args.grpo_seconds))
        grpo_tokens = int(max((h.get("num_tokens", 0) for h in grpo.history), default=0))
        train_seconds += grpo_timing["wall_s"]
        figures["grpo"] = {"steps": grpo.steps, "seconds_in_trainer": round(grpo.seconds, 1),
                           "wall_s_with_filter": grpo_timing["wall_s"], "filter": grpo.filter,
                           "groups": grpo.groups, "zero_variance_groups": grpo.zero_variance_groups,
                           "skipped_micro_batches": grpo.skipped_micro_batches,
                           "scored_micro_batches": grpo.scored_micro_batches,
                           "extra_groups": grpo.extra_groups, "replaced_groups": grpo.replaced_groups,
                           "outcomes": grpo.outcomes, "reward_means": [round(r, 3) for r in grpo.reward_means],
                           "tokens": grpo_tokens, "tokens_per_s_wall": round(grpo_tokens / max(grpo.seconds, 1e-9), 1),
                           "static_prefix_tokens": grpo.static_prefix_tokens, "static_prefix_rows": grpo.static_prefix_rows,
                           "tokens_per_s_cpu": round(grpo_tokens / max(grpo_timing["cpu_s"], 1e-9), 1)}
        with timed("eval grpo"):
            _, stack = adapter_stack(grpo.adapter_dir)
            policy = batched(load_stacked(str(args.model), stack, version="sft+grpo", device=args.device),
                             args.eval_batch)
            table["after_sft_grpo"] = trained_row(policy, "after_sft_grpo", env.scenarios, store, eval_config, home)
            del policy
        sft_episodes = (args.sft_from or home) / "episodes_after_sft.jsonl"
        if sft_episodes.exists():
            figures["grpo"]["outcome_changes"] = outcome_changes(sft_episodes, home / "episodes_after_sft_grpo.jsonl")
    store.close()

    final = table.get("after_sft_grpo") or table["after_sft"]
    sft_row = table["after_sft"]
    checks = {
        "accuracy": final["accuracy"] >= TARGETS["accuracy_min"],
        "valid_tool_calls": final["valid_tool_call_rate"] >= TARGETS["valid_tool_call_rate_min"],
        "hallucination": final["hallucination_rate"] <= TARGETS["hallucination_rate_max"],
        "turns": final["avg_turns"] <= TARGETS["avg_turns_max"],
        "train_time": train_seconds / 60 <= TARGETS["train_minutes_max"],
        "grpo_beats_sft": "after_sft_grpo" in table and (final["accuracy"] > sft_row["accuracy"]
                                                         or final["hallucination_rate"] < sft_row["hallucination_rate"]),
    }
    print("\n{:<18} {:>8} {:>10} {:>8} {:>6} {:>6} {:>6}".format(
        "policy", "accuracy", "valid_call", "halluc", "idk", "turns", "probe"))
    for name, row in table.items():
        print("{:<18} {:>8.3f} {:>10.3f} {:>8.3f} {:>6.3f} {:>6.2f} {:>6}".format(
            name, row["accuracy"], row["valid_tool_call_rate"], row["hallucination_rate"], row["idk_rate"],
            row["avg_turns"], row.get("forgetting_probe", "-")))
    report = {"benchmark": "quality", "eval_n": args.eval_n, "table": table, "timings": TIMINGS, "figures": figures,
              "train_minutes": round(train_seconds / 60, 2), "target": TARGETS, "checks": checks,
              "meets_target": all(checks.values())}
    (home / "quality.json").write_text(json.dumps(report))  # what --sft-from reads
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Serving several versions from one base model (agent/shared_base.py) against serving each as its own merged model.

Three figures, SmolLM2-135M by default (`--model tiny` for a quick run), adapters shaped like the demo's (LoRA
r=16 on the seven decoder projections; champion and challenger SFT + GRPO stacks, the previous champion SFT
alone) with random weights:
- memory: resident memory of a fresh process serving champion + challenger + previous champion as three
  adapters on one base, against one serving a single version the way it was served before (merged model), both
  serving the same traffic (3 x `--batch` conversations, two turns each; split evenly over the versions, as an
  A/B test splits production's traffic). Both the peak (VmHWM: merging loads the base in fp32 first) and the
  resident memory after the traffic are compared, and the worse ratio counts. Reported next to it: the three
  versions as three merged models (today's way), and the shared base with each version serving the whole
  traffic (caches are per version, so they grow with the traffic served, within one budget). Target: at most
  1.3x.
- throughput: generated tokens/s of a batch whose rows are half champion, half challenger against a batch of the
  same size and conversations of the champion alone, on the same shared base; alternating, median of repeats
  (the champion as a merged model is reported next to it). Target: at least 0.8x.
- hot load: seconds to load a new adapter version (read, prepare, add) while another version's traffic decodes
  in a thread, and the requests that failed. Target: under 1 s, none failed.

    OMP_NUM_THREADS=1 .venv/bin/python bench/serving.py [--model base] [--batch 8] [--tokens 48] [--repeats 3]

Memory is measured in child processes (a process's peak cannot be reset); the rest in this one. Last line:
JSON report.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_MEMORY_RATIO = 1.3
TARGET_THROUGHPUT_RATIO = 0.8
TARGET_LOAD_S = 1.0
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QUESTIONS = [
    "When is the quarterly budget review meeting?",
    "How much was the invoice from the pipeline contractor?",
    "Who approved the Houston office move?",
    "What did Sally say about the gas contract renewal?",
    "Which day was the trading floor audit moved to?",
    "Did legal sign off on the Enron Online terms?",
    "Where is the offsite planned for next month?",
    "What is the new deadline for the risk report?",
]


def conversations(n: int) -> list[list[dict]]:
    from agent_rl.environments.email.prompts import initial_messages

    return [initial_messages(f"user{i}@enron.example", QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]


def make_adapters(model: str, out: Path, rank: int) -> dict[str, list[str]]:
    """Champion and challenger: SFT + GRPO stacks; previous champion: SFT alone; a spare stack to hot-load."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agent_rl.agent.models import resolve_model

    path = resolve_model(model)
    base = AutoModelForCausalLM.from_pretrained(path)
    made = {}
    for seed, name in enumerate(("champion-sft", "champion-grpo", "challenger-sft", "challenger-grpo",
                                 "previous-sft", "new-sft", "new-grpo")):
        torch.manual_seed(seed)
        peft = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(TARGETS),
                                               init_lora_weights=False))
        with torch.no_grad():  # modest updates, like trained ones: the model still answers in its own way
            for key, parameter in peft.named_parameters():
                if "lora_B" in key:
                    parameter.mul_(0.02)
        peft.save_pretrained(out / name)
        made[name] = str(out / name)
        base = peft.unload()
    return {
        "champion": [made["champion-sft"], made["champion-grpo"]],
        "challenger": [made["challenger-sft"], made["challenger-grpo"]],
        "previous": [made["previous-sft"]],
        "new": [made["new-sft"], made["new-grpo"]],
    }


def serve_traffic(policies: dict, batch: int, tokens: int) -> None:
    """Each version answers `batch` conversations for two turns (caches fill as in serving)."""
    from agent_rl.environments.email.tools import tool_schemas

    tools = tool_schemas()
    for policy in policies.values():
        convs = conversations(batch)
        for _ in range(2):
            turns = policy.act(convs, tools, tokens)
            convs = [c + [t.as_message(), {"role": "tool", "name": "search_emails", "content": "[]"}]
                     for c, t in zip(convs, turns)]


def child_memory(mode: str, model: str, adapters: dict[str, list[str]], batch: int, tokens: int) -> dict:
    import torch

    from agent_rl.agent.shared_base import AdapterPolicy, ServingSettings, resident_bytes
    from agent_rl.policy_specs import load_stacked

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    versions = ["champion"] if mode == "one-merged" else ["champion", "challenger", "previous"]
    # The same traffic in total (3 x batch conversations), except "three-shared-full": each version serves all.
    per_version = 3 * batch // len(versions) if mode != "three-shared-full" else 3 * batch
    if mode.endswith("merged"):
        policies = {v: load_stacked(model, adapters[v], version=v) for v in versions}
        for policy in policies.values():
            policy.config = policy.config.model_copy(update={"batch_size": batch})
    else:
        policies = {v: AdapterPolicy.load(model, adapters[v], version=v,
                                          settings=ServingSettings(batch_size=batch)) for v in versions}
    serve_traffic(policies, per_version, tokens)
    now, peak = resident_bytes()
    return {"rss_mb": round(now / 2**20, 1), "peak_rss_mb": round(peak / 2**20, 1)}


def memory(model: str, adapters: dict[str, list[str]], batch: int, tokens: int) -> dict:
    out = {}
    for mode in ("one-merged", "three-shared", "three-merged", "three-shared-full"):
        result = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--model", model, "--batch", str(batch), "--tokens",
             str(tokens), "--adapters-json", json.dumps(adapters)],
            capture_output=True, text=True, check=True, env=os.environ.copy())
        out[mode] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


def timed_tokens(act) -> tuple[float, int]:
    started = time.perf_counter()
    turns = act()
    return time.perf_counter() - started, sum(t.completion_tokens for t in turns)


def throughput_and_hot_load(model: str, adapters: dict[str, list[str]], batch: int, tokens: int,
                            repeats: int) -> dict:
    import torch

    from agent_rl.agent.shared_base import AdapterPolicy, MixedVersionPolicy, ServingSettings, serving_stats
    from agent_rl.environments.email.tools import tool_schemas
    from agent_rl.policy_specs import load_stacked

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    tools = tool_schemas()
    # No turn cache: repeats must compute what the first run computed (the system prompt stays cached per version).
    settings = ServingSettings(cache_bytes=0)
    champion = AdapterPolicy.load(model, adapters["champion"], version="champion", settings=settings)
    challenger = AdapterPolicy.load(model, adapters["challenger"], version="challenger", settings=settings)
    mixed = MixedVersionPolicy({"champion": champion, "challenger": challenger})
    merged = load_stacked(model, adapters["champion"], version="merged")
    merged.turn_cache.max_tokens = 0
    merged.config = merged.config.model_copy(update={"batch_size": batch})
    convs = conversations(batch)
    rows = ["champion" if i % 2 == 0 else "challenger" for i in range(batch)]
    sides = {
        "single": lambda: champion.act(convs, tools, tokens),
        "mixed": lambda: mixed.act_rows(rows, convs, tools, tokens),
        "merged": lambda: merged.act(convs, tools, tokens),
    }
    for act in sides.values():  # warm: system prompt caches, allocator
        act()
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for repeat in range(repeats):
        for name in (list(sides) if repeat % 2 == 0 else list(reversed(sides))):
            seconds, generated = timed_tokens(sides[name])
            rates[name].append(generated / seconds)
    median = {name: statistics.median(values) for name, values in rates.items()}

    # Hot load: the champion's traffic keeps decoding in a thread while a new version loads and is dropped.
    errors, done, stop = [], [], threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            try:
                champion.act(convs[:1], tools, 8)
                done.append(time.perf_counter())
            except Exception as exc:  # counted as a failed request
                errors.append(repr(exc))

    thread = threading.Thread(target=traffic)
    thread.start()
    loads, drops = [], []
    try:
        time.sleep(1.0)
        for i in range(3):
            started = time.perf_counter()
            new = AdapterPolicy.load(model, adapters["new"], version=f"new-{i}", settings=settings)
            loads.append(time.perf_counter() - started)
            assert f"new-{i}" in serving_stats()["versions"]
            started = time.perf_counter()
            del new
            drops.append(time.perf_counter() - started)
            time.sleep(0.5)
    finally:
        stop.set()
        thread.join()
    return {
        "tokens_per_s": {name: round(value, 1) for name, value in median.items()},
        "tokens_per_s_runs": {name: [round(v, 1) for v in values] for name, values in rates.items()},
        "hot_load_s": [round(v, 3) for v in loads], "drop_s": [round(v, 4) for v in drops],
        "requests_during_load": len(done), "failed_requests": len(errors), "errors": errors[:3],
        "adapter_mb_per_stack": round(champion.base.rows.adapters[champion.adapter].nbytes / 2**20, 1),
        "dtype": str(champion.base.dtype).removeprefix("torch."),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base", help="model spec (default: the prepared SmolLM2-135M)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per turn")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank of each adapter (the demo's default)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--adapters-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child_memory(args.child, args.model, json.loads(args.adapters_json), args.batch, args.tokens)))
        return

    from agent_rl.agent.precision import BF16_OVERRIDE_ENV, cpu_has_fast_bf16

    # One dtype decision for this process and the children (each would otherwise measure its own).
    os.environ.setdefault(BF16_OVERRIDE_ENV, "1" if cpu_has_fast_bf16() else "0")
    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    adapters = make_adapters(args.model, work, args.rank)
    mem = memory(args.model, adapters, args.batch, args.tokens)
    speed = throughput_and_hot_load(args.model, adapters, args.batch, args.tokens, args.repeats)
    one, shared, merged = (mem[m]["peak_rss_mb"] for m in ("one-merged", "three-shared", "three-merged"))
    one_now, shared_now, merged_now = (mem[m]["rss_mb"] for m in ("one-merged", "three-shared", "three-merged"))
    full, full_now = mem["three-shared-full"]["peak_rss_mb"], mem["three-shared-full"]["rss_mb"]
    memory_ratio = max(shared / one, shared_now / one_now)
    throughput_ratio = speed["tokens_per_s"]["mixed"] / speed["tokens_per_s"]["single"]
    load_s = max(speed["hot_load_s"])
    print(json.dumps({
        "benchmark": "serving",
        "model": args.model, "dtype": speed["dtype"], "threads": int(os.environ["OMP_NUM_THREADS"]),
        "batch": args.batch, "tokens_per_turn": args.tokens, "rank": args.rank,
        "adapter_mb_per_stack": speed["adapter_mb_per_stack"],
        "peak_rss_mb": {"one_version_merged": one, "three_versions_shared_base": shared,
                        "three_versions_merged": merged, "three_versions_shared_base_each_full_traffic": full},
        "rss_after_traffic_mb": {"one_version_merged": one_now, "three_versions_shared_base": shared_now,
                                 "three_versions_merged": merged_now,
                                 "three_versions_shared_base_each_full_traffic": full_now},
        "memory_ratio_three_shared_vs_one": {"peak": round(shared / one, 3), "after_traffic": round(shared_now / one_now, 3)},
        "memory_ratio_three_merged_vs_one": {"peak": round(merged / one, 3), "after_traffic": round(merged_now / one_now, 3)},
        "tokens_per_s": speed["tokens_per_s"], "tokens_per_s_runs": speed["tokens_per_s_runs"],
        "throughput_ratio_mixed_vs_single": round(throughput_ratio, 3),
        "throughput_ratio_mixed_vs_merged_single": round(speed["tokens_per_s"]["mixed"] / speed["tokens_per_s"]["merged"], 3),
        "hot_load_s": speed["hot_load_s"], "drop_s": speed["drop_s"],
        "requests_during_load": speed["requests_during_load"], "failed_requests": speed["failed_requests"],
        "target": f"memory <= {TARGET_MEMORY_RATIO}x, mixed throughput >= {TARGET_THROUGHPUT_RATIO}x, "
                  f"hot load < {TARGET_LOAD_S:g} s with no failed request",
        "meets_target": bool(memory_ratio <= TARGET_MEMORY_RATIO and throughput_ratio >= TARGET_THROUGHPUT_RATIO
                             and load_s < TARGET_LOAD_S and speed["failed_requests"] == 0),
    }))


if __name__ == "__main__":
    main()

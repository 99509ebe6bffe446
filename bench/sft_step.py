"""One SFT forward+backward on SmolLM2 rows: the model's own loss (lm_head over every position) vs
`trained_positions_loss` (lm_head only where an assistant token is trained) vs that plus the static prefix (the
opening block of instructions + tool schemas computed once per optimizer step of 2 rows, without gradient:
train/static_prefix.py, the SFT default). Same rows, same adapter, interleaved so a busy neighbour slows all
sides alike. Prints per-row seconds, row tokens/s and the ratios; the target is the static prefix's >= 1.3x.

    OMP_NUM_THREADS=1 .venv/bin/python bench/sft_step.py [--rows 4] [--repeats 3] [--dtype auto]
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

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / ".data" / "models" / "smollm2-135m-instruct"
ACCUMULATION = 2  # rows per optimizer step (SFTSettings: batch 1 x gradient_accumulation_steps 2)
TARGET = 1.3


def teacher_rows(n: int) -> list[dict]:
    """SFT rows from the heuristic teacher on a small demo inbox (the shape the demo trains on)."""
    from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
    from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
    from agent_rl.curation.datasets import sft_rows
    from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.environments.email.scenarios.generate import generate_scenarios

    root = Path(tempfile.mkdtemp(prefix="bench-sft-step-"))
    store = open_inbox_store(f"sqlite:///{root / 'inbox.db'}")
    scenarios = generate_scenarios(build_demo_corpus(store, seed=0, n_inboxes=2, n_emails=300))
    teacher = HeuristicPolicy(HeuristicConfig(scenarios=scenarios), store=store)
    episodes = run_episodes(teacher, [EpisodeTask.from_scenario(s) for s in scenarios[: 4 * n]], store)
    rows = sft_rows([e.model_dump(mode="json") for e in episodes], max_idk_share=0.0)
    store.close()
    return rows[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    args = parser.parse_args()

    import torch
    from peft import get_peft_model
    from transformers import AutoTokenizer

    from agent_rl.train.config import ComputeSettings, LoraSettings
    from agent_rl.train.sft import load_model, lora_config, tokenize_rows
    from agent_rl.train.sft_loss import trained_positions_loss
    from agent_rl.train.static_prefix import StaticPrefix

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    rows = teacher_rows(args.rows)
    data = tokenize_rows(tokenizer, rows, 4096)
    prefix = StaticPrefix.find(tokenizer, rows, data.input_ids)
    if prefix is None:
        raise SystemExit("the teacher rows do not share an opening block (prompt layout changed?)")
    model = get_peft_model(load_model(args.model, ComputeSettings(base_dtype=args.dtype)), lora_config(LoraSettings()))
    model.train()
    batches = [{"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                "labels": torch.tensor([labels])} for ids, labels in zip(data.input_ids, data.labels)]

    def full(batch):
        return model(**batch).loss

    def lean(batch):
        return trained_positions_loss(model, batch)[0]

    rows_seen = [0]

    def static(batch):  # a new optimizer step every ACCUMULATION rows: the block is recomputed then
        rows_seen[0] += 1
        cache = prefix.cache(model, rows_seen[0] // ACCUMULATION, 1)
        return trained_positions_loss(model, batch, prefix_cache=cache)[0]

    arms = (("full_lm_head", full), ("trained_positions", lean), ("static_prefix", static))
    seconds = dict.fromkeys([name for name, _ in arms], 0.0)
    for batch in batches[:1]:  # warm-up: oneDNN picks kernels on first use of a shape
        for _, step in arms:
            step(batch).backward()
    for _ in range(args.repeats):
        for batch in batches:
            for name, step in arms:
                model.zero_grad(set_to_none=True)
                started = time.perf_counter()
                step(batch).backward()
                seconds[name] += time.perf_counter() - started
    steps = args.repeats * len(batches)
    tokens = sum(len(ids) for ids in data.input_ids) * args.repeats
    trained = sum(sum(1 for label in labels if label != -100) for labels in data.labels)
    print(json.dumps({
        "benchmark": "sft_step", "dtype": str(next(model.base_model.parameters()).dtype), "threads": torch.get_num_threads(),
        "rows": len(batches), "tokens_per_row": round(tokens / steps, 1),
        "trained_tokens_per_row": round(trained / len(batches), 1),
        "seconds_per_row": {k: round(v / steps, 3) for k, v in seconds.items()},
        "tokens_per_s": {k: round(tokens / v, 1) for k, v in seconds.items()},
        "static_prefix_tokens": len(prefix),
        "speedup": round(seconds["full_lm_head"] / seconds["trained_positions"], 3),
        "static_prefix_speedup": round(seconds["trained_positions"] / seconds["static_prefix"], 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "target": f"static prefix >= {TARGET:g}x trained_positions",
        "meets_target": seconds["trained_positions"] / seconds["static_prefix"] >= TARGET,
    }))


if __name__ == "__main__":
    main()

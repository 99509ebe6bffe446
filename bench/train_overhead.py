"""GRPO steps through agent_rl.train.grpo.train_grpo vs a bare TRL GRPOTrainer with the same model, data and settings.

Both sides load the model, build the trainer and run `--steps` GRPO steps with the same environment (the inbox
tools), reward functions and GRPOConfig; ours adds the prompt-row handling, rollout bookkeeping and result files.
The rubric scores every rollout of these untrained models alike (the tiny model's forced calls, the prompted
base model's format errors), and ours skips micro-batches whose advantages are all zero, so without more the
bench would time that skip, not a scored step. Both sides therefore get one more reward function, `alternating`
(1, 0, 1, 0, ... over a batch: the two rollouts of every group differ), so every micro-batch carries signal and
is scored on both sides (`ours_skipped` must be 0). Target: ours / bare <= 1.10. Last line: one JSON object.

    OMP_NUM_THREADS=1 .venv/bin/python bench/train_overhead.py [--model tiny|base] [--steps 2] [--repeats 2]
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
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = 1.10


def build_data(root: Path) -> tuple[str, Path]:
    from agent_rl.curation.datasets import save_jsonl
    from agent_rl.environments.email.grpo_rows import grpo_rows
    from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.environments.email.scenarios.generate import generate_scenarios

    url = f"sqlite:///{root / 'inbox.db'}"
    store = open_inbox_store(url)
    scenarios = generate_scenarios(build_demo_corpus(store, seed=0, n_inboxes=2, n_emails=200))
    store.close()
    path = root / "grpo.jsonl"
    save_jsonl(grpo_rows(scenarios, split=None)[:16], path)
    return url, path


def forced_call_bias(model_dir: Path) -> list:
    """The random tiny model is steered to a valid tool call (as in the tests) so both sides run the tool loop."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    call = '<tool_call>\n{"name": "search_emails", "arguments": {"keywords": ["budget"], "max_results": 2}}\n</tool_call><|im_end|>'
    ids = tokenizer(call, add_special_tokens=False)["input_ids"]
    head = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    return [[head + ids[: i + 1], 30.0] for i in range(len(ids))]


def alternating(completions: list, **_) -> list[float]:
    """1, 0, 1, 0, ...: with groups of two, every group's rollouts differ, whatever the model did."""
    return [float(index % 2 == 0) for index in range(len(completions))]


def run_ours(model: Path, url: str, rows: Path, out: Path, settings) -> tuple[float, int]:
    """Seconds, and micro-batches skipped as zero-advantage."""
    from agent_rl.train.grpo import train_grpo
    from agent_rl.train.rewards import ExtraReward

    started = time.perf_counter()
    result = train_grpo(model, None, rows, url, out, settings, extra_rewards=[ExtraReward(alternating)])
    return time.perf_counter() - started, result.skipped_micro_batches


def run_bare(model: Path, url: str, rows: Path, out: Path, settings) -> float:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.environments.email.rollouts import InboxEnvironment
    from agent_rl.train.grpo import _grpo_config
    from agent_rl.train.rewards import REWARD_GROUPS, make_reward_funcs
    from agent_rl.train.sft import load_model, lora_config, read_jsonl

    started = time.perf_counter()
    store = open_inbox_store(url)
    data = read_jsonl(rows)
    dataset = Dataset.from_list([{**r, "query_date": str(r.get("query_date") or "")} for r in data])
    tokenizer = AutoTokenizer.from_pretrained(str(model), padding_side="left")
    trainer = GRPOTrainer(
        model=load_model(model, settings.compute), reward_funcs=[*make_reward_funcs(settings.rubric), alternating],
        args=_grpo_config(settings, out, list(REWARD_GROUPS), [1.0]), train_dataset=dataset, processing_class=tokenizer,
        peft_config=lora_config(settings.lora),
        environment_factory=lambda: InboxEnvironment(store, max_turns=settings.max_tool_calling_iterations + 1),
    )
    trainer.train()
    trainer.model.save_pretrained(str(out / "adapter"))
    store.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny (default) or base (SmolLM2-135M)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from agent_rl.agent.models import resolve_model
    from agent_rl.train.config import GRPOSettings, PromptFilterSettings

    root = Path(tempfile.mkdtemp(prefix="train-overhead-"))
    os.environ.setdefault("AGENT_RL_HOME", str(root / "home"))
    model = resolve_model(args.model)
    url, rows = build_data(root)
    tiny = args.model == "tiny"
    settings = GRPOSettings(
        max_steps=args.steps, num_generations=2, per_device_train_batch_size=4, gradient_accumulation_steps=1,
        max_completion_length=1200 if tiny else 512, max_tool_calling_iterations=2,
        prompt_filter=PromptFilterSettings(mode="none"), save_steps=10_000,
        generation_kwargs={"sequence_bias": forced_call_bias(model)} if tiny else None,
    )
    run_bare(model, url, rows, root / "warm-up", settings)  # imports, file caches, allocator: paid once, untimed
    ours, bare, skipped = [], [], 0
    for repeat in range(args.repeats):  # interleaved, so machine load drifts hit both sides alike
        bare.append(run_bare(model, url, rows, root / f"bare-{repeat}", settings))
        seconds, skipped = run_ours(model, url, rows, root / f"ours-{repeat}", settings)
        ours.append(seconds)
    # Best of N on each side: the machine is shared, and load only ever adds time.
    ratio = min(ours) / min(bare)
    print(json.dumps({
        "model": args.model, "steps": args.steps, "repeats": args.repeats,
        "ours_s": [round(x, 3) for x in ours], "bare_s": [round(x, 3) for x in bare],
        "ratio": round(ratio, 4), "ours_skipped": skipped,
        "micro_batches": args.steps * settings.gradient_accumulation_steps,
        "target": TARGET, "meets_target": ratio <= TARGET,
    }))


if __name__ == "__main__":
    main()

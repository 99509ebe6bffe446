"""`python tests/train/two_process_stage.py sft|grpo --config FILE`: agent_rl.train's entry point, for comparing a
stage in one process with the same global batch in two (tests/train/test_two_processes.py). Run plainly or as
`accelerate launch`'s training script. Two test hooks, both outside what is compared:

- GRPO samples each rollout turn row by row, seeded by the row's prompt ids and its place among identical prompts
  of the round. Sampling otherwise draws one random stream per generation batch (and TRL seeds each process
  differently), so the same rollout would come out differently in one process and in two. The rest - the tool
  loop, rewards, advantages over the gathered batch, the loss, DDP's gradient averaging - is the real code.
  An extra reward, `first_is_better`, gives some groups of two reward variance (a random model's rollouts all
  score alike on the rubric), so the step has a gradient to compare, and leaves the others alike (zero-advantage
  micro-batches, which several processes skip only together).
- Rank 0 writes the trainer's log history (loss, grad_norm, reward per step) to OUT_DIR/history.json.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from collections import Counter
from pathlib import Path


def first_is_better(completions, task_id, **_):
    """1 for the first rollout of each group of two (each process holds whole groups), 0 for the second, in the
    groups of scenarios numbered a multiple of 3; 0 for both elsewhere."""
    return [float(index % 2 == 0 and int(sid[-4:]) % 3 == 0) for index, sid in enumerate(task_id)]


def _row_seeded(generate_round):
    def generate_row_by_row(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        import torch

        seen: Counter = Counter()
        completions = []
        for ids in prompt_ids:
            key = tuple(int(i) for i in ids)
            torch.manual_seed(zlib.crc32(repr((key, seen[key])).encode()))
            seen[key] += 1
            new, _ = generate_round(self, [ids], images, multimodal_fields, num_generations, has_tool_images)
            completions.append(new[0])
        return completions, None

    return generate_row_by_row


def _keeping_history(train, out_dir_arg: int, **extra):
    def run(*args, **kwargs):
        result = train(*args, **kwargs, **extra)
        if int(os.environ.get("RANK") or 0) == 0:
            out_dir = Path(args[out_dir_arg] if len(args) > out_dir_arg else kwargs["out_dir"])
            (out_dir / "history.json").write_text(json.dumps(result.history))
        return result

    return run


def main() -> int:
    from agent_rl.train import __main__ as entry
    from agent_rl.train import grpo, sft
    from agent_rl.train.grpo_trainer import AgentGRPOTrainer
    from agent_rl.train.rewards import ExtraReward

    AgentGRPOTrainer._generate_round = _row_seeded(AgentGRPOTrainer._generate_round)
    grpo.train_grpo = _keeping_history(grpo.train_grpo, 4, extra_rewards=[ExtraReward(first_is_better)])
    sft.train_sft = _keeping_history(sft.train_sft, 2)
    return entry.main()


if __name__ == "__main__":
    sys.exit(main())

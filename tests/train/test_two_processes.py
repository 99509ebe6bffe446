"""A stage in one process against the same global batch in two (`accelerate launch --num_processes 2`, DDP over
gloo on CPU, the command TrainingCompute builds for `processes = 2`), on the tiny model for two optimizer steps.

Two processes must finish, write one adapter (rank 0's) and train what one process trains:
- the log's grad_norm of each step within a relative GRAD_NORM_RTOL, and its loss within LOSS_ATOL. grad_norm is
  the check that sees the gradient's scale (a loss normalised by the wrong number of processes or tokens shows as
  a factor of 2); the weights do not, since Adam's first steps move each weight by about +-lr whatever the size.
- the adapters' weights within WEIGHT_ATOL, far below the learning rate (3e-5 GRPO, 4e-4 SFT): a weight whose
  gradient changed sign would differ by about 2 x lr.
Measured on a 2-core Intel Xeon: equal grad norms and losses to the last printed digit, weights within 7.5e-9
(GRPO) and 1.5e-8 (SFT). The runs sum the same per-row gradients in another order (each process sums its
micro-batches, DDP averages the two sums), so fp32 rounding is the only expected difference.
GRPO rollouts are sampled row by row from per-row seeds (tests/train/two_process_stage.py): with one random
stream per generation batch, the two runs would train on different rollouts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_rl.train.config import GRPOSettings, PromptFilterSettings, SFTSettings
from resources.compute import _free_port, stage_command

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("two_process_stage.py")
GLOBAL_MICRO_BATCHES = {"sft": 4, "grpo": 8}  # per optimizer step, over all processes (1 row each)
GRAD_NORM_RTOL = 1e-4
LOSS_ATOL = 1e-5
WEIGHT_ATOL = 1e-6


def _config(stage: str, data: dict, processes: int) -> dict:
    """Two steps of the same global batch: gradient accumulation shrinks as processes grow."""
    accumulation = GLOBAL_MICRO_BATCHES[stage] // processes
    if stage == "sft":
        settings = SFTSettings(max_steps=2, per_device_train_batch_size=1, gradient_accumulation_steps=accumulation,
                               max_length=8192)
        return {"model_path": str(data["tiny"]), "rows_jsonl": str(data["sft"]), "settings": settings.model_dump()}
    # Groups of two short single-turn rollouts (a random model calls no tool); a fresh adapter.
    settings = GRPOSettings(max_steps=2, num_generations=2, per_device_train_batch_size=1,
                            gradient_accumulation_steps=accumulation, max_completion_length=32, max_turn_tokens=32,
                            max_turns=2, prompt_filter=PromptFilterSettings(mode="none"))
    return {"model_path": str(data["tiny"]), "sft_adapter": None, "grpo_rows_jsonl": str(data["grpo"]),
            "store_url": data["store_url"], "settings": settings.model_dump(mode="json")}


def _run(stage: str, config: dict, processes: int, out_dir: Path) -> dict:
    """The stage as TrainingCompute launches it, with the test hooks' script in place of `-m agent_rl.train`;
    returns rank 0's summary with its log history and adapter weights."""
    from safetensors.torch import load_file

    config_path = out_dir.with_suffix(".json")
    config_path.write_text(json.dumps({**config, "out_dir": str(out_dir)}))
    command = stage_command(sys.executable, stage, processes, port=_free_port() if processes > 1 else None)
    assert command[-3:] == ["-m", "agent_rl.train", stage]
    command = [*command[:-3], str(SCRIPT), stage, "--config", str(config_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = next(json.loads(line) for line in reversed(done.stdout.splitlines()) if line.startswith('{"adapter_dir"'))
    summary["history"] = [h for h in json.loads((out_dir / "history.json").read_text()) if "grad_norm" in h]
    summary["weights"] = load_file(str(out_dir / "adapter" / "adapter_model.safetensors"))
    summary["stderr"] = done.stderr
    return summary


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_two_processes_train_what_one_process_trains_on_the_same_global_batch(stage, train_data, tmp_path):
    one = _run(stage, _config(stage, train_data, 1), 1, tmp_path / "one")
    two = _run(stage, _config(stage, train_data, 2), 2, tmp_path / "two")

    assert "rank 1 of 2 trains alongside rank 0" in two["stderr"]
    assert one["steps"] == two["steps"] == 2
    adapters = [p for p in tmp_path.rglob("adapter_model.safetensors") if "checkpoint-" not in str(p)]
    assert sorted(adapters) == [tmp_path / run / "adapter" / "adapter_model.safetensors" for run in ("one", "two")]
    for a, b in zip(one["history"], two["history"], strict=True):
        assert b["grad_norm"] > 0 and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=GRAD_NORM_RTOL)
        assert b["loss"] == pytest.approx(a["loss"], abs=LOSS_ATOL)
    assert one["weights"].keys() == two["weights"].keys()
    assert max(float((one["weights"][k] - two["weights"][k]).abs().max()) for k in one["weights"]) <= WEIGHT_ATOL
    if stage == "grpo":
        # Rank 0 recorded every process's rollouts: the whole batches, as one process records them.
        keys = ("task_id", "group", "step", "reward", "outcome", "messages")
        records = [[{k: json.loads(line)[k] for k in keys} for line in Path(run["rollouts_path"]).read_text().splitlines()]
                   for run in (one, two)]
        assert len(records[0]) == 2 * GLOBAL_MICRO_BATCHES["grpo"] and records[0] == records[1]
        for field in ("groups", "zero_variance_groups", "outcomes", "tool_calls", "reward_means"):
            assert one[field] == two[field], field
        assert 0 < two["zero_variance_groups"] < two["groups"]  # zero-advantage micro-batches, skipped together

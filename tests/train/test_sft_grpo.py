"""Real TRL steps on the tiny model: SFT -> GRPO with tool rollouts, masks, checkpoints, MLflow."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from agent_rl.train.config import GRPOSettings, PromptFilterSettings, SFTSettings


SEARCH_CALL = '{"name": "search_emails", "arguments": {"keywords": ["budget"], "max_results": 2}}'


def _forced_tool_call_bias(model_dir: Path, call: str = SEARCH_CALL) -> list:
    """A random 64-wide model cannot learn tool-call syntax in seconds, so the test steers its sampling with TRL's
    `generation_kwargs` (sequence_bias, anchored on the assistant header) towards one valid call. Everything
    after the generated text - parsing, tool execution, result masking, rewards, the update - is TRL's and ours."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    call = f"<tool_call>\n{call}\n</tool_call><|im_end|>"
    ids = tokenizer(call, add_special_tokens=False)["input_ids"]
    head = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    return [[head + ids[: i + 1], 30.0] for i in range(len(ids))]


def first_is_better(completions, **_):
    """An extra reward giving every group of two rollouts reward variance: the first of each pair is better."""
    return [1.0 if index % 2 == 0 else 0.0 for index in range(len(completions))]


def _forced_pairs(model_dir: Path, **overrides) -> GRPOSettings:
    """GRPO in groups of two whose rollouts all open with the same forced search call (so the rubric scores them
    alike), one micro-batch per completion, one step unless overridden."""
    settings = dict(
        max_steps=1, num_generations=2, per_device_train_batch_size=1, gradient_accumulation_steps=4,
        max_completion_length=1200, max_tool_calling_iterations=2, prompt_filter=PromptFilterSettings(mode="none"),
        generation_kwargs={"sequence_bias": _forced_tool_call_bias(model_dir)},
    )
    return GRPOSettings(**{**settings, **overrides})


def test_tiny_sft_then_grpo_calls_tools_masks_results_and_tracks_mlflow(train_data, tmp_path):
    from mlflow.tracking import MlflowClient

    from agent_rl.train.grpo import train_grpo
    from agent_rl.train.sft import train_sft
    from agent_rl.train.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(tracking_uri=uri, dagster_run_id="dagster-run-123")
    sft = train_sft(train_data["tiny"], train_data["sft"], tmp_path / "sft",
                    SFTSettings(max_steps=2, per_device_train_batch_size=2, max_length=4096), tracker=tracker)
    assert (sft.adapter_dir / "adapter_model.safetensors").is_file()
    assert (sft.adapter_dir / "adapter_config.json").is_file()
    assert sft.steps == 2 and len(sft.losses) == 2 and all(math.isfinite(x) for x in sft.losses)
    assert sft.cut_rows == 0

    settings = GRPOSettings(
        max_steps=1, num_generations=2, per_device_train_batch_size=4, gradient_accumulation_steps=1, max_completion_length=1200,
        max_tool_calling_iterations=2, prompt_filter=PromptFilterSettings(mode="none"),
        generation_kwargs={"sequence_bias": _forced_tool_call_bias(train_data["tiny"])},
    )
    grpo = train_grpo(train_data["tiny"], sft.adapter_dir, train_data["grpo"], train_data["store_url"],
                      tmp_path / "grpo", settings, tracker=tracker)
    assert (grpo.adapter_dir / "adapter_model.safetensors").is_file()
    assert grpo.steps == 1 and all(math.isfinite(x) for x in grpo.losses)
    # Rollouts really went through the tools: calls made, results appended, recorded for the detectors.
    assert grpo.tool_calls >= 4 and grpo.rollouts == 4
    rollouts = [json.loads(line) for line in grpo.rollouts_path.read_text().splitlines()]
    tool_messages = [m for r in rollouts for m in r["messages"] if m["role"] == "tool"]
    assert tool_messages and all(m["name"] == "search_emails" for m in tool_messages)
    assert grpo.groups == 2 and 0 <= grpo.zero_variance_groups <= 2

    # Masks of the trained batch: tool-result tokens are out of the loss, generated tool calls are in it.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(train_data["tiny"])
    assert _LAST_BATCH, "GRPO generated no batch"
    batch = _LAST_BATCH
    ids, tool_mask, completion_mask = batch["completion_ids"], batch["tool_mask"], batch["completion_mask"]
    row = 0
    valid = completion_mask[row].bool()
    masked_text = tokenizer.decode(ids[row][valid & (tool_mask[row] == 0)])
    trained_text = tokenizer.decode(ids[row][valid & (tool_mask[row] == 1)])
    assert "<tool_response>" in masked_text and "<tool_response>" not in trained_text
    assert "<tool_call>" in trained_text and "search_emails" in trained_text

    client = MlflowClient(tracking_uri=uri)
    runs = {run.data.tags["stage"]: run for run in client.search_runs([tracker.experiment_id])}
    assert set(runs) == {"parent", "sft", "grpo"}
    assert runs["parent"].data.tags["dagster_run_id"] == "dagster-run-123"
    for stage in ("sft", "grpo"):
        assert runs[stage].data.tags["mlflow.parentRunId"] == runs["parent"].info.run_id
        assert runs[stage].data.params["dataset_sha256." + ("sft_rows" if stage == "sft" else "grpo_rows")]
    assert "loss" in runs["sft"].data.metrics
    for key in ("reward_mean", "reward_std", "rewards/reward_outcome/mean", "tool_call_failure_rate",
                "completion_length", "zero_variance_group_fraction", "episode/turns"):
        assert key in runs["grpo"].data.metrics, key
    artifacts = {a.path for a in client.list_artifacts(runs["grpo"].info.run_id)}
    assert {"reward_curve.png", "rollouts_sample.json"} <= artifacts
    assert "loss_curve.png" in {a.path for a in client.list_artifacts(runs["sft"].info.run_id)}


_LAST_BATCH: dict = {}


@pytest.fixture(autouse=True)
def _keep_last_batch(monkeypatch):
    """Capture the trainer's last generated batch (its masks) without changing what it does."""
    import agent_rl.train.grpo as grpo_module

    original = grpo_module._trainer_class

    def wrapped():
        cls = original()

        class Capturing(cls):
            def _generate_and_score_completions(self, inputs):
                output = super()._generate_and_score_completions(inputs)
                _LAST_BATCH.clear()
                _LAST_BATCH.update(self.last_batch)
                return output

        return Capturing

    monkeypatch.setattr(grpo_module, "_trainer_class", wrapped)


def test_a_recorded_answer_ends_the_rollout_without_a_trained_closing_turn(train_data, tmp_path):
    """After return_final_answer TRL's tool loop would let the model speak again; the rollout instead closes with
    the end-of-turn token, which is not the model's choice and stays out of the loss."""
    from transformers import AutoTokenizer

    from agent_rl.train.grpo import train_grpo

    answer = '{"name": "return_final_answer", "arguments": {"answer": "I don\'t know", "sources": []}}'
    settings = GRPOSettings(
        max_steps=1, num_generations=2, per_device_train_batch_size=4, gradient_accumulation_steps=1,
        max_completion_length=400, max_tool_calling_iterations=3, prompt_filter=PromptFilterSettings(mode="none"),
        generation_kwargs={"sequence_bias": _forced_tool_call_bias(train_data["tiny"], answer)},
    )
    grpo = train_grpo(train_data["tiny"], None, train_data["grpo"], train_data["store_url"], tmp_path / "grpo",
                      settings)
    rollouts = [json.loads(line) for line in grpo.rollouts_path.read_text().splitlines()]
    assert len(rollouts) == 4 and all(r["outcome"] in ("correct", "idk") for r in rollouts)
    for rollout in rollouts:
        closing, ack = rollout["messages"][-1], rollout["messages"][-2]
        assert ack == {"role": "tool", "name": "return_final_answer", "content": "Answer recorded."}
        assert closing["role"] == "assistant" and not closing.get("content") and not closing.get("tool_calls")
        assert rollout["turns"] == 1
    tokenizer = AutoTokenizer.from_pretrained(train_data["tiny"])
    ids, tool_mask, completion_mask = _LAST_BATCH["completion_ids"], _LAST_BATCH["tool_mask"], _LAST_BATCH["completion_mask"]
    for row in range(ids.shape[0]):
        length = int(completion_mask[row].sum())
        assert int(ids[row, length - 1]) == tokenizer.eos_token_id and int(tool_mask[row, length - 1]) == 0
        trained = tokenizer.decode(ids[row, :length][tool_mask[row, :length] == 1])
        assert trained.count("<|im_end|>") == 1 and "return_final_answer" in trained  # the answer turn only


def test_sft_rerun_resumes_from_last_checkpoint(train_data, tmp_path):
    from agent_rl.train.sft import train_sft

    out = tmp_path / "sft"
    first = train_sft(train_data["tiny"], train_data["sft"], out,
                      SFTSettings(max_steps=2, save_steps=1, per_device_train_batch_size=2))
    assert first.resumed_from is None and (out / "checkpoint-2").is_dir()
    second = train_sft(train_data["tiny"], train_data["sft"], out,
                       SFTSettings(max_steps=4, save_steps=1, per_device_train_batch_size=2))
    assert second.resumed_from == "checkpoint-2"
    assert second.steps == 4 and len(second.losses) == 2  # only steps 3 and 4 ran again


def test_rows_longer_than_max_length_are_dropped_with_a_reason_not_truncated(train_data, tmp_path):
    from transformers import AutoTokenizer

    from agent_rl.train.sft import read_jsonl, tokenize_rows, train_sft

    tokenizer = AutoTokenizer.from_pretrained(train_data["tiny"])
    rows = read_jsonl(train_data["sft"])
    lengths = sorted(len(ids) for ids in tokenize_rows(tokenizer, rows, 10**6).input_ids)
    limit = lengths[len(lengths) // 2]  # about half the rows are longer
    expected_cut = sum(1 for n in lengths if n > limit)
    result = train_sft(train_data["tiny"], train_data["sft"], tmp_path / "sft",
                       SFTSettings(max_steps=1, per_device_train_batch_size=1, max_length=limit))
    assert result.cut_rows == expected_cut > 0
    assert result.rows_used == len(rows) - expected_cut
    assert all(f"> max_length {limit}" in d.reason and d.tokens > limit for d in result.dropped)


def test_labels_cover_assistant_turns_only_and_teach_the_stop(train_data):
    from transformers import AutoTokenizer

    from agent_rl.train.sft import read_jsonl, tokenize_rows

    tokenizer = AutoTokenizer.from_pretrained(train_data["tiny"])
    row = read_jsonl(train_data["sft"])[0]
    data = tokenize_rows(tokenizer, [row], 10**6)
    ids, labels = data.input_ids[0], data.labels[0]
    trained = tokenizer.decode([t for t, label in zip(ids, labels) if label != -100])
    ignored = tokenizer.decode([t for t, label in zip(ids, labels) if label == -100])
    calls = sum(len(m.get("tool_calls") or []) for m in row["messages"] if m["role"] == "assistant")
    assert trained.count("<tool_call>") == calls and "<tool_response>" not in trained
    assert row["messages"][2]["content"] in ignored  # the user's question is context, not a target
    assert "<tool_response>" in ignored and "# Tools" in ignored
    # Every assistant turn ends with the end-of-turn token; no empty closing turn is taught after the answer
    # (it became an empty-turn habit), and the row ends with the answer call itself.
    assert trained.count("<|im_end|>") == calls
    text = tokenizer.decode(ids)
    assert "Answer recorded." not in text
    assert text[text.rindex("<tool_call>"):].startswith('<tool_call>\n{"name": "return_final_answer"')
    assert text.rstrip().endswith("</tool_call><|im_end|>")
    # Same tokens as the chat template gives at generation time (no whitespace drift).
    from agent_rl.environments.messages import training_messages
    from agent_rl.train.chat_rows import row_tools
    from agent_rl.train.sft import without_answer_ack

    messages = without_answer_ack(training_messages(row["messages"], "row"))
    assert ids == tokenizer.apply_chat_template(messages, tools=row_tools(row["tools"]), tokenize=True,
                                                return_dict=False)


def test_cli_entry_point_runs_a_stage_from_a_config_file(train_data, tmp_path):
    config = {"model_path": str(train_data["tiny"]), "rows_jsonl": str(train_data["sft"]),
              "out_dir": str(tmp_path / "sft"), "settings": {"max_steps": 1, "per_device_train_batch_size": 1, "max_length": 8192}}
    path = tmp_path / "sft.json"
    path.write_text(json.dumps(config))
    done = subprocess.run([sys.executable, "-m", "agent_rl.train", "sft", "--config", str(path)],
                          capture_output=True, text=True, timeout=300,
                          env={**_env(), "AGENT_RL_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 1 and Path(summary["adapter_dir"], "adapter_model.safetensors").is_file()

    bad = subprocess.run([sys.executable, "-m", "agent_rl.train", "sft", "--config", str(tmp_path / "nope.json")],
                         capture_output=True, text=True, timeout=120, env=_env())
    assert bad.returncode != 0 and "nope.json" in bad.stderr


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}



def test_merged_adapter_checkpoint_matches_base_plus_adapter(train_data, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from agent_rl.train.adapters import adapter_stack, merge_adapter_stack
    from agent_rl.train.sft import train_sft

    sft = train_sft(train_data["tiny"], train_data["sft"], tmp_path / "sft",
                    SFTSettings(max_steps=1, per_device_train_batch_size=1, max_length=8192, learning_rate=1e-2,
                                warmup_ratio=0.0))
    base, stack = adapter_stack(sft.adapter_dir)
    assert base == Path(train_data["tiny"]) and stack == [sft.adapter_dir]
    merged_dir = merge_adapter_stack(sft.adapter_dir, tmp_path / "merged")
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(merged_dir)(ids).logits
        peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(sft.adapter_dir))(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(base)(ids).logits
    assert torch.allclose(merged, peft, atol=1e-4) and not torch.allclose(merged, plain, atol=1e-4)


def test_trained_positions_loss_equals_the_models_own_loss_and_gradients(train_data):
    """The lm_head runs only where a token is trained, yet loss and LoRA gradients are the full forward's."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_rl.train.config import LoraSettings
    from agent_rl.train.sft import lora_config, read_jsonl, tokenize_rows
    from agent_rl.train.sft_loss import trained_positions_loss

    tokenizer = AutoTokenizer.from_pretrained(train_data["tiny"])
    data = tokenize_rows(tokenizer, read_jsonl(train_data["sft"])[:2], 10**6)
    width = max(len(ids) for ids in data.input_ids)
    pad = tokenizer.pad_token_id or 0
    batch = {  # two rows of different length, right-padded as the collator does
        "input_ids": torch.tensor([ids + [pad] * (width - len(ids)) for ids in data.input_ids]),
        "attention_mask": torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in data.input_ids]),
        "labels": torch.tensor([labels + [-100] * (width - len(labels)) for labels in data.labels]),
    }
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(train_data["tiny"], dtype=torch.float32),
                           lora_config(LoraSettings(r=4, alpha=8)))
    for name, param in model.named_parameters():  # non-zero B so gradients reach both LoRA matrices
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    items = int((batch["labels"][:, 1:] != -100).sum())

    reference = model(**batch, num_items_in_batch=items).loss
    reference.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    loss, outputs, accuracy = trained_positions_loss(model, batch, items)
    loss.backward()

    assert outputs.logits.shape[1] < width // 2  # the vocabulary projection skipped most positions
    assert torch.allclose(loss, reference, rtol=1e-5, atol=1e-6)
    assert 0.0 <= accuracy <= 1.0 and expected
    for name, grad in expected.items():
        assert torch.allclose(dict(model.named_parameters())[name].grad, grad, rtol=1e-4, atol=1e-7), name


def test_cached_rollout_turns_generate_what_transformers_generate_does(train_data, tmp_path, monkeypatch):
    """The prefix-cached rollout decoder is an optimisation only: at a near-zero temperature (effectively
    greedy) each round's completion ids equal those of TRL's generate() path, stop token included."""
    import agent_rl.train.grpo as grpo_module

    rounds: list[tuple[list, list]] = []
    original = grpo_module._trainer_class

    def comparing():
        cls = original()

        class Comparing(cls):
            def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                                      has_tool_images=False):
                assert self._cached_rollouts_apply(images, multimodal_fields)
                if not rounds:  # a random model rarely says <|im_end|>: stop on a token it does say, mid-row
                    self.cached_rollouts = False
                    first, _ = super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations)
                    self.eos_token_ids = [*self.eos_token_ids, int(first[0][5])]
                    self.generation_config.eos_token_id = list(self.eos_token_ids)
                self.cached_rollouts = False
                theirs, _ = super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations)
                self.cached_rollouts = True
                ours, logprobs = super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations)
                rounds.append((ours, theirs))
                return ours, logprobs

        return Comparing

    monkeypatch.setattr(grpo_module, "_trainer_class", comparing)
    settings = GRPOSettings(
        max_steps=1, num_generations=2, per_device_train_batch_size=4, gradient_accumulation_steps=1,
        max_completion_length=48, max_tool_calling_iterations=1, temperature=1e-4,
        prompt_filter=PromptFilterSettings(mode="none"),
    )
    grpo_module.train_grpo(train_data["tiny"], None, train_data["grpo"], train_data["store_url"], tmp_path / "grpo",
                           settings)
    assert rounds, "no generation round ran"
    for ours, theirs in rounds:
        assert len(ours) == len(theirs) == 4
        assert ours == [list(map(int, ids)) for ids in theirs]
    assert any(len(ids) < 48 for ours, _ in rounds for ids in ours)  # rows stopped early and left the batch


@pytest.mark.parametrize("micro_batch, quantile", [(1, 1.0), (4, 1.0), (1, 0.2)])
def test_trimmed_micro_batches_scoring_generated_tokens_give_trls_loss(train_data, tmp_path, monkeypatch, micro_batch,
                                                                       quantile):
    """Dropping all-padding columns and skipping tool-result positions in the LM head is an optimisation only:
    each micro-batch's gradient equals that of TRL's own compute_loss on the untrimmed micro-batch, also when
    top_entropy_quantile keeps only the high-entropy generated tokens (the entropies must be TRL's)."""
    import torch
    from trl import GRPOTrainer

    import agent_rl.train.grpo as grpo_module
    from agent_rl.train.grpo_batches import trim_padding

    seen: list[tuple[float, float, int, int]] = []
    masked: list[float] = []  # gradient difference between all generated tokens and the high-entropy ones
    original = grpo_module._trainer_class

    def comparing():
        cls = original()

        class Comparing(cls):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                # Forced identical rollouts score alike (advantage 0, loss 0): give the rows advantages of both signs.
                rows = inputs["advantages"].shape[0]
                inputs = {**inputs, "advantages": torch.linspace(-1.0, 1.0, rows) if rows > 1 else torch.ones(1)}
                params = [p for p in model.parameters() if p.requires_grad]
                ours = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
                ours_grads = torch.autograd.grad(ours, params, retain_graph=True, allow_unused=True)
                reference = GRPOTrainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)
                reference_grads = torch.autograd.grad(reference, params, allow_unused=True)
                if self.top_entropy_quantile < 1.0:  # the quantile must act: every token's gradient differs
                    self.top_entropy_quantile, kept = 1.0, self.top_entropy_quantile
                    every = GRPOTrainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)
                    every_grads = torch.autograd.grad(every, params, allow_unused=True)
                    self.top_entropy_quantile = kept
                    masked.append(max(float((a - b).abs().max()) for a, b in
                                      zip(every_grads, reference_grads, strict=True)
                                      if a is not None and b is not None))
                # On-policy, the loss value is -A x token share whatever the log-probs; its gradient is where they act.
                difference = max(float((a - b).abs().max()) for a, b in zip(ours_grads, reference_grads, strict=True)
                                 if a is not None and b is not None)
                scale = max(float(b.abs().max()) for b in reference_grads if b is not None)
                width = inputs["prompt_ids"].shape[1] + inputs["completion_ids"].shape[1]
                trimmed = trim_padding(inputs)
                seen.append((difference, scale, width, trimmed["prompt_ids"].shape[1] + trimmed["completion_ids"].shape[1]))
                return ours

        return Comparing

    monkeypatch.setattr(grpo_module, "_trainer_class", comparing)
    settings = GRPOSettings(
        max_steps=1, num_generations=2, per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=4 // micro_batch, max_completion_length=600, max_tool_calling_iterations=2,
        prompt_filter=PromptFilterSettings(mode="none"),
        generation_kwargs={"sequence_bias": _forced_tool_call_bias(train_data["tiny"])},
        static_prefix=False,  # drops a gradient path on purpose: tested on its own below
        experimental={"top_entropy_quantile": quantile},
    )
    grpo_module.train_grpo(train_data["tiny"], None, train_data["grpo"], train_data["store_url"], tmp_path / "grpo",
                           settings)
    assert len(seen) == 4 // micro_batch
    assert len(masked) == (len(seen) if quantile < 1 else 0)
    assert all(difference > 0 for difference in masked)
    for difference, scale, _, _ in seen:
        assert scale > 0 and difference <= 1e-4 * scale, (difference, scale)
    if micro_batch == 1:  # rows of different lengths: every single-row micro-batch lost its padding
        assert any(trimmed < width for _, _, width, trimmed in seen)


def test_rehearsal_keeps_its_share_of_training_rows_however_large_the_task_set():
    from agent_rl.train.sft import TokenizedRows, rehearsal_count, repeat_to

    assert rehearsal_count(252, 0.15) == 44 and rehearsal_count(3525, 0.15) == 622 and rehearsal_count(100, 0.0) == 0
    unique = TokenizedRows(input_ids=[[1, 2], [3, 4], [5, 6]], labels=[[-100, 2], [-100, 4], [-100, 6]])
    repeated = repeat_to(unique, 622)
    assert len(repeated.input_ids) == len(repeated.labels) == 622
    assert repeated.input_ids.count([3, 4]) == 207 and repeated.labels[4] == [-100, 4]  # cycled evenly, paired
    assert 622 / (3525 + 622) == pytest.approx(0.15, abs=0.001)
    assert repeat_to(TokenizedRows(), 10).input_ids == []


def test_static_prefix_gives_the_full_rows_loss_and_is_computed_once_per_step(train_data, tmp_path):
    """The opening block (instructions + tool schemas) shared by the rows is found, its keys/values give exactly
    the loss of the whole rows, and training computes it once per optimizer step, not once per row."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_rl.train.config import LoraSettings
    from agent_rl.train.sft import lora_config, read_jsonl, tokenize_rows, train_sft
    from agent_rl.train.sft_loss import trained_positions_loss
    from agent_rl.train.static_prefix import StaticPrefix

    tokenizer = AutoTokenizer.from_pretrained(train_data["tiny"])
    rows = read_jsonl(train_data["sft"])
    data = tokenize_rows(tokenizer, rows, 10**6)
    prefix = StaticPrefix.find(tokenizer, rows, data.input_ids)
    assert prefix is not None and len(prefix) > 200  # the instructions and three tool schemas
    decoded = tokenizer.decode(prefix.ids)
    assert "# Tools" in decoded and "@" not in decoded  # no inbox address: the block is the same for every inbox
    assert StaticPrefix.find(tokenizer, rows[:1] + [{"messages": [{"role": "user", "content": "hi"}]}],
                             data.input_ids[:1] + [[1, 2, 3]] * 3) is None  # most rows do not open with it

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(train_data["tiny"], dtype=torch.float32),
                           lora_config(LoraSettings(r=4, alpha=8)))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    for ids, labels in zip(data.input_ids[:3], data.labels[:3]):
        batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                 "labels": torch.tensor([labels])}
        assert prefix.opens(batch["input_ids"], batch["attention_mask"], batch["labels"])
        full, _, _ = trained_positions_loss(model, batch)
        short, outputs, _ = trained_positions_loss(model, batch, prefix_cache=prefix.cache(model, step=0, batch=1))
        assert torch.allclose(short, full, rtol=1e-5, atol=1e-6)
        short.backward()  # the remainder trains the adapter
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "lora" in n)
        model.zero_grad()
    assert prefix.computed == 1  # same weights (step 0): computed once for all three rows
    prefix.cache(model, step=1, batch=2)
    assert prefix.computed == 2

    sft = train_sft(train_data["tiny"], train_data["sft"], tmp_path / "sft",
                    SFTSettings(max_steps=3, gradient_accumulation_steps=2, retain_fraction=0.0, max_length=4096))
    assert sft.static_prefix_tokens == len(prefix) and sft.static_prefix_passes == 3  # one per optimizer step
    plain = train_sft(train_data["tiny"], train_data["sft"], tmp_path / "plain",
                      SFTSettings(max_steps=3, gradient_accumulation_steps=2, retain_fraction=0.0, max_length=4096,
                                  static_prefix=False))
    assert plain.static_prefix_tokens == 0
    assert sft.losses[0] == pytest.approx(plain.losses[0], rel=1e-4)  # same first step: the forward is exact


def test_grpo_scores_rollouts_after_the_static_prefix_with_the_same_log_probs(train_data, tmp_path, monkeypatch):
    """The prompts' opening block is computed once per step, and the generated tokens' log-probs (what the loss
    is made of) are those of the full forward pass."""
    import torch

    import agent_rl.train.grpo as grpo_module

    compared: list[float] = []
    original = grpo_module._trainer_class

    def comparing():
        cls = original()

        class Comparing(cls):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                # Forced identical rollouts score alike; an advantage of 0 would skip scoring altogether.
                inputs = {**inputs, "advantages": torch.ones(inputs["advantages"].shape[0])}
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

            def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
                ours = super()._get_per_token_logps_and_entropies(model, input_ids, *args, **kwargs)
                prefix, self.static_prefix = self.static_prefix, None
                try:
                    with torch.no_grad():
                        full = super()._get_per_token_logps_and_entropies(model, input_ids, *args, **kwargs)
                finally:
                    self.static_prefix = prefix
                scored = self._skip_positions is not None
                if scored:
                    keep = ~self._skip_positions
                    compared.append(float((ours[0].detach() - full[0])[keep].abs().max()))
                return ours

        return Comparing

    monkeypatch.setattr(grpo_module, "_trainer_class", comparing)
    settings = GRPOSettings(
        max_steps=2, num_generations=2, per_device_train_batch_size=1, gradient_accumulation_steps=2,
        max_completion_length=600, max_tool_calling_iterations=2, prompt_filter=PromptFilterSettings(mode="none"),
        generation_kwargs={"sequence_bias": _forced_tool_call_bias(train_data["tiny"])},
    )
    result = grpo_module.train_grpo(train_data["tiny"], None, train_data["grpo"], train_data["store_url"],
                                    tmp_path / "grpo", settings)
    assert result.static_prefix_tokens > 200 and result.static_prefix_rows == 4  # 2 steps x 2 single-row batches
    assert compared and max(compared) < 1e-4


def test_zero_advantage_micro_batches_are_skipped_and_train_the_same_adapter(train_data, tmp_path, monkeypatch):
    """A micro-batch whose completions all have advantage 0 (a group that scored alike) is not scored: the adapter
    after three steps - one mixed, one with no signal at all (AdamW's momentum still moves it), one all signal -
    equals the one trained by scoring every micro-batch, and the skips are counted. (Scoring rounding residue
    instead of 0 is not harmless: lora_A's first non-zero gradient comes in the no-signal step, and Adam scales
    a 3e-7 gradient to a full-size update.)"""
    import torch
    from safetensors.torch import load_file

    import agent_rl.train.grpo as grpo_module

    original = grpo_module._trainer_class
    # 2 micro-batches per step; zero advantages on the 2nd, 3rd and 4th
    plan = [True, False, False, False, True, True]

    def planned(skipping: bool):
        def make():
            cls = original()

            class Planned(cls):
                calls = 0

                def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                    signal = plan[Planned.calls % len(plan)]
                    Planned.calls += 1
                    rows = inputs["advantages"].shape[0]
                    # No signal: exact zeros when scored; rounding residue (what a zero-variance group leaves)
                    # when skipping, which must count as zero.
                    advantages = torch.full((rows,), 0.8 if signal else (3e-7 if skipping else 0.0))
                    return super().compute_loss(model, {**inputs, "advantages": advantages}, return_outputs,
                                                 num_items_in_batch)

                def _loss_is_zero(self, inputs) -> bool:
                    return super()._loss_is_zero(inputs) if skipping else False

            return Planned

        return make

    settings = GRPOSettings(
        max_steps=3, num_generations=2, per_device_train_batch_size=1, gradient_accumulation_steps=2,
        max_completion_length=400, max_tool_calling_iterations=2, learning_rate=1e-3,
        prompt_filter=PromptFilterSettings(mode="none"),
        generation_kwargs={"sequence_bias": _forced_tool_call_bias(train_data["tiny"])},
    )
    adapters = {}
    for skipping in (True, False):
        monkeypatch.setattr(grpo_module, "_trainer_class", planned(skipping))
        result = grpo_module.train_grpo(train_data["tiny"], None, train_data["grpo"], train_data["store_url"],
                                        tmp_path / f"grpo-{skipping}", settings)
        assert (result.skipped_micro_batches, result.scored_micro_batches) == ((3, 3) if skipping else (0, 6))
        adapters[skipping] = load_file(result.adapter_dir / "adapter_model.safetensors")
    assert adapters[True].keys() == adapters[False].keys()
    moved = 0.0
    for name, weight in adapters[True].items():
        assert torch.allclose(weight, adapters[False][name], atol=1e-6), name
        moved = max(moved, float(weight.abs().max()))
    assert moved > 0


def test_rollouts_cut_by_the_completion_budget_are_counted_and_warned_about(train_data, tmp_path, caplog):
    """A search whose results do not fit max_completion_length ends the rollout as 'ran out' though the policy
    chose to go on; serving has no such budget, so the run says how many rollouts it cut and what to raise."""
    import json
    import logging

    from agent_rl.train.grpo import train_grpo

    settings = _forced_pairs(train_data["tiny"], max_completion_length=64)
    with caplog.at_level(logging.WARNING, logger="agent_rl.train.grpo"):
        result = train_grpo(train_data["tiny"], None, train_data["grpo"], train_data["store_url"], tmp_path / "g",
                            settings)
    rollouts = [json.loads(line) for line in result.rollouts_path.read_text().splitlines()]
    assert result.budget_cuts == 4 == sum(r["budget_cut"] for r in rollouts)
    assert all(r["outcome"] == "ran_out" and r["turns"] == 1 for r in rollouts)
    assert "4 of 4 rollouts were cut by max_completion_length=64" in caplog.text

    # The turn budget running out is the policy's doing, not a cut.
    roomy = settings.model_copy(update={"max_completion_length": 1200})
    result = train_grpo(train_data["tiny"], None, train_data["grpo"], train_data["store_url"], tmp_path / "g2", roomy)
    assert result.budget_cuts == 0 and result.outcomes == {"ran_out": 4}


def test_a_rollout_turn_stops_where_serving_stops_it(train_data, tmp_path):
    """A cached-rollout turn generates at most max_turn_tokens (the runner's per-turn limit when serving), not the
    whole completion budget: the random tiny model, which rarely stops by itself, is cut there."""
    from agent_rl.train.grpo import train_grpo

    lengths = {}
    for limit in (8, None):
        settings = GRPOSettings(
            max_steps=1, num_generations=2, per_device_train_batch_size=1, gradient_accumulation_steps=4,
            max_completion_length=64, max_turn_tokens=limit, max_tool_calling_iterations=1,
            prompt_filter=PromptFilterSettings(mode="none"),
        )
        result = train_grpo(train_data["tiny"], None, train_data["grpo"], train_data["store_url"],
                            tmp_path / f"g-{limit}", settings)
        assert result.outcomes == {"format_error": 4}  # random text is no tool call
        lengths[limit] = _LAST_BATCH["completion_mask"].sum(1).tolist()
    assert max(lengths[8]) <= 8 and max(lengths[None]) > 8, lengths


def test_an_extra_reward_joins_the_rubric_in_advantages_records_and_mlflow(train_data, tmp_path):
    """A reward function of the user's (here: the first rollout of each group is better) is added to the rubric's
    total with its weight: groups the rubric scores alike now have variance, so every micro-batch is scored,
    and each rollout record carries the extra component and the weighted total."""
    import json

    from mlflow.tracking import MlflowClient

    from agent_rl.train.grpo import train_grpo
    from agent_rl.train.rewards import ExtraReward
    from agent_rl.train.tracking import Tracker

    settings = _forced_pairs(train_data["tiny"])
    plain = train_grpo(train_data["tiny"], None, train_data["grpo"], train_data["store_url"], tmp_path / "plain",
                       settings)
    assert plain.zero_variance_groups == 2 and plain.skipped_micro_batches == 4  # forced rollouts score alike

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(tracking_uri=uri)
    result = train_grpo(train_data["tiny"], None, train_data["grpo"], train_data["store_url"], tmp_path / "extra",
                        settings, tracker=tracker, extra_rewards=[ExtraReward(first_is_better, weight=0.5)])
    assert (result.zero_variance_groups, result.skipped_micro_batches, result.scored_micro_batches) == (0, 0, 4)
    records = [json.loads(line) for line in result.rollouts_path.read_text().splitlines()]
    plain_records = [json.loads(line) for line in plain.rollouts_path.read_text().splitlines()]
    rubric_total = plain_records[0]["reward"]
    assert [r["reward_components"]["extra.first_is_better"] for r in records] == [1.0, 0.0, 1.0, 0.0]
    assert [r["reward"] for r in records] == pytest.approx([rubric_total + 0.5, rubric_total] * 2)
    run = MlflowClient(uri).get_run(result.mlflow_run_id)
    assert "rewards/first_is_better/mean" in run.data.metrics
    assert run.data.params["extra_rewards.first_is_better"] == "0.5"


@pytest.mark.parametrize("extra, complaint", [
    ("lambda", "a lambda has none"),
    ("taken", "the name is taken"),
    ("nan", "is not a finite number"),
    ("function", "is not an ExtraReward"),
])
def test_an_unusable_extra_reward_is_refused_before_training(train_data, tmp_path, extra, complaint):
    from agent_rl.train.grpo import train_grpo
    from agent_rl.train.rewards import ExtraReward

    def reward_outcome(completions, **_):
        return [0.0] * len(completions)

    extras = {"lambda": [ExtraReward(lambda completions, **_: [0.0] * len(completions))],
              "taken": [ExtraReward(reward_outcome)], "nan": [ExtraReward(reward_outcome, weight=float("nan"))],
              "function": [reward_outcome]}[extra]
    with pytest.raises(ValueError, match=complaint):
        train_grpo(train_data["tiny"], None, train_data["grpo"], train_data["store_url"], tmp_path / "g",
                   GRPOSettings(max_steps=1), extra_rewards=extras)
    assert not (tmp_path / "g").exists()


def test_extra_prompts_replace_groups_that_scored_alike(train_data, tmp_path):
    """With extra prompts rolled out each step, the groups trained on are the ones with reward variance: here a
    reward of the user's separates the rollouts of two of the four prompts only, so whichever two prompts the
    sampler puts in the batch, those two are trained and every micro-batch is scored; the other rollouts are
    recorded as not trained."""
    import json

    from agent_rl.train.grpo import train_grpo
    from agent_rl.train.rewards import ExtraReward

    rows = train_data["grpo"].read_text().splitlines()[:4]
    prompts = tmp_path / "grpo.jsonl"
    prompts.write_text("\n".join(rows) + "\n")
    ids = [json.loads(row)["task_id"] for row in rows]
    signal = set(ids[2:])

    def separates_two_prompts(completions, task_id, **_):
        return [float(index % 2) if sid in signal else 0.0 for index, sid in enumerate(task_id)]

    settings = _forced_pairs(train_data["tiny"], max_steps=2, experimental={"extra_prompts_per_step": 2})
    result = train_grpo(train_data["tiny"], None, prompts, train_data["store_url"], tmp_path / "g", settings,
                        extra_rewards=[ExtraReward(separates_two_prompts)])
    records = [json.loads(line) for line in result.rollouts_path.read_text().splitlines()]
    assert len(records) == 2 * 4 * 2 and result.groups == 8 and result.extra_groups == 4
    for step in (0, 1):
        batch = [r for r in records if r["step"] == step]
        assert {r["task_id"] for r in batch} == set(ids)  # 2 batch prompts + 2 extra ones
        assert {r["task_id"] for r in batch if r["trained"]} == signal
        assert sum(r["trained"] for r in batch) == 4
    assert (result.skipped_micro_batches, result.scored_micro_batches) == (0, 8)
    assert result.zero_variance_groups == 4  # 2 of the 4 prompts, both steps
    # An extra group (after the batch's 2 in each step's numbering) trained = a batch group replaced.
    assert result.replaced_groups == len({(r["step"], r["group"]) for r in records if r["trained"] and r["group"] >= 2})


def test_selected_rows_keep_their_tensors_and_recount_the_loss_normaliser():
    import torch

    from agent_rl.train.grpo_batches import choose_groups, select_rows

    assert choose_groups([1, 1, 0, 1, 2, 2, 0, 3], group_size=2, wanted=2) == [1, 3]
    assert choose_groups([1, 1, 2, 2, 0, 1], group_size=2, wanted=2) == [0, 2]  # signal first, then alike
    assert choose_groups([1, 1, 2, 2, 3, 3], group_size=2, wanted=2) == [0, 1]  # none: the batch's own
    output = {"completion_ids": torch.arange(12).view(4, 3), "completion_mask": torch.tensor(
        [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]), "tool_mask": torch.tensor(
        [[1, 0, 1], [1, 1, 1], [1, 1, 1], [0, 0, 1]]), "advantages": torch.tensor([0.5, -0.5, 0.0, 0.0]),
        "num_items_in_batch": torch.tensor(7)}
    kept = select_rows(output, [1, 3])
    assert kept["completion_ids"].tolist() == [[3, 4, 5], [9, 10, 11]]
    assert kept["advantages"].tolist() == [-0.5, 0.0]
    assert int(kept["num_items_in_batch"]) == 3 + 1


@pytest.mark.parametrize("beta, fresh_adapter", [(0.04, False), (0.0, True)])
def test_a_kl_anchor_or_fresh_adapter_trains_a_new_adapter_over_the_merged_sft_policy(train_data, tmp_path, beta,
                                                                                       fresh_adapter):
    """beta > 0: TRL's reference is the policy with its adapter disabled, so GRPO merges the SFT adapter into the
    base and trains a new adapter over it: the KL term then pulls towards the SFT policy, not the raw base model.
    fresh_adapter does the same without a KL term. The checkpoint that gets served must be base + SFT + GRPO."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from agent_rl.agent.precision import load_merged
    from agent_rl.train.adapters import adapter_stack, merge_adapter_stack
    from agent_rl.train.grpo import train_grpo
    from agent_rl.train.rewards import ExtraReward
    from agent_rl.train.sft import train_sft

    sft = train_sft(train_data["tiny"], train_data["sft"], tmp_path / "sft",
                    SFTSettings(max_steps=1, per_device_train_batch_size=1, max_length=8192, learning_rate=1e-2,
                                warmup_ratio=0.0))
    settings = _forced_pairs(train_data["tiny"], beta=beta, experimental={"fresh_adapter": fresh_adapter},
                             learning_rate=1e-2, max_steps=2)
    result = train_grpo(train_data["tiny"], sft.adapter_dir, train_data["grpo"], train_data["store_url"],
                        tmp_path / "grpo", settings, extra_rewards=[ExtraReward(first_is_better, weight=1.0)])
    assert result.steps == 2 and result.skipped_micro_batches == 0  # every group has reward variance
    kl = [h["kl"] for h in result.history if "kl" in h]
    if beta:
        # Finite and never negative. Its size is not asserted: the forced rollouts of a group are identical, so
        # their advantages cancel and the policy moves by Adam's epsilon only; in fp32 that KL rounds to 0.
        assert len(kl) == 2 and all(math.isfinite(x) and x >= 0 for x in kl)
    else:
        assert not kl  # no reference model, no KL term

    base, stack = adapter_stack(result.adapter_dir)
    assert base == Path(train_data["tiny"]) and stack == [sft.adapter_dir, result.adapter_dir]
    merged_dir = merge_adapter_stack(result.adapter_dir, tmp_path / "merged")
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    with torch.no_grad():
        served = AutoModelForCausalLM.from_pretrained(merged_dir)(ids).logits
        sft_policy = load_merged(base, [sft.adapter_dir], torch.float32)
        sft_only = sft_policy(ids).logits
        by_hand = PeftModel.from_pretrained(sft_policy, str(result.adapter_dir))(ids).logits
    assert torch.allclose(served, by_hand, atol=1e-4) and not torch.allclose(served, sft_only, atol=1e-4)


def test_sft_continues_a_given_adapter_instead_of_starting_a_fresh_one(train_data, tmp_path):
    """What the loop does when production runs a model of ours: the week's SFT keeps training the champion's
    adapter. With a vanishing learning rate the continued adapter is the champion's; a fresh one is not."""
    from safetensors.torch import load_file

    from agent_rl.train.sft import train_sft

    settings = SFTSettings(max_steps=2, save_steps=2, per_device_train_batch_size=2, learning_rate=1e-2)
    champion = train_sft(train_data["tiny"], train_data["sft"], tmp_path / "champion", settings)
    still = settings.model_copy(update={"learning_rate": 1e-12, "lora": settings.lora.model_copy(update={"r": 4})})
    continued = train_sft(train_data["tiny"], train_data["sft"], tmp_path / "continued", still,
                          init_adapter=champion.adapter_dir)
    fresh = train_sft(train_data["tiny"], train_data["sft"], tmp_path / "fresh", still)
    assert continued.started_from == str(champion.adapter_dir) and fresh.started_from is None

    def weights(result):
        return load_file(str(result.adapter_dir / "adapter_model.safetensors"))

    before, after, new = weights(champion), weights(continued), weights(fresh)
    assert before.keys() == after.keys()  # the champion's shape (rank 16), not the settings' rank 4
    assert all(float((before[k] - after[k]).abs().max()) < 1e-6 for k in before)
    lora_b = [k for k in before if "lora_B" in k]
    assert lora_b and any(float(before[k].abs().max()) > 1e-4 for k in lora_b)  # the champion learnt something
    assert all(float(new[k].abs().max()) < 1e-6 for k in new if "lora_B" in k)  # a fresh adapter starts at zero

    with pytest.raises(ValueError, match="not a PEFT adapter directory"):
        train_sft(train_data["tiny"], train_data["sft"], tmp_path / "bad", still, init_adapter=tmp_path)

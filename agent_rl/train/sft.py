"""SFT warmup: TRL `SFTTrainer` + a PEFT LoRA adapter on teacher trajectories, loss on assistant tokens only.

We tokenize the conversations ourselves and hand TRL `input_ids` + `labels` (tool results, user and
system turns set to -100): TRL's `assistant_only_loss` path swaps in a `{% generation %}` training
template and re-renders every row, and its CPU defaults (bf16 autocast, gradient checkpointing) are
what made it slow here. No row is ever truncated: rows longer than `max_length` are dropped with a
reason and counted. Checkpoints go to `out_dir`; a re-run resumes from the last one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_rl.environments.messages import training_messages
from agent_rl.jsonl import read_jsonl
from agent_rl.train.chat_rows import row_tools
from agent_rl.train.config import SFTSettings, common_trainer_args
from agent_rl.train.outputs import ADAPTER_DIR, MANIFEST
from agent_rl.train.static_prefix import StaticPrefix
from agent_rl.train.tracking import MetricsCallback, Tracker, file_sha256

log = logging.getLogger(__name__)
MAX_DROPS_SHOWN = 5


@dataclass
class DroppedRow:
    index: int
    reason: str
    tokens: int = 0


@dataclass
class TokenizedRows:
    input_ids: list[list[int]] = field(default_factory=list)
    labels: list[list[int]] = field(default_factory=list)
    dropped: list[DroppedRow] = field(default_factory=list)
    longest: int = 0

    @property
    def trained_tokens(self) -> int:
        return sum(sum(1 for label in row if label != -100) for row in self.labels)

    @property
    def total_tokens(self) -> int:
        return sum(len(row) for row in self.input_ids)


@dataclass
class SFTResult:
    adapter_dir: Path
    steps: int
    train_loss: float | None
    losses: list[float]
    rows_used: int
    dropped: list[DroppedRow]
    trained_tokens_per_epoch: int
    tokens_seen: int
    seconds: float
    tokens_per_second: float
    resumed_from: str | None
    mlflow_run_id: str | None
    history: list[dict[str, float]] = field(default_factory=list)
    retain_rows: int = 0
    static_prefix_tokens: int = 0  # the shared opening block computed once per step (0: every row in full)
    static_prefix_passes: int = 0
    started_from: str | None = None  # the adapter training continued (None: a fresh adapter on the base)

    @property
    def cut_rows(self) -> int:
        """Rows that did not fit max_length (dropped, never truncated)."""
        return sum(1 for row in self.dropped if row.reason.startswith("too long"))

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data["adapter_dir"] = str(self.adapter_dir)
        data["cut_rows"] = self.cut_rows
        data.pop("history")
        return data


# -- data -------------------------------------------------------------------------------------------


def without_answer_ack(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation ending at the final answer call: the tool's acknowledgement after it (recorded by the
    runner) is context nobody generates from, so it is not worth its tokens."""
    end = len(messages)
    while end > 1 and messages[end - 1]["role"] == "tool" and messages[end - 1].get("name") == "return_final_answer":
        end -= 1
    return messages[:end]


def assistant_char_spans(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans the model generates (each assistant turn, through its
    end-of-turn token). Fails loudly if the template is not prefix-preserving
    (training would not match serving)."""
    render = lambda msgs, gen=False: tokenizer.apply_chat_template(  # noqa: E731
        msgs, tools=tools, tokenize=False, add_generation_prompt=gen
    )
    text = render(messages)
    eos = tokenizer.eos_token
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or i == 0:
            continue
        before, through = render(messages[:i], True), render(messages[: i + 1])
        if not (text.startswith(before) and text.startswith(through) and through.startswith(before)):
            raise ValueError("the chat template renders a conversation prefix differently from the whole "
                             "conversation; training would not match generation")
        end = through.rfind(eos)
        end = end + len(eos) if end >= len(before) else len(through)
        spans.append((len(before), end))
    return text, spans


def tokenize_conversation(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None) -> tuple[list[int], list[int]]:
    """input_ids and labels (-100 outside assistant turns) for one conversation."""
    text, spans = assistant_char_spans(tokenizer, messages, tools)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    labels = []
    for token, (start, _end) in zip(encoded["input_ids"], encoded["offset_mapping"]):
        inside = any(a <= start < b for a, b in spans)
        labels.append(token if inside else -100)
    return list(encoded["input_ids"]), labels


def tokenize_rows(tokenizer, rows: list[dict[str, Any]], max_length: int) -> TokenizedRows:
    out = TokenizedRows()
    for index, row in enumerate(rows):
        where = f"SFT row {index}"
        messages = training_messages(row.get("messages"), where)
        tools = row_tools(row.get("tools"))
        messages = without_answer_ack(messages)
        input_ids, labels = tokenize_conversation(tokenizer, messages, tools or None)
        out.longest = max(out.longest, len(input_ids))
        if all(label == -100 for label in labels):
            out.dropped.append(DroppedRow(index, "no assistant turn to learn from", len(input_ids)))
        elif len(input_ids) > max_length:
            out.dropped.append(DroppedRow(
                index, f"too long: {len(input_ids)} tokens > max_length {max_length}; truncating would cut a "
                       "tool call or the answer", len(input_ids)))
        else:
            out.input_ids.append(input_ids)
            out.labels.append(labels)
    return out


# -- training ---------------------------------------------------------------------------------------


def lora_config(lora, task_type: str = "CAUSAL_LM"):
    from peft import LoraConfig

    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=list(lora.target_modules), task_type=task_type, bias="none",
                      modules_to_save=list(lora.modules_to_save) or None)


def training_dtype(model_path: str | Path, compute=None):
    """dtype of the frozen base as `compute` says: bf16 with autocast, else `base_dtype` (the frozen base in bf16
    is 1.4-2x faster per step on AMX or AVX512_BF16 CPUs; adapters stay fp32). No settings: fp32."""
    import torch

    from agent_rl.agent.precision import hidden_size_of, resolve_dtype

    if compute is None:
        return torch.float32
    if compute.bf16:
        return torch.bfloat16
    device = "cpu" if compute.use_cpu or not torch.cuda.is_available() else "cuda"
    return resolve_dtype(compute.base_dtype, device, hidden_size_of(model_path))


def load_model(model_path: str | Path, compute=None):
    """The base model to train adapters on, in `training_dtype`."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_path), dtype=training_dtype(model_path, compute))


def last_checkpoint(out_dir: Path) -> str | None:
    """The newest complete checkpoint: a kill during a save leaves a folder without trainer_state.json
    (the Trainer writes it last), which resuming from would crash on."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return None
    steps = []
    for folder in out_dir.glob("checkpoint-*"):
        suffix = folder.name.removeprefix("checkpoint-")
        if suffix.isdigit() and (folder / "trainer_state.json").is_file():
            steps.append((int(suffix), folder))
    return str(max(steps)[1]) if steps else None


INPUTS_FILE = "inputs.sha256"  # what the checkpoints in an out_dir were trained from
# Written in INPUTS_FILE by the stage store after it downloaded a checkpoint of the same stage (same inputs, proved by
# the stage key): the run adopts it under its own fingerprint instead of starting afresh.
ADOPT_CHECKPOINTS = "adopt: same stage key"
# Settings that say how long and how often to save, not what is learned: a run may go on with more steps.
RUN_LENGTH_FIELDS = {"max_steps", "save_steps", "save_total_limit", "logging_steps"}


def inputs_fingerprint(*parts: str | Path) -> str:
    """One hash over the training inputs: Paths by content (a directory: every file in it), strings as text."""
    digest = hashlib.sha256()
    for part in parts:
        path = part if isinstance(part, Path) else None
        if path is not None and path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file() and "checkpoint-" not in str(p)):
                digest.update(file.name.encode())
                digest.update(file_sha256(file).encode())
        elif path is not None and path.is_file():
            digest.update(file_sha256(path).encode())
        else:
            digest.update(str(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def resumable_checkpoint(out_dir: str | Path, fingerprint: str) -> str | None:
    """The checkpoint to resume from: only one written from the same inputs (this run, killed). A run on other
    inputs (the next week of a partition, new rows or settings) starts afresh: resuming would return the earlier
    run's adapter, trained on other data, as this run's; its stale checkpoints are removed."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    marker = out_dir / INPUTS_FILE
    recorded = marker.read_text().strip() if marker.is_file() else None
    if recorded == ADOPT_CHECKPOINTS:
        marker.write_text(fingerprint + "\n")
        return last_checkpoint(out_dir)
    if recorded == fingerprint:
        return last_checkpoint(out_dir)
    for folder in out_dir.glob("checkpoint-*"):
        shutil.rmtree(folder, ignore_errors=True)
    marker.write_text(fingerprint + "\n")
    return None


def rehearsal_count(task_rows: int, fraction: float) -> int:
    """Rehearsal rows that make up `fraction` of the training set next to `task_rows` task rows."""
    return round(task_rows * fraction / (1 - fraction)) if fraction > 0 else 0


def repeat_to(rows: TokenizedRows, n: int) -> TokenizedRows:
    """`n` rows cycling through `rows`: the share must hold in what training samples, not in unique prompts (the
    demo pool gave 3,525 task rows and 36 usable rehearsal answers: 1% of the rows, ~1 seen in 48 steps)."""
    if not rows.input_ids or n <= 0:
        return TokenizedRows()
    k = len(rows.input_ids)
    return TokenizedRows(input_ids=[rows.input_ids[i % k] for i in range(n)],
                         labels=[rows.labels[i % k] for i in range(n)])


def rehearsal(model, tokenizer, task_rows: int, settings: SFTSettings) -> TokenizedRows:
    """Tokenized rehearsal rows (train/retain.py), `retain_fraction` of the training set next to `task_rows`."""
    from agent_rl.train.retain import RETAIN_PROMPTS, retain_rows

    n = rehearsal_count(task_rows, settings.retain_fraction)
    if n <= 0:
        return TokenizedRows()
    rows = retain_rows(model, tokenizer, min(n, len(RETAIN_PROMPTS)))
    retained = tokenize_rows(tokenizer, rows, settings.max_length)
    log.info("SFT rehearsal: %d general prompts answered by the base model within budget, repeated to %d rows",
             len(rows), n)
    return repeat_to(retained, n)


def write_manifest(adapter_dir: Path, base_model: str | Path, stack: list[str | Path]) -> None:
    """Base model and the adapters to apply in order (the last is this directory) - what loaders read."""
    manifest = {"base_model": str(base_model), "adapters": [str(p) for p in stack]}
    (adapter_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))


def train_sft(
    model_path: str | Path,
    rows_jsonl: str | Path,
    out_dir: str | Path,
    settings: SFTSettings | None = None,
    tracker: Tracker | None = None,
    callbacks: list | None = None,
    init_adapter: str | Path | None = None,
) -> SFTResult:
    """Train a LoRA adapter on `rows_jsonl` ({"messages", "tools"} per line); the adapter lands in out_dir/adapter.

    `init_adapter`: a LoRA adapter of the same base to keep training (what production serves, when it is ours)
    instead of a fresh one; its rank and target modules are the adapter's own, not `settings.lora`."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig

    from agent_rl.train.sft_trainer import LeanSFTTrainer

    settings = settings or SFTSettings()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    if not tokenizer.chat_template:
        raise ValueError(f"model {model_path} has no chat template; tool calls cannot be rendered")
    rows = read_jsonl(rows_jsonl)
    data = _usable_rows(tokenizer, rows, settings.max_length, rows_jsonl)

    init_adapter = Path(init_adapter) if init_adapter else None
    if init_adapter is not None and not (init_adapter / "adapter_config.json").is_file():
        raise ValueError(f"init_adapter {str(init_adapter)!r} is not a PEFT adapter directory (no adapter_config.json)")
    torch.manual_seed(settings.compute.seed)
    model = load_model(model_path, settings.compute)
    retained = rehearsal(model, tokenizer, len(data.input_ids), settings)  # the base's own answers, adapter or not
    peft_config = lora_config(settings.lora)
    if init_adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(init_adapter), is_trainable=True)
        peft_config = None
    dataset = Dataset.from_dict({"input_ids": data.input_ids + retained.input_ids,
                                 "labels": data.labels + retained.labels})
    config = SFTConfig(
        **common_trainer_args(settings, str(out_dir)),
        max_length=settings.max_length,
        num_train_epochs=settings.num_train_epochs,
        weight_decay=settings.weight_decay,
        pad_to_multiple_of=settings.pad_to_multiple_of,
        dataset_num_proc=None,
    )
    rows_hash = file_sha256(rows_jsonl)  # read once: MLflow's dataset hash and the resume fingerprint
    stage = None
    if tracker is not None:
        stage = tracker.start_stage(
            "sft",
            params={"model_path": str(model_path), "settings": settings.model_dump(mode="json"),
                    "rows": len(rows), "rows_used": len(data.input_ids), "rows_dropped": len(data.dropped),
                    "retain_rows": len(retained.input_ids),
                    "started_from": str(init_adapter) if init_adapter is not None else "base",
                    "longest_row_tokens": data.longest, "trained_tokens_per_epoch": data.trained_tokens},
            dataset_hashes={"sft_rows": rows_hash},
        )
    callback = MetricsCallback(stage)
    trainer = LeanSFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                             peft_config=peft_config, callbacks=[callback, *(callbacks or [])])
    trainer.static_prefix = StaticPrefix.find(tokenizer, rows, data.input_ids) if settings.static_prefix else None
    resume = resumable_checkpoint(out_dir, inputs_fingerprint(
        rows_hash, str(model_path), settings.model_dump_json(exclude=RUN_LENGTH_FIELDS),
        *([init_adapter] if init_adapter is not None else [])))
    if resume:
        log.info("resuming SFT from %s", resume)
    started = time.perf_counter()
    try:
        output = trainer.train(resume_from_checkpoint=resume)
    except BaseException:
        if stage is not None:
            stage.finish("FAILED")
        raise
    seconds = time.perf_counter() - started

    adapter_dir = out_dir / ADAPTER_DIR
    trainer.model.save_pretrained(str(adapter_dir))
    tokenizer.save_pretrained(str(adapter_dir))
    write_manifest(adapter_dir, model_path, [adapter_dir])

    losses = [h["loss"] for h in callback.history if "loss" in h]
    tokens_seen = int(max((h.get("num_tokens", 0) for h in callback.history), default=0))
    # Tokens this process pushed through the model (padding excluded; a resumed run counts only its own steps).
    tokens_this_run = int(getattr(trainer, "_total_train_tokens", 0))
    result = SFTResult(
        adapter_dir=adapter_dir,
        steps=trainer.state.global_step,
        train_loss=float(output.training_loss) if output.training_loss is not None else None,
        losses=losses,
        rows_used=len(data.input_ids),
        dropped=data.dropped,
        trained_tokens_per_epoch=data.trained_tokens,
        tokens_seen=tokens_seen,
        seconds=seconds,
        tokens_per_second=tokens_this_run / seconds if seconds > 0 else 0.0,
        resumed_from=Path(resume).name if resume else None,
        mlflow_run_id=stage.run_id if stage else None,
        history=callback.history,
        retain_rows=len(retained.input_ids),
        static_prefix_tokens=len(trainer.static_prefix or ()),
        static_prefix_passes=trainer.static_prefix.computed if trainer.static_prefix else 0,
        started_from=str(init_adapter) if init_adapter is not None else None,
    )
    if stage is not None:
        _finish_stage(stage, result, rows)
    return result


def _usable_rows(tokenizer, rows: list[dict[str, Any]], max_length: int, rows_jsonl: str | Path) -> TokenizedRows:
    """The rows tokenized, those that cannot be trained on dropped with a warning (a few named, the rest counted);
    fails when none is left."""
    data = tokenize_rows(tokenizer, rows, max_length)
    for dropped in data.dropped[:MAX_DROPS_SHOWN]:
        log.warning("SFT row %d dropped: %s", dropped.index, dropped.reason)
    if len(data.dropped) > MAX_DROPS_SHOWN:  # one line per row buried the run's log under hundreds of them
        reasons = Counter(d.reason.split(":")[0] for d in data.dropped[MAX_DROPS_SHOWN:])
        log.warning("SFT: %d more rows dropped (%s) of %d", len(data.dropped) - MAX_DROPS_SHOWN,
                    ", ".join(f"{n} {r}" for r, n in reasons.most_common()), len(rows))
    if not data.input_ids:
        raise ValueError(f"no usable SFT rows in {rows_jsonl}: {len(rows)} read, all dropped "
                         f"({'; '.join(sorted({d.reason.split(':')[0] for d in data.dropped}))})")
    return data


def _finish_stage(stage: Any, result: SFTResult, rows: list[dict[str, Any]]) -> None:
    """The run's metrics, loss curve, dropped rows and a sample of the conversations to MLflow; closes the stage."""
    stage.log_metrics({"tokens_per_second": result.tokens_per_second, "cut_rows": result.cut_rows,
                       "rows_dropped": len(result.dropped), "static_prefix_tokens": result.static_prefix_tokens},
                      step=result.steps)
    stage.log_curves(["loss", "mean_token_accuracy", "learning_rate"], name="loss_curve.png")
    stage.log_json([asdict(d) for d in result.dropped], "dropped_rows.json")
    stage.log_json(_sample_conversations(rows, 5), "sample_rows.json")
    stage.set_tags({"adapter_dir": result.adapter_dir})
    stage.finish()


def _sample_conversations(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    return [{"messages": row.get("messages")} for row in rows[:n]]

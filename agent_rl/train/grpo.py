"""Multi-turn GRPO: TRL `GRPOTrainer` continues from the SFT adapter, with tool rollouts in the inbox environment.

TRL 1.16 runs the rollouts itself (`environment_factory`): it generates, parses `<tool_call>` blocks,
calls the environment's tool methods, appends the results and generates again, up to
`max_tool_calling_iterations` rounds; tool-result tokens get `tool_mask = 0` and stay out of the loss.
The rubric is split into reward functions (train/rewards.py) weighed with `reward_weights`.
`AgentGRPOTrainer` adds only bookkeeping: it keeps the rollouts (for the reward-hacking detectors and
MLflow), counts zero-variance groups and logs episode metrics (turns, outcomes, tool failures).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_rl.environments.email.tools import TOOL_NAMES
from agent_rl.train.config import GRPOSettings, common_trainer_args
from agent_rl.train.environment import ANSWER_ACK, InboxEnvironment
from agent_rl.train.plugin_rollouts import rollout_class
from agent_rl.train.prompt_filter import FilterReport, filter_prompts
from agent_rl.train.rewards import REWARD_GROUPS, ExtraReward, check_extra_rewards, make_reward_funcs, rollout_scores
from agent_rl.train.static_prefix import StaticPrefix
from agent_rl.train.sft import (
    ADAPTER_DIR,
    MANIFEST,
    RUN_LENGTH_FIELDS,
    inputs_fingerprint,
    load_model,
    lora_config,
    read_jsonl,
    resumable_checkpoint,
    training_dtype,
    write_manifest,
)
from agent_rl.train.tracking import MetricsCallback, Tracker, file_sha256

log = logging.getLogger(__name__)

ROLLOUTS_FILE = "rollouts.jsonl"


@dataclass
class GRPOResult:
    adapter_dir: Path
    steps: int
    losses: list[float]
    reward_means: list[float]
    groups: int  # groups of num_generations rollouts of one prompt
    zero_variance_groups: int  # of those, groups whose rollouts all got the same reward
    rollouts_path: Path
    rollouts: int
    tool_calls: int
    tool_failures: int
    outcomes: dict[str, int]
    filter: dict[str, Any]
    seconds: float
    resumed_from: str | None
    mlflow_run_id: str | None
    history: list[dict[str, float]] = field(default_factory=list)
    static_prefix_tokens: int = 0  # the prompts' shared opening block, computed once per optimizer step
    static_prefix_rows: int = 0  # scored rows that fed only what follows it
    skipped_micro_batches: int = 0  # micro-batches of zero advantage, not scored: their gradient is exactly zero
    scored_micro_batches: int = 0
    budget_cuts: int = 0  # rollouts whose last tool results did not fit max_completion_length (scored as ran out)
    extra_groups: int = 0  # groups rolled out beyond the batch (extra_prompts_per_step); counted in `groups`
    replaced_groups: int = 0  # batch groups that scored alike, replaced by an extra group with reward variance

    @property
    def zero_variance_fraction(self) -> float:
        return self.zero_variance_groups / self.groups if self.groups else 0.0

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("history")
        data["adapter_dir"], data["rollouts_path"] = str(self.adapter_dir), str(self.rollouts_path)
        data["zero_variance_fraction"] = self.zero_variance_fraction
        return data


def _trainer_class():
    """Defined lazily so importing this module does not import TRL (slow; not needed by the detectors)."""
    from trl import GRPOTrainer

    class AgentGRPOTrainer(GRPOTrainer):
        """GRPOTrainer plus rollout bookkeeping; generation, tool loop, masking and loss are TRL's."""

        def __init__(self, *args, group_weights: list[float], rubric, rollouts_kept: int = 256,
                     tool_order: Sequence[str] = TOOL_NAMES, cached_rollouts: bool = True, max_turn_tokens: int | None = None,
                     extra_rewards: list[ExtraReward] | None = None, extra_prompts_per_step: int = 0, **kwargs):
            super().__init__(*args, **kwargs)
            if extra_prompts_per_step and self.accelerator.num_processes > 1:
                raise ValueError("extra_prompts_per_step needs a single process: a group's rollouts may be split "
                                 "across processes, so groups cannot be exchanged locally")
            self.extra_prompts_per_step = extra_prompts_per_step
            if extra_prompts_per_step:  # TRL's completion logs hold one generation batch; ours is larger
                rows = self.args.generation_batch_size + extra_prompts_per_step * self.num_generations
                for key, log in list(self._logs.items()):
                    if isinstance(log, deque):
                        self._logs[key] = deque(log, maxlen=rows)
                    elif isinstance(log, dict):
                        self._logs[key] = defaultdict(lambda rows=rows: deque(maxlen=rows),
                                                      {k: deque(v, maxlen=rows) for k, v in log.items()})
            self.extra_groups = 0
            self.replaced_groups = 0
            self.extra_rewards = list(extra_rewards or [])
            self.cached_rollouts = cached_rollouts
            self.max_turn_tokens = max_turn_tokens
            self._rollout_decoder = None
            self._rollout_weights_step = -1
            self._skip_positions = None  # tool-result positions of the micro-batch being scored
            self._ack_suffix: list[int] | None = None  # ids of the answer's acknowledgement + next turn header
            # TRL lists environment methods alphabetically; serving (and SFT) show the tools in the environment's
            # order. Same schemas, same order => the GRPO prompt is token-identical to the one seen in production.
            order = list(tool_order)

            def position(tool) -> int:
                return order.index(tool.__name__) if tool.__name__ in order else len(order)

            for name, tools in self._env_tools.items():
                self._env_tools[name] = sorted(tools, key=position)
            self.tools = sorted(self.tools, key=position)
            self.group_weights = group_weights
            self.rubric = rubric
            self.rollouts: deque[dict[str, Any]] = deque(maxlen=rollouts_kept)
            self.groups = 0
            self.zero_variance_groups = 0
            self.tool_calls = 0
            self.tool_failures = 0
            self.outcomes: Counter[str] = Counter()
            self.last_batch: dict[str, Any] = {}  # masks of the latest generated batch (tests inspect them)
            self.static_prefix = None  # set by train_grpo (train/static_prefix.py)
            self.skipped_micro_batches = 0
            self.scored_micro_batches = 0
            self.budget_cuts = 0  # rollouts stopped by max_completion_length, not by the policy

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                                  has_tool_images=False):
            """One generation round, where a rollout whose answer was just recorded only closes its turn.

            TRL's tool loop lets the model speak once more after every tool round, also after return_final_answer,
            which ends an episode everywhere else (runner, arbiter, evaluation). Teaching the model an empty
            closing turn for that (SFT used to) made it emit empty turns elsewhere too: 4 of 48 held-out episodes
            ended in one after a fruitless search. Here the closing turn is the end-of-turn token, not generated,
            and `_generate_and_score_completions` keeps it out of the loss."""
            done = [self._answer_recorded(ids) for ids in prompt_ids]
            if not any(done) or images or multimodal_fields:  # multimodal rows: TRL's own path, unchanged
                return self._generate_round(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
            live = [i for i, finished in enumerate(done) if not finished]
            ids, logprobs = ([], None) if not live else self._generate_round(
                [prompt_ids[i] for i in live], images, multimodal_fields, num_generations, has_tool_images)
            all_ids: list[list[int]] = [[self._tokenizer.eos_token_id] for _ in prompt_ids]
            all_logprobs = None if logprobs is None else [[0.0] for _ in prompt_ids]
            for slot, index in enumerate(live):
                all_ids[index] = ids[slot]
                if all_logprobs is not None:
                    all_logprobs[index] = logprobs[slot]
            return all_ids, all_logprobs

        def _mask_closing_tokens(self, output: dict[str, Any]) -> None:
            """Zero the tool mask of the closing tokens `_generate_single_turn` put after a recorded answer (not the
            model's choice: nothing to learn from)."""
            tool_mask = output.get("tool_mask")
            if tool_mask is None or not self._ack_suffix:
                return
            pattern = self._ack_suffix + [self._tokenizer.eos_token_id]
            for row, length in enumerate(output["completion_mask"].sum(1).tolist()):
                ids = output["completion_ids"][row, :int(length)].tolist()
                if ids[-len(pattern):] == pattern:
                    tool_mask[row, int(length) - 1] = 0

        def _answer_recorded(self, ids) -> bool:
            """Whether a rollout's ids end with return_final_answer's acknowledgement (and the next turn header)."""
            if self._ack_suffix is None:
                self._ack_suffix = list(self._get_tool_suffix_ids(
                    [{"role": "tool", "name": "return_final_answer", "content": ANSWER_ACK}]))
            suffix = self._ack_suffix
            return bool(suffix) and len(ids) >= len(suffix) and list(ids[-len(suffix):]) == suffix

        def _generate_round(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            """One generation round of the rollouts. With `cached_rollouts`, our decoder instead of generate(): the
            rows' common prefix (system prompt + tool schemas, ~650 tokens) is computed once per round instead of
            once per row, finished rows leave the batch, and decoding reads the GQA cache in place (eval mode;
            LoRA dropout is 0 so eval and train forwards are the same function). Same contract as TRL's
            transformers path: new ids up to and including the stop token, no sampling logprobs."""
            if not self._cached_rollouts_apply(images, multimodal_fields):
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                     has_tool_images)
            model = self.accelerator.unwrap_model(self.model)
            if self._rollout_decoder is None:
                from agent_rl.agent.local_policy import DEFAULT_TURN_CACHE_TOKENS, LocalPolicy

                # from_model also switches the model to the grouped decoding attention (agent/attention.py).
                # Turn caches: TRL's tool loop sends prompt + completion + tool ids, so a rollout's next turn
                # resumes after its own completion. They hold only while the weights stay as they are (below).
                self._rollout_decoder = LocalPolicy.from_model(
                    model, self.processing_class, version="grpo-rollout", temperature=self.temperature,
                    top_p=self.top_p, reuse_prefix_cache=False,
                    turn_cache_tokens=DEFAULT_TURN_CACHE_TOKENS)
                self._rollout_decoder.stop_token_ids = sorted(set(self.eos_token_ids))
            if self._rollout_weights_step != self.state.global_step:  # an optimizer step changed the weights
                self._rollout_decoder.clear_prefix_cache()
                self._rollout_weights_step = self.state.global_step
            was_training = model.training
            model.eval()
            try:
                # A turn stops where serving stops it (the runner's max_new_tokens), not at the whole budget.
                limit = min(self.max_turn_tokens or self.max_completion_length, self.max_completion_length)
                completion_ids = self._rollout_decoder.generate_ids(list(prompt_ids), limit)
            finally:
                model.train(was_training)
            return completion_ids, None

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            """TRL's loss on a micro-batch without its all-padding columns, scoring only generated tokens.

            TRL pads every micro-batch to the whole generation batch's longest prompt and completion. Dropping
            columns no row of the micro-batch uses changes no loss term (padding is masked, 'dapo' normalises by
            the global token count) but lets attention take its unmasked causal path: one 1,500-token row plus
            one 1,100-token row took 12.4 s to train as two single rows vs 19.5 s as one padded batch of 2. And
            log-probabilities are only needed where tool_mask is 1: tool results (~80% of a completion) are
            masked out of the loss, so the fused LM head skips them (see _get_per_token_logps_and_entropies)."""
            if self._loss_is_zero(inputs):
                self.skipped_micro_batches += 1
                return _zero_loss(model)
            self.scored_micro_batches += 1
            inputs = trim_padding(inputs)
            tool_mask = inputs.get("tool_mask")
            self._skip_positions = None if tool_mask is None else tool_mask == 0
            try:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            finally:
                self._skip_positions = None

        def _loss_is_zero(self, inputs) -> bool:
            """True when the micro-batch's loss and gradient are zero whatever the model says: every loss type
            multiplies each token's term by its completion's advantage, and a group whose rollouts all scored the
            same has advantage 0 (most CPU groups: 6 of 10 on one demo run). Its forward and backward pass, ~60%
            of a step, would add exactly nothing. Anything else in the loss (a KL term, an entropy bonus, a
            router loss) depends on the model, so then the micro-batch is scored as TRL would."""
            advantages = inputs.get("advantages")
            if (not self.model.training or advantages is None or self.beta != 0.0
                    or getattr(self, "_entropy_bonus_enabled", False) or self.aux_loss_enabled):
                return False
            # Identical rewards can leave ~1e-8 of rounding in (reward - group mean) / (std + 1e-4).
            return bool((advantages.abs() <= ZERO_ADVANTAGE).all())

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                               **multimodal):
            import torch

            skip = self._skip_positions
            if (skip is None or compute_aux_loss or any(v is not None for v in multimodal.values())
                    or tuple(skip.shape) != (input_ids.size(0), logits_to_keep)):
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                    compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
            # As TRL's own call, plus label -100 (not scored) on tool-result tokens: their log-probs come back 0,
            # and the loss and the entropy metric multiply them by tool_mask = 0.
            labels = input_ids.masked_fill(attention_mask == 0, -100)
            labels[:, :-logits_to_keep] = -100
            labels[:, -logits_to_keep:] = labels[:, -logits_to_keep:].masked_fill(skip, -100)
            prefix = self.static_prefix
            with self.accelerator.autocast():
                if (prefix is not None and model.training and input_ids.size(1) - len(prefix) > logits_to_keep
                        and prefix.opens(input_ids, attention_mask, labels)):
                    # The prompts' shared opening block: keys/values once per optimizer step (train/static_prefix.py).
                    n = len(prefix)
                    cache = prefix.cache(model, self.state.global_step, input_ids.size(0))
                    positions = torch.arange(n, input_ids.size(1), device=input_ids.device).expand(input_ids.size(0), -1)
                    outputs = model(input_ids=input_ids[:, n:], attention_mask=attention_mask, position_ids=positions,
                                    past_key_values=cache, use_cache=True, labels=labels[:, n:], fused_lm_head=True)
                else:
                    outputs = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                                    fused_lm_head=True)
            entropies = outputs.entropy[:, -logits_to_keep:] if compute_entropy else None
            return outputs.log_probs[:, -logits_to_keep:], entropies, None

        def _cached_rollouts_apply(self, images, multimodal_fields) -> bool:
            from accelerate.utils import DistributedType

            return (self.cached_rollouts and not self.use_vllm and not self.use_transformers_continuous_batching
                    and not images and not multimodal_fields and not self.args.generation_kwargs
                    and self.accelerator.distributed_type == DistributedType.NO
                    and not self.top_k and self.min_p is None and self.repetition_penalty == 1.0)

        def _extra_prompt_inputs(self, inputs) -> list[dict[str, Any]]:
            """G copies each of `extra_prompts_per_step` training rows not in this batch, drawn by a generator
            seeded with the run's seed and the step (a resumed run draws the same)."""
            import random

            dataset = self.train_dataset
            taken = {str(x.get("scenario_id")) for x in inputs}
            ids = dataset["scenario_id"] if "scenario_id" in dataset.column_names else [None] * len(dataset)
            pool = [i for i, sid in enumerate(ids) if sid is None or str(sid) not in taken]
            rng = random.Random(f"{self.args.seed}:{self.state.global_step}")
            chosen = rng.sample(pool, min(self.extra_prompts_per_step, len(pool)))
            return [dict(dataset[i]) for i in chosen for _ in range(self.num_generations)]

        def _generate_and_score_completions(self, inputs):
            batch_rows = len(inputs)
            if self.model.training and self.extra_prompts_per_step:
                inputs = [*inputs, *self._extra_prompt_inputs(inputs)]
            output = super()._generate_and_score_completions(inputs)
            self._mask_closing_tokens(output)
            mode = "train" if self.model.training else "eval"
            completions = list(self._logs["completion"])[-len(inputs):]
            # The user's extra rewards, as TRL computed them for this batch (NaN where a function had no opinion).
            extras = {x.name: (x.weight, list(self._logs["rewards"][x.name])[-len(inputs):]) for x in self.extra_rewards}
            totals = []
            turns = []
            for index, (env, completion) in enumerate(zip(self.environments, completions, strict=True)):
                obs = env._observe(completion)
                groups, components = rollout_scores(env, completion, self.rubric)
                total = sum(w * groups[g] for w, g in zip(self.group_weights, REWARD_GROUPS))
                for name, (weight, values) in extras.items():
                    if values[index] == values[index]:  # not NaN
                        components[f"extra.{name}"] = values[index]
                        total += weight * values[index]
                totals.append(total)
                turns.append(obs.turns)
                self.tool_calls += obs.tool_calls
                self.tool_failures += obs.tool_failures
                self.outcomes[obs.outcome.value] += 1
                self.budget_cuts += obs.budget_cut
                self.rollouts.append(_rollout_record(env, obs, total, components, self.state.global_step,
                                                     index // self.num_generations))
            group_size = self.num_generations
            batch_groups = [totals[i: i + group_size] for i in range(0, len(totals), group_size)]
            zero = sum(1 for g in batch_groups if scored_alike(g))
            self.groups += len(batch_groups)
            self.zero_variance_groups += zero
            if len(inputs) > batch_rows:  # extra prompts were rolled out: keep the batch's size, prefer signal
                wanted = batch_rows // group_size
                kept = choose_groups(totals, group_size, wanted)
                replaced = sum(1 for g in kept if g >= wanted)
                self.extra_groups += len(batch_groups) - wanted
                self.replaced_groups += replaced
                self._metrics[mode]["replaced_groups"].append(float(replaced))
                rows = [g * group_size + k for g in kept for k in range(group_size)]
                trained = set(rows)
                records = list(self.rollouts)[-len(totals):]  # fewer if rollouts_kept is below the batch
                for index, record in enumerate(records, start=len(totals) - len(records)):
                    record["trained"] = index in trained
                output = select_rows(output, rows)
            metrics = self._metrics[mode]
            metrics["episode/turns"].append(sum(turns) / len(turns))
            batch = list(self.rollouts)[-len(totals):]
            for outcome in ("correct", "wrong", "idk", "format_error", "ran_out"):
                metrics[f"episode/{outcome}_rate"].append(sum(r["outcome"] == outcome for r in batch) / len(batch))
            metrics["episode/budget_cut_rate"].append(sum(r["budget_cut"] for r in batch) / len(batch))
            metrics["zero_variance_groups"].append(float(zero))
            self.last_batch = {
                "completion_mask": output["completion_mask"].detach().cpu(),
                "tool_mask": output["tool_mask"].detach().cpu() if "tool_mask" in output else None,
                "completion_ids": output["completion_ids"].detach().cpu(),
            }
            return output

    return AgentGRPOTrainer


def scored_alike(rewards: list[float]) -> bool:
    """A group whose rollouts all got the same reward: zero advantage, nothing to learn."""
    return max(rewards) - min(rewards) < 1e-6


def choose_groups(totals: list[float], group_size: int, wanted: int) -> list[int]:
    """Indices of the `wanted` groups to train on: groups with reward variance first, then groups that scored
    alike, each in generation order (the batch's own groups come first)."""
    groups = [totals[i: i + group_size] for i in range(0, len(totals), group_size)]
    varied = [g for g, values in enumerate(groups) if not scored_alike(values)]
    alike = [g for g, values in enumerate(groups) if scored_alike(values)]
    return sorted((varied + alike)[:wanted])


def select_rows(output: dict[str, Any], rows: list[int]) -> dict[str, Any]:
    """TRL's generated batch with only `rows` (text-only batches: every per-row tensor has the batch as its first
    dimension). `num_items_in_batch`, the loss normaliser of 'dapo', is recounted over what is kept."""
    import torch

    if any(output.get(key) is not None for key in _MULTIMODAL_KEYS):
        raise ValueError("extra_prompts_per_step supports text-only GRPO")
    size = output["completion_ids"].shape[0]
    index = torch.tensor(rows, dtype=torch.long, device=output["completion_ids"].device)
    selected = {}
    for key, value in output.items():
        if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == size:
            selected[key] = value.index_select(0, index)
        elif isinstance(value, list) and len(value) == size:
            selected[key] = [value[i] for i in rows]
        else:
            selected[key] = value
    loss_mask = selected["completion_mask"]
    if selected.get("tool_mask") is not None:
        loss_mask = loss_mask * selected["tool_mask"]
    if isinstance(output.get("num_items_in_batch"), torch.Tensor):
        selected["num_items_in_batch"] = loss_mask.sum().to(output["num_items_in_batch"].dtype)
    return selected


# |advantage| at or below this counts as zero: a zero-variance group's advantages are rounding residue, and
# scoring it is worse than useless when it is a parameter's only gradient: Adam scales it to a full-size step.
ZERO_ADVANTAGE = 1e-6


def _zero_loss(model):
    """0 x the trainable parameters: backward() leaves a zero gradient on each, as scoring the batch would. Not
    None: then a step whose every group had zero variance would skip the optimizer's update for those parameters,
    where TRL's AdamW still moves them by its momentum."""
    trainable = [p.sum() for p in model.parameters() if p.requires_grad]
    return sum(trainable) * 0.0


# Micro-batch tensors aligned with the prompt / the completion columns (text-only GRPO).
_PROMPT_KEYS = ("prompt_ids", "prompt_mask")
_COMPLETION_KEYS = ("completion_ids", "completion_mask", "tool_mask", "old_per_token_logps",
                    "sampling_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio")
_MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "token_type_ids", "mm_token_type_ids", "num_images")


def trim_padding(inputs: dict[str, Any]) -> dict[str, Any]:
    """The micro-batch without the leading prompt columns and trailing completion columns that are padding in
    every one of its rows (multimodal batches are returned unchanged)."""
    if any(inputs.get(key) is not None for key in _MULTIMODAL_KEYS):
        return inputs
    prompt_used = inputs["prompt_mask"].bool().any(0).nonzero()
    completion_used = inputs["completion_mask"].bool().any(0).nonzero()
    start = int(prompt_used[0]) if len(prompt_used) else 0
    end = int(completion_used[-1]) + 1 if len(completion_used) else 1
    prompt_width, completion_width = inputs["prompt_ids"].shape[1], inputs["completion_ids"].shape[1]
    if start == 0 and end == completion_width:
        return inputs
    trimmed = dict(inputs)
    for key in _PROMPT_KEYS:
        if getattr(inputs.get(key), "ndim", 0) == 2 and inputs[key].shape[1] == prompt_width:
            trimmed[key] = inputs[key][:, start:]
    for key in _COMPLETION_KEYS:
        if getattr(inputs.get(key), "ndim", 0) == 2 and inputs[key].shape[1] == completion_width:
            trimmed[key] = inputs[key][:, :end]
    return trimmed


def _rollout_record(env: InboxEnvironment, obs, total: float, components: dict[str, float], step: int,
                    group: int) -> dict[str, Any]:
    return {
        "budget_cut": obs.budget_cut,
        "step": step,
        "trained": True,  # False: an extra group left out of the loss (extra_prompts_per_step)
        "group": group,
        "scenario_id": env.row.get("scenario_id"),
        "environment": env.row.get("environment") or "email",
        "question": obs.question,
        "golden_answer": env.row.get("answer"),
        "final_answer": obs.trace.final_answer,
        "sources": list(obs.trace.sources),
        "reads": list(obs.trace.reads),
        "outcome": obs.outcome.value,
        "format_error": obs.format_error.value if obs.format_error else None,
        "reward": total,
        "reward_components": components,
        "turns": obs.turns,
        "tool_calls": obs.tool_calls,
        "tool_failures": obs.tool_failures,
        "messages": json.loads(json.dumps(obs.messages, default=str)),
    }


def _grpo_config(settings: GRPOSettings, out_dir: Path, group_names: list[str], extra_weights: Sequence[float] = ()):
    from trl import GRPOConfig

    vllm: dict[str, Any] = {}
    if settings.use_vllm:
        vllm = {"use_vllm": True, "vllm_mode": settings.vllm_mode,
                "vllm_gpu_memory_utilization": settings.vllm_gpu_memory_utilization}
        if settings.vllm_server_base_url:
            vllm["vllm_server_base_url"] = settings.vllm_server_base_url
    return GRPOConfig(
        **common_trainer_args(settings, str(out_dir)),
        num_generations=settings.num_generations,
        num_iterations=settings.num_iterations,
        beta=settings.beta,
        epsilon=settings.epsilon,
        loss_type=settings.loss_type,
        scale_rewards=settings.scale_rewards,
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_completion_length=settings.max_completion_length,
        max_tool_calling_iterations=settings.max_tool_calling_iterations,
        mask_truncated_completions=settings.mask_truncated_completions,
        top_entropy_quantile=settings.experimental.top_entropy_quantile,
        generation_kwargs=settings.generation_kwargs,
        reward_weights=[*settings.reward_weights.as_list(group_names), *extra_weights],
        log_completions=False,
        **vllm,
    )


def load_policy_for_grpo(model_path: str | Path, sft_adapter: str | Path | None, settings: GRPOSettings):
    """(model, peft_config, adapter stack). beta == 0: keep training the SFT adapter itself, unless
    experimental.fresh_adapter. beta > 0 or fresh_adapter: merge SFT into the base and train a fresh adapter (so
    TRL's reference, the adapter disabled, is the SFT policy)."""
    from peft import PeftModel

    from agent_rl.agent.precision import load_merged

    if sft_adapter is None:
        return load_model(model_path, settings.compute), lora_config(settings.lora), []
    sft_adapter = Path(sft_adapter)
    if not (sft_adapter / "adapter_config.json").is_file():
        raise ValueError(f"sft_adapter {sft_adapter} is not a PEFT adapter directory (no adapter_config.json)")
    if settings.beta == 0 and not settings.experimental.fresh_adapter:
        model = load_model(model_path, settings.compute)
        return PeftModel.from_pretrained(model, str(sft_adapter), is_trainable=True), None, []
    merged = load_merged(model_path, [sft_adapter], training_dtype(model_path, settings.compute))
    return merged, lora_config(settings.lora), [sft_adapter]


def train_grpo(
    model_path: str | Path,
    sft_adapter: str | Path | None,
    grpo_rows_jsonl: str | Path,
    inbox_store_url: str | None,
    out_dir: str | Path,
    settings: GRPOSettings | None = None,
    tracker: Tracker | None = None,
    solve_rates: dict[str, float] | None = None,
    callbacks: list | None = None,
    extra_rewards: list[ExtraReward] | None = None,
    environment: Any = None,
) -> GRPOResult:
    """GRPO on the rows of `grpo_rows_jsonl`; the adapter lands in out_dir/adapter and the rollouts in
    out_dir/rollouts.jsonl (input of the reward-hacking detectors). `extra_rewards` add reward functions of your
    own to the rubric's, each with its weight.

    The email assistant rolls out against the inbox store at `inbox_store_url` and is scored by its rubric. Any
    other plug-in (`environment`: an Environment instance or a spec `load_environment` accepts) rolls out in its
    own sessions (rows from `plugin_rollouts.task_rows`) and is scored by its own judge. A list of plug-ins trains
    one policy on all of them: each row's `environment` column picks its world, and its prompt shows that
    environment's tools only (TRL's environment_factory by name)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is marked experimental
    from datasets import Dataset
    from transformers import AutoTokenizer

    from agent_rl.environments.email.inbox.store import open_inbox_store

    settings = settings or GRPOSettings()
    extras = check_extra_rewards(extra_rewards or [])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plugins = _plugin_environments(environment)
    plugin = plugins[0] if plugins else None
    rows = read_jsonl(grpo_rows_jsonl)
    needed = ("prompt", "task", "category") if plugin else ("prompt", "inbox", "answer", "category")
    for index, row in enumerate(rows):
        missing = [k for k in needed if k not in row]
        if missing:
            raise ValueError(f"GRPO row {index} ({row.get('scenario_id', '?')}): missing field(s) {', '.join(missing)}")
    if not rows:
        raise ValueError(f"{grpo_rows_jsonl} holds no GRPO rows")
    names = [p.name for p in plugins]
    if len(plugins) > 1:
        strays = sorted({str(row.get("environment")) for row in rows} - set(names))
        if strays:
            raise ValueError(f"GRPO rows of environment(s) {', '.join(strays)} not among those trained on "
                             f"({', '.join(names)})")
    if plugin and settings.prompt_filter.mode == "sampled":
        raise ValueError(f"prompt filter mode 'sampled' plays the email environment only; environment "
                         f"{plugin.name!r} needs mode 'none' or 'solve_rates'")
    if plugin is None and not inbox_store_url:
        raise ValueError("GRPO on the email environment needs inbox_store_url")

    store = open_inbox_store(inbox_store_url) if plugin is None else None
    max_turns = settings.max_turns  # tool rounds + the answer's closing turn
    rows_hash = file_sha256(grpo_rows_jsonl)  # read once: the resume fingerprint and MLflow's dataset hash
    resume = resumable_checkpoint(out_dir, inputs_fingerprint(
        rows_hash, str(model_path), Path(sft_adapter) if sft_adapter else "no SFT adapter",
        inbox_store_url or f"environment {'+'.join(names)}",
        settings.model_dump_json(exclude=RUN_LENGTH_FIELDS), json.dumps(solve_rates or {}, sort_keys=True)))
    if resume:
        # The filter already ran for this out_dir: reuse its choice so the resumed data order is the same.
        kept_path = out_dir / "grpo_prompts.jsonl"
        kept = read_jsonl(kept_path) if kept_path.exists() else rows
        report = FilterReport("resumed", len(rows), len(kept))
    else:
        kept, report = filter_prompts(rows, settings.prompt_filter, solve_rates=solve_rates, model_path=model_path,
                                      adapter=sft_adapter, store=store, max_turns=max_turns, seed=settings.compute.seed)
        with (out_dir / "grpo_prompts.jsonl").open("w", encoding="utf-8") as handle:
            for row in kept:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    if not kept:
        raise ValueError(f"prompt filter kept none of the {len(rows)} GRPO rows ({report.as_dict()}); "
                         "set prompt_filter.keep_when_empty or widen min_rate/max_rate")
    prompts_per_step = settings.per_device_train_batch_size * settings.gradient_accumulation_steps // settings.num_generations
    while len(kept) < prompts_per_step:  # TRL needs a full generation batch of distinct slots
        kept = kept + kept[: prompts_per_step - len(kept)]
    # Plain columns only (strings, lists of strings): the datasets schema stays exact, no nulls creep in.
    dataset = Dataset.from_list([row if plugin else {**row, "source_ids": [str(s) for s in row.get("source_ids") or []],
                                                     "query_date": str(row.get("query_date") or "")} for row in kept])

    tokenizer_dir = sft_adapter if sft_adapter and (Path(sft_adapter) / "tokenizer_config.json").exists() else model_path
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), padding_side="left")
    model, peft_config, stack = load_policy_for_grpo(model_path, sft_adapter, settings)
    group_names = list(REWARD_GROUPS)

    stage = None
    if tracker is not None:
        stage = tracker.start_stage(
            "grpo",
            params={"model_path": str(model_path), "sft_adapter": str(sft_adapter),
                    "environment": "+".join(names) if plugins else "email",
                    "inbox_store": _redact(inbox_store_url) if inbox_store_url else None,
                    "settings": settings.model_dump(mode="json"), "rows": len(rows), "prompts_kept": len(kept),
                    "prompt_filter": report.as_dict(),
                    "extra_rewards": {x.name: x.weight for x in extras}},
            dataset_hashes={"grpo_rows": rows_hash},
        )
    callback = MetricsCallback(stage)
    trainer_cls = _trainer_class()
    trainer = trainer_cls(
        model=model,
        reward_funcs=[*make_reward_funcs(settings.rubric), *(x.func for x in extras)],
        args=_grpo_config(settings, out_dir, group_names, [x.weight for x in extras]),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        environment_factory=_factory(plugins, store, max_turns),
        tool_order=list(dict.fromkeys(t for p in plugins for t in p.tool_names())) if plugins else TOOL_NAMES,
        callbacks=[callback, *(callbacks or [])],
        group_weights=settings.reward_weights.as_list(group_names),
        rubric=settings.rubric,
        rollouts_kept=settings.rollouts_kept,
        cached_rollouts=settings.cached_rollouts,
        max_turn_tokens=settings.max_turn_tokens,
        extra_rewards=extras,
        extra_prompts_per_step=settings.experimental.extra_prompts_per_step,
    )
    if settings.static_prefix and kept and len(plugins) <= 1:  # one system prompt for every row
        from agent_rl.environments.email.tools import tool_schemas

        if kept[0]["prompt"][0].get("role") == "system":
            schemas = plugin.tool_schemas() if plugin else tool_schemas()
            trainer.static_prefix = StaticPrefix.of_system_message(tokenizer, kept[0]["prompt"][0], schemas)
    started = time.perf_counter()
    try:
        trainer.train(resume_from_checkpoint=resume)
    except BaseException:
        if stage is not None:
            stage.finish("FAILED")
        if store is not None:
            store.close()
        raise
    seconds = time.perf_counter() - started

    adapter_dir = out_dir / ADAPTER_DIR
    trainer.model.save_pretrained(str(adapter_dir))
    tokenizer.save_pretrained(str(adapter_dir))
    write_manifest(adapter_dir, model_path, [*stack, adapter_dir])
    rollouts = list(trainer.rollouts)
    rollouts_path = out_dir / ROLLOUTS_FILE
    with rollouts_path.open("w", encoding="utf-8") as handle:
        for rollout in rollouts:
            handle.write(json.dumps(rollout, ensure_ascii=False, default=str) + "\n")

    result = GRPOResult(
        adapter_dir=adapter_dir,
        steps=trainer.state.global_step,
        losses=[h["loss"] for h in callback.history if "loss" in h],
        reward_means=[h["reward"] for h in callback.history if "reward" in h],
        groups=trainer.groups,
        zero_variance_groups=trainer.zero_variance_groups,
        rollouts_path=rollouts_path,
        rollouts=len(rollouts),
        tool_calls=trainer.tool_calls,
        tool_failures=trainer.tool_failures,
        outcomes=dict(trainer.outcomes),
        filter=report.as_dict(),
        seconds=seconds,
        resumed_from=Path(resume).name if resume else None,
        mlflow_run_id=stage.run_id if stage else None,
        history=callback.history,
        static_prefix_tokens=len(trainer.static_prefix or ()),
        static_prefix_rows=trainer.static_prefix.rows if trainer.static_prefix else 0,
        skipped_micro_batches=trainer.skipped_micro_batches,
        scored_micro_batches=trainer.scored_micro_batches,
        budget_cuts=trainer.budget_cuts,
        extra_groups=trainer.extra_groups,
        replaced_groups=trainer.replaced_groups,
    )
    if result.budget_cuts:
        log.warning("GRPO: %d of %d rollouts were cut by max_completion_length=%d (their tool results did not fit) "
                    "and scored as running out; serving has no such budget: raise it", result.budget_cuts,
                    sum(result.outcomes.values()), settings.max_completion_length)
    if result.zero_variance_groups:
        log.info("GRPO: %d of %d groups had zero reward variance (no learning signal); %d of %d micro-batches "
                 "skipped as zero-advantage", result.zero_variance_groups, result.groups,
                 result.skipped_micro_batches, result.skipped_micro_batches + result.scored_micro_batches)
    if stage is not None:
        stage.log_metrics({"zero_variance_groups_total": result.zero_variance_groups, "groups_total": result.groups,
                           "zero_variance_fraction_total": result.zero_variance_fraction,
                           "skipped_micro_batches_total": result.skipped_micro_batches,
                           "budget_cuts_total": result.budget_cuts, "extra_groups_total": result.extra_groups,
                           "replaced_groups_total": result.replaced_groups}, step=result.steps)
        stage.log_curves(["reward", "reward_std", *[f"rewards/reward_{g}/mean" for g in group_names],
                          *[f"rewards/{x.name}/mean" for x in extras],
                          "episode/turns", "frac_reward_zero_std", "loss"])
        stage.log_json(rollouts[-32:], "rollouts_sample.json")
        stage.log_json(result.summary(), "grpo_summary.json")
        stage.set_tags({"adapter_dir": adapter_dir})
        stage.finish()
    if store is not None:
        store.close()
    return result


def _plugin_environments(environment: Any) -> list:
    """The plug-ins GRPO rolls out in; empty for the email assistant (its own rubric path)."""
    from agent_rl.environments.registry import load_environment

    if environment is None:
        return []
    many = list(environment) if isinstance(environment, (list, tuple)) else [environment]
    loaded = [load_environment(e) if isinstance(e, str) else e for e in many]
    if len(loaded) == 1 and loaded[0].name == "email":
        return []
    names = [e.name for e in loaded]
    if "email" in names:
        raise ValueError("the email assistant trains alone (its inbox rubric path); combine it with no other "
                         f"environment, got {', '.join(names)}")
    if len(set(names)) < len(names):
        raise ValueError(f"environments named twice: {', '.join(names)}")
    return loaded


def _factory(plugins: list, store: Any, max_turns: int) -> Any:
    """TRL's environment_factory: the inbox, one plug-in's rollout class, or several by name."""
    if not plugins:
        return lambda: InboxEnvironment(store, max_turns=max_turns)
    if len(plugins) == 1:
        return rollout_class(plugins[0], max_turns)
    return {p.name: rollout_class(p, max_turns) for p in plugins}


def _redact(url: str) -> str:
    """Store URLs may carry a password; MLflow params are readable by everyone with UI access."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def read_rollouts(path: str | Path) -> list[dict[str, Any]]:
    """The rollouts a GRPO run recorded (input of agent_rl.reward.hacking.detect_reward_hacking)."""
    return read_jsonl(path)


__all__ = ["GRPOResult", "MANIFEST", "read_rollouts", "train_grpo"]

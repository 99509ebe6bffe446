"""`AgentGRPOTrainer`: TRL's `GRPOTrainer` plus rollout bookkeeping (see agent_rl/train/grpo.py).

This module imports TRL at its top; `agent_rl.train.grpo` imports it only inside `train_grpo`, so importing
that module (the reward-hacking detectors do) stays cheap.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from typing import Any

import torch
from accelerate.utils import DistributedType, gather_object
from trl import GRPOTrainer

from agent_rl.environments.rollouts import ANSWER_ACK
from agent_rl.train.cpu_resume import CpuResumeMixin
from agent_rl.train.grpo_batches import choose_groups, scored_alike, select_rows, trim_padding
from agent_rl.train.rewards import REWARD_GROUPS, ExtraReward, rollout_scores

# |advantage| at or below this counts as zero: a zero-variance group's advantages are rounding residue, and
# scoring it is worse than useless when it is a parameter's only gradient: Adam scales it to a full-size step.
ZERO_ADVANTAGE = 1e-6
# Where every process holds the whole model (plain or DDP data parallelism): a process can generate its rollouts with
# the unwrapped module alone. Sharded setups (DeepSpeed ZeRO-3, FSDP) need TRL's gathering generation path.
_WHOLE_MODEL_PER_PROCESS = frozenset(t for t in DistributedType if t.value == "NO" or t.value.startswith("MULTI_"))


class AgentGRPOTrainer(CpuResumeMixin, GRPOTrainer):
    """GRPOTrainer plus rollout bookkeeping; generation, tool loop, masking and loss are TRL's."""

    def __init__(self, *args, group_weights: list[float], rubric, tool_order: Sequence[str], rollouts_kept: int = 256,
                 cached_rollouts: bool = True, max_turn_tokens: int | None = None,
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

    # -- Trainer's public API ------------------------------------------------------------------------------------

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

    # -- our own helpers (not TRL methods: none of these names exists in trl 1.16.0's GRPOTrainer) ---------------

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
        zero = bool((advantages.abs() <= ZERO_ADVANTAGE).all())
        if self.accelerator.num_processes == 1:
            return zero
        # Several processes skip together or not at all: TRL's loss gathers its metrics from every process, and
        # the micro-batch that syncs gradients must run DDP's forward and backward everywhere (its all-reduce also
        # carries the micro-batches accumulated before it). One process skipping alone would hang the others.
        if self.accelerator.sync_gradients:
            return False
        votes = self.accelerator.gather(torch.tensor([float(zero)], device=self.accelerator.device))
        return bool(votes.min() > 0)

    def _cached_rollouts_apply(self, images, multimodal_fields) -> bool:
        return (self.cached_rollouts and not self.use_vllm and not self.use_transformers_continuous_batching
                and not images and not multimodal_fields and not self.args.generation_kwargs
                and self.accelerator.distributed_type in _WHOLE_MODEL_PER_PROCESS
                and not self.top_k and self.min_p is None and self.repetition_penalty == 1.0)

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

    def _answer_recorded(self, ids) -> bool:
        """Whether a rollout's ids end with return_final_answer's acknowledgement (and the next turn header)."""
        if self._ack_suffix is None:
            self._ack_suffix = list(self._get_tool_suffix_ids(
                [{"role": "tool", "name": "return_final_answer", "content": ANSWER_ACK}]))
        suffix = self._ack_suffix
        return bool(suffix) and len(ids) >= len(suffix) and list(ids[-len(suffix):]) == suffix

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

    def _extra_prompt_inputs(self, inputs) -> list[dict[str, Any]]:
        """G copies each of `extra_prompts_per_step` training rows not in this batch, drawn by a generator
        seeded with the run's seed and the step (a resumed run draws the same)."""
        dataset = self.train_dataset
        taken = {str(x.get("task_id")) for x in inputs}
        ids = dataset["task_id"] if "task_id" in dataset.column_names else [None] * len(dataset)
        pool = [i for i, sid in enumerate(ids) if sid is None or str(sid) not in taken]
        rng = random.Random(f"{self.args.seed}:{self.state.global_step}")
        chosen = rng.sample(pool, min(self.extra_prompts_per_step, len(pool)))
        return [dict(dataset[i]) for i in chosen for _ in range(self.num_generations)]

    # == Overrides of TRL's private methods =======================================================================
    # Written against trl==1.16.0 (trl/trainer/grpo_trainer.py). TRL may change these signatures or their callers
    # in any release: re-check all three when upgrading (tests/train/test_sft_grpo.py exercises each of them).
    #
    # - _generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
    #   called by TRL's _generate (first turn) and _tool_call_loop (each turn after tool results). Ours closes a
    #   rollout whose return_final_answer was just acknowledged with the end-of-turn token instead of generating
    #   (TRL would let the model speak again: its tool loop has no way for an environment to end a rollout), and
    #   with `cached_rollouts` generates through our prefix-cached decoder (_generate_round) instead of TRL's
    #   transformers generate(). Where _cached_rollouts_apply is false (vLLM, continuous batching,
    #   generation_kwargs, sharded models...) generation is TRL's; multimodal rows skip both changes.
    # - _get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, ...):
    #   while compute_loss scores a micro-batch, tool-result positions (tool_mask == 0) get label -100 so the fused
    #   LM head skips them (their log-probs come back 0, multiplied by tool_mask = 0 in the loss), and the prompts'
    #   shared opening block comes from the static prefix cache when one is set. Any other call (outside
    #   compute_loss, MoE aux loss, multimodal) is TRL's.
    # - _generate_and_score_completions(inputs):
    #   rolls out `extra_prompts_per_step` more groups and keeps the batch's size with the groups that carry reward
    #   variance (select_rows), zeroes the tool mask of the closing token put in by _generate_single_turn, and keeps
    #   the bookkeeping: rollout records, zero-variance groups, outcomes, tool calls/failures, episode metrics.
    #
    # Public hooks checked in trl 1.16.0, none of which replaces an override with the same behaviour:
    # `rollout_func` replaces only the first generation (and receives untokenized prompts; templating moves into
    # it) while _tool_call_loop still calls _generate_single_turn for every later turn; reward functions and
    # `environment.get_reward` see the rollouts but cannot change the batch or its masks; callbacks (on_log,
    # on_step_end) do not see the generated batch; nothing public reaches the labels of the log-prob forward pass.
    # Other TRL internals read (not overridden): self._logs, self._metrics, self._env_tools, self._tokenizer,
    # self.environments, self._entropy_bonus_enabled, self._get_tool_suffix_ids().

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

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                           **multimodal):
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

    def _generate_and_score_completions(self, inputs):
        batch_rows = len(inputs)
        if self.model.training and self.extra_prompts_per_step:
            inputs = [*inputs, *self._extra_prompt_inputs(inputs)]
        output = super()._generate_and_score_completions(inputs)
        self._mask_closing_tokens(output)
        mode = "train" if self.model.training else "eval"
        batch = self._batch_records(inputs)
        totals = [record["reward"] for record in batch]
        for record in batch:
            self.tool_calls += record["tool_calls"]
            self.tool_failures += record["tool_failures"]
            self.outcomes[record["outcome"]] += 1
            self.budget_cuts += record["budget_cut"]
        self.rollouts.extend(batch)
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
            for index, record in enumerate(batch):
                record["trained"] = index in trained
            output = select_rows(output, rows)
        metrics = self._metrics[mode]
        metrics["episode/turns"].append(sum(r["turns"] for r in batch) / len(batch))
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

    def _batch_records(self, inputs) -> list[dict[str, Any]]:
        """Rollout records of the whole generation batch: this process scores its own rows (its environments hold
        their episodes), then every process's records are gathered in rank order, as TRL gathers the rewards. So
        groups, counters, metrics and the records written are the batch's on every process, as one process
        counts them; under several processes each holds whole groups (the batch per process is a multiple of G)."""
        rows, processes = len(inputs), self.accelerator.num_processes
        start = self.accelerator.process_index * rows
        # TRL's logs hold the gathered batch (every process's rows in rank order): this process's rows are its slice.
        def mine(log) -> list:
            return list(log)[-rows * processes:][start:start + rows]

        completions = mine(self._logs["completion"])
        # The user's extra rewards, as TRL computed them for this batch (NaN where a function had no opinion).
        extras = {x.name: (x.weight, mine(self._logs["rewards"][x.name])) for x in self.extra_rewards}
        records = []
        for index, (env, completion) in enumerate(zip(self.environments, completions, strict=True)):
            obs = env._observe(completion)
            groups, components = rollout_scores(env, completion, self.rubric)
            total = sum(w * groups[g] for w, g in zip(self.group_weights, REWARD_GROUPS))
            for name, (weight, values) in extras.items():
                if values[index] == values[index]:  # not NaN
                    components[f"extra.{name}"] = values[index]
                    total += weight * values[index]
            records.append(_rollout_record(env, obs, total, components, self.state.global_step,
                                           (start + index) // self.num_generations))
        return gather_object(records) if processes > 1 else records


def _zero_loss(model):
    """0 x the trainable parameters: backward() leaves a zero gradient on each, as scoring the batch would. Not
    None: then a step whose every group had zero variance would skip the optimizer's update for those parameters,
    where TRL's AdamW still moves them by its momentum."""
    trainable = [p.sum() for p in model.parameters() if p.requires_grad]
    return sum(trainable) * 0.0


def _rollout_record(env: Any, obs, total: float, components: dict[str, float], step: int,
                    group: int) -> dict[str, Any]:
    return {
        "budget_cut": obs.budget_cut,
        "step": step,
        "trained": True,  # False: an extra group left out of the loss (extra_prompts_per_step)
        "group": group,
        "task_id": env.row.get("task_id"),
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


__all__ = ["ZERO_ADVANTAGE", "AgentGRPOTrainer"]

"""A policy that runs a causal LM in-process with transformers: several conversations are rendered with the
chat template and decoded together in one padded batch, then parsed into tool calls (fp32 on CPU by default).

Rollouts repeat one long system prompt (instructions + tool schemas) in every conversation and turn, so its
attention cache is computed once and shared; rows leave the batch as soon as they stop.

A policy whose model has per-row adapters installed (agent/row_lora.py, used by agent/shared_base.py) decodes
rows of several versions in one batch: `act_with_adapters` names each row's adapter, and the caches are kept
per adapter.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveInt

from agent_rl.agent.chat_format import parse_completion, render_prompt
from agent_rl.agent.policy import Conversation, Policy, PolicyTurn, ToolSchema
from agent_rl.agent.turn_cache import CachedRow, TurnCache


# Tokens of earlier turns' attention caches a policy keeps by default (~1.5 GB for SmolLM2-135M in bf16).
DEFAULT_TURN_CACHE_TOKENS = 65536


class LocalPolicyConfig(BaseModel):
    """How to load and sample a local model."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(description="checkpoint directory, or a spec for resolve_model: 'base', 'smollm2', 'tiny'")
    adapter: str | None = Field(None, description="PEFT adapter directory applied (and merged) on top of `model`")
    temperature: NonNegativeFloat = Field(0.0, description="0 means greedy decoding")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass when temperature > 0")
    seed: int | None = Field(None, description="makes sampled generations reproducible across runs")
    batch_size: PositiveInt = Field(8, description="conversations generated together in one forward batch")
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "auto", description="'auto' picks bfloat16 on CUDA and on CPUs with AMX or AVX512_BF16 (fast bf16 matmul), else float32")
    version: str | None = Field(None, description="recorded on episodes; defaults to the model/adapter names")
    reuse_prefix_cache: bool = Field(
        True, description="keep the attention cache of the system prompt + tool schemas between calls; only safe "
                          "while the weights do not change (off by default for from_model, i.e. a model in training)")
    turn_cache_tokens: NonNegativeInt = Field(
        DEFAULT_TURN_CACHE_TOKENS, description="tokens of earlier turns' attention caches kept so a conversation's next turn computes "
        "only its new tokens (agent/turn_cache.py); ~23 KB per token for SmolLM2-135M in bf16. 0 turns it off; "
        "off by default for from_model (weights in training change; a trainer clears it when they do)")


# Below this many shared tokens a separate prefix forward pass costs more than it saves.
MIN_SHARED_PREFIX = 16
# Tells policies apart in a turn cache shared by several of them (agent/shared_base.py).
_CACHE_OWNERS = itertools.count()


@dataclass(eq=False)
class _Request:
    """One caller's chunk of prompts, waiting to be decoded (possibly together with other callers')."""

    prompts: list[list[int]]
    system_length: int
    max_new_tokens: int
    adapters: list[str | None]
    turns: list[PolicyTurn] | None = None
    error: BaseException | None = None
    done: bool = False


class LocalPolicy(Policy):
    """Batched transformers generation behind the Policy interface."""

    def __init__(self, model: str | Path, adapter: str | Path | None = None, **options: Any) -> None:
        self.config = LocalPolicyConfig(model=str(model), adapter=None if adapter is None else str(adapter), **options)
        self.model, self.tokenizer, path = _load(self.config)
        self.version = self.config.version or _default_version(path, self.config.adapter)
        self._setup_generation()

    @classmethod
    def from_config(cls, config: LocalPolicyConfig) -> LocalPolicy:
        return cls(**config.model_dump())

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, version: str = "in-memory", **options: Any) -> LocalPolicy:
        """Wrap an already loaded model (e.g. the one being trained) without reloading it."""
        policy = cls.__new__(cls)
        options.setdefault("reuse_prefix_cache", False)
        options.setdefault("turn_cache_tokens", 0)
        policy.config = LocalPolicyConfig(model="<in-memory>", version=version, **options)
        policy.model, policy.tokenizer, policy.version = model, tokenizer, version
        policy._setup_generation()
        return policy

    def _setup_generation(self) -> None:
        from agent_rl.agent.attention import use_grouped_decode_attention

        use_grouped_decode_attention(self.model)  # decoding reads the GQA cache in place (agent/attention.py)
        tokenizer = self.tokenizer
        tokenizer.padding_side = "left"  # generation continues from the right edge of every row
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        stop = {tokenizer.eos_token_id}
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
            stop.add(im_end)
        self.stop_token_ids = sorted(i for i in stop if i is not None)
        self.context_length = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None
        self._calls = 0
        # One generation at a time: the arbiter calls act() from several threads, and the seed stream is global.
        self._lock = threading.Lock()
        # Per adapter (None: the model as it is): the system block's tokens and their attention cache.
        self._system_cache: dict[str | None, tuple[tuple[int, ...], Any]] = {}
        self._plain_layers = _plain_dynamic_layers(self.model)
        self.turn_cache = TurnCache(self.config.turn_cache_tokens if self._plain_layers else 0)
        self._cache_owner = next(_CACHE_OWNERS)
        self.rows: Any = None  # RowAdapters when per-row adapters are installed (agent/row_lora.py)
        self._waiting: list[_Request] = []  # calls waiting for the lock (decoded together, see _generate)
        self._waiting_lock = threading.Lock()

    def use_turn_cache(self, cache: TurnCache) -> None:
        """Keep earlier turns in `cache` (e.g. one shared by every policy of the process, under one budget)."""
        self.turn_cache = cache if _plain_dynamic_layers(self.model) else TurnCache(0)

    def forget_adapter(self, adapter: str) -> None:
        """Drop the caches computed with `adapter` (it was unloaded). Needs no lock: only dict and cache
        updates, and no batch can still name an adapter nobody serves."""
        self._system_cache.pop(adapter, None)
        self.turn_cache.drop_key((self._cache_owner, adapter))

    def clear_prefix_cache(self) -> None:
        """Forget the cached system-prompt and earlier turns' attention states (call after changing the weights)."""
        with self._lock:
            self._system_cache = {}
            self.turn_cache.clear()

    def act(self, conversations: list[Conversation], tools: list[ToolSchema],
            max_new_tokens: int = 256) -> list[PolicyTurn]:
        return self.act_with_adapters(conversations, [None] * len(conversations), tools, max_new_tokens)

    def act_with_adapters(
        self,
        conversations: list[Conversation],
        adapters: list[str | None],
        tools: list[ToolSchema],
        max_new_tokens: int = 256,
    ) -> list[PolicyTurn]:
        """Like `act`, each conversation answered by the base model with its adapter (None: none)."""
        if any(a is not None for a in adapters) and self.rows is None:
            raise ValueError("this policy's model has no per-row adapters installed")
        turns: list[PolicyTurn | None] = [None] * len(conversations)
        prompts: dict[int, list[int]] = {}
        system_lengths: dict[int, int] = {}
        for index, messages in enumerate(conversations):
            try:
                text = render_prompt(self.tokenizer, messages, tools)
            except Exception as exc:  # a conversation the template cannot render is that turn's format error
                turns[index] = PolicyTurn(parse_error=f"could not render the conversation: {exc}")
                continue
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if self.context_length and len(ids) + max_new_tokens > self.context_length:
                turns[index] = PolicyTurn(
                    parse_error=f"prompt of {len(ids)} tokens + {max_new_tokens} new tokens exceeds the "
                                f"context length {self.context_length}", prompt_tokens=len(ids))
                continue
            prompts[index] = ids
            system_lengths[index] = self._system_block_length(messages, tools, text, ids)
        # Similar lengths together: less padding, same outputs (greedy results do not depend on the batch).
        order = sorted(prompts, key=lambda i: len(prompts[i]))
        size = self.config.batch_size
        for start in range(0, len(order), size):
            chunk = order[start:start + size]
            system = min(system_lengths[i] for i in chunk)
            generated = self._generate([prompts[i] for i in chunk], system, max_new_tokens, [adapters[i] for i in chunk])
            for index, turn in zip(chunk, generated):
                turns[index] = turn
        return [t if t is not None else PolicyTurn(parse_error="no output") for t in turns]

    def _decode(self, batch: dict[str, Any], max_new_tokens: int, prompts: list[list[int]] | None = None,
                adapters: list[str | None] | None = None) -> list[list[int]]:
        """Greedy or sampled decoding of a padded batch; each row's new tokens, ending at its stop token.

        Our own loop rather than generate(): a row that has stopped leaves the batch (and the attention cache) at
        once, so a batch costs what its unfinished rows need instead of running every row to the longest one.
        """
        import torch

        from agent_rl.agent.slot_cache import RESERVE, ensure_room, reserve_slots

        cache, mask, ids = batch["past_key_values"], batch["attention_mask"], batch["input_ids"]
        cached = cache.get_seq_length()
        # Positions count only real tokens, so padding anywhere in a row changes nothing for that row.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        stop = torch.tensor(self.stop_token_ids, device=ids.device)
        self._calls += 1
        generator = None
        if self.config.temperature > 0 and self.config.seed is not None:
            # A different but reproducible stream per call: same seed, same sequence of episodes.
            generator = torch.Generator(device=ids.device).manual_seed(self.config.seed + self._calls)
        active = list(range(ids.shape[0]))
        outputs: list[list[int]] = [[] for _ in active]
        next_positions = positions[:, -1] + 1
        remember = prompts is not None and self.turn_cache.enabled
        starts: list[tuple[int, CachedRow | None]] = batch.get("turn_hits") or [(0, None)] * len(active)
        keys = [(self._cache_owner, a) for a in (adapters or [None] * len(active))]
        row_adapters = adapters or [None] * len(active)
        if self.rows is not None:
            self.rows.set_rows(row_adapters)
        with torch.inference_mode():
            logits, cache = self._prompt_pass(ids, mask, positions, cache, cached, row_adapters)
            # Generated tokens go into reserved slots instead of a concatenation per token (agent/slot_cache.py).
            slots = max_new_tokens > 1 and _plain_dynamic_layers_of(cache)
            if slots:
                reserve_slots(cache, min(RESERVE, max_new_tokens))
            for step in range(max_new_tokens):
                tokens = self._pick(logits.float(), generator)
                for row, token in zip(active, tokens.tolist()):
                    outputs[row].append(token)
                running = ~torch.isin(tokens, stop)
                if step == max_new_tokens - 1 or not bool(running.any()):
                    if remember:
                        for i, row in enumerate(active):
                            self._remember(prompts[row], outputs[row][:-1], cache, mask, i, starts[row], keys[row])
                    break
                if not bool(running.all()):
                    if remember:
                        for i in (~running).nonzero().squeeze(1).tolist():
                            row = active[i]
                            self._remember(prompts[row], outputs[row][:-1], cache, mask, i, starts[row], keys[row])
                    keep = running.nonzero().squeeze(1)
                    cache.batch_select_indices(keep)
                    if self.rows is not None:
                        self.rows.select_rows(keep)
                    mask, tokens, next_positions = mask[keep], tokens[keep], next_positions[keep]
                    active = [active[i] for i in keep.tolist()]
                if slots:
                    written = cache.get_seq_length()
                    mask = ensure_room(cache, mask)
                    mask[:, written] = 1  # the slot this step's token is written to
                else:
                    mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
                logits = self.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_positions[:, None],
                                    past_key_values=cache, use_cache=True).logits[:, -1, :]
                next_positions = next_positions + 1
        return outputs

    def _prompt_pass(self, ids: Any, mask: Any, positions: Any, cache: Any, cached: int,
                     adapters: list[str | None]) -> tuple[Any, Any]:
        """Last-token logits of every row and the filled cache: rows bringing new tokens of very different
        lengths run in groups so the padding is not computed (agent/ragged_prefill.py)."""
        from agent_rl.agent.ragged_prefill import grouped_prefill, new_token_lengths, prefill_groups

        def forward(input_ids: Any, attention_mask: Any, position_ids: Any, past_key_values: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              past_key_values=past_key_values, use_cache=True, logits_to_keep=1).logits[:, -1, :]

        lengths, groups = [], [list(range(ids.shape[0]))]
        if self._plain_layers and ids.shape[0] > 1 and (not cached or _plain_dynamic_layers_of(cache)):
            lengths = new_token_lengths(mask, ids.shape[1] - cached)
            groups = prefill_groups(lengths)
        if len(groups) == 1:
            return forward(ids[:, cached:], mask, positions[:, cached:], cache), cache

        def select_rows(rows: list[int]) -> None:
            if self.rows is not None:
                self.rows.set_rows([adapters[i] for i in rows])

        return grouped_prefill(forward, cache, ids, mask, positions, cached, lengths, groups, select_rows,
                               self.model.config)

    def _pick(self, logits: Any, generator: Any) -> Any:
        """Next token per row: argmax, or a sample from the temperature-scaled nucleus (top_p)."""
        import torch

        if self.config.temperature <= 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / self.config.temperature, dim=-1)
        if self.config.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest set of tokens whose mass reaches top_p (the most likely token always stays).
            outside = sorted_probs.cumsum(-1) - sorted_probs > self.config.top_p
            sorted_probs = sorted_probs.masked_fill(outside, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    def _system_block_length(self, messages: list[dict[str, Any]], tools: list[ToolSchema], text: str,
                             ids: list[int]) -> int:
        """Tokens of the rendered system message + tool schemas at the start of this prompt (0 if none): the part
        every turn of every episode shares, worth keeping in the attention cache."""
        if not messages or not isinstance(messages[0], dict) or messages[0].get("role") != "system":
            return 0
        try:
            block = render_prompt(self.tokenizer, messages[:1], tools, add_generation_prompt=False)
        except Exception:
            return 0
        if not text.startswith(block):
            return 0
        block_ids = self.tokenizer(block, add_special_tokens=False)["input_ids"]
        return len(block_ids) if ids[: len(block_ids)] == block_ids else 0

    def _prefix_cached_batch(self, prompts: list[list[int]], shared: int, system_length: int,
                             adapters: list[str | None]) -> dict[str, Any]:
        """Decoder inputs that skip recomputing the shared prefix: its attention cache is computed once per adapter
        in the batch (the system block is kept across calls), copied for every row, and each row's own suffix
        follows after padding. The mask hides the padding; positions come from the mask, so each row sees exactly
        its prompt."""
        import torch
        from transformers import DynamicCache

        device = self.model.device
        prefix = prompts[0][:shared]
        groups = list(dict.fromkeys(adapters))
        caches = [self._prefix_cache(prefix, system_length, adapter) for adapter in groups]
        if len(groups) == 1:
            cache = caches[0]
            cache.batch_repeat_interleave(len(prompts))
        else:  # each row copies its own adapter's prefix
            index = torch.tensor([groups.index(a) for a in adapters], device=device)
            cache = DynamicCache(ddp_cache_data=[
                (torch.cat([c.layers[i].keys for c in caches])[index], torch.cat([c.layers[i].values for c in caches])[index])
                for i in range(len(caches[0].layers))], config=self.model.config)
        width = max(len(p) for p in prompts) - shared
        pad = self.tokenizer.pad_token_id
        rows, masks = [], []
        for prompt in prompts:
            suffix = prompt[shared:]
            gap = width - len(suffix)
            rows.append(prefix + [pad] * gap + suffix)
            masks.append([1] * shared + [0] * gap + [1] * len(suffix))
        return {"input_ids": torch.tensor(rows, device=device), "attention_mask": torch.tensor(masks, device=device),
                "past_key_values": cache}

    def _prefix_cache(self, prefix: list[int], system_length: int, adapter: str | None) -> Any:
        """One row's attention cache of `prefix` computed with `adapter`; its system block is kept for later calls."""
        import copy

        import torch
        from transformers import DynamicCache

        device = self.model.device
        cache, cached = None, 0
        key = tuple(prefix[:system_length])
        kept = self._system_cache.get(adapter)
        if self.config.reuse_prefix_cache and system_length and kept and kept[0] == key:
            cache, cached = copy.deepcopy(kept[1]), system_length
        if cache is None:
            cache = DynamicCache(config=self.model.config)
        if self.rows is not None:
            self.rows.set_rows([adapter])
        with torch.inference_mode():
            if cached < system_length:
                self.model(torch.tensor([prefix[:system_length]], device=device), past_key_values=cache, use_cache=True)
                cached = system_length
                if self.config.reuse_prefix_cache:
                    self._system_cache[adapter] = (key, copy.deepcopy(cache))
            if cached < len(prefix):
                self.model(torch.tensor([prefix[cached:]], device=device), past_key_values=cache, use_cache=True)
        return cache

    def _turn_cached_batch(self, prompts: list[list[int]], hits: list[tuple[int, CachedRow | None]]) -> dict[str, Any]:
        """Decoder inputs where each row resumes from its own cached prefix (an earlier turn of the same
        conversation): the cached keys/values are left-padded to a common length, each row's new tokens follow
        after padding, and the mask hides both gaps (positions come from the mask)."""
        import torch
        from transformers import DynamicCache

        device = self.model.device
        cached = max(n for n, _ in hits)
        reference = next(row for n, row in hits if n)
        layers = []
        for index, (like, _) in enumerate(reference.layers):
            shape = (len(hits), like.shape[1], cached, like.shape[3])
            keys, values = like.new_zeros(shape), like.new_zeros(shape)
            for i, (n, row) in enumerate(hits):
                if n:
                    keys[i, :, cached - n:] = row.layers[index][0][0, :, :n]
                    values[i, :, cached - n:] = row.layers[index][1][0, :, :n]
            layers.append((keys, values))
        cache = DynamicCache(ddp_cache_data=layers, config=self.model.config)
        self.turn_cache.record_use([n for n, _ in hits])
        width = max(len(p) - n for p, (n, _) in zip(prompts, hits))
        pad = self.tokenizer.pad_token_id
        rows, masks = [], []
        for prompt, (n, _) in zip(prompts, hits):
            suffix = prompt[n:]
            gap = width - len(suffix)
            rows.append([pad] * cached + [pad] * gap + suffix)
            masks.append([0] * (cached - n) + [1] * n + [0] * gap + [1] * len(suffix))
        return {"input_ids": torch.tensor(rows, device=device), "attention_mask": torch.tensor(masks, device=device),
                "past_key_values": cache, "turn_hits": hits}

    def _remember(self, prompt: list[int], fed: list[int], cache: Any, mask: Any, index: int,
                  resumed: tuple[int, CachedRow | None], key: Any = None) -> None:
        """Keep row `index` of the batch cache for a later turn: its unmasked positions hold exactly the prompt
        and the generated tokens fed back so far (`fed`: all but the last one sampled)."""
        valid = mask[index].nonzero().squeeze(1)
        if valid.numel() != len(prompt) + len(fed):
            return  # should not happen; never store a cache that does not match its tokens
        # Indexing with a tensor copies, so the entry does not pin the whole batch cache in memory.
        layers = [(layer.keys[index:index + 1, :, valid], layer.values[index:index + 1, :, valid])
                  for layer in cache.layers]
        self.turn_cache.add(prompt + fed, layers, len(prompt), resumed, key=key)

    def _generate(self, prompts: list[list[int]], system_length: int, max_new_tokens: int,
                  adapters: list[str | None]) -> list[PolicyTurn]:
        if self.rows is None or (self.config.temperature > 0 and self.config.seed is not None):
            with self._lock:
                return self._generate_locked(prompts, system_length, max_new_tokens, adapters)
        # Per-row adapters: calls that wait for the lock (other versions' requests, the gateway's single
        # conversations) are decoded together by whichever thread gets it first. Not with seeded sampling,
        # whose stream per call must not depend on what else was waiting.
        request = _Request(prompts, system_length, max_new_tokens, adapters)
        with self._waiting_lock:
            self._waiting.append(request)
        with self._lock:
            if not request.done:
                self._serve_waiting(request)
        if request.error is not None:
            raise request.error
        return request.turns  # type: ignore[return-value]

    def _serve_waiting(self, first: _Request) -> None:
        """Decode `first` and the waiting calls with the same token limit, up to batch_size rows, in one batch."""
        with self._waiting_lock:
            group, rows = [first], len(first.prompts)
            for request in self._waiting:
                if request is not first and request.max_new_tokens == first.max_new_tokens \
                        and rows + len(request.prompts) <= self.config.batch_size:
                    group.append(request)
                    rows += len(request.prompts)
            self._waiting = [r for r in self._waiting if all(r is not g for g in group)]
        try:
            turns = self._generate_locked([p for r in group for p in r.prompts], min(r.system_length for r in group),
                                          first.max_new_tokens, [a for r in group for a in r.adapters])
        except BaseException as exc:
            for request in group:
                request.error, request.done = exc, True
            raise
        finally:
            self.rows.clear_rows()
        start = 0
        for request in group:
            request.turns, request.done = turns[start:start + len(request.prompts)], True
            start += len(request.prompts)

    def generate_ids(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Each prompt's new token ids, up to and including its stop token (as a trainer wants them): one padded
        batch, the prompts' common prefix computed once, finished rows leaving the batch."""
        if not prompts:
            return []
        with self._lock:
            adapters: list[str | None] = [None] * len(prompts)
            return self._decode(self._batch(prompts, 0, adapters), max_new_tokens, prompts, adapters)

    def _batch(self, prompts: list[list[int]], system_length: int, adapters: list[str | None]) -> dict[str, Any]:
        from transformers import DynamicCache

        shared = _common_prefix_length(prompts)
        hits = ([self.turn_cache.lookup(p, key=(self._cache_owner, a)) for p, a in zip(prompts, adapters)]
                if self.turn_cache.enabled else [])
        longest = max(len(p) for p in prompts)
        # The cheaper prompt pass: rows resuming their own earlier turns, or one shared prefix computed once.
        if hits and max(len(p) - n for p, (n, _) in zip(prompts, hits)) < longest - shared:
            batch = self._turn_cached_batch(prompts, hits)
        elif shared >= MIN_SHARED_PREFIX:
            batch = self._prefix_cached_batch(prompts, shared, min(system_length, shared), adapters)
        else:
            batch = self.tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt")
            batch = {k: v.to(self.model.device) for k, v in batch.items()}
        if "past_key_values" not in batch:
            batch["past_key_values"] = DynamicCache(config=self.model.config)
        return batch

    def _generate_locked(self, prompts: list[list[int]], system_length: int, max_new_tokens: int,
                         adapters: list[str | None]) -> list[PolicyTurn]:
        rows = self._decode(self._batch(prompts, system_length, adapters), max_new_tokens, prompts, adapters)
        turns = []
        for prompt, row in zip(prompts, rows):
            completion = _until_stop(row, self.stop_token_ids)
            text = self.tokenizer.decode(completion, skip_special_tokens=False)
            turn = parse_completion(text)
            turn.prompt_tokens = len(prompt)
            # The stop token is generated and billed like any other token.
            turn.completion_tokens = len(completion) + (1 if len(completion) < len(row) else 0)
            turns.append(turn)
        return turns


def _plain_dynamic_layers_of(cache: Any) -> bool:
    """Slots replace only plain DynamicLayers (sliding-window and other layers keep their own update)."""
    from transformers.cache_utils import DynamicLayer

    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def _plain_dynamic_layers(model: Any) -> bool:
    """Turn caches are spliced per layer: only for models whose cache layers all keep every position."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


def _common_prefix_length(prompts: list[list[int]]) -> int:
    """Tokens all prompts start with, leaving at least one token of each to feed the first decoding step."""
    limit = min(len(p) for p in prompts) - 1
    length = 0
    while length < limit and all(p[length] == prompts[0][length] for p in prompts):
        length += 1
    return length


def _until_stop(row: list[int], stop_ids: list[int]) -> list[int]:
    for position, token in enumerate(row):
        if token in stop_ids:
            return row[:position]
    return row


def _default_version(model_path: Path, adapter: str | None) -> str:
    return f"{model_path.name}+{Path(adapter).name}" if adapter else model_path.name


def _load(config: LocalPolicyConfig) -> tuple[Any, Any, Path]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_rl.agent.models import resolve_model
    from agent_rl.agent.precision import hidden_size_of, load_merged, resolve_dtype

    path = resolve_model(config.model)
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = resolve_dtype(config.dtype, device, hidden_size_of(path))
    tokenizer = AutoTokenizer.from_pretrained(path)
    if config.adapter:
        adapter = Path(config.adapter)
        if not (adapter / "adapter_config.json").is_file():
            raise ValueError(f"adapter {config.adapter!r} is not a PEFT adapter directory (no adapter_config.json)")
        # Merged for inference: one matmul per layer instead of base + low-rank path.
        model = load_merged(path, [adapter], dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.to(device).eval()
    return model, tokenizer, path

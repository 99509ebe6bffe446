"""Typed settings for the two training stages: TRL's own knobs, with defaults that run on a 2-core CPU.

`SFTSettings.gpu()` / `GRPOSettings.gpu()` are presets that differ only in configuration (bf16, vLLM,
gradient checkpointing, bigger groups); the training code is the same.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from agent_rl.reward.rubric import RubricWeights
from agent_rl.turn_budget import DEFAULT_MAX_TURNS, DEFAULT_TURN_TOKENS

# LoRA on every linear projection of a Llama/Qwen2 block: the adapter is tiny next to the base matmuls,
# and attention-only LoRA learned the tool-call format noticeably slower in our SFT runs.
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# Knobs measured and taken out (docs/experiments.md), and knobs that moved under GRPOSettings.experimental: a
# settings dict that still names them is refused with a pointer (any other unknown key is refused too: extra="forbid").
SFT_REMOVED = frozenset({"close_after_answer"})
GRPO_REMOVED = frozenset({"negative_advantage_scale"})
GRPO_MOVED = ("extra_prompts_per_step", "fresh_adapter", "top_entropy_quantile")


def _refuse_removed(values: Any, removed: frozenset[str], moved: tuple[str, ...] = ()) -> Any:
    if not isinstance(values, dict):
        return values
    gone = sorted(set(values) & removed)
    if gone:
        raise ValueError(f"{', '.join(gone)}: removed, measured not to help (docs/experiments.md)")
    elsewhere = sorted(set(values) & set(moved))
    if elsewhere:
        raise ValueError(f"{', '.join(elsewhere)}: moved to experimental (e.g. {{\"experimental\": "
                         f"{{\"{elsewhere[0]}\": ...}}}})")
    return values


class LoraSettings(BaseModel):
    """PEFT LoRA adapter shape."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    r: PositiveInt = Field(16, description="adapter rank")
    alpha: PositiveInt = Field(32, description="scaling numerator (lora_alpha)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter input; 0 skips the extra op")
    target_modules: tuple[str, ...] = Field(DEFAULT_LORA_TARGETS, min_length=1, description="module names to adapt")
    modules_to_save: tuple[str, ...] = Field(
        (), description="modules trained in full next to the adapter (PEFT modules_to_save), e.g. ('norm',)"
    )


class ComputeSettings(BaseModel):
    """Where and in which precision training runs; CPU defaults (docs/architecture.md: fp32, no checkpointing)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    use_cpu: bool = Field(True, description="train on CPU even if an accelerator is visible")
    bf16: bool = Field(False, description="bf16 mixed precision (autocast); TRL turns it on by default, slow on CPU")
    base_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="dtype of the frozen base weights (LoRA adapters always train in fp32); 'auto' = bf16 "
        "on CUDA and on CPUs with AMX or AVX512_BF16, where it cuts the step time 1.4-2x, else fp32 (agent/precision.py)")
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in backward; TRL's default, ~30% slower and pointless on CPU"
    )
    seed: int = Field(0, description="seed for data order, adapter init and sampling")
    dataloader_num_workers: int = Field(0, ge=0)


class SFTSettings(BaseModel):
    """SFT warmup on teacher trajectories (TRL `SFTConfig` knobs plus our data handling)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lora: LoraSettings = Field(default_factory=LoraSettings)
    compute: ComputeSettings = Field(default_factory=ComputeSettings)
    # CPU budget (20 minutes for SFT + GRPO on 2 cores): 96 small optimizer steps of batch 1 x accumulation 2, since
    # rows differ a lot in length and a padded batch pays for its longest row. Fewer steps learn the tool-call format
    # worse, more cost general knowledge (the forgetting gate): docs/experiments.md.
    learning_rate: float = Field(4e-4, gt=0)
    num_train_epochs: float = Field(1.0, gt=0)
    max_steps: int = Field(96, description="optimizer steps; -1 trains num_train_epochs")
    per_device_train_batch_size: PositiveInt = 1
    gradient_accumulation_steps: PositiveInt = 2
    warmup_ratio: float = Field(
        0.0, ge=0, lt=1, description="share of steps warming up; the first warmup step has lr 0 (a lost step on CPU)"
    )
    lr_scheduler_type: str = "cosine"
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    max_length: PositiveInt = Field(
        3072,
        description="longest tokenized row kept; longer rows are dropped with a reason, never truncated "
        "(batches pad to their longest row, so a generous limit costs nothing; 2048 dropped 14 of 386 demo rows)",
    )
    pad_to_multiple_of: PositiveInt | None = Field(
        None, description="pad each batch to a multiple of this many tokens: a few shapes instead of one per row "
        "length, so oneDNN reuses its per-shape kernels (bf16 on CPU)")
    logging_steps: PositiveInt = 1
    save_steps: PositiveInt = Field(16, description="checkpoint every N steps (resume point after a crash)")
    save_total_limit: PositiveInt = Field(2, description="checkpoints kept in out_dir")
    retain_fraction: float = Field(
        0.15, ge=0, lt=1,
        description="share of training rows that rehearse plain chat: general prompts answered by the base model "
        "itself (train/retain.py), so tool-use SFT does not erase general knowledge (the forgetting gate); 0 = off")
    static_prefix: bool = Field(
        True, description="compute the opening block most rows share (instructions + tool schemas, ~610 of ~1,450 "
        "demo tokens, never trained) once per optimizer step without gradient, instead of with every row "
        "(train/static_prefix.py); exact forward, the adapter just is not trained to change that block's keys")

    @model_validator(mode="before")
    @classmethod
    def _no_removed_knobs(cls, values: Any) -> Any:
        return _refuse_removed(values, SFT_REMOVED)

    @classmethod
    def gpu(cls, **overrides) -> SFTSettings:
        """Preset for one or more CUDA GPUs (accelerate launches several); only configuration differs."""
        base = {
            "compute": ComputeSettings(use_cpu=False, bf16=True, gradient_checkpointing=True),
            "per_device_train_batch_size": 16,
            "gradient_accumulation_steps": 1,
            "learning_rate": 2e-4,
            "max_steps": 200,
            "lora": LoraSettings(r=32, alpha=64),
            "max_length": 4096,
        }
        return cls(**{**base, **overrides})


class RewardWeights(BaseModel):
    """TRL `reward_weights`, one per reward function (train/rewards.py); 1.0 everywhere = the rubric's total."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    outcome: float = Field(1.0, description="correctness tiers: correct > I don't know / ran out > wrong")
    format: float = Field(1.0, description="format-error penalties")
    sources: float = Field(1.0, description="right sources, source precision, cited a gold email")
    turns: float = Field(1.0, description="turn efficiency of correct answers (fewer turns)")
    partial: float = Field(1.0, description="partial credit: found / read a gold email")

    def as_list(self, names: list[str]) -> list[float]:
        return [getattr(self, name) for name in names]


class PromptFilterSettings(BaseModel):
    """Keep only prompts the model sometimes solves: groups with zero reward variance teach GRPO nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["none", "solve_rates", "sampled"] = Field(
        "none",
        description="'solve_rates': use given per-task solve rates (e.g. from the SFT evaluation); "
        "'sampled': a quick sampled pre-pass with the SFT model (the GPU preset); 'none': keep every prompt (the "
        "CPU default: the 8-candidate pre-pass cost ~1 of 8 minutes and kept 1 prompt plus the 378 it never saw)",
    )
    samples_per_prompt: PositiveInt = Field(2, description="episodes per prompt in the sampled pre-pass")
    min_rate: float = Field(0.0, ge=0, le=1, description="keep prompts solved more often than this ...")
    max_rate: float = Field(1.0, ge=0, le=1, description="... and less often than this (strict bounds)")
    max_candidates: PositiveInt = Field(
        8, description="prompts looked at by the pre-pass (bounds its cost: 8 x 2 CPU episodes take ~2 min)")
    temperature: float = Field(0.7, gt=0, description="as GRPO's sampling temperature, so rates predict variance")
    keep_when_empty: bool = Field(
        True, description="if no prompt passes, train on the unfiltered ones (reported) instead of failing"
    )


def grpo_rubric() -> RubricWeights:
    """The rubric GRPO trains on: a wrong answer costs 2, not 1 (format errors move down with it, so the tiers keep
    their order). With correct +1 / "I don't know" 0 / wrong -1, answering pays whenever the model is right more
    than half the time, and GRPO learned exactly that: it turned "I don't know" into answers, right and wrong. At -2
    answering pays above 2/3 certainty (measurements: docs/experiments.md). The evaluation and the pool keep the
    rubric of docs/architecture.md (wrong -1): this only sets what GRPO optimises."""
    return RubricWeights(wrong=-2.0, unparsable_tool_call=-3.0, unknown_tool=-2.9, no_tool_call=-2.8, policy_error=-3.0)


class GRPOExperimental(BaseModel):
    """Research knobs: measured on the CPU demo and not adopted, kept for stronger policies or other budgets. Each
    is off by default; what it did is in docs/experiments.md."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    extra_prompts_per_step: NonNegativeInt = Field(
        0, description="prompts rolled out beyond the generation batch (G rollouts each); their groups with reward "
                       "variance take the places of batch groups that scored alike, which teach nothing (DAPO's "
                       "dynamic sampling, bounded: one extra generation). Costs their rollouts; a single process only")
    fresh_adapter: bool = Field(
        False, description="with beta 0 too: merge the SFT adapter into the base and train a new zero-initialised "
                           "adapter over it instead of training the SFT adapter on (Adam's first, sign-sized steps "
                           "then move the policy less); the served model is base + SFT + GRPO")
    top_entropy_quantile: float = Field(
        1.0, gt=0, le=1, description="TRL's top_entropy_quantile: share of each completion's generated tokens, by "
                                     "entropy, that the policy loss keeps ('Beyond the 80/20 rule': 0.2 trains only "
                                     "the forking tokens); 1 keeps all")


class GRPOSettings(BaseModel):
    """Multi-turn GRPO with tool rollouts: TRL `GRPOConfig` knobs under TRL's names, with CPU defaults. Why each
    default is what it is, with the measurements: docs/experiments.md."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lora: LoraSettings = Field(default_factory=LoraSettings,
                               description="shape of the fresh adapter (beta > 0 or experimental.fresh_adapter)")
    compute: ComputeSettings = Field(default_factory=ComputeSettings)
    # 5 steps of ~40-110 s on 2 cores keep SFT + GRPO near 17 minutes; 10 did no better. 3e-5 moved fewer answers
    # the wrong way than 1e-4 on the same rollouts.
    learning_rate: float = Field(3e-5, gt=0)
    max_steps: PositiveInt = 5
    num_generations: int = Field(4, ge=2, description="group size G")
    # Generation batch = per_device_train_batch_size x gradient_accumulation_steps (TRL steps_per_generation):
    # 2 prompts x G=4 rollouts generated together, the loss back-propagated 1 completion at a time (all 8 ~1.9k-token
    # completions in one backward pass needed >22 GB on CPU).
    per_device_train_batch_size: PositiveInt = Field(
        1, description="completions per backward pass; 1 on CPU: a row alone needs no padding mask (1.6x faster)")
    gradient_accumulation_steps: PositiveInt = Field(8, description="micro-batches per optimizer step")
    num_iterations: PositiveInt = Field(1, description="optimizer passes per generated batch (mu)")
    beta: float = Field(0.0, ge=0, description="KL coefficient; 0 loads no reference model. > 0: the SFT adapter is "
                                               "merged and a fresh one trained (TRL's reference is the adapter off); "
                                               "every micro-batch is then scored (GRPO 1.2-1.5x longer)")
    epsilon: float = Field(0.2, gt=0)
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo"] = "dapo"
    # "none" (Dr. GRPO): advantage = reward - group mean. Scaling by each group's std gave the 0.1-0.4 that a cited
    # source or partial credit adds inside an all-correct or all-wrong group the weight of right against wrong.
    scale_rewards: Literal["group", "batch", "none"] = "none"
    temperature: float = Field(
        0.7, gt=0, description="below 1: a 135M model sampled at 1.0 breaks long ids, and at 0.8 got 17 of 32 "
                               "rollouts wrong where greedy gets ~30% wrong: rollouts should resemble the served policy")
    top_p: float = Field(1.0, gt=0, le=1)
    # Serving has no such budget, so it should almost never bind: a cut rollout scores as running out, whatever it
    # would have said (at 1,792 tokens a quarter of the rollouts that read four emails together were cut).
    max_completion_length: PositiveInt = Field(
        3072, description="token budget of the whole multi-turn completion, tool results included; rollouts it cuts "
                          "are counted (GRPOResult.budget_cuts) and warned about"
    )
    max_turns: int = Field(
        DEFAULT_MAX_TURNS, ge=2, description="turn budget of a rollout: its tool rounds (TRL's max_tool_calling_"
        "iterations = max_turns - 1) plus the answer's turn; the runner's and the evaluation's budget by default, so "
        "the turn-efficiency reward means the same in training and evaluation (agent_rl/turn_budget.py)")
    max_turn_tokens: PositiveInt | None = Field(
        DEFAULT_TURN_TOKENS, description="tokens one rollout turn may generate, as the runner's max_new_tokens when serving (a turn "
                         "cut there is a truncated call, a format error, in both); None: up to the remaining budget. "
                         "Applies to cached rollouts (the CPU path); TRL's own generation (vLLM, generate()) "
                         "lets a turn run to max_completion_length")
    cached_rollouts: bool = Field(
        True, description="generate rollout turns with the prefix-cached decoder (shared system prompt computed once "
                          "per round, finished rows leave the batch) instead of transformers generate(); ignored "
                          "with vLLM, multimodal inputs, top_k/min_p/repetition_penalty or sharded models "
                          "(DeepSpeed ZeRO-3, FSDP)")
    mask_truncated_completions: bool = False
    generation_kwargs: dict[str, Any] | None = Field(
        None, description="extra transformers/vLLM sampling options (TRL generation_kwargs), e.g. sequence_bias"
    )
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    lr_scheduler_type: str = "constant"
    max_grad_norm: float = Field(1.0, gt=0)
    logging_steps: PositiveInt = 1
    save_steps: PositiveInt = 5
    save_total_limit: PositiveInt = 2
    use_vllm: bool = False
    vllm_mode: Literal["colocate", "server"] = "colocate"
    vllm_server_base_url: str | None = None
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    reward_weights: RewardWeights = Field(default_factory=RewardWeights)
    rubric: RubricWeights = Field(default_factory=grpo_rubric,
                                  description="the rubric's tier values GRPO trains on (see grpo_rubric: wrong -2)")
    prompt_filter: PromptFilterSettings = Field(default_factory=PromptFilterSettings)
    rollouts_kept: PositiveInt = Field(256, description="most rollouts kept for the hacking detectors / MLflow")
    static_prefix: bool = Field(
        True, description="score rollouts without re-running the prompts' shared opening block (instructions + tool "
        "schemas): its keys/values are computed once per optimizer step without gradient (train/static_prefix.py)")
    experimental: GRPOExperimental = Field(
        default_factory=GRPOExperimental, description="research knobs, off by default (docs/experiments.md)")

    @model_validator(mode="before")
    @classmethod
    def _no_removed_knobs(cls, values: Any) -> Any:
        return _refuse_removed(values, GRPO_REMOVED, GRPO_MOVED)

    @model_validator(mode="before")
    @classmethod
    def _tool_rounds_as_turns(cls, values: Any) -> Any:
        """TRL's `max_tool_calling_iterations` (tool rounds) is still accepted, as max_turns = rounds + 1."""
        if not isinstance(values, dict) or "max_tool_calling_iterations" not in values:
            return values
        values = dict(values)
        rounds = values.pop("max_tool_calling_iterations")
        if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
            raise ValueError(f"max_tool_calling_iterations must be a positive integer (tool rounds), got {rounds!r}")
        if values.setdefault("max_turns", rounds + 1) != rounds + 1:
            raise ValueError(f"max_tool_calling_iterations={rounds} and max_turns={values['max_turns']} disagree: "
                             "set max_turns alone (tool rounds + the answer's turn)")
        return values

    @property
    def max_tool_calling_iterations(self) -> int:
        """TRL's name for a rollout's tool rounds: every turn but the answer's."""
        return self.max_turns - 1

    @field_validator("rubric", mode="before")
    @classmethod
    def _rubric_overrides_grpo_rubric(cls, value: Any) -> Any:
        """{"rubric": {"correct": 1.5}} changes one number of GRPO's rubric, not of the evaluation's."""
        if isinstance(value, dict):
            return {**grpo_rubric().model_dump(), **value}
        return value

    @model_validator(mode="after")
    def _group_fits_batch(self) -> GRPOSettings:
        generation_batch = self.per_device_train_batch_size * self.gradient_accumulation_steps
        if generation_batch % self.num_generations:
            raise ValueError(
                f"per_device_train_batch_size x gradient_accumulation_steps ({generation_batch}) must be a multiple "
                f"of num_generations ({self.num_generations})"
            )
        if self.vllm_mode == "server" and self.use_vllm and not self.vllm_server_base_url:
            raise ValueError("vllm_mode='server' needs vllm_server_base_url (e.g. http://vllm:8000)")
        return self

    @classmethod
    def gpu(cls, **overrides) -> GRPOSettings:
        """Preset for CUDA GPUs with vLLM colocated generation; only configuration differs."""
        base = {
            "compute": ComputeSettings(use_cpu=False, bf16=True, gradient_checkpointing=True),
            "use_vllm": True,
            "vllm_mode": "colocate",
            "num_generations": 8,
            "per_device_train_batch_size": 32,
            "max_steps": 200,
            "beta": 0.0,
            "max_completion_length": 4096,
            "temperature": 1.0,
            "learning_rate": 1e-5,
            "prompt_filter": PromptFilterSettings(mode="sampled", samples_per_prompt=4, max_candidates=1024),
        }
        return cls(**{**base, **overrides})


def common_trainer_args(settings: SFTSettings | GRPOSettings, out_dir: str) -> dict[str, Any]:
    """The `TrainingArguments` both stages set the same way: schedule, checkpoints, compute, quiet logging."""
    compute = settings.compute
    return {
        "output_dir": out_dir,
        "learning_rate": settings.learning_rate,
        "max_steps": settings.max_steps,
        "per_device_train_batch_size": settings.per_device_train_batch_size,
        "gradient_accumulation_steps": settings.gradient_accumulation_steps,
        "warmup_steps": settings.warmup_ratio,  # transformers 5: a float < 1 is a ratio of the steps
        "lr_scheduler_type": settings.lr_scheduler_type,
        "max_grad_norm": settings.max_grad_norm,
        "logging_steps": settings.logging_steps,
        "save_strategy": "steps",
        "save_steps": settings.save_steps,
        "save_total_limit": settings.save_total_limit,
        "seed": compute.seed,
        "use_cpu": compute.use_cpu,
        "bf16": compute.bf16,
        "gradient_checkpointing": compute.gradient_checkpointing,
        "dataloader_num_workers": compute.dataloader_num_workers,
        "report_to": "none",
        "disable_tqdm": True,
    }

"""Multi-turn GRPO: TRL `GRPOTrainer` continues from the SFT adapter, with tool rollouts in the inbox environment.

TRL 1.16 runs the rollouts itself (`environment_factory`): it generates, parses `<tool_call>` blocks,
calls the environment's tool methods, appends the results and generates again, up to
`max_tool_calling_iterations` rounds; tool-result tokens get `tool_mask = 0` and stay out of the loss.
The rubric is split into reward functions (train/rewards.py) weighed with `reward_weights`.
`AgentGRPOTrainer` (train/grpo_trainer.py, which imports TRL: loaded only by `train_grpo`) adds only bookkeeping:
it keeps the rollouts (for the reward-hacking detectors and MLflow), counts zero-variance groups and logs episode
metrics (turns, outcomes, tool failures).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_rl.train.config import GRPOSettings, common_trainer_args
from agent_rl.train.outputs import ROLLOUTS_FILE
from agent_rl.train.plugin_rollouts import rollout_factory
from agent_rl.train.prompt_filter import FilterReport, filter_prompts
from agent_rl.train.rewards import REWARD_GROUPS, ExtraReward, check_extra_rewards, make_reward_funcs
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

DDP_TIMEOUT_SECONDS = 4 * 3600


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
    """The trainer class (agent_rl/train/grpo_trainer.py), imported on first use so that importing this module does
    not import TRL (slow; not needed by the detectors)."""
    from agent_rl.train.grpo_trainer import AgentGRPOTrainer

    return AgentGRPOTrainer


# GRPOSettings fields that GRPOConfig takes as they are, under the same name.
_GRPO_CONFIG_FIELDS = ("num_generations", "num_iterations", "beta", "epsilon", "loss_type", "scale_rewards",
                       "temperature", "top_p", "max_completion_length", "max_tool_calling_iterations",
                       "mask_truncated_completions", "generation_kwargs")


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
        **{name: getattr(settings, name) for name in _GRPO_CONFIG_FIELDS},
        top_entropy_quantile=settings.experimental.top_entropy_quantile,
        reward_weights=[*settings.reward_weights.as_list(group_names), *extra_weights],
        log_completions=False,
        # Processes wait for each other at each generation batch (and for rank 0's prompt filter) for as long as
        # the slowest one rolls out; torch's 30 minutes would turn a long sampled pre-pass into a crash.
        ddp_timeout=DDP_TIMEOUT_SECONDS,
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
    store_url: str | None,
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

    With no `environment`, or one that trains alone (its world a store of its own), GRPO plays it (by default the
    registry's, the email assistant) on the store at `store_url`, with its own rows and rollouts, scored by
    the rubric. Any other plug-in (`environment`: an Environment instance or a spec `load_environment` accepts)
    rolls out in its own sessions (rows from `plugin_rollouts.task_rows`) and is scored by its own judge. A list of
    plug-ins trains one policy on all of them: each row's `environment` column picks its world, and its prompt
    shows that environment's tools only (TRL's environment_factory by name)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is marked experimental
    from transformers import AutoTokenizer

    from agent_rl.environments.registry import DEFAULT, load_environment

    settings = settings or GRPOSettings()
    extras = check_extra_rewards(extra_rewards or [])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plugins, alone = _plugin_environments(environment)
    plugin = plugins[0] if plugins else None
    rows = read_jsonl(grpo_rows_jsonl)
    _check_rows(rows, plugins, settings, grpo_rows_jsonl, store_url)
    names = [p.name for p in plugins]
    max_turns = settings.max_turns  # tool rounds + the answer's closing turn
    # The environments rolled out in: the plug-ins, or the one that trains alone on its store (rubric rollouts).
    played = plugins or [load_environment(alone or DEFAULT, store_url=store_url)]
    factory = _factory(played, max_turns)
    rows_hash = file_sha256(grpo_rows_jsonl)  # read once: the resume fingerprint and MLflow's dataset hash
    resume = resumable_checkpoint(out_dir, inputs_fingerprint(
        rows_hash, str(model_path), Path(sft_adapter) if sft_adapter else "no SFT adapter",
        store_url or f"environment {'+'.join(names)}",
        settings.model_dump_json(exclude=RUN_LENGTH_FIELDS), json.dumps(solve_rates or {}, sort_keys=True)))
    group_names = list(REWARD_GROUPS)
    # Built first: reading its world size starts the process group under `accelerate launch`.
    args = _grpo_config(settings, out_dir, group_names, [x.weight for x in extras])
    kept, report = _kept_rows(rows, resume, out_dir, settings, args.world_size, solve_rates=solve_rates,
                              model_path=model_path, adapter=sft_adapter, environment=played[0],
                              max_turns=max_turns)
    dataset = _dataset(kept, plugin)

    tokenizer_dir = sft_adapter if sft_adapter and (Path(sft_adapter) / "tokenizer_config.json").exists() else model_path
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), padding_side="left")
    model, peft_config, stack = load_policy_for_grpo(model_path, sft_adapter, settings)

    stage = None
    if tracker is not None:
        stage = tracker.start_stage(
            "grpo",
            params={"model_path": str(model_path), "sft_adapter": str(sft_adapter),
                    "environment": "+".join(p.name for p in played),
                    "store": _redact(store_url) if store_url else None,
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
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        environment_factory=factory,
        tool_order=list(dict.fromkeys(t for p in played for t in p.tool_names())),
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
        trainer.static_prefix = _static_prefix(tokenizer, kept[0]["prompt"][0], played[0])
    started = time.perf_counter()
    try:
        trainer.train(resume_from_checkpoint=resume)
    except BaseException:
        if stage is not None:
            stage.finish("FAILED")
        _close(played, loaded_here=not plugins)
        raise
    seconds = time.perf_counter() - started

    adapter_dir, rollouts_path, rollouts = _save_outputs(trainer, tokenizer, out_dir, model_path, stack)
    result = _grpo_result(trainer, callback.history, adapter_dir, rollouts_path, len(rollouts), report, seconds,
                          resume, stage)
    _report(result, stage, settings.max_completion_length, group_names, extras, rollouts)
    _close(played, loaded_here=not plugins)
    return result


def _close(played: list, loaded_here: bool) -> None:
    """Release what the environment loaded here opened for its rollouts and the prompt filter (the email
    assistant's mail store); plug-ins stay open (the caller gave them, or loaded them for several uses)."""
    if loaded_here:
        for environment in played:
            environment.close()


def _check_rows(rows: list[dict[str, Any]], plugins: list, settings: GRPOSettings, grpo_rows_jsonl: str | Path,
                store_url: str | None) -> None:
    """Fail before any work on rows, plug-ins and settings that cannot train together."""
    plugin = plugins[0] if plugins else None
    needed = ("prompt", "task", "category")  # every environment's rows; its own rollouts check their own columns
    for index, row in enumerate(rows):
        missing = [k for k in needed if k not in row]
        if missing:
            raise ValueError(f"GRPO row {index} ({row.get('task_id', '?')}): missing field(s) {', '.join(missing)}")
    if not rows:
        raise ValueError(f"{grpo_rows_jsonl} holds no GRPO rows")
    names = [p.name for p in plugins]
    if len(plugins) > 1:
        strays = sorted({str(row.get("environment")) for row in rows} - set(names))
        if strays:
            raise ValueError(f"GRPO rows of environment(s) {', '.join(strays)} not among those trained on "
                             f"({', '.join(names)})")
    if len(plugins) > 1 and settings.prompt_filter.mode == "sampled":  # the pre-pass plays one environment
        raise ValueError(f"prompt filter mode 'sampled' plays one environment; training on {', '.join(names)} at "
                         "once needs mode 'none' or 'solve_rates'")
    if plugin is None and not store_url:
        raise ValueError("GRPO on an environment that trains alone (the email assistant) needs its store_url")


def _kept_rows(rows: list[dict[str, Any]], resume: str | None, out_dir: Path, settings: GRPOSettings,
               processes: int = 1, **filter_options: Any) -> tuple[list[dict[str, Any]], FilterReport]:
    """The rows the prompt filter keeps, repeated up to one generation batch of distinct prompts (over all
    processes). Under several processes rank 0 filters and every process trains on its choice: the sampled
    pre-pass need not come out the same in each, and TRL's sampler indexes one dataset for all of them."""
    if processes > 1:
        from accelerate import PartialState
        from accelerate.utils import broadcast_object_list

        main = PartialState().is_main_process  # the state GRPOConfig started
        chosen = [_filtered_rows(rows, resume, out_dir, settings, **filter_options) if main else None]
        kept, report = broadcast_object_list(chosen, from_process=0)[0]
    else:
        kept, report = _filtered_rows(rows, resume, out_dir, settings, **filter_options)
    if not kept:
        raise ValueError(f"prompt filter kept none of the {len(rows)} GRPO rows ({report.as_dict()}); "
                         "set prompt_filter.keep_when_empty or widen min_rate/max_rate")
    prompts_per_step = (settings.per_device_train_batch_size * settings.gradient_accumulation_steps * processes
                        // settings.num_generations)
    while len(kept) < prompts_per_step:  # TRL needs a full generation batch of distinct slots
        kept = kept + kept[: prompts_per_step - len(kept)]
    return kept, report


def _filtered_rows(rows: list[dict[str, Any]], resume: str | None, out_dir: Path, settings: GRPOSettings, *,
                   solve_rates: dict[str, float] | None, model_path: str | Path, adapter: str | Path | None,
                   environment: Any, max_turns: int) -> tuple[list[dict[str, Any]], FilterReport]:
    """The rows the prompt filter keeps (saved to out_dir/grpo_prompts.jsonl); a resumed run reuses that file."""
    if resume:
        # The filter already ran for this out_dir: reuse its choice so the resumed data order is the same.
        kept_path = out_dir / "grpo_prompts.jsonl"
        kept = read_jsonl(kept_path) if kept_path.exists() else rows
        return kept, FilterReport("resumed", len(rows), len(kept))
    kept, report = filter_prompts(rows, settings.prompt_filter, solve_rates=solve_rates, model_path=model_path,
                                  adapter=adapter, environment=environment, max_turns=max_turns,
                                  seed=settings.compute.seed)
    with (out_dir / "grpo_prompts.jsonl").open("w", encoding="utf-8") as handle:
        for row in kept:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return kept, report


def _dataset(kept: list[dict[str, Any]], plugin: Any):
    """The training dataset. Plain columns only (strings, lists of strings): the datasets schema stays exact, no
    nulls creep in."""
    from datasets import Dataset

    return Dataset.from_list([row if plugin else {**row, "source_ids": [str(s) for s in row.get("source_ids") or []],
                                                  "query_date": str(row.get("query_date") or "")} for row in kept])


def _static_prefix(tokenizer, system_message: dict[str, Any], environment: Any) -> StaticPrefix | None:
    """The prompts' shared opening block (train/static_prefix.py), when the prompts open with a system message."""
    if system_message.get("role") == "system":
        return StaticPrefix.of_system_message(tokenizer, system_message, environment.tool_schemas())
    return None


def _save_outputs(trainer, tokenizer, out_dir: Path, model_path: str | Path,
                  stack: list) -> tuple[Path, Path, list[dict[str, Any]]]:
    """(adapter dir, rollouts file, rollouts): the trained adapter with its manifest, and the rollouts kept."""
    adapter_dir = out_dir / ADAPTER_DIR
    rollouts = list(trainer.rollouts)  # the whole batches', gathered from every process
    rollouts_path = out_dir / ROLLOUTS_FILE
    if not trainer.accelerator.is_main_process:  # rank 0 writes them (other ranks may share out_dir)
        return adapter_dir, rollouts_path, rollouts
    trainer.model.save_pretrained(str(adapter_dir))
    tokenizer.save_pretrained(str(adapter_dir))
    write_manifest(adapter_dir, model_path, [*stack, adapter_dir])
    with rollouts_path.open("w", encoding="utf-8") as handle:
        for rollout in rollouts:
            handle.write(json.dumps(rollout, ensure_ascii=False, default=str) + "\n")
    return adapter_dir, rollouts_path, rollouts


def _grpo_result(trainer, history: list[dict[str, float]], adapter_dir: Path, rollouts_path: Path, rollouts: int,
                 report: FilterReport, seconds: float, resume: str | None, stage: Any) -> GRPOResult:
    return GRPOResult(
        adapter_dir=adapter_dir,
        steps=trainer.state.global_step,
        losses=[h["loss"] for h in history if "loss" in h],
        reward_means=[h["reward"] for h in history if "reward" in h],
        groups=trainer.groups,
        zero_variance_groups=trainer.zero_variance_groups,
        rollouts_path=rollouts_path,
        rollouts=rollouts,
        tool_calls=trainer.tool_calls,
        tool_failures=trainer.tool_failures,
        outcomes=dict(trainer.outcomes),
        filter=report.as_dict(),
        seconds=seconds,
        resumed_from=Path(resume).name if resume else None,
        mlflow_run_id=stage.run_id if stage else None,
        history=history,
        static_prefix_tokens=len(trainer.static_prefix or ()),
        static_prefix_rows=trainer.static_prefix.rows if trainer.static_prefix else 0,
        skipped_micro_batches=trainer.skipped_micro_batches,
        scored_micro_batches=trainer.scored_micro_batches,
        budget_cuts=trainer.budget_cuts,
        extra_groups=trainer.extra_groups,
        replaced_groups=trainer.replaced_groups,
    )


def _report(result: GRPOResult, stage: Any, max_completion_length: int, group_names: list[str],
            extras: list[ExtraReward], rollouts: list[dict[str, Any]]) -> None:
    """Warn about budget cuts, say how many groups carried no signal, and close the MLflow stage."""
    if result.budget_cuts:
        log.warning("GRPO: %d of %d rollouts were cut by max_completion_length=%d (their tool results did not fit) "
                    "and scored as running out; serving has no such budget: raise it", result.budget_cuts,
                    sum(result.outcomes.values()), max_completion_length)
    if result.zero_variance_groups:
        log.info("GRPO: %d of %d groups had zero reward variance (no learning signal); %d of %d micro-batches "
                 "skipped as zero-advantage", result.zero_variance_groups, result.groups,
                 result.skipped_micro_batches, result.skipped_micro_batches + result.scored_micro_batches)
    if stage is None:
        return
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
    stage.set_tags({"adapter_dir": result.adapter_dir})
    stage.finish()


def _plugin_environments(environment: Any) -> tuple[list, str | None]:
    """The plug-ins GRPO rolls out in with the loop's task rows, and the spec of an environment given that trains
    alone instead (`World.trains_alone`: played on `store_url` with its own rows; no plug-ins then)."""
    from agent_rl.environments.registry import load_environment

    if environment is None:
        return [], None
    many = list(environment) if isinstance(environment, (list, tuple)) else [environment]
    loaded = [load_environment(e) if isinstance(e, str) else e for e in many]
    names = [e.name for e in loaded]
    alone = [e for e in loaded if e.world().trains_alone]
    if alone and len(loaded) == 1:
        return [], many[0] if isinstance(many[0], str) else loaded[0].name
    if alone:
        raise ValueError(f"{', '.join(repr(e.name) for e in alone)} trains alone (its world is a store of its own); "
                         f"combine it with no other environment, got {', '.join(names)}")
    if len(set(names)) < len(names):
        raise ValueError(f"environments named twice: {', '.join(names)}")
    return loaded, None


def _factory(played: list, max_turns: int) -> Any:
    """TRL's environment_factory: its world's own rollouts (`World.rollout_factory`) or the loop's
    plug-in rollouts; several environments by name."""
    if len(played) == 1:
        return rollout_factory(played[0], max_turns)
    return {p.name: rollout_factory(p, max_turns) for p in played}


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

"""Training: SFT warmup and multi-turn GRPO (TRL + PEFT), MLflow tracking, and the Pipes entry point.

Public API (imports are lazy so `import agent_rl.train` stays cheap):
    train_sft(model_path, rows_jsonl, out_dir, settings=None, tracker=None) -> SFTResult
    train_grpo(model_path, sft_adapter, grpo_rows_jsonl, store_url, out_dir, settings=None,
               tracker=None, solve_rates=None, extra_rewards=None) -> GRPOResult
    SFTSettings, GRPOSettings (.gpu() presets), Tracker, ExtraReward (a reward function of your own + weight)
"""

from __future__ import annotations

from typing import Any

from agent_rl.train.config import GRPOSettings, PromptFilterSettings, RewardWeights, SFTSettings

__all__ = ["ExtraReward", "GRPOSettings", "PromptFilterSettings", "RewardWeights", "SFTSettings", "Tracker", "train_grpo", "train_sft"]


def __getattr__(name: str) -> Any:
    if name == "train_sft":
        from agent_rl.train.sft import train_sft

        return train_sft
    if name == "train_grpo":
        from agent_rl.train.grpo import train_grpo

        return train_grpo
    if name == "ExtraReward":
        from agent_rl.train.rewards import ExtraReward

        return ExtraReward
    if name == "Tracker":
        from agent_rl.train.tracking import Tracker

        return Tracker
    raise AttributeError(name)

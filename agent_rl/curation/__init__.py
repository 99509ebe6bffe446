"""Curation: validation suite, anonymization, balancing and TRL dataset formatting of pool episodes."""

from agent_rl.curation.balance import BalanceConfig, balance_episodes
from agent_rl.curation.datasets import load_jsonl, quality, save_jsonl, sft_rows
from agent_rl.curation.validate import (
    GateConfig,
    GateResult,
    ValidationConfig,
    ValidationResult,
    evaluate_gates,
    validate_episodes,
)

__all__ = [
    "BalanceConfig", "GateConfig", "GateResult", "ValidationConfig", "ValidationResult", "balance_episodes",
    "evaluate_gates", "load_jsonl", "quality", "save_jsonl", "sft_rows", "validate_episodes",
]

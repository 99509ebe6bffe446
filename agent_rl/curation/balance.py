"""Per-category caps and weights so no task category dominates training; deterministic for a seed.

A category keeps at most round(cap_per_category * weight) episodes, chosen by a seeded hash of
episode_id (so the same export and seed always keep the same rows). With `upsample` a category
below its target is filled by repeating its rows in the same order. When the rows come from several
environments, a category is one environment's (`support/cancel_order`): two environments may name
categories alike, and each keeps its own share.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MISSING = "(none)"


class BalanceConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    cap_per_category: int | None = Field(None, ge=1, description="most episodes kept per category; None = no cap")
    weights: dict[str, float] = Field(default_factory=dict, description="per-category multiplier of the cap (1.0)")
    upsample: bool = Field(False, description="repeat rows of categories below their target")
    seed: int = 0


def _order_key(row: dict[str, Any], index: int, seed: int) -> str:
    ident = str(row.get("episode_id", index))
    return hashlib.sha256(f"{seed}\0{ident}".encode("utf-8", "surrogatepass")).hexdigest()


def balance_episodes(
    rows: list[dict[str, Any]], config: BalanceConfig | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(balanced rows, table of {category, before, after, weight, target}) for asset metadata."""
    config = config or BalanceConfig()
    for category, weight in config.weights.items():
        if weight < 0:
            raise ValueError(f"balance weight for {category!r} must be >= 0, got {weight}")
    groups: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    several = len({str(row.get("environment") or "") for row in rows}) > 1
    plain: dict[str, str] = {}  # group key -> the category alone (weights may name either)
    for i, row in enumerate(rows):
        category = str(row.get("task_category") or MISSING)
        key = f"{row.get('environment') or MISSING}/{category}" if several else category
        plain[key] = category
        groups[key].append((_order_key(row, i, config.seed), row))
    kept: list[dict[str, Any]] = []
    table = []
    for category in sorted(groups):
        ordered = [row for _, row in sorted(groups[category], key=lambda kr: kr[0])]
        weight = float(config.weights.get(category, config.weights.get(plain[category], 1.0)))
        target = None if config.cap_per_category is None else round(config.cap_per_category * weight)
        chosen = ordered if target is None else ordered[:target]
        if config.upsample and target is not None and ordered and len(chosen) < target:
            chosen = [ordered[i % len(ordered)] for i in range(target)]
        kept.extend(chosen)
        table.append({"category": category, "before": len(ordered), "after": len(chosen), "weight": weight,
                      "target": target})
    return kept, table

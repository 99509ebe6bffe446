"""Where a week's SFT starts: the adapter production serves when it is ours, or a fresh adapter on the base.

Why: the loop improves the agent in production. Starting again from the base each week throws away what the
champion learnt and makes every candidate a re-run of last week's recipe on a slightly larger pool; continuing
the champion's adapter trains on top of what serves now. A champion we cannot continue (an API model, a
configuration, another base, a stack of two adapters) leaves the base as the start, and the reason is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent_rl import registry
from agent_rl.ab.controller import is_registered_version

StartFrom = Literal["champion", "base"]


@dataclass(frozen=True)
class StartingPoint:
    adapter: Path | None  # None: a fresh adapter on the base model
    description: str  # one line for the run's metadata and lineage
    version: str | None = None  # the registered version continued (`v3`)

    def lineage(self) -> str:
        return self.version or "base"


def starting_point(start_from: StartFrom, incumbent: str, base_model: str, *, model_name: str,
                   tracking_uri: str | None = None) -> StartingPoint:
    """The adapter to keep training: the registered version `incumbent` (a routing name, `v3`) when
    `start_from` is `champion` and that version is one LoRA adapter on `base_model`; otherwise the base."""
    if start_from == "base":
        return StartingPoint(None, "a fresh adapter on the base model (training.start_from = base)")
    if not is_registered_version(incumbent):
        return StartingPoint(None, f"a fresh adapter on the base model: production runs {incumbent}, not a "
                                   "registered model of ours")
    try:
        path, manifest = registry.download_version(version=incumbent[1:], name=model_name, tracking_uri=tracking_uri)
    except LookupError:
        return StartingPoint(None, f"a fresh adapter on the base model: {incumbent} is not a version of {model_name}")
    if "policy_spec" in manifest:
        return StartingPoint(None, f"a fresh adapter on the base model: production's {incumbent} is a configured "
                                   "policy, not weights")
    if manifest.get("base_model") != base_model:
        return StartingPoint(None, f"a fresh adapter on the base model: production's {incumbent} is an adapter of "
                                   f"{manifest.get('base_model')!r}, not of {base_model!r}")
    adapters = manifest.get("adapters") or []
    if len(adapters) != 1:
        return StartingPoint(None, f"a fresh adapter on the base model: production's {incumbent} is a stack of "
                                   f"{len(adapters)} adapters")
    return StartingPoint(path / adapters[0], f"production's {incumbent}: its adapter, trained further", incumbent)

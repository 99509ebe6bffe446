"""Where GRPO's training process finds the run's anonymized worlds: the stage config entries that name them. The
rollouts themselves live with the environments: the shared pieces in `agent_rl.environments.rollouts` (plug-ins may
import them), a world's own behind `World.rollout_factory`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_rl.environments.core import Environment
from agent_rl.environments.worlds import saved_path, stored_world


def grpo_world(environments: list[Environment], out_dir: str | Path) -> dict[str, Any]:
    """The GRPO config entries for the worlds curation anonymized under `out_dir`: the store an environment that
    trains alone wrote itself (`store_url`, played with its own rows), else the saved plug-ins
    (`environment_files`). Both are staged for a pod like any input (train/stage_store.py)."""
    stored = stored_world(environments, out_dir)
    if stored is not None:
        stored.environment.close()  # only its location is needed here
        return {"store_url": stored.store_url}
    return {"environment_files": [str(saved_path(out_dir, env.name)) for env in environments]}

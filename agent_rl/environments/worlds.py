"""Handing an environment's (anonymized) world from curation to the training process.

Curation builds the anonymized copy of a plug-in (`Environment.anonymized`) once per partition; GRPO runs in
another process (Dagster Pipes, Kubernetes) and must roll out in exactly that copy, not in the raw world. The
copy is saved with pickle: it is written and read only by the pipeline's own steps on the artifact store, never
taken from users or the network. An environment whose world is a store of its own writes the anonymized copy
itself (`World.anonymize`) and says where it lives (`World.reopen`); `reopen` gives either
kind back to GRPO's rows and validation.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agent_rl.environments.core import Environment, EnvironmentError, StoredWorld, Task, check_environment
from agent_rl.jsonl import read_jsonl
from agent_rl.records import Split

WORLDS_DIR = "worlds"  # under a partition's anonymized_environment folder: one pickle per plug-in
INDEX_FILE = "worlds.json"  # the saved plug-ins' names, in run order
TASKS_FILE = "tasks.jsonl"  # their anonymized tasks, all environments together


def save(environment: Environment, path: str | Path) -> Path:
    """Write `environment` to `path` whole or not at all (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            pickle.dump(environment, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_saved(path: str | Path) -> Environment:
    """The environment curation saved at `path`, checked against the contract."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no saved environment at {path} (materialize anonymized_environment first)")
    with path.open("rb") as handle:
        environment = pickle.load(handle)  # noqa: S301 - the pipeline's own artifact, see the module docstring
    if not isinstance(environment, Environment):
        raise EnvironmentError(path.name, f"holds a {type(environment).__name__}, not an Environment")
    return check_environment(environment)


def saved_path(out_dir: str | Path, name: str) -> Path:
    """Where curation saves the anonymized world of plug-in `name` under a partition's folder."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return Path(out_dir) / WORLDS_DIR / f"{safe}.pkl"


def save_index(names: list[str], out_dir: str | Path) -> None:
    """Record which plug-ins curation saved under `out_dir`, in run order."""
    (Path(out_dir) / INDEX_FILE).write_text(json.dumps(names))


def saved_environments(out_dir: str | Path) -> list[Environment]:
    """The plug-ins with their anonymized worlds, as curation saved them under `out_dir`, in run order."""
    names = json.loads((Path(out_dir) / INDEX_FILE).read_text())
    return [load_saved(saved_path(out_dir, name)) for name in names]


def saved_tasks(out_dir: str | Path) -> list[Task]:
    """The plug-ins' tasks as curation anonymized them under `out_dir`."""
    return [Task.model_validate(row) for row in read_jsonl(Path(out_dir) / TASKS_FILE)]


def stored_world(environments: list[Environment], out_dir: str | Path) -> StoredWorld | None:
    """The anonymized world a run's environment wrote itself under `out_dir` (`World.reopen`): only a world that
    trains alone runs its own privacy pass, so only a run of one has such a world."""
    return environments[0].world().reopen(Path(out_dir)) if len(environments) == 1 else None


@dataclass
class AnonymizedWorld:
    """An environment on the anonymized world curation left for a partition, with its anonymized tasks."""

    environment: Environment
    tasks: list[Task]


def reopen(environments: list[Environment], out_dir: str | Path) -> list[AnonymizedWorld]:
    """The run's environments on the anonymized worlds curation left under `out_dir`, with their tasks of every
    split: the world an environment's own privacy pass wrote (`World.reopen`), else the copies the loop saved
    with the tasks it anonymized. GRPO's rows and validation play these, never the raw world; close each
    environment when done."""
    stored = stored_world(environments, out_dir)
    if stored is not None:
        env = stored.environment
        return [AnonymizedWorld(env, [task for split in Split for task in env.tasks(split)])]
    tasks = saved_tasks(out_dir)
    return [AnonymizedWorld(env, [task for task in tasks if task.environment == env.name])
            for env in saved_environments(out_dir)]

"""Handing an environment's (anonymized) world from curation to the training process.

Curation builds the anonymized copy of a plug-in (`Environment.anonymized`) once per partition; GRPO runs in
another process (Dagster Pipes, Kubernetes) and must roll out in exactly that copy, not in the raw world. The
copy is saved with pickle: it is written and read only by the pipeline's own steps on the artifact store, never
taken from users or the network.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

from agent_rl.environments.core import Environment, EnvironmentError, check_environment


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

"""Where things live by default: everything under AGENT_RL_HOME (default `.data/`), overridable per URL."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """The data directory (databases, models, artifacts); created on first use."""
    path = Path(os.environ.get("AGENT_RL_HOME", ".data")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def inbox_url() -> str:
    return os.environ.get("AGENT_RL_INBOX_URL") or f"sqlite:///{home() / 'inbox.db'}"


def pool_url() -> str:
    return os.environ.get("AGENT_RL_POOL_URL") or f"sqlite:///{home() / 'pool.db'}"


def mlflow_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home() / 'mlflow.db'}"


def models_dir() -> Path:
    path = home() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def sqlalchemy_url(url: str) -> str:
    """Accept plain `postgresql://` URLs from users and pick the psycopg 3 driver."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return url


def artifact_dir(name: str, partition: str | None = None) -> Path:
    """Where a pipeline stage keeps its outputs, one folder per stage and partition."""
    path = home() / "artifacts" / name / (partition or "all")
    path.mkdir(parents=True, exist_ok=True)
    return path


def mlflow_artifact_location(tracking_uri: str | None = None) -> str | None:
    """Artifacts of new experiments: under AGENT_RL_HOME for a local store (not ./mlruns of whatever the
    working directory is); the server's own default for a remote one."""
    uri = tracking_uri or mlflow_uri()
    if uri.startswith(("sqlite:", "file:")) or "://" not in uri:
        path = home() / "mlartifacts"
        path.mkdir(parents=True, exist_ok=True)
        return path.as_uri()
    return None

"""Where things live by default: everything under AGENT_RL_HOME (default `.data/`), overridable per URL."""

from __future__ import annotations

import os
import warnings
from pathlib import Path


def home() -> Path:
    """The data directory (databases, models, artifacts); created on first use."""
    path = Path(os.environ.get("AGENT_RL_HOME", ".data")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


STORE_URL_ENV = "AGENT_RL_STORE_URL"
OLD_STORE_URL_ENV = "AGENT_RL_INBOX_URL"  # its first name (the email assistant was the only world): one release


def store_url() -> str:
    """The store the environment's world lives in (handed to an environment that keeps one): $AGENT_RL_STORE_URL,
    else SQLite under AGENT_RL_HOME (`world.db`; a home made before the name changed keeps its `inbox.db`)."""
    url = os.environ.get(STORE_URL_ENV)
    if not url and os.environ.get(OLD_STORE_URL_ENV):
        warnings.warn(f"{OLD_STORE_URL_ENV} is now {STORE_URL_ENV}; the old name goes in the next release",
                      DeprecationWarning, stacklevel=2)
        url = os.environ[OLD_STORE_URL_ENV]
    if url:
        return url
    world, before = home() / "world.db", home() / "inbox.db"
    return f"sqlite:///{before if before.exists() and not world.exists() else world}"


def inbox_url() -> str:
    """`store_url`'s first name, warned, for one release."""
    warnings.warn("settings.inbox_url() is now settings.store_url(); the old name goes in the next release",
                  DeprecationWarning, stacklevel=2)
    return store_url()


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

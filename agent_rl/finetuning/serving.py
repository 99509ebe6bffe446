"""Where a fine-tuning job's model lives and how the gateway serves it by the name the job reports.

A job's version is registered under a registered model of its own (`registered_model`), never production's, so no
production sensor takes it for a challenger; the gateway serves it to its tenant by `fine_tuned_model`.
"""

from __future__ import annotations

import threading
from agent_rl.finetuning.jobs import JobsConfig, JobStore

FINE_TUNED_PREFIX = "ft:"


def registered_model(job_id: str) -> str:
    """The registered model (MLflow) a job's version goes to."""
    return f"agent-rl-{job_id}"


def served_spec(job_id: str) -> str:
    """The policy spec of a job's model: its registered model's challenger, loaded like any registered version."""
    return f"mlflow:{registered_model(job_id)}/challenger"


class FineTunedModels:
    """What the gateway asks of the jobs: the spec of a tenant's fine-tuned model by name (`pinned`), and the
    names a tenant may ask for (`names`, for /v1/models). The job store opens on first use."""

    def __init__(self, config: JobsConfig) -> None:
        self._config = config
        self._store: JobStore | None = None
        self._lock = threading.Lock()

    def _jobs(self) -> JobStore:
        with self._lock:
            if self._store is None:
                self._store = JobStore.from_config(self._config)
            return self._store

    def pinned(self, tenant: str, model: str) -> str | None:
        """The spec of `tenant`'s fine-tuned model named `model`; None for any other name."""
        if not model.startswith(FINE_TUNED_PREFIX):
            return None
        job = self._jobs().find_model(tenant, model)
        return served_spec(job.id) if job is not None else None

    def names(self, tenant: str, limit: int = 100) -> list[str]:
        """`tenant`'s fine-tuned models, newest first (its latest `limit` jobs)."""
        jobs, _ = self._jobs().list(tenant, limit=limit)
        return [job.fine_tuned_model for job in jobs if job.fine_tuned_model]

"""Where a fine-tuning job's model lives and how the gateway serves it by the name the job reports.

A job's version is registered under a registered model of its own (`registered_model`), never production's, so no
production sensor takes it for a challenger; the gateway serves it to its tenant by `fine_tuned_model`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from agent_rl.finetuning.jobs import JobsConfig, JobStore

FINE_TUNED_PREFIX = "ft:"


def registered_model(job_id: str) -> str:
    """The registered model (MLflow) a job's version goes to."""
    return f"agent-rl-{job_id}"


def served_spec(job_id: str) -> str:
    """The policy spec of a job's model: its registered model's challenger, loaded like any registered version."""
    return f"mlflow:{registered_model(job_id)}/challenger"


def pinned_models(config: JobsConfig) -> Callable[[str, str], str | None]:
    """The gateway's `pinned`: (tenant, requested model) -> the spec of that tenant's fine-tuned model of that name,
    else None. The job store opens on the first fine-tuned name asked for."""
    store: list[JobStore] = []
    lock = threading.Lock()

    def pinned(tenant: str, model: str) -> str | None:
        if not model.startswith(FINE_TUNED_PREFIX):
            return None
        with lock:
            if not store:
                store.append(JobStore.from_config(config))
        job = store[0].find_model(tenant, model)
        return served_spec(job.id) if job is not None else None

    return pinned

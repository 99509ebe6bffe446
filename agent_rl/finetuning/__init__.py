"""OpenAI fine-tuning jobs on our loop: the job store (jobs.py) the arbiter's `/v1/fine_tuning/jobs` routes write and
the runner reads, and the checks a job request passes before anything is written (checks.py). No Dagster, no
FastAPI: the arbiter's routes are agent_rl/arbiter/job_routes.py, the runner lives with the pipelines."""

from agent_rl.finetuning.checks import JobRequest, JobRequestError, normalize_method, parse_job_request
from agent_rl.finetuning.jobs import (
    FineTuningJob,
    JobCheckpoint,
    JobEvent,
    JobInputMissing,
    JobNotFound,
    JobsConfig,
    JobStateError,
    JobStatus,
    JobStore,
    JobStoreUnavailable,
    UnknownAfter,
    checkpoint_model_name,
    default_root,
    fine_tuned_model_name,
    is_job_id,
)

__all__ = [
    "FineTuningJob",
    "JobCheckpoint",
    "JobEvent",
    "JobInputMissing",
    "JobNotFound",
    "JobRequest",
    "JobRequestError",
    "JobStateError",
    "JobStatus",
    "JobStore",
    "JobStoreUnavailable",
    "JobsConfig",
    "UnknownAfter",
    "checkpoint_model_name",
    "default_root",
    "fine_tuned_model_name",
    "is_job_id",
    "normalize_method",
    "parse_job_request",
]

"""OpenAI fine-tuning jobs run by the loop: a job's files and grader as an environment (environment.py), its rows
read and checked line by line (rows.py)."""

from agent_rl.environments.openai_jobs.environment import (
    JOB_DIR_ENV,
    NAME,
    SUPERVISED_GRADER,
    JobSession,
    OpenAIJobEnvironment,
    load_job,
)
from agent_rl.environments.openai_jobs.rows import (
    JobFileError,
    JobRow,
    Method,
    content_text,
    iter_rows,
    parse_row,
    read_rows,
    row_kind,
)

__all__ = [
    "JOB_DIR_ENV",
    "NAME",
    "SUPERVISED_GRADER",
    "JobFileError",
    "JobRow",
    "JobSession",
    "Method",
    "OpenAIJobEnvironment",
    "content_text",
    "iter_rows",
    "load_job",
    "parse_row",
    "read_rows",
    "row_kind",
]

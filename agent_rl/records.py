"""The records every stage shares: episodes, their outcomes and splits (docs/architecture.md, Records). The email
assistant's own records (emails, search hits, questions) live in agent_rl/environments/email/records.py."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from enum import StrEnum
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field


# Episodes and tasks written before environments were plug-ins all came from the email assistant.
DEFAULT_ENVIRONMENT = "email"
# Episode keys of exports written before environments were plug-ins, and their names now.
LEGACY_EPISODE_KEYS = {"inbox_id": "context", "sources": "citations", "scenario_id": "task_id"}


def current_episode_keys(row: dict[str, Any]) -> dict[str, Any]:
    """An exported episode row under today's keys (an older export's `inbox_id`/`sources` renamed, and its
    environment the email assistant's), so curation reads one layout whatever release wrote the file."""
    if not any(old in row for old in LEGACY_EPISODE_KEYS) and "environment" in row:
        return row
    out = dict(row)
    for old, new in LEGACY_EPISODE_KEYS.items():
        if old in out and new not in out:
            out[new] = out.pop(old)
    out.setdefault("environment", DEFAULT_ENVIRONMENT)
    return out


class Outcome(StrEnum):
    CORRECT = "correct"
    WRONG = "wrong"
    IDK = "idk"
    FORMAT_ERROR = "format_error"
    RAN_OUT = "ran_out"
    # Live traffic nobody judged (the arbiter's OpenAI-compatible gateway): never correct, so curation's
    # quality is 0 and, without a reward, validation quarantines it; it never becomes an SFT positive.
    UNJUDGED = "unjudged"


class Split(StrEnum):
    TRAIN = "train"
    TEST = "test"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Episode(BaseModel):
    """One agent run as stored in the benchmark pool; inserts are idempotent on episode_id.

    Environment-agnostic: `environment` names the plug-in that ran it (agent_rl/environments), `context` the
    world it ran in (the email assistant's mailbox address, a store's database) and `citations` what the final
    answer cites. Records written before environments existed load through their old names (`inbox_id`,
    `sources`), which stay readable as properties for the email environment's code.
    """

    model_config = ConfigDict(populate_by_name=True)

    episode_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    created_at: datetime = Field(default_factory=utcnow)
    tenant: str = "default"
    environment: str = DEFAULT_ENVIRONMENT
    context: str = Field(validation_alias=AliasChoices("context", "inbox_id"))
    task_category: str | None = None
    task_id: str | None = Field(None, validation_alias=AliasChoices("task_id", "scenario_id"))
    question: str
    policy_version: str
    messages: list[dict[str, Any]] = Field(default_factory=list)
    final_answer: str | None = None
    citations: list[str] = Field(default_factory=list, validation_alias=AliasChoices("citations", "sources"))
    # The tool schemas the agent was offered, where they are not its environment's own: a gateway client declares
    # its tools per request, and SFT must train with exactly those.
    tools: list[dict[str, Any]] | None = None
    outcome: Outcome
    reward: float | None = None
    reward_components: dict[str, float] = Field(default_factory=dict)
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    cost_usd: float = 0.0
    feedback: str | None = None
    # The PolicyUnavailable that kept the serving stack from answering (environments/policy.py; typed Any because
    # this module sits below that one): an unserved episode holds no turn of the model's, so it is never stored or
    # scored, and the arbiter answers 503 for it instead.
    unserved: Any = Field(None, exclude=True)

    @property
    def inbox_id(self) -> str:
        """The email assistant's name for `context`."""
        return self.context

    @property
    def sources(self) -> list[str]:
        """The email assistant's name for `citations`."""
        return self.citations

    @property
    def scenario_id(self) -> str | None:
        """The email assistant's name for `task_id`."""
        return self.task_id

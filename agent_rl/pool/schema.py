"""The benchmark pool's tables (SQLAlchemy Core), shared by SQLite and PostgreSQL.

The schema is versioned by an explicit `schema_version` table; bump SCHEMA_VERSION and add a
migration step (migrations.py) whenever a table changes.

Version 2 (environments as plug-ins): episodes carry their `environment`; `inbox_id` became `context`
and `sources` became `citations`; a task category is any string an environment declares (64 characters);
`tools` keeps the tool schemas an episode was offered when they are not its environment's (gateway traffic).

Version 3 (the gateway on several worker processes): `gateway_live` holds the gateway's episodes while they are
served, so that any worker continues any of them; a row leaves it in the transaction that writes the episode.

Version 4 (the loop's names for what every environment has): `scenario_id`, the email assistant's name, became
`task_id`.

Version 5 (an outage is not evidence): `serving_failures` counts the requests a version could not serve (its engine
down), so the rollout controller holds the step instead of reading an outage as the model's failures.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.types import TypeDecorator

from agent_rl.utc import as_utc

SCHEMA_VERSION = 5


class UTCDateTime(TypeDecorator):
    """Always UTC and timezone-aware in Python; naive UTC in SQLite so text order is time order."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        value = as_utc(value)
        # SQLite stores datetimes as text: keep one fixed format (no offset) so comparisons are exact.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return as_utc(value)


metadata = MetaData()

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_at", UTCDateTime, nullable=False),
)

# Plain JSON (not JSONB) on PostgreSQL: JSONB reorders object keys, and tool-call arguments
# must come back in the order the model produced them.
episodes = Table(
    "episodes",
    metadata,
    Column("episode_id", String(64), primary_key=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("tenant", String(200), nullable=False),
    Column("environment", String(64), nullable=False, server_default="email"),
    Column("context", String(320), nullable=False),
    Column("task_category", String(64)),
    Column("task_id", String(200)),
    Column("question", Text, nullable=False),
    Column("policy_version", String(200), nullable=False),
    Column("messages", JSON, nullable=False),
    Column("final_answer", Text),
    Column("citations", JSON, nullable=False),
    Column("tools", JSON),  # the tool schemas the agent was offered, when not its environment's own (gateway)
    Column("outcome", String(32), nullable=False),
    Column("reward", Float),
    Column("reward_components", JSON, nullable=False),
    Column("turns", Integer, nullable=False),
    Column("prompt_tokens", Integer, nullable=False),
    Column("completion_tokens", Integer, nullable=False),
    Column("latency_ms", Float, nullable=False),
    Column("cost_usd", Float, nullable=False),
    Column("feedback", Text),
    Column("feedback_at", UTCDateTime),
    # (created_at, episode_id) is the export cursor: this index serves time ranges and pages.
    Index("ix_episodes_created_at", "created_at", "episode_id"),
    Index("ix_episodes_policy_version", "policy_version"),
    Index("ix_episodes_task_id", "task_id"),
    Index("ix_episodes_environment", "environment"),
)

routing = Table(
    "routing",
    metadata,
    Column("policy_version", String(200), primary_key=True),
    Column("weight", Float, nullable=False),
    Column("spec", Text, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

routing_history = Table(
    "routing_history",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("changed_at", UTCDateTime, nullable=False),
    Column("actor", String(200), nullable=False),
    Column("reason", Text, nullable=False),
    Column("old_weights", JSON, nullable=False),
    Column("new_weights", JSON, nullable=False),
    Column("specs", JSON, nullable=False),
    Column("stats", JSON),
)

# The payload is text, not JSON, so rows too malformed to parse still fit; row_key (a hash of
# partition + payload) makes re-running a curation partition idempotent.
quarantine = Table(
    "quarantine",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("row_key", String(64), nullable=False),
    Column("episode_id", String(200)),
    Column("payload", Text, nullable=False),
    Column("reasons", JSON, nullable=False),
    Column("partition", String(200), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("row_key", name="uq_quarantine_row_key"),
    Index("ix_quarantine_partition", "partition"),
)

# Gateway episodes while they are served (agent_rl/pool/live.py): the authoritative copy every arbiter worker
# reads and extends. `row_version` grows by one with every change; `session` is the caller's name for the
# episode (NULL: grouped by `prefix`, the hash of its transcript so far, arbiter/gateway/sessions.prefix_hashes).
gateway_live = Table(
    "gateway_live",
    metadata,
    Column("episode_id", String(64), primary_key=True),
    Column("tenant", String(200), nullable=False),
    Column("context", String(320), nullable=False),
    Column("session", String(128)),
    Column("prefix", String(64)),
    Column("row_version", Integer, nullable=False),
    Column("policy_version", String(200), nullable=False),
    Column("spec", Text, nullable=False),
    Column("environment", String(64), nullable=False),
    Column("task_category", String(64)),
    Column("task", Text, nullable=False),
    Column("final_tool", String(64)),
    Column("tools", JSON),
    Column("messages", JSON, nullable=False),
    Column("calls", Integer, nullable=False),
    Column("prompt_tokens", Integer, nullable=False),
    Column("completion_tokens", Integer, nullable=False),
    Column("latency_ms", Float, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("last_active", UTCDateTime, nullable=False),
    # NULL sessions never collide (SQL's NULLs are distinct), so only named sessions are unique per tenant and context.
    UniqueConstraint("tenant", "context", "session", name="uq_gateway_live_session"),
    Index("ix_gateway_live_prefix", "tenant", "context", "prefix"),
    Index("ix_gateway_live_last_active", "last_active"),
)

# Requests a version could not serve (PolicyUnavailable: its engine down): the arbiter answers them 503 and stores
# no episode; the rollout controller holds the step while a version in the test has failures this recent
# (agent_rl/ab/controller.py). `kind` is the failure's type name only: its message names operators' addresses.
serving_failures = Table(
    "serving_failures",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("policy_version", String(200), nullable=False),
    Column("requests", Integer, nullable=False),
    Column("kind", String(64), nullable=False),
    Index("ix_serving_failures_at", "at"),
)

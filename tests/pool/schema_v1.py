"""The benchmark pool's tables as release 1 wrote them (before environments were plug-ins), kept frozen so
the migration test builds a real old pool on both databases. Never change this file."""

from sqlalchemy import JSON, Column, Float, Index, Integer, MetaData, String, Table, Text, UniqueConstraint

from agent_rl.pool.schema import UTCDateTime

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
    Column("inbox_id", String(320), nullable=False),
    Column("task_category", String(32)),
    Column("scenario_id", String(200)),
    Column("question", Text, nullable=False),
    Column("policy_version", String(200), nullable=False),
    Column("messages", JSON, nullable=False),
    Column("final_answer", Text),
    Column("sources", JSON, nullable=False),
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
    Index("ix_episodes_scenario_id", "scenario_id"),
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

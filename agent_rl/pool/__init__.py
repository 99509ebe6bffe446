"""The benchmark pool: every served episode, user feedback, the routing table and the curation quarantine."""

from agent_rl.pool.repository import (
    ExportCursor,
    ExportPage,
    PoolRepository,
    QuarantinedRow,
    Routing,
    RoutingChange,
    SchemaVersionError,
    UnknownEpisodeError,
)
from agent_rl.pool.schema import SCHEMA_VERSION

__all__ = [
    "SCHEMA_VERSION",
    "ExportCursor",
    "ExportPage",
    "PoolRepository",
    "QuarantinedRow",
    "Routing",
    "RoutingChange",
    "SchemaVersionError",
    "UnknownEpisodeError",
]

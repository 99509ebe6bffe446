"""The code location: every asset, check, resource, job, schedule and sensor of agent-rl in one place."""

from __future__ import annotations

import dagster as dg

from assets import environment
from resources.stores import InboxStoreResource, PoolResource

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([environment]),
    resources={
        "inbox_store": InboxStoreResource(),
        "pool": PoolResource(),
    },
)

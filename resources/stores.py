"""Where the environment's world and the episodes live, by URL (SQLite default): the world's store is handed to the
environment, which opens it; the pool is the loop's own."""


import warnings

from dagster import ConfigurableResource
from pydantic import Field

from agent_rl import settings


class WorldStoreResource(ConfigurableResource):
    """The store an environment's world lives in, passed to environments that take a `store_url` (the email
    assistant keeps its inboxes there); empty URL means AGENT_RL_STORE_URL or SQLite under AGENT_RL_HOME."""

    url: str = Field(default="", description="sqlite:///PATH or postgresql://HOST/DB; empty for the default")

    def resolved_url(self) -> str:
        return self.url or settings.store_url()


def __getattr__(name: str):
    if name == "InboxStoreResource":  # its first name, from when the email assistant was the only world
        warnings.warn("InboxStoreResource is now WorldStoreResource (resource key world_store); the old name goes in "
                      "the next release", DeprecationWarning, stacklevel=2)
        return WorldStoreResource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class PoolResource(ConfigurableResource):
    """The benchmark pool (episodes, routing, quarantine); empty URL means AGENT_RL_POOL_URL or SQLite."""

    url: str = Field(default="", description="sqlite:///PATH or postgresql://HOST/DB; empty for the default")

    def resolved_url(self) -> str:
        return self.url or settings.pool_url()

    def open(self):
        from agent_rl.pool.repository import PoolRepository

        return PoolRepository(self.resolved_url())

    def incumbent(self, base_model: str) -> tuple[str, str]:
        """(version, spec) of what production serves now: the largest share of the routing table; the prompted
        base model only where nothing was ever routed."""
        from agent_rl.ab.controller import BASE_VERSION, incumbent_of

        repository = self.open()
        try:
            routing = repository.get_routing()
        finally:
            repository.close()
        version = incumbent_of(routing.weights)
        if version is None:
            return BASE_VERSION, base_model
        return version, routing.specs.get(version) or version

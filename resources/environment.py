"""Which agent the loop trains: one environment plug-in for the whole job (assets, checks, sensors)."""

from dagster import ConfigurableResource
from pydantic import Field, field_validator

from agent_rl.curation.live import LIVE_ENVIRONMENT
from agent_rl.environments.core import Environment
from agent_rl.environments.registry import load_environment

EMAIL = "email"


class EnvironmentResource(ConfigurableResource):
    """The environment by name ('email', 'support'), import path ('my_pkg.env:MyEnvironment') or installed
    plug-in; AGENT_RL_ENV sets it when the profile does not (`make demo ENV=support`). 'gateway' trains on the
    gateway's live episodes of an agent that is no plug-in (curation/live.py): SFT only, validated by replay."""

    name: str = Field(default=EMAIL, description="built-in name, import path 'package.module:Class', or the name "
                      "of a plug-in installed under the agent_rl.environments entry point, or 'gateway'")

    @field_validator("name")
    @classmethod
    def _loads(cls, value: str) -> str:
        if value.strip() == LIVE_ENVIRONMENT:
            return LIVE_ENVIRONMENT
        load_environment(value)  # a misspelt or broken environment fails when the resource is built, named
        return value.strip()

    @property
    def is_email(self) -> bool:
        return self.name == EMAIL

    @property
    def is_live(self) -> bool:
        """The gateway's live episodes: no tasks, world or tools of ours."""
        return self.name == LIVE_ENVIRONMENT

    def load(self) -> Environment:
        if self.is_live:
            raise ValueError("the gateway's live episodes have no environment plug-in to load (tools run in the "
                             "client); curation/live.py handles them")
        return load_environment(self.name)

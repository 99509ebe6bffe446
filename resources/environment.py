"""Which agent the loop trains: one environment plug-in for the whole job (assets, checks, sensors), or several
plug-ins trained into one policy."""

from typing import Any

from dagster import ConfigurableResource
from pydantic import Field, field_validator, model_validator

from agent_rl.environments.core import Capabilities, Environment
from agent_rl.environments.registry import (
    DEFAULT,
    accepted_options,
    capabilities_of,
    load_environment,
    setting_names,
)


def split_names(value: str) -> tuple[str, list[str]]:
    """`AGENT_RL_ENV=support,examples.timetable:TimetableEnvironment` as (name, also)."""
    names = setting_names(value)
    return (names[0] if names else DEFAULT), names[1:]


class EnvironmentResource(ConfigurableResource):
    """The environment by name ('email', 'support'), import path ('my_pkg.env:MyEnvironment') or installed
    plug-in; AGENT_RL_ENV sets it when the profile does not (`make demo ENV=support`; a comma-separated list
    trains one policy on several plug-ins). 'gateway' (environments/gateway) trains on the gateway's live episodes
    of an agent that is no plug-in: no world and judged by its users, so SFT only, validated by replay."""

    name: str = Field(default=DEFAULT, description="built-in name, import path 'package.module:Class', or the name "
                      "of a plug-in installed under the agent_rl.environments entry point, or 'gateway'")
    also: list[str] = Field(default_factory=list, description="more plug-ins trained in the same run: one policy "
                            "on all of them, curated, balanced and validated per environment (not with 'email' "
                            "or 'gateway', which train alone)")

    @field_validator("name")
    @classmethod
    def _loads(cls, value: str) -> str:
        load_environment(value)  # a misspelt or broken environment fails when the resource is built, named
        return value.strip()

    @model_validator(mode="after")
    def _together(self) -> "EnvironmentResource":
        if not self.also:
            return self
        # Live traffic, and an environment whose world is a store of its own, each make a run of their own.
        envs = [(n, load_environment(n)) for n in self.names]
        alone = [n for n, env in envs if env.world().trains_alone or not env.capabilities.world]
        if alone:
            raise ValueError(f"{', '.join(repr(n) for n in alone)}: the gateway's live traffic and an environment "
                             "whose world is a store of its own train alone; 'also' combines plug-ins only "
                             f"(got {', '.join([self.name, *self.also])})")
        loaded = [env.name for _, env in envs]
        if len(set(loaded)) < len(loaded):
            raise ValueError(f"an environment is named twice: {', '.join(loaded)}")
        return self

    @property
    def names(self) -> list[str]:
        return [self.name, *(n.strip() for n in self.also)]

    @property
    def capabilities(self) -> Capabilities:
        """What this run's episodes let the loop do (a world to play in, a judge of ours), which the assets ask
        instead of the environment's name: declared on the environment's class (the gateway's: no world, judged by
        its users; the contract's defaults for plug-ins)."""
        return capabilities_of(self.name)

    @property
    def episode_environments(self) -> list[str]:
        """The `environment` its episodes carry in the pool: a run exports these and leaves other agents' alone."""
        if not self.capabilities.world:
            return [self.name]  # no plug-in to load: the episodes carry the name the setting gave
        return [env.name for env in self.loads()]

    def load(self, **options: Any) -> Environment:
        """The (first) environment; of `options` (a world's `store_url`), those its class takes."""
        if not self.capabilities.world:
            raise ValueError(f"environment {self.name!r} has no world to load (its tools run in the client); "
                             "curation/live.py handles its episodes")
        return load_environment(self.name, **accepted_options(self.name, options))

    def loads(self, **options: Any) -> list[Environment]:
        """Every plug-in this run trains on, in order, each built with those of `options` its class takes."""
        return [self.load(**options), *(load_environment(n, **accepted_options(n, options)) for n in self.also)]

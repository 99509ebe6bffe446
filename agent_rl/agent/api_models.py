"""Simulated API models: the rule-based agent playing a named prompted model with its published figures.

A team's production agent before any training is usually a prompted large model behind an API. The demo cannot
call one (no network, no key), so the rule-based agent plays it: its answers carry a configured error profile and
are judged like any other policy's, while latency and cost per episode are the model's published figures
(`api_models.toml` names the source). Everything that shows these figures labels them as simulated.
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from agent_rl.agent.policy import Policy

PROFILES_FILE = Path(__file__).with_name("api_models.toml")
SPEC_PREFIX = "api-sim"


class ApiModelProfile(BaseModel):
    """A named model's published figures and the error profile the rule-based agent plays it with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    display_name: str
    published_accuracy: float = Field(ge=0, le=1)
    latency_s: float = Field(gt=0)
    cost_per_1k_runs_usd: float = Field(ge=0)
    wrong_rate: float = Field(0.0, ge=0, le=1)
    idk_rate: float = Field(0.0, ge=0, le=1)
    source: str = Field(min_length=1, description="where the published figures come from")
    environment: str = Field("email", description="the environment whose teacher plays the model with the error "
                             "rates above (its teacher takes wrong_rate, idk_rate, seed and version)")

    @property
    def latency_ms(self) -> float:
        return self.latency_s * 1000.0

    @property
    def cost_per_episode_usd(self) -> float:
        return self.cost_per_1k_runs_usd / 1000.0

    def label(self) -> dict[str, object]:
        """What reports and metadata show next to the figures."""
        return {"simulated": True, "model": self.name, "latency_s": self.latency_s,
                "cost_per_1k_runs_usd": self.cost_per_1k_runs_usd, "source": self.source}


@cache
def api_model_profiles(path: Path = PROFILES_FILE) -> dict[str, ApiModelProfile]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return {name: ApiModelProfile(name=name, **values) for name, values in data.items()}


def api_model_profile(name: str) -> ApiModelProfile:
    profiles = api_model_profiles()
    if name not in profiles:
        raise ValueError(f"unknown simulated API model {name!r}; known: {', '.join(sorted(profiles))} "
                         f"({PROFILES_FILE.name})")
    return profiles[name]


def simulated_api_policy(name: str, seed: int = 0) -> Policy:
    """The rule-based agent with the profile's error rates; `policy.simulation` carries latency and cost."""
    from agent_rl.environments.registry import load_environment

    profile = api_model_profile(name.strip())
    policy = load_environment(profile.environment).teacher(
        wrong_rate=profile.wrong_rate, idk_rate=profile.idk_rate, seed=seed, version=f"{SPEC_PREFIX}:{profile.name}")
    policy.simulation = profile
    return policy

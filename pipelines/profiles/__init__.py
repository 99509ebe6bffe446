"""Resource settings per profile, chosen with AGENT_RL_PROFILE: `default` (production gates), `demo` (the laptop
demo: same gates, A/B steps small enough to decide in minutes on CPU), `fast` (the tiny model: shows the whole
loop's mechanics in a few minutes; it cannot learn the task), `learn` (a tiny model fitted to the help desk example:
a promotion it earns in minutes), or the path of a TOML file of your own.

A profile is data, not code: a TOML file (default.toml, demo.toml, fast.toml next to this module) mapping a
resource name to the values of its fields; resources it does not name keep their defaults. So a GPU deployment is
a file, e.g. `[training] profile = "gpu"`, selected by configuration. One value depends on the machine: the string
"all-cores" stands for its CPU core count (threads for a process that runs alone). One table is not a resource:
`[demo]` (`DemoSettings`) sizes what the demo driver (demos/demo.py) does around the jobs on this profile.
"""

import os
import tomllib
import warnings
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError

from agent_rl.registry import model_name_for

from resources.compute import TrainingCompute
from resources.curation import CurationResource
from resources.environment import EnvironmentResource, split_names
from resources.evaluation import EvaluationResource
from resources.registry import MlflowResource
from resources.rollout import RolloutResource
from resources.stores import PoolResource, WorldStoreResource
from resources.training import TrainingResource

PROFILE_DIR = Path(__file__).resolve().parent
PROFILES = ("default", "demo", "fast", "learn")
ALL_CORES = "all-cores"
ENV_VARIABLE = "AGENT_RL_ENV"  # the environment plug-in, where the profile does not name one
RESOURCES: dict[str, type[ConfigurableResource]] = {
    "environment": EnvironmentResource,
    "world_store": WorldStoreResource,
    "pool": PoolResource,
    "curation": CurationResource,
    "mlflow": MlflowResource,
    "rollout": RolloutResource,
    "compute": TrainingCompute,
    "training": TrainingResource,
    "evaluation": EvaluationResource,
}


class DemoSettings(BaseModel):
    """How the demo driver sizes its world on this profile, where its command line says nothing; a profile states
    it, so the summary can name the scale a machine runs (the `demo` profile: 2 CPU cores)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v0_steps: PositiveInt | None = Field(None, description="SFT steps that train v0 from the base (None: half the "
                                         "profile's SFT steps)")
    week_sft_steps: PositiveInt | None = Field(None, description="SFT steps a week's run adds to the champion's "
                                               "adapter when production runs a model of ours (None: the profile's)")
    week_requests: PositiveInt = Field(400, description="production requests in each week served by a model of ours")
    week_grpo: bool = Field(True, description="GRPO after SFT in a week's run when production runs a model of ours "
                            "(off where the machine is too small for GRPO to change the outcome in the time)")


DEMO_TABLE = "demo"
# Fields renamed since a release: [resource] old name -> new name, read under the old name for one more release.
RENAMED = {"evaluation": {"max_scenarios": "max_tasks"}}
# Resources renamed since a release: old table -> new, read under the old name for one more release.
RENAMED_TABLES = {"inbox_store": "world_store"}


def profile_path(profile: str) -> Path:
    """The TOML file of a profile: a shipped one by name, or a file of the user's own by path."""
    if profile in PROFILES:
        return PROFILE_DIR / f"{profile}.toml"
    path = Path(profile).expanduser()
    if path.suffix == ".toml" or os.sep in profile:
        if not path.is_file():
            raise ValueError(f"AGENT_RL_PROFILE={profile!r}: no such profile file")
        return path
    raise ValueError(f"AGENT_RL_PROFILE={profile!r}: expected one of {', '.join(PROFILES)} or the path of a .toml file")


def read_profile(path: Path) -> dict[str, dict[str, Any]]:
    """The profile's field values per resource, every resource and field name checked against the resources."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    for old, new in RENAMED_TABLES.items():
        if old in data:
            warnings.warn(f"{path}: [{old}] is now [{new}]; the old name goes in the next release",
                          DeprecationWarning, stacklevel=2)
            data.setdefault(new, data.pop(old))
    for name, fields in data.items():
        if name not in RESOURCES and name != DEMO_TABLE:
            raise ValueError(f"{path}: unknown resource [{name}]; known: {', '.join(RESOURCES)} (and [{DEMO_TABLE}])")
        if not isinstance(fields, dict):
            raise ValueError(f"{path}: {name} must be a table of field values ([{name}]), got {type(fields).__name__}")
        known = DemoSettings.model_fields if name == DEMO_TABLE else RESOURCES[name].model_fields
        for old, new in RENAMED.get(name, {}).items():
            if old in fields:
                warnings.warn(f"{path}: [{name}] {old} is now {new}; the old name goes in the next release",
                              DeprecationWarning, stacklevel=2)
                fields[new] = fields.pop(old)
        for key in fields:
            if key not in known:
                raise ValueError(f"{path}: [{name}] unknown field {key!r}; {name} has {', '.join(known)}")
    return data


def _on_this_machine(value: Any) -> Any:
    return max(1, os.cpu_count() or 1) if value == ALL_CORES else value


def demo_settings(profile: str) -> DemoSettings:
    """The profile's `[demo]` table, checked (a shipped profile's name or a TOML path)."""
    path = profile_path(profile)
    try:
        return DemoSettings(**read_profile(path).get(DEMO_TABLE, {}))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{path}: [{DEMO_TABLE}] {problems}") from None


def resources_for(profile: str | None = None) -> dict:
    """Every resource, configured by the profile (default: $AGENT_RL_PROFILE, else `default`)."""
    path = profile_path(profile or os.environ.get("AGENT_RL_PROFILE") or "default")
    values = read_profile(path)
    resources = {}
    for name, resource in RESOURCES.items():
        fields = {key: _on_this_machine(value) for key, value in values.get(name, {}).items()}
        if name == "environment" and os.environ.get(ENV_VARIABLE) and "name" not in fields:
            fields["name"], also = split_names(os.environ[ENV_VARIABLE])
            if also:
                fields.setdefault("also", also)
        if name == "mlflow" and os.environ.get(ENV_VARIABLE):
            # One registered model per environment: an email model must never be promoted for support traffic.
            fields.setdefault("model_name", model_name_for(os.environ[ENV_VARIABLE]))
        try:
            resources[name] = resource(**fields)
        except ValidationError as exc:
            problems = "; ".join(
                ": ".join(part for part in (".".join(str(p) for p in error["loc"]),
                                            error["msg"].removeprefix("Value error, ")) if part)
                for error in exc.errors())
            raise ValueError(f"{path}: [{name}] {problems}") from None
    return resources


def resource_config(defs, changes: dict[str, dict]) -> dict:
    """Run config that changes some fields of some resources for one run. A resource's run config replaces all its
    fields (those it leaves out fall back to the class defaults, not the profile's): every field is given, the
    profile's values under the changes."""
    config = {}
    for name, fields in changes.items():
        resource = defs.resources[name]
        config[name] = {"config": {**{f: getattr(resource, f) for f in type(resource).model_fields}, **fields}}
    return config

"""The A/B rollout settings the sensors use, as a resource so they can be changed per deployment.

The resource wraps the library's `RolloutConfig` (agent_rl/ab/rollout.py) instead of restating it: every field of
it, the guardrails included, is a profile key here (`_KEYS` says where each lands), each default and description is
read from RolloutConfig, and the values are checked by building the RolloutConfig when the resource loads, so a
misspelt or out-of-range value fails then, named by its profile key, not when the sensor first decides.

    [rollout]
    min_samples_per_arm = 50
    max_step_hours = 48
    guardrails = { failure_rate = { value = 0.03 }, latency_p95 = { kind = "absolute", value = 250.0 } }

`guardrails` mirrors `Guardrails`: name only what changes (a margin's `value` alone keeps its `kind`).
"""

from datetime import timedelta
from typing import Any

from dagster import ConfigurableResource
from pydantic import Field, ValidationError, field_validator, model_validator

from agent_rl.ab.rollout import RolloutConfig

_DEFAULT = RolloutConfig()
_HOUR = timedelta(hours=1)
_MINUTE = timedelta(minutes=1)

# Each profile key and the RolloutConfig field it sets: one table builds the config and names a bad value; a test
# checks that it covers every field of RolloutConfig.
_KEYS: dict[str, tuple[str, ...]] = {
    "steps": ("steps",),
    "alpha": ("alpha",),
    "tau_squared": ("tau_squared",),
    "min_samples_per_arm": ("min_samples_per_arm",),
    "min_samples_per_step": ("min_samples_per_step",),
    "max_step_hours": ("max_step_duration",),
    "outage_hold_minutes": ("outage_hold",),
    "ramp_on": ("ramp_on",),
    "guardrails": ("guardrails",),
    "use_labels": ("labels", "use"),
    "labels_min_rated_per_arm": ("labels", "min_rated_per_arm"),
    "labels_disagreement_alpha": ("labels", "disagreement_alpha"),
}


def _doc(*path: str) -> str:
    """The library's description of the field at `path`."""
    model: Any = RolloutConfig
    for name in path[:-1]:
        model = model.model_fields[name].annotation
    return model.model_fields[path[-1]].description or ""


def _merged(default: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`given` over `default`, table by table: a table names only what it changes."""
    out = dict(default)
    for key, value in given.items():
        out[key] = _merged(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


class RolloutResource(ConfigurableResource):
    base_spec: str = Field(default="base", description="the model that serves as champion before one is registered")
    steps: list[float] = Field(default=list(_DEFAULT.steps), description=_doc("steps"))
    alpha: float = Field(default=_DEFAULT.alpha, description=_doc("alpha"))
    tau_squared: float = Field(default=_DEFAULT.tau_squared, description=_doc("tau_squared"))
    min_samples_per_arm: int = Field(default=_DEFAULT.min_samples_per_arm, description=_doc("min_samples_per_arm"))
    min_samples_per_step: int = Field(default=_DEFAULT.min_samples_per_step, description=_doc("min_samples_per_step"))
    max_step_hours: float = Field(default=_DEFAULT.max_step_duration / _HOUR,
                                  description="RolloutConfig.max_step_duration in hours. " + _doc("max_step_duration"))
    outage_hold_minutes: float = Field(default=_DEFAULT.outage_hold / _MINUTE,
                                       description="RolloutConfig.outage_hold in minutes. " + _doc("outage_hold"))
    ramp_on: str = Field(default=_DEFAULT.ramp_on, description=_doc("ramp_on"))
    guardrails: dict[str, Any] = Field(
        default_factory=_DEFAULT.guardrails.model_dump, description="RolloutConfig.guardrails, a table naming what "
        "changes: failure_rate and latency_p95 as {kind = 'absolute' or 'relative', value}, and alpha")
    use_labels: bool = Field(default=_DEFAULT.labels.use, description=_doc("labels", "use"))
    labels_min_rated_per_arm: int = Field(default=_DEFAULT.labels.min_rated_per_arm,
                                          description=_doc("labels", "min_rated_per_arm"))
    labels_disagreement_alpha: float = Field(default=_DEFAULT.labels.disagreement_alpha,
                                             description=_doc("labels", "disagreement_alpha"))

    @field_validator("guardrails", mode="before")
    @classmethod
    def _guardrails_over_defaults(cls, value: Any) -> Any:
        return _merged(_DEFAULT.guardrails.model_dump(), value) if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _is_a_rollout_config(self) -> "RolloutResource":
        try:
            self.config()
        except ValidationError as exc:
            raise ValueError("; ".join(
                f"{_key_of(error['loc'])}: {error['msg'].removeprefix('Value error, ')}" for error in exc.errors()
            )) from None
        return self

    def config(self) -> RolloutConfig:
        """The RolloutConfig the controller decides with."""
        values: dict[str, Any] = {}
        for key, path in _KEYS.items():
            value = getattr(self, key)
            if key == "steps":
                value = tuple(value)
            elif key == "max_step_hours":
                value = _duration(key, hours=value)
            elif key == "outage_hold_minutes":
                value = _duration(key, minutes=value)
            target = values
            for name in path[:-1]:
                target = target.setdefault(name, {})
            target[path[-1]] = value
        return RolloutConfig.model_validate(values)


def _duration(key: str, **amount: float) -> timedelta:
    try:
        return timedelta(**amount)
    except (OverflowError, ValueError):  # nan, inf, or past what a timedelta holds
        unit, value = next(iter(amount.items()))
        raise ValueError(f"{key}: {value} is not a number of {unit}") from None


def _key_of(loc: tuple[Any, ...]) -> str:
    """The profile key (and the part of its table) a RolloutConfig error location points at."""
    parts = tuple(str(part) for part in loc)
    for key, path in _KEYS.items():
        if parts[:len(path)] == path:
            return ".".join((key, *parts[len(path):]))
    return ".".join(parts) or "rollout"


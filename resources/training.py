"""What to train and how hard: the base model spec and the SFT / GRPO settings (TRL knobs) per deployment.

Profiles: `cpu` (the laptop demo defaults), `gpu` (bf16, vLLM colocate; configuration only), and
overrides of any settings field, e.g. {"max_steps": 2} for a quick run. The overrides are checked against
SFTSettings / GRPOSettings when the resource is built, so a misspelt field fails at load, named, not mid-run.
"""

import json
from typing import Any, Literal

from dagster import ConfigurableResource
from pydantic import Field, ValidationError, field_validator, model_validator

from agent_rl.train.config import GRPOSettings, SFTSettings


class TrainingResource(ConfigurableResource):
    base_model: str = Field(default="base", description="'base' (SmolLM2-135M), 'tiny', a path or a hub name")
    profile: Literal["cpu", "gpu"] = "cpu"
    sft_overrides: dict[str, Any] = Field(default_factory=dict, description="SFTSettings fields to change, e.g. "
                                          '{"max_steps": 48} (agent_rl/train/config.py)')
    start_from: Literal["champion", "base"] = Field(
        default="champion", description="where SFT starts: the adapter production serves when it is a registered "
        "model of ours on this base (champion), else a fresh adapter on the base model; or always the base (base)")
    grpo_enabled: bool = Field(default=True, description="run GRPO after SFT; false: SFT alone is the candidate "
                               "(a first model shipped quickly, or a budget that GRPO does not fit)")
    grpo_overrides: dict[str, Any] = Field(default_factory=dict, description="GRPOSettings fields to change, e.g. "
                                           '{"max_steps": 2, "prompt_filter": {"mode": "none"}}')

    @field_validator("sft_overrides", "grpo_overrides", mode="before")
    @classmethod
    def _json_object(cls, value: Any, info: Any) -> Any:
        """A JSON object given as text (the earlier form of these fields) is read as that object."""
        if not isinstance(value, str):
            return value
        try:
            value = json.loads(value or "{}")
        except ValueError as exc:
            raise ValueError(f"{info.field_name} is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{info.field_name} must be a JSON object, got {type(value).__name__}")
        return value

    @model_validator(mode="after")
    def _overrides_are_settings(self) -> "TrainingResource":
        for name, build in (("sft_overrides", self.sft), ("grpo_overrides", self.grpo)):
            try:
                build()
            except ValidationError as exc:
                raise ValueError("; ".join(
                    f"{'.'.join((name, *(str(part) for part in error['loc'])))}: "
                    f"{error['msg'].removeprefix('Value error, ')}" for error in exc.errors())) from None
        return self

    def sft(self) -> SFTSettings:
        overrides = self.sft_overrides
        return SFTSettings.gpu(**overrides) if self.profile == "gpu" else SFTSettings(**overrides)

    def grpo(self) -> GRPOSettings:
        overrides = self.grpo_overrides
        return GRPOSettings.gpu(**overrides) if self.profile == "gpu" else GRPOSettings(**overrides)

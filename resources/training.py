"""What to train and how hard: the base model spec and the SFT / GRPO settings (TRL knobs) per deployment.

Profiles: `cpu` (the laptop demo defaults), `gpu` (bf16, vLLM colocate; configuration only), and
any override given as JSON, e.g. '{"max_steps": 2}' for a quick run.
"""

import json
from typing import Any, Literal

from dagster import ConfigurableResource
from pydantic import Field

from agent_rl.train.config import GRPOSettings, SFTSettings


class TrainingResource(ConfigurableResource):
    base_model: str = Field(default="base", description="'base' (SmolLM2-135M), 'tiny', a path or a hub name")
    profile: Literal["cpu", "gpu"] = "cpu"
    sft_overrides: str = Field(default="{}", description="JSON merged into SFTSettings")
    grpo_overrides: str = Field(default="{}", description="JSON merged into GRPOSettings")

    def _overrides(self, text: str, name: str) -> dict[str, Any]:
        try:
            value = json.loads(text or "{}")
        except ValueError as exc:
            raise ValueError(f"{name} is not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise ValueError(f"{name} must be a JSON object")
        return value

    def sft(self) -> SFTSettings:
        overrides = self._overrides(self.sft_overrides, "sft_overrides")
        return SFTSettings.gpu(**overrides) if self.profile == "gpu" else SFTSettings(**overrides)

    def grpo(self) -> GRPOSettings:
        overrides = self._overrides(self.grpo_overrides, "grpo_overrides")
        return GRPOSettings.gpu(**overrides) if self.profile == "gpu" else GRPOSettings(**overrides)

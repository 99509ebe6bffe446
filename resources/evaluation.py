"""Validation settings: the held-out sample and the gates a candidate must pass to be registered."""

from dagster import ConfigurableResource
from pydantic import Field

from agent_rl.evaluate.harness import EvalConfig
from agent_rl.evaluate.report import GateSettings
from agent_rl.turn_budget import DEFAULT_MAX_TURNS


class EvaluationResource(ConfigurableResource):
    max_scenarios: int = Field(default=60, ge=1, description="held-out scenarios per model (fixed seed)")
    seed: int = 0
    min_relative_improvement: float = Field(default=0.10, description="over the champion's accuracy")
    max_forgetting_drop: float = Field(default=0.10, ge=0, le=1)
    torch_threads: int = Field(default=1, ge=1, description="CPU threads for the models under evaluation (it runs "
                               "in the Dagster step's process); 1 on a busy machine, every core when it runs alone")
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=1, description="turn budget per episode; GRPO trains with "
                           "the same one unless grpo_overrides sets max_turns apart")
    batch_size: int = Field(default=16, ge=1, description="episodes decoded together; larger is faster when the "
                            "evaluation has the machine to itself (bf16 greedy outputs depend slightly on it)")

    def eval_config(self) -> EvalConfig:
        return EvalConfig(max_scenarios=self.max_scenarios, seed=self.seed, max_turns=self.max_turns,
                          batch_size=self.batch_size)

    def gates(self) -> GateSettings:
        return GateSettings(min_relative_improvement=self.min_relative_improvement,
                            max_forgetting_drop=self.max_forgetting_drop)

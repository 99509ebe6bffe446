"""Sequential A/B statistics (always-valid mSPRT) and the gradual-rollout decision policy."""

from agent_rl.ab.outcomes import arm_stats_from_episodes, feedback_verdict
from agent_rl.ab.rollout import (
    Decision,
    Guardrails,
    Margin,
    RolloutConfig,
    RolloutEvent,
    RolloutState,
    apply_decision,
    decide,
)
from agent_rl.ab.stats import (
    ArmStats,
    GuardrailResult,
    SequentialTestConfig,
    TestResult,
    always_valid_test,
    fixed_horizon_z_test,
)

__all__ = [
    "ArmStats",
    "Decision",
    "GuardrailResult",
    "Guardrails",
    "Margin",
    "RolloutConfig",
    "RolloutEvent",
    "RolloutState",
    "SequentialTestConfig",
    "TestResult",
    "always_valid_test",
    "apply_decision",
    "arm_stats_from_episodes",
    "decide",
    "feedback_verdict",
    "fixed_horizon_z_test",
]

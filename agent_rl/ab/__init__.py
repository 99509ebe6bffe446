"""Sequential A/B statistics (always-valid mSPRT) and the gradual-rollout decision policy."""

from agent_rl.ab.evidence import ArmEstimate, Disagreement, LabeledArm, disagreement, ppi_estimate, ppi_test
from agent_rl.ab.outcomes import arm_stats_from_episodes, feedback_verdict, labeled_arms_from_episodes
from agent_rl.ab.rollout import (
    Decision,
    Guardrails,
    Labels,
    LabelSettings,
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
    "ArmEstimate",
    "ArmStats",
    "Decision",
    "Disagreement",
    "GuardrailResult",
    "Guardrails",
    "LabelSettings",
    "LabeledArm",
    "Labels",
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
    "disagreement",
    "feedback_verdict",
    "fixed_horizon_z_test",
    "labeled_arms_from_episodes",
    "ppi_estimate",
    "ppi_test",
]

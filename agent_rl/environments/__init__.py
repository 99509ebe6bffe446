"""Environments as plug-ins: the contract (core.py), discovery (registry.py) and safe calls (sessions.py)."""

from agent_rl.environments.core import (
    Environment,
    EnvironmentError,
    FinalAnswer,
    Judgement,
    PrivacySpec,
    ProbeItem,
    Task,
    Trajectory,
    WorldPrivacy,
)

__all__ = ["Environment", "EnvironmentError", "FinalAnswer", "Judgement", "PrivacySpec", "ProbeItem", "Task",
           "Trajectory", "WorldPrivacy"]

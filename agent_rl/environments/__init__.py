"""Environments as plug-ins: the contract (core.py), discovery (registry.py) and safe calls (sessions.py)."""

from agent_rl.environments.core import (
    Capabilities,
    Environment,
    EnvironmentError,
    FinalAnswer,
    Grading,
    Judgement,
    PrivacySpec,
    ProbeItem,
    StoredWorld,
    Task,
    Trajectory,
    World,
    WorldPrivacy,
)

__all__ = ["Capabilities", "Environment", "EnvironmentError", "FinalAnswer", "Grading", "Judgement", "PrivacySpec",
           "ProbeItem", "StoredWorld", "Task", "Trajectory", "World", "WorldPrivacy"]

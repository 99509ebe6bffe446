"""Moved to agent_rl/simulated_users/behaviour.py (the simulators live apart from the production labeler); this name
imports it, with a warning, for one release."""

import warnings

from agent_rl.simulated_users.behaviour import *  # noqa: F401,F403

warnings.warn("agent_rl.feedback.behaviour moved to agent_rl.simulated_users.behaviour", DeprecationWarning, stacklevel=2)

"""Moved to agent_rl/simulated_users/outside_agent.py (the simulators live apart from the production labeler); this name
imports it, with a warning, for one release."""

import warnings

from agent_rl.simulated_users.outside_agent import *  # noqa: F401,F403

warnings.warn("agent_rl.feedback.outside_agent moved to agent_rl.simulated_users.outside_agent", DeprecationWarning, stacklevel=2)

"""Moved to agent_rl/simulated_users/population.py (the simulators live apart from the production labeler); this name
imports it, with a warning, for one release."""

import warnings

from agent_rl.simulated_users.population import *  # noqa: F401,F403

warnings.warn("agent_rl.feedback.population moved to agent_rl.simulated_users.population", DeprecationWarning, stacklevel=2)

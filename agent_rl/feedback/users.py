"""Moved to agent_rl/simulated_users/users.py (the simulators live apart from the production labeler); this name
imports it, with a warning, for one release."""

import warnings

from agent_rl.simulated_users.users import *  # noqa: F401,F403

warnings.warn("agent_rl.feedback.users moved to agent_rl.simulated_users.users", DeprecationWarning, stacklevel=2)

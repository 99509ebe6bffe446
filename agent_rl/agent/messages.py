"""The old place of the ground floor's `agent_rl.environments.messages`: this name is the same module, read, warned,
for one release (environments import only the ground floor, and they play and read conversations through it)."""

import sys
import warnings

from agent_rl.environments import messages as _moved

warnings.warn("agent_rl.agent.messages is now agent_rl.environments.messages; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved

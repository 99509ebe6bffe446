"""The old place of the ground floor's `agent_rl.environments.runner`: this name is the same module, read, warned,
for one release (environments import only the ground floor, and they play and read conversations through it)."""

import sys
import warnings

from agent_rl.environments import runner as _moved

warnings.warn("agent_rl.agent.runner is now agent_rl.environments.runner; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved

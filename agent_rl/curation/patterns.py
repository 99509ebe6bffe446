"""The old place of the ground floor's `agent_rl.privacy.patterns`: this name is the same module, read, warned, for one
release (environments import only the ground floor, and they run the privacy kit)."""

import sys
import warnings

from agent_rl.privacy import patterns as _moved

warnings.warn("agent_rl.curation.patterns is now agent_rl.privacy.patterns; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved

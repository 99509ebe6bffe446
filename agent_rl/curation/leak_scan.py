"""The old place of the ground floor's `agent_rl.privacy.leak_scan`: this name is the same module, read, warned, for one
release (environments import only the ground floor, and they run the privacy kit)."""

import sys
import warnings

from agent_rl.privacy import leak_scan as _moved

warnings.warn("agent_rl.curation.leak_scan is now agent_rl.privacy.leak_scan; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved

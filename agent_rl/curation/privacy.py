"""The old place of the ground floor's `agent_rl.privacy.audit`: this name is the same module, read, warned, for one
release (environments import only the ground floor, and they run the privacy kit)."""

import sys
import warnings

from agent_rl.privacy import audit as _moved

warnings.warn("agent_rl.curation.privacy is now agent_rl.privacy.audit; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved

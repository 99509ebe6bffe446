"""The chat client's old place: it is `agent_rl.chat_client` now (a leaf the environments may use); this name is
read, warned, for one release."""

import warnings

from agent_rl.chat_client import (ChatClient, ChatEndpoint, ChatEndpointError, ChatReply, ClosesOnExit,
                                  extract_json)

warnings.warn("agent_rl.agent.chat_client is now agent_rl.chat_client; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)

__all__ = ["ChatClient", "ChatEndpoint", "ChatEndpointError", "ChatReply", "ClosesOnExit", "extract_json"]

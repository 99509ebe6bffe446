"""The gateway's live traffic as an environment: an agent that is no plug-in of ours, served through the arbiter's
OpenAI-compatible gateway, with no world the loop can open and no judge but its users."""

from agent_rl.environments.gateway.environment import GatewayEnvironment

__all__ = ["GatewayEnvironment"]

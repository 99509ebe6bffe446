"""Tool calls as conversations hold them: the reader lives on the ground floor (agent_rl/environments/tool_calls.py),
where environments and their rollouts read calls too; importable here under its old name."""

from agent_rl.environments.tool_calls import MalformedArguments, call_function, call_name, decode_arguments

__all__ = ["MalformedArguments", "call_function", "call_name", "decode_arguments"]

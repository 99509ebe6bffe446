"""A training row read as the chat template wants it: its messages normalised and its tool schemas as offered.

Shared by SFT's tokenizer (agent_rl/train/sft.py) and the static prefix (agent_rl/train/static_prefix.py), which
must render a row's opening exactly as SFT does; a module of its own so the static prefix does not import sft.py,
which imports it.
"""

from __future__ import annotations

import json
from typing import Any


def normalize_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    """Plain-Python messages with tool-call arguments as dicts (the template renders them with `tojson`)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of chat messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"{where}: messages[{i}] needs a role of system/user/assistant/tool")
        message = {k: v for k, v in message.items() if v is not None}  # nulls from schema merging render as 'None'
        message["content"] = "" if message.get("content") is None else str(message["content"])
        calls = []
        for call in message.get("tool_calls") or []:
            function = dict(call.get("function", call))
            arguments = function.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments) if arguments.strip() else {}
                except ValueError:
                    raise ValueError(f"{where}: messages[{i}] has tool-call arguments that are not JSON") from None
            calls.append({"type": "function", "function": {"name": function.get("name"), "arguments": arguments}})
        if calls:
            message["tool_calls"] = calls
        else:
            message.pop("tool_calls", None)
        out.append(message)
    return out


def row_tools(tools: Any) -> list[dict[str, Any]] | None:
    """The row's tool schemas exactly as they were offered when the episode was served (None: no tools).

    Their key order is part of the prompt; datasets keep it (curation/datasets.py), so nothing is reordered here."""
    if isinstance(tools, str):
        tools = json.loads(tools)
    return list(tools) if tools else None

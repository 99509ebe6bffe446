"""The assistant messages the gateway answers with, in OpenAI's wire shape.

A client sends OpenAI wire messages; our policies (`Policy.act`) are handed them in the chat template's shape
(environments/messages.py: text content, argument objects, the tool's name on each result) and answer with a
`PolicyTurn`. The episode stores the wire messages exactly as the client sent them, so what is built here is only
the assistant message the client gets back (which is also what the episode records as the reply).
"""

from __future__ import annotations

import uuid
from typing import Any

from agent_rl.environments.messages import wire_arguments
from agent_rl.agent.policy import PolicyTurn


def undeclared_tools(message: dict[str, Any], tools: list[dict[str, Any]] | None) -> list[str]:
    """Names the reply calls that the client did not declare (every one when it declared none): a version trained
    for another agent's tools must not hand this client a call it cannot run."""
    declared = {(tool.get("function") or {}).get("name") for tool in tools or []}
    return sorted({(call.get("function") or {}).get("name") or "" for call in message.get("tool_calls") or []} - declared)


def assistant_message(content: str | None, calls: list[tuple[str | None, str, str]]) -> dict[str, Any]:
    """An OpenAI assistant message from its text and its tool calls as `(id, name, arguments JSON)`: every
    call gets an id (one is made up where the model gave none); without calls, content is text, never null."""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {"id": call_id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": name, "arguments": arguments}}
            for call_id, name, arguments in calls
        ]
    elif message["content"] is None:
        message["content"] = ""
    return message


def turn_to_message(turn: PolicyTurn) -> dict[str, Any]:
    """A PolicyTurn as an OpenAI assistant message (arguments as JSON text, every call with an id)."""
    return assistant_message(turn.content, [(call.id, call.name, wire_arguments(call.arguments))
                                            for call in turn.tool_calls or []])


def upstream_message(payload: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of an OpenAI-compatible upstream's completion, without the empty fields some
    servers add (`refusal: null`, `annotations: []`, ...)."""
    message = dict(payload["choices"][0]["message"])
    message["role"] = "assistant"
    for extra in ("refusal", "annotations", "audio", "function_call", "reasoning_content"):
        if message.get(extra) in (None, [], ""):
            message.pop(extra, None)
    return message

"""Messages between OpenAI's layout and the one our policies read and write.

A client sends OpenAI wire messages (content as a string or a list of parts, tool-call arguments as JSON
text, tool results naming only the call they answer); our policies (`Policy.act`) read text content, argument
objects and the tool's name on each result, and answer with a `PolicyTurn`. The episode stores the wire
messages exactly as the client sent them, so these conversions only ever build what a policy is handed and
the assistant message the client gets back (which is also what the episode records as the reply).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from agent_rl.agent.policy import PolicyTurn


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text")


def undeclared_tools(message: dict[str, Any], tools: list[dict[str, Any]] | None) -> list[str]:
    """Names the reply calls that the client did not declare (every one when it declared none): a version trained
    for another agent's tools must not hand this client a call it cannot run."""
    declared = {(tool.get("function") or {}).get("name") for tool in tools or []}
    return sorted({(call.get("function") or {}).get("name") or "" for call in message.get("tool_calls") or []} - declared)


def to_policy_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI wire messages as our policies read them: text content, tool-call arguments as objects,
    tool results carrying the name of the tool they answer."""
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "developer":
            role = "system"
        converted: dict[str, Any] = {"role": role, "content": text_of(message.get("content"))}
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = call["function"]
                try:
                    arguments = json.loads(function["arguments"]) if function["arguments"].strip() else {}
                except ValueError:
                    arguments = function["arguments"]
                names[call["id"]] = function["name"]
                calls.append({"id": call["id"], "type": "function",
                              "function": {"name": function["name"], "arguments": arguments}})
            converted["tool_calls"] = calls
        elif role == "tool":
            converted["tool_call_id"] = message["tool_call_id"]
            converted["name"] = message.get("name") or names.get(message["tool_call_id"], "")
        out.append(converted)
    return out


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
    """A PolicyTurn as an OpenAI assistant message (arguments JSON-encoded, every call with an id)."""
    return assistant_message(turn.content, [
        (call.id, call.name, call.arguments if isinstance(call.arguments, str)
         else json.dumps(call.arguments, ensure_ascii=False))
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

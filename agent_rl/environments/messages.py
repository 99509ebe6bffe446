"""One set of rules for chat messages, toward the two shapes the project hands them on in.

Conversations come in OpenAI's wire shape (a client through the gateway, an episode exported from the pool, a
fine-tuning job's rows) or as our policies write them (`PolicyTurn`, `ToolCall`). They leave either for a chat
template (a prompt to render, a row to train on) or for an OpenAI-compatible server. Every reader and writer of
messages goes through the functions here, so serving and training read a message the same way
(tests/train/test_training_matches_serving.py checks that token for token).

Role
  - "developer" (OpenAI's newer name for system) is "system" toward a chat template: ours know no other name for
    it, and a template leaves out a message of a role it does not know. The wire keeps "developer".
  - A missing role is "user". Any other role is kept as given where a conversation is only shown, and refused
    where one is trained on (`training_messages`: system, user, assistant, tool, and developer as system).

Content
  - Toward a template: text. None is "", a string is itself, a list of content parts is the text of its string
    parts and {"type": "text"} parts joined (an image or another part has no text), anything else is its str().
    An assistant turn with tool calls and no text has "".
  - On the wire: as given (a string or a list of parts, which servers read), None as "", except that an
    assistant turn with tool calls and no text has null (as OpenAI sends it).

Tool calls (assistant messages only: a template renders no other role's calls and the gateway refuses them)
  - Read in either layout: OpenAI's {"id", "type": "function", "function": {"name", "arguments"}} or a flat
    {"name", "arguments"} (TRL's parsed calls), and our `ToolCall(name, arguments, id)` from a policy.
  - Toward a template: {"id" (where the call has one), "type": "function", "function": {"name", "arguments"}}
    with arguments as an object: templates write it with `tojson`, so JSON text would be encoded twice and the
    prompt would differ from the training text.
  - On the wire: every call has an id (`call_<turn>_<call>` made up where it has none) and arguments as JSON
    text (`wire_arguments`): an object is encoded with ensure_ascii=False (text stays as written), text goes as
    it came.
  - A tool result keeps its tool_call_id (where there is one; the wire makes one up for a result without, the
    first call of the turn before not yet answered) and, toward a template, names the tool it answers: its own
    "name", else the name of the earlier call with that id.
  - Only these keys are kept (role, content, tool_calls, and tool_call_id and name on a tool result): refusal,
    audio, annotations and nulls left by merged dataset schemas are not part of a conversation.

Arguments (one decoder: `call_arguments`, on agent/tool_calls.py's `decode_arguments`)
  - An object is itself (a copy); JSON text of an object is decoded; None, a missing field, "" and blank text are
    a call without arguments, {} (OpenAI-style servers send "" for one).
  - Malformed arguments (text that is not JSON, JSON that is not an object, a value that is not an object) are
    never repaired and never replaced by {}. They keep their raw text (a value that is not text: its JSON
    text); a str where well-formed arguments are a dict is the marker (`is_malformed`).
    Where a conversation is only shown (a prompt rendered for serving, the gateway handing a client's history to
    a policy, a replayed step) the template writes that text as a JSON string and the wire sends it back as it
    came. Where a call is acted on or judged it is a format error: the runner ends the episode as unparsable
    (`policy_calls`), the local and HTTP policies report a parse error (chat_format.parse_tool_call), the
    validation suite quarantines the episode (curation/conversation_rules.py) and the hacking detectors read it
    as {"_raw": text}. Training data never holds one, raw or repaired: `sft_rows` leaves such an episode out
    and `training_messages` refuses a row that has one.

Which direction each caller needs
  - `template_messages`, the chat template's shape: `render_prompt` (local and engine policies, the static
    prefix), the gateway handing a client's conversation to a policy, curation's SFT rows and replay steps
    (curation/datasets.py `conversation`, with ids=False: a row is the same bytes whatever ids a run made up).
  - `training_messages`: the same shape, strict, for a training row (train/sft.py, train/static_prefix.py).
  - `wire_messages`, `wire_arguments`, OpenAI's shape: requests to an OpenAI-compatible server
    (agent/http_policy.py, arbiter/upstreams.py) and the gateway's replies (arbiter/gateway/messages.py).
  - `policy_calls`: a PolicyTurn's calls with their arguments decoded, for the runner to execute.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from agent_rl.environments.policy import PolicyTurn, ToolCall
from agent_rl.environments.tool_calls import call_function, decode_arguments

# The roles a chat template renders (developer is rendered as system).
ROLES = ("system", "user", "assistant", "tool")


def template_role(role: Any) -> str:
    """A message's role toward a chat template: developer as system, a missing one as user."""
    role = str(role or "user")
    return "system" if role == "developer" else role


def text_of(content: Any, sep: str = "") -> str:
    """The text of a message's content: a string, or the text of a list of content parts joined with `sep` (""
    toward a template; readers that match words across parts, such as the feedback signals and the judge, use " ")."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return sep.join(part if isinstance(part, str) else str(part.get("text", "")) for part in content
                        if isinstance(part, str) or (isinstance(part, Mapping) and part.get("type") == "text"))
    return str(content)


def call_arguments(raw: Any) -> dict[str, Any] | str:
    """A call's arguments as an object; malformed ones as their raw text (see the module docstring)."""
    try:
        return decode_arguments(raw)
    except ValueError:
        return raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False, default=str)


def is_malformed(arguments: Any) -> bool:
    """Whether arguments as `call_arguments` gives them are malformed (kept as text, not an object)."""
    return not isinstance(arguments, Mapping)


def wire_arguments(raw: Any) -> str:
    """A call's arguments as the wire carries them: text as it came (blank: "{}"), anything else as JSON text."""
    if isinstance(raw, str):
        return raw if raw.strip() else "{}"
    return "{}" if raw is None else json.dumps(raw, ensure_ascii=False)


def _call_id(call: Any) -> str:
    call_id = call.get("id") if isinstance(call, Mapping) else None
    return call_id if isinstance(call_id, str) else ""


def template_messages(messages: Iterable[Mapping[str, Any]], ids: bool = True) -> list[dict[str, Any]]:
    """Messages in the chat template's shape (module docstring); ids=False leaves out call ids and tool_call_id."""
    names: dict[str, str] = {}  # call id -> the name of the tool it called
    out: list[dict[str, Any]] = []
    for message in messages:
        role = template_role(message.get("role"))
        content = text_of(message.get("content"))
        if role == "tool":
            call_id = message.get("tool_call_id")
            named = message.get("name") or (names.get(call_id, "") if isinstance(call_id, str) else "")
            result: dict[str, Any] = {"role": "tool", "name": str(named), "content": content}
            if ids and call_id is not None:
                result["tool_call_id"] = call_id
            out.append(result)
            continue
        converted: dict[str, Any] = {"role": role, "content": content}
        calls = []
        for call in (message.get("tool_calls") or []) if role == "assistant" else []:
            function = call_function(call) or {}
            name = str(function.get("name") or "")
            entry: dict[str, Any] = {"type": "function",
                                     "function": {"name": name, "arguments": call_arguments(function.get("arguments"))}}
            call_id = _call_id(call)
            if call_id:
                names[call_id] = name
                if ids:
                    entry = {"id": call_id, **entry}
            calls.append(entry)
        if calls:
            converted["tool_calls"] = calls
        out.append(converted)
    return out


def malformed_calls(messages: Iterable[Mapping[str, Any]]) -> int:
    """How many calls of template-shaped messages have malformed arguments."""
    return sum(is_malformed(call["function"]["arguments"]) for message in messages
               for call in message.get("tool_calls") or [])


def training_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    """A training row's messages in the chat template's shape; ValueError naming `where` for a row that is not a
    conversation, a role the template does not render or a call with malformed arguments."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of chat messages")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in (*ROLES, "developer"):
            raise ValueError(f"{where}: messages[{i}] needs a role of system/user/assistant/tool")
    out = template_messages(messages)
    for i, message in enumerate(out):
        if malformed_calls([message]):
            raise ValueError(f"{where}: messages[{i}] has tool-call arguments that are not a JSON object")
    return out


def wire_content(content: Any) -> str | list[Any]:
    """Content as the wire carries it: a string or a list of parts as given, None as ""."""
    if content is None:
        return ""
    return content if isinstance(content, (str, list)) else str(content)


def wire_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages in OpenAI's wire shape (module docstring): arguments as JSON text, every tool call with an id and
    every tool result pointing at one (servers reject unmatched tool messages)."""
    wire: list[dict[str, Any]] = []
    unanswered: list[str] = []  # ids of the last assistant turn's calls not yet matched by a tool message
    for turn_index, message in enumerate(messages):
        role = str(message.get("role") or "user")
        content = message.get("content")
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call_index, call in enumerate(message["tool_calls"]):
                function = call_function(call) or {}
                calls.append({"id": _call_id(call) or f"call_{turn_index}_{call_index}", "type": "function",
                              "function": {"name": str(function.get("name") or ""),
                                           "arguments": wire_arguments(function.get("arguments"))}})
            unanswered = [c["id"] for c in calls]
            wire.append({"role": "assistant", "content": content or None, "tool_calls": calls})
        elif role == "tool":
            call_id = message.get("tool_call_id") or (unanswered[0] if unanswered else f"call_{turn_index}")
            if call_id in unanswered:
                unanswered.remove(call_id)
            wire.append({"role": "tool", "tool_call_id": call_id, "content": wire_content(content)})
        else:
            wire.append({"role": role, "content": wire_content(content)})
    return wire


def policy_calls(turn: PolicyTurn) -> list[ToolCall] | None:
    """The turn's tool calls with their arguments decoded (`call_arguments`); None when any call is malformed:
    not a ToolCall, a name that is not text, or malformed arguments (the runner's unparsable format error)."""
    if not isinstance(turn.tool_calls, list):
        return None
    calls = []
    for call in turn.tool_calls:
        if not isinstance(call, ToolCall) or not isinstance(call.name, str):
            return None
        arguments = call_arguments(call.arguments)
        if is_malformed(arguments):
            return None
        calls.append(ToolCall(name=call.name, arguments=dict(arguments), id=call.id if isinstance(call.id, str) else ""))
    return calls

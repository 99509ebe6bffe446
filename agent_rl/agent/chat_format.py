"""The text format between conversations and a chat model: render a conversation (with tool schemas) into the
generation prompt through the tokenizer's chat template, and parse generated text (Qwen2.5 / Hermes style
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks) back into a PolicyTurn.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agent_rl.agent.policy import PolicyTurn, ToolCall

TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# Generation may run past the turn (e.g. a sampled continuation); everything after the first of these is dropped.
END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|im_start|>")


def normalize_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message in the layout the chat template expects: string content, tool-call arguments as objects.

    OpenAI-style messages carry arguments as JSON strings; rendered as they are, the template would
    double-encode them and the prompt would differ from the training text.
    """
    out: dict[str, Any] = {"role": str(message.get("role") or "user"), "content": _text(message.get("content"))}
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass  # keep the raw string: the model's malformed call stays visible to it
        calls.append({"type": "function", "function": {"name": str(function.get("name", "")), "arguments": arguments}})
    if calls:
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if key in message:
            out[key] = message[key]
    return out


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return str(content)


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                  add_generation_prompt: bool = True) -> str:
    """The generation prompt: the conversation rendered by the chat template, ending with the assistant header
    exactly as the template writes it in training (`<|im_start|>assistant\\n` for ChatML)."""
    return tokenizer.apply_chat_template(
        [normalize_message(m) for m in messages],
        tools=tools or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )


def strip_turn_end(text: str) -> str:
    """Generated text up to (not including) the end of the assistant turn."""
    cut = len(text)
    for marker in END_MARKERS:
        index = text.find(marker)
        if index != -1:
            cut = min(cut, index)
    return text[:cut]


def parse_tool_call(block: str) -> ToolCall:
    """One `<tool_call>` body as a ToolCall; ValueError naming what is wrong otherwise."""
    try:
        payload = json.loads(block.strip())
    except json.JSONDecodeError as exc:
        raise ValueError(f"tool call is not valid JSON ({exc.msg} at char {exc.pos}): {block.strip()[:80]!r}") from None
    if not isinstance(payload, dict):
        raise ValueError(f"tool call must be a JSON object with 'name' and 'arguments', got {type(payload).__name__}")
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("tool call has no 'name' (a non-empty string is required)")
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the OpenAI wire form, arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise ValueError(f"tool call {name!r}: 'arguments' is a string that is not valid JSON") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ValueError(f"tool call {name!r}: 'arguments' must be a JSON object, got {type(arguments).__name__}")
    return ToolCall(name=name.strip(), arguments=arguments)


def parse_completion(text: str) -> PolicyTurn:
    """Generated assistant text as a PolicyTurn. Never raises: malformed tool calls set `parse_error`
    (well-formed calls in the same turn are kept), text outside tool-call blocks becomes `content`."""
    text = strip_turn_end(text if isinstance(text, str) else str(text))
    calls: list[ToolCall] = []
    errors: list[str] = []
    for match in TOOL_CALL_BLOCK.finditer(text):
        try:
            call = parse_tool_call(match.group(1))
        except ValueError as exc:
            errors.append(str(exc))
            continue
        call.id = f"call_{len(calls)}"
        calls.append(call)
    rest = TOOL_CALL_BLOCK.sub("", text)
    if "<tool_call>" in rest:
        errors.append("unterminated <tool_call> block (no </tool_call>; generation may have hit max_new_tokens)")
        rest = rest[: rest.index("<tool_call>")]
    elif "</tool_call>" in rest:
        errors.append("</tool_call> without a matching <tool_call>")
    return PolicyTurn(content=rest.strip(), tool_calls=calls, parse_error="; ".join(errors) or None)

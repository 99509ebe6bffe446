"""The text format between conversations and a chat model: render a conversation (with tool schemas) into the
generation prompt through the tokenizer's chat template, and parse generated text (Qwen2.5 / Hermes style
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks) back into a PolicyTurn.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agent_rl.environments.messages import template_messages
from agent_rl.agent.policy import PolicyTurn, ToolCall
from agent_rl.agent.tool_calls import MalformedArguments, decode_arguments

TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# Generation may run past the turn (e.g. a sampled continuation); everything after the first of these is dropped.
END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|im_start|>")


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                  add_generation_prompt: bool = True) -> str:
    """The generation prompt: the conversation rendered by the chat template, ending with the assistant header
    exactly as the template writes it in training (`<|im_start|>assistant\\n` for ChatML). Messages are put in the
    template's shape first (environments/messages.py): OpenAI-style JSON-text arguments rendered as they are would be
    encoded twice and the prompt would differ from the training text."""
    return tokenizer.apply_chat_template(
        template_messages(messages),
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
    # Some models emit the OpenAI wire form, arguments as JSON text; none, null or "" is a call without arguments.
    raw = payload.get("arguments")
    try:
        arguments = decode_arguments(raw)
    except MalformedArguments:
        raise ValueError(f"tool call {name!r}: 'arguments' is a string that is not valid JSON: {raw[:80]!r}") from None
    except ValueError:
        got = json.loads(raw) if isinstance(raw, str) else raw
        raise ValueError(f"tool call {name!r}: 'arguments' must be a JSON object, got {type(got).__name__}") from None
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

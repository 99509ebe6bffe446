"""OpenAI's score_model grader, asked through our OpenAI-compatible chat client (agent_rl/chat_client.py).

The grader's messages are rendered and sent to the operator's endpoint with the grader's model. OpenAI forces a
structured reply; an OpenAI-compatible server may not, so we ask for `{"result": <number>}` in a system message
and read the number out of the reply (a JSON object with `result` or `score`, or a bare number), retrying
unusable replies like the LLM judge does. The number is clipped to `range` and mapped linearly onto [0, 1].
An endpoint that keeps failing scores 0.0 with the reason, so one judge outage shows in the reasons instead of
stopping a training step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from agent_rl.chat_client import ChatEndpoint, ChatEndpointError, ChatReply, extract_json
from agent_rl.graders.config import GraderConfigError, InputText, ScoreModelGrader
from agent_rl.graders.context import GraderContext
from agent_rl.graders.result import GradeResult
from agent_rl.graders.templates import render

_NUMBER = re.compile(r"\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*")


def instruction(low: float, high: float) -> str:
    return f'Reply with JSON only: {{"result": <a number from {low:g} to {high:g}>}}.'


def build_messages(grader: ScoreModelGrader, sample: Mapping[str, Any],
                   item: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:  # fmt: skip
    """The chat messages for this sample (templates rendered), and the sample references that were missing."""
    messages: list[dict[str, Any]] = []
    missing: list[str] = []

    def text_of(template: str) -> str:
        text, gaps = render(template, sample, item)
        missing.extend(gaps)
        return text

    for message in grader.input:
        role = "system" if message.role == "developer" else message.role  # not every server knows "developer"
        if isinstance(message.content, str):
            content: Any = text_of(message.content)
        elif all(isinstance(part, InputText) for part in message.content):
            content = "\n".join(text_of(part.text) for part in message.content)
        else:
            content = [
                {"type": "text", "text": text_of(part.text)} if isinstance(part, InputText)
                else {"type": "image_url", "image_url": {"url": text_of(part.image_url),
                                                         **({"detail": part.detail} if part.detail else {})}}
                for part in message.content
            ]  # fmt: skip
        messages.append({"role": role, "content": content})

    ask = instruction(*grader.range)
    if messages[0]["role"] == "system" and isinstance(messages[0]["content"], str):
        messages[0] = {"role": "system", "content": f"{messages[0]['content']}\n\n{ask}"}
    else:
        messages.insert(0, {"role": "system", "content": ask})
    return messages, missing


def parse_score(reply: ChatReply) -> float:
    """The number in a reply; ValueError (the chat client then asks again) when there is none."""
    text = reply.content.strip()
    if _NUMBER.fullmatch(text):
        value: Any = float(text)
    else:
        value = extract_json(text)
        if isinstance(value, dict):
            value = value.get("result", value.get("score"))
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f'expected a number or {{"result": <number>}}, got {text[:120]!r}')
    return float(value)


def endpoint_for(grader: ScoreModelGrader, base: ChatEndpoint) -> ChatEndpoint:
    """The operator's endpoint with the grader's model and the sampling parameters our client sends."""
    update: dict[str, Any] = {"model": grader.model}
    params = grader.sampling_params
    if params and params.temperature is not None:
        update["temperature"] = params.temperature
    if params and params.max_completions_tokens is not None:
        update["max_tokens"] = params.max_completions_tokens
    return base.model_copy(update=update)


def normalized(value: float, low: float, high: float) -> float:
    return (min(high, max(low, value)) - low) / (high - low)


def grade_score_model(grader: ScoreModelGrader, sample: Mapping[str, Any], item: Mapping[str, Any],
                      context: GraderContext) -> GradeResult:  # fmt: skip
    if context.chat_endpoint is None:
        raise GraderConfigError(
            f"score_model grader {grader.name!r} needs a chat endpoint: set GraderContext.chat_endpoint"
        )
    messages, missing = build_messages(grader, sample, item)
    client = context.chat_client(endpoint_for(grader, context.chat_endpoint))
    try:
        value = client.complete(messages, parse_score)
    except ChatEndpointError as exc:
        return GradeResult(score=0.0, reason=f"score_model {grader.name!r} got no score: {exc}")
    low, high = grader.range
    notes = list(missing)
    if not low <= value <= high:
        notes.append(f"the model answered {value:g}, outside [{low:g}, {high:g}]: clipped")
    return GradeResult(score=normalized(value, low, high), reason="; ".join(notes) or None)

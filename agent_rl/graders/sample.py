"""The `sample` a grader sees: what the policy produced, in the shape OpenAI's graders expect.

OpenAI fills `output_text`, `output_json` (the output as a JSON object, when it is one), `output_tools` (the
tool calls, Chat Completions shape) and `choices`; `make_sample` builds the same from one assistant reply, so
a template such as `{{ sample.output_json.answer }}` means here what it meant there.
"""

from __future__ import annotations

import json
from typing import Any

# The sample fields a template may name (OpenAI's list; output_audio is never filled by our policies).
SAMPLE_FIELDS = ("output_text", "output_json", "output_tools", "choices", "output_audio")


def make_sample(output_text: str, tool_calls: list[dict[str, Any]] | None = None, *,
                output_json: dict[str, Any] | None = None, finish_reason: str = "stop") -> dict[str, Any]:  # fmt: skip
    """A grader sample from one assistant reply; `output_json` is parsed from the text when not given.

    Only a JSON object counts as `output_json` (OpenAI: "the model output content as a JSON object"); any other
    text leaves it None.
    """
    if output_json is None:
        try:
            parsed = json.loads(output_text)
        except (TypeError, ValueError):
            parsed = None
        output_json = parsed if isinstance(parsed, dict) else None
    tools = list(tool_calls or [])
    message: dict[str, Any] = {"role": "assistant", "content": output_text}
    if tools:
        message["tool_calls"] = tools
    return {
        "output_text": output_text,
        "output_json": output_json,
        "output_tools": tools,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tools else finish_reason}],
    }

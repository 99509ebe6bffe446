"""Streaming (`stream: true`) in OpenAI's server-sent-events format, both ways.

Our policies' replies are produced whole and then cut into the chunks OpenAI streams (`stream_chunks`). An
OpenAI-compatible upstream's stream is relayed chunk by chunk, and `StreamedReply` puts its deltas back
together into the assistant message the episode records; the chunk with the finish reason is held back and
sent last, carrying the episode id (`agent_rl.episode_id`), followed by the usage chunk when the client asked
for it (`stream_options.include_usage`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from agent_rl.arbiter.gateway.messages import assistant_message
from agent_rl.arbiter.gateway.wire import usage_counts

STREAM_PIECE_CHARS = 24


def stream_chunks(response: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A finished completion as the chunks OpenAI streams: role, content pieces, tool calls (name, then
    argument pieces, by index), the finish reason, and the usage chunk when asked for."""
    base = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
            "model": response["model"]}
    choice = response["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    content = message.get("content") or ""
    for start in range(0, len(content), STREAM_PIECE_CHARS):
        chunks.append(chunk({"content": content[start:start + STREAM_PIECE_CHARS]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                              "function": {"name": call["function"]["name"], "arguments": ""}}]}))
        arguments = call["function"]["arguments"]
        for start in range(0, len(arguments), STREAM_PIECE_CHARS):
            chunks.append(chunk({"tool_calls": [{"index": index,
                                                 "function": {"arguments": arguments[start:start + STREAM_PIECE_CHARS]}}]}))
    final = chunk({}, choice["finish_reason"])
    final["agent_rl"] = response["agent_rl"]
    chunks.append(final)
    if include_usage:
        chunks.append({**base, "choices": [], "usage": response["usage"], "agent_rl": response["agent_rl"]})
    return chunks


def sse_bytes(item: dict[str, Any]) -> bytes:
    """One server-sent event carrying `item`."""
    return b"data: " + json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


async def sse_events(chunks: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    """`chunks` as server-sent events, closed by OpenAI's `data: [DONE]`."""
    for item in chunks:
        yield sse_bytes(item)
    yield b"data: [DONE]\n\n"


class StreamedReply:
    """An upstream's stream, chunk by chunk: the assistant message, finish reason and usage it adds up to."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}  # by the index the upstream gives each tool call
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.held: dict[str, Any] | None = None  # the chunk with the finish reason: sent last, with the episode id
        self.first: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> bool:
        """Take in one chunk; whether to relay it now (the usage chunk and the finishing one wait for the end)."""
        self.first = self.first or chunk
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        for choice in choices:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                slot = self.calls.setdefault(int(call.get("index", 0)), {"id": "", "name": "", "arguments": ""})
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""
            self.finish = choice.get("finish_reason") or self.finish
        if not choices:
            return False  # the usage chunk: sent at the end when the client asked for it
        if any(choice.get("finish_reason") for choice in choices):
            self.held = chunk
            return False
        return True

    def message(self) -> dict[str, Any]:
        """The assistant message the stream added up to."""
        return assistant_message("".join(self.content), [(c["id"], c["name"], c["arguments"])
                                                         for _, c in sorted(self.calls.items())])

    def counts(self) -> dict[str, int]:
        return usage_counts((self.usage or {}).get("prompt_tokens"), (self.usage or {}).get("completion_tokens"))

    def closing(self, meta: dict[str, Any], counts: dict[str, int], include_usage: bool) -> list[dict[str, Any]]:
        """The chunks sent after the stream ended: the finishing one with the gateway's `agent_rl` field,
        then the usage chunk when the client asked for it."""
        base = {"id": (self.first or {}).get("id", f"chatcmpl-{uuid.uuid4().hex}"), "object": "chat.completion.chunk",
                "created": (self.first or {}).get("created", int(time.time())), "model": meta["policy_version"]}
        finish = self.finish or ("tool_calls" if self.calls else "stop")
        final = self.held or {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]}
        chunks = [{**final, "agent_rl": meta}]
        if include_usage:
            total = counts["prompt_tokens"] + counts["completion_tokens"]
            chunks.append({**base, "choices": [], "usage": {**counts, "total_tokens": total}, "agent_rl": meta})
        return chunks

"""An agent that is not ours: a small tool loop on the official `openai` client, pointed at the arbiter's gateway.

This is how a team outside agent-rl writes an agent: it declares its tools in every request, runs the calls the
model sends back against its own backend, sends the results back, and stops when the model answers (a text reply,
or a call of its final tool). Nothing here knows about our policies, our environments or the pool: the only
coupling is the base URL (`<arbiter>/v1`) and the API key the gateway admits. Two agent-rl endpoints that the
OpenAI API has no counterpart for are called with plain HTTP: `POST /v1/episodes/<id>/end` (the user closed the
chat) and `POST /v1/feedback` (the user pressed thumbs up or down).

`ToolLoopAgent.work` runs one user turn to its answer; `close` sends the final answer's result back (what a tool
loop owes the API for every call) with the user's last words, declaring the final tool so that the gateway ends
the episode there and records the answer; `end` and `rate` are the two agent-rl calls. Used by the simulated
users of `users.py` and by the demo's outside program (`examples/outside_agent.py`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

EPISODE_HEADER = "X-Agent-RL-Episode"
Backend = Callable[[str, Any], str]  # (tool name, arguments: a dict, or the text that did not parse) -> result text


class OutsideAgentError(RuntimeError):
    """A call the agent could not complete (the gateway or the model refused); the user sees an error."""


@dataclass
class Turn:
    """What one user turn came to: the answer (None when the user left while the agent worked, or on an error),
    the episode and version the gateway reported, the model calls it took, and whether tool calls were left
    unanswered because the user left (`pending`)."""

    answer: str | None = None
    final_call_id: str | None = None  # the final tool's call, owed a result if the conversation goes on
    episode_id: str | None = None
    version: str | None = None
    calls: int = 0
    pending: bool = False
    error: str | None = None
    ended: bool = False  # the gateway ended the episode with this turn's reply (its final tool)


@dataclass
class ToolLoopAgent:
    """One deployment of the agent: its client, its declared tools, its backend, its final tool.

    `metadata` goes with every request (OpenAI's `metadata` field; the gateway reads `context`, `task`, `category`,
    `final_tool` from it); `max_tool_turns` bounds one user turn; `max_tokens` each reply."""

    client: Any  # openai.OpenAI, base_url <arbiter>/v1
    tools: list[dict[str, Any]]
    final_tool: str = "return_final_answer"
    answer_field: str = "answer"
    model: str = "outside-agent"
    max_tool_turns: int = 6
    max_tokens: int = 256
    metadata: dict[str, str] = field(default_factory=dict)
    http: httpx.Client | None = None  # for the two agent-rl calls; one is made from the client's URL and key

    def __post_init__(self) -> None:
        declared = {(t.get("function") or {}).get("name") for t in self.tools}
        if self.final_tool not in declared:
            raise ValueError(f"final tool {self.final_tool!r} is not among the declared tools {sorted(declared)}")
        if self.max_tool_turns < 1 or self.max_tokens < 1:
            raise ValueError("max_tool_turns and max_tokens must be >= 1")
        if self.http is None:
            root = str(self.client.base_url).rstrip("/")
            root = root[: -len("/v1")] if root.endswith("/v1") else root
            self.http = httpx.Client(base_url=root, timeout=120,
                                     headers={"Authorization": f"Bearer {self.client.api_key}"})

    # -- model calls -------------------------------------------------------------------------------

    def _complete(self, messages: list[dict[str, Any]], session: str, metadata: dict[str, str]) -> tuple[dict, Turn]:
        """One chat completion through the gateway: the assistant message as wire JSON, and what it says of the
        episode. Raises OutsideAgentError with the gateway's status and message."""
        import openai

        try:
            raw = self.client.chat.completions.with_raw_response.create(
                model=self.model, messages=messages, tools=self.tools, max_tokens=self.max_tokens,
                metadata={**self.metadata, **metadata}, extra_headers={EPISODE_HEADER: session})
        except openai.APIStatusError as exc:
            raise OutsideAgentError(f"{exc.status_code}: {_error_message(exc)}") from exc
        except openai.APIError as exc:
            raise OutsideAgentError(type(exc).__name__) from exc
        completion = raw.parse()
        message = completion.choices[0].message
        wire: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            wire["tool_calls"] = [{"id": c.id, "type": "function",
                                   "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                  for c in message.tool_calls]
        extra = (completion.model_extra or {}).get("agent_rl") or {}
        return wire, Turn(episode_id=raw.headers.get(EPISODE_HEADER) or extra.get("episode_id"),
                          version=extra.get("policy_version"), ended=bool(extra.get("episode_ended")))

    def work(self, messages: list[dict[str, Any]], backend: Backend, session: str,
             leave: Callable[[int], bool] = lambda _turn: False, metadata: dict[str, str] | None = None) -> Turn:
        """Run the user's latest message to an answer, appending every message to `messages` (the conversation
        as the client keeps it). `leave(i)` is asked before the i-th round of tool calls is run: True means the
        user closed the chat while the agent was still working (the calls stay unanswered)."""
        turn = Turn()
        for index in range(self.max_tool_turns):
            try:
                reply, seen = self._complete(messages, session, metadata or {})
            except OutsideAgentError as exc:
                turn.error = str(exc)
                return turn
            turn.calls += 1
            turn.episode_id, turn.version = seen.episode_id or turn.episode_id, seen.version or turn.version
            messages.append(reply)
            calls = reply.get("tool_calls") or []
            final = next((c for c in calls if c["function"]["name"] == self.final_tool), None)
            if final is not None:
                turn.answer, turn.final_call_id = self._answer_of(final), final["id"]
                return turn
            if not calls:
                turn.answer = reply.get("content") or ""
                return turn
            if leave(index):
                turn.pending = True
                return turn
            for call in calls:
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": backend(call["function"]["name"], _arguments(call))})
        turn.error = f"no answer after {self.max_tool_turns} rounds of tool calls"
        return turn

    def close(self, messages: list[dict[str, Any]], turn: Turn, session: str, user_text: str | None) -> Turn:
        """The conversation's last call: the final answer's result ("shown to the user"), the user's last words if
        any, and `final_tool` declared so the gateway ends the episode at the model's closing call of it. Returns
        the closing turn (`ended` when the gateway ended the episode; else the caller ends it)."""
        self.owe_result(messages, turn)
        if user_text:
            messages.append({"role": "user", "content": user_text})
        closing = Turn()
        try:
            reply, closing = self._complete(messages, session, {"final_tool": self.final_tool})
        except OutsideAgentError as exc:
            closing.error = str(exc)
            return closing
        closing.calls = 1
        messages.append(reply)
        return closing

    def owe_result(self, messages: list[dict[str, Any]], turn: Turn) -> None:
        """Answer the final tool's call (the API wants a result for every call before the next user message)."""
        if turn.final_call_id is not None:
            messages.append({"role": "tool", "tool_call_id": turn.final_call_id,
                             "content": json.dumps({"shown_to_user": True})})
            turn.final_call_id = None

    def _answer_of(self, call: dict[str, Any]) -> str:
        arguments = _arguments(call)
        if isinstance(arguments, dict):
            return str(arguments.get(self.answer_field, ""))
        return str(arguments)

    # -- agent-rl's own endpoints ------------------------------------------------------------------

    def end(self, episode_id: str) -> None:
        """The user closed the chat: end the episode now rather than at the gateway's idle timeout."""
        response = self.http.post(f"/v1/episodes/{episode_id}/end")
        if response.status_code != 200:
            raise OutsideAgentError(f"ending episode failed: {response.status_code} {_detail(response)}")

    def rate(self, episode_id: str, verdict: str) -> None:
        """The user's thumbs up or down (`up` / `down`), sent to the gateway's feedback endpoint."""
        response = self.http.post("/v1/feedback", json={"episode_id": episode_id, "verdict": verdict})
        if response.status_code != 200:
            raise OutsideAgentError(f"feedback refused: {response.status_code} {_detail(response)}")

    def close_http(self) -> None:
        if self.http is not None:
            self.http.close()


def new_session() -> str:
    """A session name for one conversation (sent as X-Agent-RL-Episode: every call of it is one episode)."""
    return f"conv-{uuid.uuid4().hex}"


def _arguments(call: dict[str, Any]) -> Any:
    text = call["function"].get("arguments") or ""
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:
        return text


def _error_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error") if isinstance(body.get("error"), dict) else body
        return str(error.get("message") or error.get("detail") or "")[:200]
    return str(exc)[:200]


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    return str(body.get("detail") or body.get("error") or body)[:200]

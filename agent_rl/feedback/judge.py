"""A model judge for the episodes nobody rated: any OpenAI-compatible endpoint scores a conversation.

The signals labeler (labeler.py) reads behaviour; a judge reads the conversation itself, which is what the traffic
of a week without ratings, or a plug-in environment without a deterministic judge, has left. Two modes:

- `absolute`: one call per episode, the reply `{"score": p}` with p in [0, 1], the judge's probability that the
  user rated the conversation good;
- `relative` (RULER-style): episodes of one task (same context and request) are shown together in one call and
  scored against each other, `{"scores": [{"trajectory": 1, "score": p}, ...]}`; a comparison tells apart
  trajectories a lone reading would score alike. A task seen once is judged absolutely.

What the judge sees is a compact transcript (roles, tool calls, truncated tool results): never the rating, the
feedback, the outcome or the reward, so agreement with the ratings (judge_agreement.py) measures the judge and
not a leak. Replies that are not the strict JSON asked for are retried, then raise `ModelJudgeError`. The
criteria part of the prompt can be optimized against ratings with DSPy (judge_optimize.py) and loaded here
(`JudgePrompt.load`). This module imports no curation, pool or training code: a plug-in may use it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, field_validator

from agent_rl.chat_client import (ChatClient, ChatEndpoint, ChatEndpointError, ChatReply, ClosesOnExit,
                                        extract_json)
from agent_rl.environments.messages import text_of
from agent_rl.environments.registry import capabilities_of
from agent_rl.records import Episode

DEFAULT_CRITERIA = (
    "A good conversation is one its user would rate thumbs-up: the assistant understood the request, used its "
    "tools sensibly, answered correctly and completely from what the tools returned, invented nothing, and said "
    "so plainly when it could not help. Signs of a bad one: the user has to ask again or correct the assistant, "
    "complains, or leaves before an answer; tool errors the assistant ignored; a vague, wrong or made-up answer."
)
_ABSOLUTE = ("You judge one conversation between a user and an AI assistant that uses tools.\n\n{criteria}\n\n"
             "Reply with JSON only: {{\"score\": P}} where P is a number between 0 and 1, the probability that the "
             "user rated this conversation good.")
_RELATIVE = ("You compare {n} conversations in which an AI assistant that uses tools handled the same user "
             "request.\n\n{criteria}\n\nScore every conversation between 0 and 1, the probability that its user "
             "rated it good; judge them against each other (the better one scores higher) and on an absolute "
             "scale (if all are bad, all score low). Reply with JSON only: {{\"scores\": [{{\"trajectory\": 1, "
             "\"score\": P}}, ...]}} with one entry for each of the {n} trajectories.")
_SECRET_KEYS = re.compile(r"^(?:api_?key|(?:access_|auth_|bearer_)?token|bearer|secret|password|authorization)$",
                          re.IGNORECASE)


class ModelJudgeError(RuntimeError):
    """The judge's endpoint kept failing or never answered with the JSON asked for."""


class JudgePrompt(BaseModel):
    """The part of the judge's prompt that may be tuned: the criteria, and scored examples (demos) shown before
    the episode. The reply format stays the judge's own, so a tuned prompt can never break parsing."""

    model_config = ConfigDict(extra="forbid")

    criteria: str = DEFAULT_CRITERIA
    demos: list[dict[str, Any]] = Field(default_factory=list, description="{'transcript': str, 'score': float}")
    source: dict[str, Any] = Field(default_factory=dict, description="how it was made (optimizer, agreement)")

    @field_validator("demos")
    @classmethod
    def _demos_scored(cls, demos: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for demo in demos:
            if not isinstance(demo.get("transcript"), str) or _unit(demo.get("score")) is None:
                raise ValueError(f"a demo needs a 'transcript' string and a 'score' in [0, 1], got {demo!r:.200}")
        return demos

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> JudgePrompt:
        return cls.model_validate_json(Path(path).read_text())


class JudgeConfig(BaseModel):
    """Where the judge runs and how. The endpoint names the variable holding its key (`api_key_env`), never the
    key. `group_size`: most trajectories in one relative call (a larger task is split into even chunks);
    `retries`: extra attempts after a failed call or an unusable reply; `max_message_chars` / `max_chars`: how
    much of one message / of the whole transcript the judge reads; `prompt_path`: a tuned `JudgePrompt` file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: ChatEndpoint
    mode: Literal["absolute", "relative"] = "absolute"
    group_size: int = Field(default=8, ge=2, le=32)
    retries: NonNegativeInt = 2
    max_message_chars: int = Field(default=600, ge=50)
    max_chars: int = Field(default=8000, ge=500)
    prompt_path: str | None = None

    @field_validator("endpoint", mode="before")
    @classmethod
    def _no_key_in_config(cls, value: Any) -> Any:
        """A key in a profile would be stored with it; only the name of its environment variable may be."""
        if isinstance(value, Mapping):
            leaked = [k for k in value if _SECRET_KEYS.match(str(k))]
            if leaked:
                raise ValueError(f"endpoint fields {leaked} would store a credential: name an environment variable "
                                 "in 'api_key_env' instead")
        return value


@dataclass(frozen=True)
class JudgeScore:
    """One episode's score in [0, 1] and how it was obtained (`group`: trajectories judged together, 1: absolute)."""

    episode_id: str | None
    score: float
    mode: str
    group: int


# -- what the judge reads --------------------------------------------------------------------------------------


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text) - limit} chars cut]"


def _field(episode: Episode | Mapping[str, Any], name: str) -> Any:
    return getattr(episode, name, None) if isinstance(episode, Episode) else episode.get(name)


def _call_line(call: Any, limit: int) -> str:
    function = (call.get("function") or {}) if isinstance(call, Mapping) else {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False, default=str)
    return f"ASSISTANT calls {function.get('name') or '?'}({_cut(arguments, limit)})"


def compact_transcript(episode: Episode | Mapping[str, Any], *, max_message_chars: int = 600,
                       max_chars: int = 8000) -> str:  # fmt: skip
    """The conversation as the judge reads it: one line per message or tool call, long ones cut, the middle of a
    long conversation left out (its start, the request, and its end, the answer, matter most). Reads `messages`
    only: feedback, outcome and reward are never shown."""
    names: dict[str, str] = {}
    lines: list[str] = []
    for message in _field(episode, "messages") or []:
        if not isinstance(message, Mapping):
            continue
        role = str(message.get("role") or "?")
        text = _cut(text_of(message.get("content"), " "), max_message_chars)
        if role == "tool":
            name = names.get(str(message.get("tool_call_id")), message.get("name") or "tool")
            lines.append(f"TOOL {name} returned: {text}")
            continue
        if text or role != "assistant":
            lines.append(f"{'SYSTEM' if role in ('system', 'developer') else role.upper()}: {text}")
        for call in message.get("tool_calls") or []:
            if isinstance(call, Mapping):
                names[str(call.get("id"))] = str((call.get("function") or {}).get("name") or "tool")
            lines.append(_call_line(call, max_message_chars))
    if not lines:
        return "(empty conversation)"
    return "\n".join(_fit(lines, max_chars))


def _fit(lines: list[str], max_chars: int) -> list[str]:
    """The lines within `max_chars`: the start up to the first user request, then as much of the end as fits."""
    if sum(len(line) + 1 for line in lines) <= max_chars:
        return lines
    first_user = next((i for i, line in enumerate(lines) if line.startswith("USER:")), 0)
    head = lines[:min(first_user + 1, 3)]
    budget = max_chars - sum(len(line) + 1 for line in head) - 40
    tail: list[str] = []
    for line in reversed(lines[len(head):]):
        if len(line) + 1 > budget:
            break
        tail.append(line)
        budget -= len(line) + 1
    tail.reverse()
    return [*head, f"[... {len(lines) - len(head) - len(tail)} lines left out ...]", *tail]


def task_key(episode: Episode | Mapping[str, Any]) -> tuple[str, str]:
    """Which episodes a relative judgement compares: same context and same task. A live episode's (its environment
    judged by its users: the gateway's) task is its first user message (a client's declared task names a kind of
    request, not the request); others' is the task or the question."""
    context = str(_field(episode, "context") or _field(episode, "inbox_id") or "")
    live = capabilities_of(str(_field(episode, "environment") or "")).judged_by_users
    if live or not _field(episode, "question"):
        first = next((m for m in _field(episode, "messages") or []
                      if isinstance(m, Mapping) and m.get("role") == "user"), {})
        return context, " ".join(text_of(first.get("content"), " ").lower().split())
    return context, str(_field(episode, "task_id") or _field(episode, "scenario_id") or _field(episode, "question"))


# -- replies -----------------------------------------------------------------------------------------------


def _unit(value: Any) -> float | None:
    """A number in [0, 1], else None (booleans and strings are not scores)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0 <= value <= 1 else None


def parse_absolute(reply: ChatReply) -> float:
    """{"score": p}, p in [0, 1]; anything else is a ValueError (the client retries it)."""
    data = extract_json(reply.content)
    score = _unit(data.get("score")) if isinstance(data, dict) else None
    if score is None:
        raise ValueError(f'expected {{"score": number in [0, 1]}}, got {reply.content[:160]!r}')
    return score


def parse_relative(reply: ChatReply, n: int) -> list[float]:
    """{"scores": [{"trajectory": i, "score": p}, ...]}: each of trajectories 1..n exactly once, p in [0, 1]."""
    data = extract_json(reply.content)
    entries = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f'expected {{"scores": [{{"trajectory": i, "score": p}}, ...]}}, got {reply.content[:160]!r}')
    scores: dict[int, float] = {}
    for entry in entries:
        index = entry.get("trajectory") if isinstance(entry, dict) else None
        score = _unit(entry.get("score")) if isinstance(entry, dict) else None
        if isinstance(index, str) and index.strip().isdigit():
            index = int(index)
        if not isinstance(index, int) or isinstance(index, bool) or not 1 <= index <= n or score is None:
            raise ValueError(f"unusable entry {entry!r:.120}: need a trajectory in 1..{n} and a score in [0, 1]")
        if index in scores:
            raise ValueError(f"trajectory {index} scored twice")
        scores[index] = score
    if len(scores) != n:
        raise ValueError(f"scored trajectories {sorted(scores)}, expected 1..{n}")
    return [scores[i] for i in range(1, n + 1)]


def _chunks(items: list[int], size: int) -> list[list[int]]:
    """Even chunks of at most `size` (9 by 8 gives 5 and 4, never 8 and a lone 1)."""
    count = math.ceil(len(items) / size)
    step, extra = divmod(len(items), count)
    out, start = [], 0
    for i in range(count):
        end = start + step + (i < extra)
        out.append(items[start:end])
        start = end
    return out


class ModelJudge(ClosesOnExit):
    """Scores episodes through an OpenAI-compatible endpoint (see the module docstring)."""

    def __init__(self, config: JudgeConfig, *, prompt: JudgePrompt | None = None,
                 client: ChatClient | None = None) -> None:  # fmt: skip
        self.config = config
        if prompt is None:
            prompt = JudgePrompt.load(config.prompt_path) if config.prompt_path else JudgePrompt()
        self.prompt = prompt
        endpoint = config.endpoint.model_copy(update={"max_retries": config.retries})
        self._client = client or ChatClient(endpoint)
        self.calls = 0

    def close(self) -> None:
        self._client.close()

    def transcript(self, episode: Episode | Mapping[str, Any]) -> str:
        return compact_transcript(episode, max_message_chars=self.config.max_message_chars,
                                  max_chars=self.config.max_chars)

    def _ask(self, messages: list[dict[str, Any]], parse: Callable[[ChatReply], Any], what: str) -> Any:
        self.calls += 1
        try:
            return self._client.complete(messages, parse)
        except ChatEndpointError as exc:
            raise ModelJudgeError(f"the model judge gave no usable score for {what}: {exc}") from exc

    def absolute_messages(self, transcript: str) -> list[dict[str, Any]]:
        """System prompt, each demo as an earlier exchange, then the conversation to judge."""
        messages = [{"role": "system", "content": _ABSOLUTE.format(criteria=self.prompt.criteria)}]
        for demo in self.prompt.demos:
            messages += [{"role": "user", "content": demo["transcript"]},
                         {"role": "assistant", "content": json.dumps({"score": round(float(demo["score"]), 3)})}]
        return messages + [{"role": "user", "content": transcript}]

    def relative_messages(self, transcripts: Sequence[str]) -> list[dict[str, Any]]:
        """All trajectories of one task in one message, numbered from 1; demos as scored references."""
        system = _RELATIVE.format(n=len(transcripts), criteria=self.prompt.criteria)
        if self.prompt.demos:
            system += "\n\nScored examples of single conversations, for reference:\n" + "\n\n".join(
                f"Example (score {float(d['score']):.2f}):\n{d['transcript']}" for d in self.prompt.demos)
        body = "\n\n".join(f"### Trajectory {i}\n{text}" for i, text in enumerate(transcripts, 1))
        return [{"role": "system", "content": system}, {"role": "user", "content": body}]

    def score(self, episode: Episode | Mapping[str, Any]) -> float:
        """One episode, judged on its own."""
        what = f"episode {_field(episode, 'episode_id')}"
        return self._ask(self.absolute_messages(self.transcript(episode)), parse_absolute, what)

    def score_group(self, episodes: Sequence[Episode | Mapping[str, Any]]) -> list[float]:
        """Episodes of one task compared in one call, scores in their order (a group of one: absolute)."""
        if len(episodes) == 1:
            return [self.score(episodes[0])]
        n = len(episodes)
        what = f"a group of {n} episodes ({', '.join(str(_field(e, 'episode_id')) for e in episodes[:3])}...)"
        messages = self.relative_messages([self.transcript(e) for e in episodes])
        return self._ask(messages, lambda reply: parse_relative(reply, n), what)

    def score_episodes(self, episodes: Iterable[Episode | Mapping[str, Any]]) -> list[JudgeScore]:
        """Every episode's score, in input order: one call each (absolute), or one per task chunk (relative)."""
        items = list(episodes)
        out: list[JudgeScore | None] = [None] * len(items)
        if self.config.mode == "absolute":
            groups = [[i] for i in range(len(items))]
        else:
            by_task: dict[tuple[str, str], list[int]] = {}
            for i, episode in enumerate(items):
                by_task.setdefault(task_key(episode), []).append(i)
            groups = [chunk for members in by_task.values() for chunk in _chunks(members, self.config.group_size)]
        for group in groups:
            scores = self.score_group([items[i] for i in group])
            mode = "relative" if len(group) > 1 else "absolute"
            for i, score in zip(group, scores):
                out[i] = JudgeScore(_field(items[i], "episode_id"), score, mode, len(group))
        return [s for s in out if s is not None]


class JudgeReward:
    """The judge as a GRPO reward (agent_rl.train.rewards.ExtraReward), for a plug-in with no deterministic judge:
    a TRL reward function over conversational completions. The rollouts of one prompt are one task, so relative
    mode compares them in one call, as RULER does. Scores are in [0, 1]; None where the judge failed (no opinion),
    so one bad reply does not stop training."""

    __name__ = "model_judge"

    def __init__(self, judge: ModelJudge) -> None:
        self.judge = judge

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **_: Any) -> list[float | None]:
        def as_messages(part: Any) -> list[dict[str, Any]]:
            return list(part) if isinstance(part, list) else [{"role": "assistant", "content": str(part)}]

        episodes = [{"episode_id": str(i), "question": json.dumps(as_messages(p), sort_keys=True, default=str),
                     "messages": as_messages(p) + as_messages(c)} for i, (p, c) in enumerate(zip(prompts, completions))]
        try:
            return [s.score for s in self.judge.score_episodes(episodes)]
        except ModelJudgeError:
            return [None] * len(episodes)

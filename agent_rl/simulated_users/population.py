"""A simulated population of users of an outside agent: conversations with a hidden truth, for benches and tests.

Each simulated user either ends up satisfied or not; only the simulation knows which (`SimulatedEpisode.satisfied`),
so a labeler can be measured against the truth rather than against the few ratings. A share of users rates
(`rated_share`, 5% by default), sometimes mis-clicking. The rest only behave: after each answer a user thanks,
leaves without a word, re-asks, corrects, complains, or gives up while the agent is still working, with
probabilities that depend on the hidden truth but overlap, as people's do (a satisfied user sometimes re-asks, an
unhappy one often just leaves). Every such decision is `behaviour.User`'s, the model the gateway demo's users
(`users.py`) draw from too, at the same noise presets (`NoiseConfig`: `DEFAULT_NOISE` and two noisier ones, fixed
before any labeler ran on them): only the agent here is scripted, and where the demo's users judge a real agent's
answers, here the truth is drawn per user before the first question. The scripted agent's side is noisy too: tool
errors and "I couldn't find" answers are more frequent when the user ends unhappy, but happen to satisfied users as
well. A user may leave while the agent works (before each of its tool calls, `User.leaves`); leaving does not
change the drawn truth.

After an answer the user lets stand (thanks, or silence), a stated share asks a follow-up question on another topic
(`NoiseConfig.follow_up`: satisfied users more often), a request about a topic not yet asked in that conversation,
which the agent works on and answers like the first. The hidden truth is about the whole conversation: one draw per
user, before the first question, and every reaction, follow-ups' included, follows it.

Conversations come out as the gateway records them (`agent_rl.arbiter.gateway.sessions.LiveEpisode.record`): an
`Episode` of environment "gateway", outcome unjudged, OpenAI wire messages (tool-call arguments as JSON text,
`tool` results naming their call), the client-declared tools, `final_answer` the last reply's text, and the
rating, when given, in `feedback`. Each user draws from a `random.Random` of their own (seed and index): same
config, same episodes.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from agent_rl.environments.gateway import GatewayEnvironment
from agent_rl.simulated_users import conversations as talk
from agent_rl.simulated_users.behaviour import (  # noqa: F401  (the presets, re-exported where they always were)
    DEFAULT_NOISE, MAX_ROUNDS, NOISE_PRESETS, NOISY, REACTIONS, VERY_NOISY, NoiseConfig, Reaction, Reactions, User)
from agent_rl.records import Episode, Outcome


@dataclass(frozen=True)
class PopulationConfig:
    """A week of simulated traffic: how many episodes, which share rates, which share ends satisfied, the noise."""

    n_episodes: int = 4000
    rated_share: float = 0.05
    satisfied_share: float = 0.65
    noise: NoiseConfig = DEFAULT_NOISE
    max_rounds: int = MAX_ROUNDS  # user messages the agent answers at most (the demo's users' too)
    seed: int = 0
    week_start: datetime = field(default_factory=lambda: datetime(2026, 11, 16, tzinfo=timezone.utc))

    def __post_init__(self) -> None:
        for name in ("rated_share", "satisfied_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.n_episodes < 0 or self.max_rounds < 1:
            raise ValueError("n_episodes must be >= 0 and max_rounds >= 1")


@dataclass(frozen=True)
class SimulatedEpisode:
    """An episode as the pool would store it, and the truth only the simulation knows (measure with it, never
    label with it)."""

    episode: Episode
    satisfied: bool


class _Conversation:
    """One user's conversation as it grows: the wire messages, the scripted agent's draws, and the user (whose
    every decision is `behaviour.User`'s, as in the demo)."""

    def __init__(self, rng: random.Random, noise: NoiseConfig, satisfied: bool) -> None:
        self.rng, self.noise, self.satisfied = rng, noise, satisfied
        self.person = User(rng, noise)
        self.side = 0 if satisfied else 1
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": talk.SYSTEM_PROMPT}]
        self.topic, self.slots = rng.choice(talk.TOPICS), talk.draw_slots(rng)
        self.asked = [self.topic]

    def fill(self, template: str) -> str:
        slots = {**self.slots, "short": self.topic.short.format(**self.slots)}
        slots["request"] = self.rng.choice(self.topic.phrasings).format(**self.slots)
        slots["other"] = self.rng.choice(self.topic.phrasings).format(**self.slots)
        slots["changed"] = talk.changed_slots(self.rng, self.slots, self.topic)
        return template.format(**slots)

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": self.person.typed(text)})

    def assistant(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def work(self, mood: bool | None) -> bool:
        """The agent calls its tools, a round per call; before each the user may leave (`User.leaves`, as the demo's
        users do), leaving the call unanswered. True when the user left."""
        for tool, names in self.topic.calls:
            call_id = f"call_{self.rng.getrandbits(64):016x}"
            arguments = talk.call_arguments(tool, names, self.slots)
            self.messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": tool, "arguments": arguments}}]})
            if self.person.leaves(mood):
                return True
            failed = self.rng.random() < self.noise.tool_error[self.side]
            content = self.rng.choice(talk.TOOL_ERRORS) if failed else talk.tool_result(tool, self.slots)
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        return False

    def answer(self) -> None:
        if self.rng.random() < self.noise.agent_gives_up[self.side]:
            self.assistant(self.fill(self.rng.choice(talk.GIVE_UP)))
        else:
            self.assistant(self.topic.answer.format(**self.slots))

    def new_topic(self) -> None:
        """A follow-up's topic: one this conversation has not asked about yet (coming back to an earlier topic with
        other specifics reads as a re-ask, to a person as to the signals). Fresh specifics, too."""
        self.topic = self.rng.choice([t for t in talk.TOPICS if t not in self.asked]
                                    or [t for t in talk.TOPICS if t is not self.topic])
        self.asked.append(self.topic)
        self.slots = talk.draw_slots(self.rng)


def _play(conv: _Conversation, max_rounds: int) -> None:
    """Request, work, answer, reaction: round after round until the user leaves, gives up or runs out of rounds. A
    re-ask or a correction restates the question the user is on; a follow-up asks a new one. The user's mood is
    the conversation's truth once the agent has answered (None before: `User.leave_rate`)."""
    rng, person = conv.rng, conv.person
    conv.user(rng.choice(conv.topic.phrasings).format(**conv.slots))
    mood: bool | None = None
    for round_ in range(max_rounds):
        if conv.work(mood):
            return
        conv.answer()
        mood = conv.satisfied
        reaction = person.reaction(mood)
        last = round_ == max_rounds - 1
        if reaction in ("reask", "correct") and not last:
            conv.user(conv.fill(rng.choice(talk.REASKS if reaction == "reask" else talk.CORRECTIONS)))
            continue
        if reaction == "thank":
            conv.user(rng.choice(talk.THANKS))
            conv.assistant(talk.WELCOME)
        elif reaction == "complain":
            conv.user(rng.choice(talk.COMPLAINTS))
            conv.assistant(talk.APOLOGY)
            return
        if last or not person.follows_up(mood):
            return
        conv.new_topic()
        conv.user(talk.follow_up(rng, rng.choice(conv.topic.phrasings).format(**conv.slots)))


def _record(conv: _Conversation, rng: random.Random, config: PopulationConfig, feedback: str | None) -> Episode:
    """The episode as `LiveEpisode.record` writes it: final answer the last reply's text, turns its calls."""
    messages = conv.messages
    last = messages[-1]
    words = sum(len(str(m.get("content") or "").split()) for m in messages)
    return Episode(
        episode_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        created_at=config.week_start + timedelta(seconds=rng.uniform(0, 7 * 86400)),
        tenant="acme", environment=GatewayEnvironment.name, context="gateway", question=messages[1]["content"],
        policy_version="v1", messages=messages, tools=talk.TOOLS, outcome=Outcome.UNJUDGED, reward=None,
        final_answer=(last.get("content") or None) if last["role"] == "assistant" else None,
        turns=sum(m["role"] == "assistant" for m in messages), prompt_tokens=words * 2,
        completion_tokens=words // 3, feedback=feedback,
    )


def simulate(config: PopulationConfig = PopulationConfig()) -> list[SimulatedEpisode]:
    """`config.n_episodes` conversations, each with its hidden truth; deterministic per config (seed included).
    Every user draws from a `random.Random` of their own (seed and index), as the demo's users do (`users.py`)."""
    out: list[SimulatedEpisode] = []
    for index in range(config.n_episodes):
        rng = random.Random(f"{config.seed}:{index}")
        satisfied = rng.random() < config.satisfied_share
        conv = _Conversation(rng, config.noise, satisfied)
        _play(conv, config.max_rounds)
        feedback = conv.person.rating(satisfied) if conv.person.rates(config.rated_share) else None
        out.append(SimulatedEpisode(_record(conv, rng, config, feedback), satisfied))
    return out

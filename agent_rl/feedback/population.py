"""A simulated population of users of an outside agent: conversations with a hidden truth, for benches and tests.

Each simulated user either ends up satisfied or not; only the simulation knows which (`SimulatedEpisode.satisfied`),
so a labeler can be measured against the truth rather than against the few ratings. A share of users rates
(`rated_share`, 5% by default), sometimes mis-clicking. The rest only behave: after each answer a user thanks,
leaves without a word, re-asks, corrects, complains, or gives up while the agent is still working, with
probabilities that depend on the hidden truth but overlap, as people's do (a satisfied user sometimes re-asks, an
unhappy one often just leaves). The rates are stated in `NoiseConfig`: `DEFAULT_NOISE` and two noisier presets,
fixed before any labeler ran on them. The agent's side is noisy too: tool errors and "I couldn't find" answers are
more frequent when the user ends unhappy, but happen to satisfied users as well.

After an answer the user lets stand (thanks, or silence), a stated share asks a follow-up question on another topic
(`NoiseConfig.follow_up`: satisfied users more often), a request about a topic not yet asked in that conversation,
which the agent works on and answers like the first. The hidden truth is about the whole conversation: one draw per
user, before the first question, and every reaction, follow-ups' included, follows it.

Conversations come out as the gateway records them (`agent_rl.arbiter.gateway_sessions.LiveEpisode.record`): an
`Episode` of environment "gateway", outcome unjudged, OpenAI wire messages (tool-call arguments as JSON text,
`tool` results naming their call), the client-declared tools, `final_answer` the last reply's text, and the
rating, when given, in `feedback`. Everything is drawn from one `random.Random(seed)`: same config, same episodes.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from agent_rl.feedback import conversations as talk
from agent_rl.records import Episode, Outcome

Reaction = Literal["thank", "silent", "reask", "correct", "complain", "give_up"]
REACTIONS: tuple[Reaction, ...] = ("thank", "silent", "reask", "correct", "complain", "give_up")


@dataclass(frozen=True)
class Reactions:
    """How a user reacts to one answer, as shares that sum to 1. `give_up`: leaves while the agent is still
    calling tools (the episode ends without an answer); `silent`: leaves after the answer without a word."""

    thank: float
    silent: float
    reask: float
    correct: float
    complain: float
    give_up: float

    def __post_init__(self) -> None:
        shares = [getattr(self, r) for r in REACTIONS]
        if any(s < 0 for s in shares) or abs(sum(shares) - 1) > 1e-9:
            raise ValueError(f"reaction shares must be >= 0 and sum to 1, got {dict(zip(REACTIONS, shares))}")

    def draw(self, rng: random.Random) -> Reaction:
        return rng.choices(REACTIONS, weights=[getattr(self, r) for r in REACTIONS])[0]


@dataclass(frozen=True)
class NoiseConfig:
    """How users and the agent behave, by the hidden truth. Pairs are (satisfied, unhappy): `tool_error` per tool
    call, `agent_gives_up` per answer ("I couldn't find..."), `follow_up` the chance of a new question on another
    topic after an answer the user let stand (thanked for, or left without a word; not after the last round);
    `rating_flip` the chance a rating says the opposite of the truth."""

    name: str
    satisfied: Reactions
    unhappy: Reactions
    tool_error: tuple[float, float]
    agent_gives_up: tuple[float, float]
    follow_up: tuple[float, float]
    rating_flip: float


# Default: half of satisfied users leave without a word, 40% thank; 40% of unhappy users leave without a word;
# after an answer they let stand, 25% of satisfied and 10% of unhappy users ask about something else.
DEFAULT_NOISE = NoiseConfig(
    name="default",
    satisfied=Reactions(thank=0.40, silent=0.45, reask=0.07, correct=0.05, complain=0.0, give_up=0.03),
    unhappy=Reactions(thank=0.03, silent=0.40, reask=0.22, correct=0.18, complain=0.05, give_up=0.12),
    tool_error=(0.04, 0.20), agent_gives_up=(0.03, 0.20), follow_up=(0.25, 0.10), rating_flip=0.03,
)
# Noisier: fewer people say anything; what they say separates the two groups less.
NOISY = NoiseConfig(
    name="noisy",
    satisfied=Reactions(thank=0.25, silent=0.55, reask=0.10, correct=0.06, complain=0.01, give_up=0.03),
    unhappy=Reactions(thank=0.05, silent=0.55, reask=0.15, correct=0.12, complain=0.03, give_up=0.10),
    tool_error=(0.06, 0.15), agent_gives_up=(0.05, 0.15), follow_up=(0.20, 0.12), rating_flip=0.05,
)
VERY_NOISY = NoiseConfig(
    name="very_noisy",
    satisfied=Reactions(thank=0.15, silent=0.60, reask=0.12, correct=0.07, complain=0.01, give_up=0.05),
    unhappy=Reactions(thank=0.06, silent=0.65, reask=0.12, correct=0.08, complain=0.02, give_up=0.07),
    tool_error=(0.08, 0.12), agent_gives_up=(0.06, 0.12), follow_up=(0.15, 0.12), rating_flip=0.08,
)
NOISE_PRESETS: dict[str, NoiseConfig] = {n.name: n for n in (DEFAULT_NOISE, NOISY, VERY_NOISY)}


@dataclass(frozen=True)
class PopulationConfig:
    """A week of simulated traffic: how many episodes, which share rates, which share ends satisfied, the noise."""

    n_episodes: int = 4000
    rated_share: float = 0.05
    satisfied_share: float = 0.65
    noise: NoiseConfig = DEFAULT_NOISE
    max_rounds: int = 4  # user messages the agent answers at most (re-asks, corrections, follow-ups included)
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
    """One user's conversation as it grows: the wire messages and the draws that shape them."""

    def __init__(self, rng: random.Random, noise: NoiseConfig, satisfied: bool) -> None:
        self.rng, self.noise, self.satisfied = rng, noise, satisfied
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
        self.messages.append({"role": "user", "content": talk.casual(self.rng, text)})

    def assistant(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def work(self, pending: bool) -> None:
        """The agent calls its tools; with `pending` the user leaves before the results come back."""
        for tool, names in self.topic.calls:
            call_id = f"call_{self.rng.getrandbits(64):016x}"
            arguments = talk.call_arguments(tool, names, self.slots)
            self.messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": tool, "arguments": arguments}}]})
            if pending:
                return
            failed = self.rng.random() < self.noise.tool_error[self.side]
            content = self.rng.choice(talk.TOOL_ERRORS) if failed else talk.tool_result(tool, self.slots)
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})

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


def _play(conv: _Conversation, reactions: Reactions, max_rounds: int) -> None:
    """Request, work, answer, reaction: round after round until the user leaves, gives up or runs out of rounds. A
    re-ask or a correction restates the question the user is on; a follow-up asks a new one."""
    rng = conv.rng
    conv.user(rng.choice(conv.topic.phrasings).format(**conv.slots))
    for round_ in range(max_rounds):
        reaction = reactions.draw(rng)
        if reaction == "give_up":
            conv.work(pending=True)
            return
        conv.work(pending=False)
        conv.answer()
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
        if last or rng.random() >= conv.noise.follow_up[conv.side]:
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
        tenant="acme", environment="gateway", context="gateway", question=messages[1]["content"],
        policy_version="v1", messages=messages, tools=talk.TOOLS, outcome=Outcome.UNJUDGED, reward=None,
        final_answer=(last.get("content") or None) if last["role"] == "assistant" else None,
        turns=sum(m["role"] == "assistant" for m in messages), prompt_tokens=words * 2,
        completion_tokens=words // 3, feedback=feedback,
    )


def simulate(config: PopulationConfig = PopulationConfig()) -> list[SimulatedEpisode]:
    """`config.n_episodes` conversations, each with its hidden truth; deterministic per config (seed included)."""
    rng = random.Random(config.seed)
    out: list[SimulatedEpisode] = []
    for _ in range(config.n_episodes):
        satisfied = rng.random() < config.satisfied_share
        conv = _Conversation(rng, config.noise, satisfied)
        _play(conv, config.noise.satisfied if satisfied else config.noise.unhappy, config.max_rounds)
        feedback = None
        if rng.random() < config.rated_share:
            says_good = satisfied != (rng.random() < config.noise.rating_flip)
            feedback = "up" if says_good else "down"
        out.append(SimulatedEpisode(_record(conv, rng, config, feedback), satisfied))
    return out

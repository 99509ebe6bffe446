"""How a simulated user behaves: one model for the bench's population (`population.py`) and the demo's users
(`users.py`), so that `bench/labels.py` measures the labeler on the behaviour the gateway demo trains on.

Both worlds draw every decision a user makes from `User`: whether to leave while the agent is still calling tools,
how to react to an answer (thank, leave without a word, re-ask, correct, complain), whether to ask a follow-up on
another topic, whether to rate and whether the rating is a mis-click, and how carelessly to type. The rates are the
noise presets below (`NoiseConfig`: `DEFAULT_NOISE` and two noisier ones, fixed before any labeler ran on them),
for users who are, so far, satisfied or unhappy. What differs between the worlds is only the agent and where the
user's mood comes from: the population scripts its agent's answers around a truth drawn per user, the demo's users
judge a real agent's answers (`users.Grounding`). Until 2026-11-29 each world drew its users its own way (a
leave was a reaction share per answer in one and a rate per tool round in the other, 4 rounds against 3, other
typing), and the two did not give alike signals.

The agent-side rates in a preset (`tool_error`, `agent_gives_up`) are the population's scripted agent's; a real
agent has its own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Reaction = Literal["thank", "silent", "reask", "correct", "complain", "give_up"]
REACTIONS: tuple[Reaction, ...] = ("thank", "silent", "reask", "correct", "complain", "give_up")


@dataclass(frozen=True)
class Reactions:
    """How a user reacts to one answer, as shares that sum to 1. `give_up`: leaves while the agent is still
    calling tools (the episode ends without an answer), drawn before each round of tool calls at `LEAVE_SCALE` x
    this share (`User.leaves`), the other reactions in their shares without it (`User.reaction`); `silent`: leaves
    after the answer without a word."""

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


MAX_ROUNDS = 3  # user messages the agent answers at most (re-asks, corrections, follow-ups included), in both worlds
LEAVE_SCALE = 0.5  # per round of tool calls: chance of leaving = LEAVE_SCALE x the preset's give_up share
LOWERCASE_SHARE = 0.3  # share of messages a user types all in lower case


@dataclass
class User:
    """One simulated user's decisions, drawn from the user's own random stream. `mood` is whether the user is
    satisfied so far: None before any answer (patience then follows neither group in particular)."""

    rng: random.Random
    noise: NoiseConfig
    leave_scale: float = LEAVE_SCALE
    lowercase_share: float = LOWERCASE_SHARE

    def leave_rate(self, mood: bool | None) -> float:
        """The chance of leaving before one round of tool calls is run."""
        if mood is None:
            return (self.leave_rate(True) + self.leave_rate(False)) / 2
        return self.leave_scale * (self.noise.satisfied if mood else self.noise.unhappy).give_up

    def leaves(self, mood: bool | None) -> bool:
        return self.rng.random() < self.leave_rate(mood)

    def reaction(self, mood: bool) -> Reaction:
        """A reaction to an answer: the preset's shares without `give_up` (leaving mid-work is `leaves`)."""
        shares = self.noise.satisfied if mood else self.noise.unhappy
        names = [r for r in REACTIONS if r != "give_up"]
        return self.rng.choices(names, weights=[getattr(shares, r) for r in names])[0]

    def follows_up(self, mood: bool) -> bool:
        """After an answer the user let stand: asks about something else at the preset's share."""
        return self.rng.random() < self.noise.follow_up[0 if mood else 1]

    def rates(self, share: float) -> bool:
        return self.rng.random() < share

    def rating(self, satisfied: bool) -> str:
        """Thumbs "up" or "down": the truth, but for a mis-click at the preset's `rating_flip`."""
        return "up" if satisfied != (self.rng.random() < self.noise.rating_flip) else "down"

    def typed(self, text: str) -> str:
        """How the user types a message: all lower case at `lowercase_share`, without final punctuation at 30%."""
        if self.rng.random() < self.lowercase_share:
            text = text.lower()
        if self.rng.random() < 0.3:
            text = text.rstrip(".?!")
        return text

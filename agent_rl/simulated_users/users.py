"""Simulated users of a real outside agent: they ask, read the answer, react, sometimes rate. Truth stays hidden.

`population.py` writes whole conversations itself; here users talk to an agent that really runs (`outside_agent.py`:
the official `openai` client, over HTTP, through the gateway), so what the agent did is whatever the model
production routes to did. Each user asks a question whose right answer only the simulation knows (`Question`), and
may ask one follow-up on another topic (below).

Whether a user ends up satisfied is the hidden truth, drawn from what happened, with stated noise
(`Grounding`): a right answer satisfies with probability `satisfied_if_right` (0.92: some users wanted more, or
distrust it), a wrong or "I don't know" answer with `satisfied_if_wrong` (0.12: some cannot tell it is wrong); a
user who left before any answer, or saw an error, is unhappy. How a user then behaves is the behaviour model the
bench's population shares (`behaviour.User`, with its noise presets: the shares of thanks, silent leaving, re-asks,
corrections and complaints for satisfied and for unhappy users, and how often a rating is a mis-click); before each
round of tool calls a user may close the chat while the agent still works (`Grounding.leave_scale` of the preset's
`give_up` share). After a re-ask or a correction the agent answers again and the
user judges the new answer. After an answer the user lets stand (thanks, or silence), the preset's `follow_up` share
(for how that answer left the user) asks a follow-up question in the same conversation, when the app names one
(`run_users(follow_ups=...)`: another question its backend can answer); the agent works on it like on the first,
and re-asks and corrections then restate the follow-up. The hidden truth is about the whole conversation: a user is
satisfied only if every question asked ended with an answer that satisfied them (`Outcome.right`, `answered`
likewise cover every question). A share of users (`rated_share`, 5%) presses thumbs up or down at the end, through
the gateway's feedback endpoint.

Every user draws from a `random.Random` of its own (seed and index), so a conversation's draws do not depend on
how threads interleave; which version the gateway routed a conversation to may.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from agent_rl.simulated_users import conversations as talk
from agent_rl.simulated_users.outside_agent import Backend, OutsideAgentError, ToolLoopAgent, Turn, new_session
from agent_rl.simulated_users.behaviour import DEFAULT_NOISE, LEAVE_SCALE, LOWERCASE_SHARE, MAX_ROUNDS, NoiseConfig, User

# What users write back, for any question (the re-asks restate it, so the signals' overlap measure sees a re-ask).
REASKS = ("I asked: {question}", "{question} Please answer the question.", "Again: {question}",
          "Can you just tell me? {question}", "{question} I still need to know.")
CORRECTIONS = ("That's not right. {question}", "No, that's wrong. Can you check again?",
               "That's not what I asked. {question}", "That is incorrect, please look again.",
               "No. {question}")


@dataclass(frozen=True)
class Grounding:
    """How the hidden truth follows from what the agent did (each a probability, stated in the summary)."""

    satisfied_if_right: float = 0.92
    satisfied_if_wrong: float = 0.12
    leave_scale: float = LEAVE_SCALE  # per round of tool calls: leaving = leave_scale x the preset's give_up

    def __post_init__(self) -> None:
        for name in ("satisfied_if_right", "satisfied_if_wrong", "leave_scale"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")


@dataclass(frozen=True)
class UsersConfig:
    """A population: its noise preset, grounding, rating share, rounds a user stays for, and the seed."""

    noise: NoiseConfig = DEFAULT_NOISE
    grounding: Grounding = Grounding()
    rated_share: float = 0.05
    max_rounds: int = MAX_ROUNDS
    seed: int = 0
    lowercase_share: float = LOWERCASE_SHARE  # messages typed all lower case (behaviour.User.typed)

    def __post_init__(self) -> None:
        for name in ("rated_share", "lowercase_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds}")

    def describe(self) -> dict[str, Any]:
        """The rates as plain numbers, for the summary (what the simulation assumed)."""
        return {"noise": self.noise.name, "rated_share": self.rated_share, "max_rounds": self.max_rounds,
                "satisfied_if_right": self.grounding.satisfied_if_right,
                "satisfied_if_wrong": self.grounding.satisfied_if_wrong,
                "leave_per_tool_round": {"before_an_answer": self.leave_rate(None), "satisfied": self.leave_rate(True),
                                         "unhappy": self.leave_rate(False)},
                "reactions_satisfied": asdict(self.noise.satisfied), "reactions_unhappy": asdict(self.noise.unhappy),
                "follow_up": {"satisfied": self.noise.follow_up[0], "unhappy": self.noise.follow_up[1]},
                "rating_flip": self.noise.rating_flip, "lowercase_share": self.lowercase_share}

    def user(self, rng: random.Random) -> User:
        """A user of this population, deciding by the behaviour model every simulated user shares."""
        return User(rng, self.noise, leave_scale=self.grounding.leave_scale, lowercase_share=self.lowercase_share)

    def leave_rate(self, satisfied_so_far: bool | None) -> float:
        """Per round of tool calls; before any answer (None) the mean of the two groups' rates."""
        return self.user(random.Random(0)).leave_rate(satisfied_so_far)


@dataclass(frozen=True)
class Question:
    """What a user asks, and how the simulation judges an answer to it (never shown to the agent)."""

    text: str
    is_right: Callable[[str], bool]
    category: str | None = None


@dataclass
class Outcome:
    """One user's conversation as the simulation saw it. `satisfied` is the hidden truth."""

    index: int
    episode_id: str | None
    version: str | None
    satisfied: bool
    answered: bool
    right: bool
    reactions: list[str] = field(default_factory=list)  # "follow_up" after the reaction its question followed
    rated: str | None = None  # "up" / "down" when the user rated
    left_while_working: bool = False
    error: str | None = None
    calls: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def typed(rng: random.Random, text: str, lowercase_share: float) -> str:
    """How a user types a message (`behaviour.User.typed`)."""
    return User(rng, DEFAULT_NOISE, lowercase_share=lowercase_share).typed(text)


def converse(agent: ToolLoopAgent, opening: list[dict[str, Any]], question: Question, backend: Backend,
             config: UsersConfig, index: int, follow_up: Question | None = None) -> Outcome:
    """One user's conversation with the agent, from the opening messages (the agent's system prompt and the
    question) to the user leaving; `follow_up` is the question this user may go on to ask (None: none); rates the
    conversation when this user is one who rates."""
    rng = random.Random(f"{config.seed}:{index}")
    person = config.user(rng)  # every decision below is the shared behaviour model's (behaviour.User)
    messages = [dict(m) for m in opening]
    session = new_session()
    outcome = Outcome(index=index, episode_id=None, version=None, satisfied=False, answered=False, right=False)
    mood: bool | None = None  # before any answer the user's patience follows neither group in particular
    metadata = {"category": question.category} if question.category else {}
    asking, earlier = question, (True, True)  # the question on the table; (satisfied, right) with those before it
    turn = Turn()
    for round_ in range(config.max_rounds):
        turn = agent.work(messages, backend, session, metadata=metadata,
                          leave=lambda _i: person.leaves(mood))
        outcome.calls += turn.calls
        outcome.episode_id = turn.episode_id or outcome.episode_id
        outcome.version = turn.version or outcome.version
        if turn.error is not None or turn.pending:
            outcome.error, outcome.left_while_working = turn.error, turn.pending
            outcome.satisfied, outcome.answered, outcome.right = False, False, False
            outcome.reactions.append("error" if turn.error else "give_up")
            _end(agent, outcome)
            break
        right = bool(asking.is_right(turn.answer or ""))
        g = config.grounding
        mood = rng.random() < (g.satisfied_if_right if right else g.satisfied_if_wrong)
        outcome.answered, outcome.right, outcome.satisfied = True, earlier[1] and right, earlier[0] and mood
        reaction = person.reaction(mood)
        last = round_ == config.max_rounds - 1
        if reaction in ("reask", "correct") and not last:
            outcome.reactions.append(reaction)
            agent.owe_result(messages, turn)
            template = rng.choice(REASKS if reaction == "reask" else CORRECTIONS)
            messages.append({"role": "user", "content": person.typed(template.format(question=asking.text))})
            continue
        words = {"thank": rng.choice(talk.THANKS), "complain": rng.choice(talk.COMPLAINTS)}.get(reaction)
        outcome.reactions.append(reaction if words else "silent")
        if (follow_up is not None and not last and reaction != "complain"
                and person.follows_up(mood)):
            outcome.reactions.append("follow_up")
            agent.owe_result(messages, turn)
            asked = person.typed(talk.follow_up(rng, follow_up.text))
            messages.append({"role": "user", "content": f"{words} {asked}" if words else asked})
            asking, follow_up, earlier = follow_up, None, (outcome.satisfied, outcome.right)
            continue
        closing = agent.close(messages, turn, session, words)
        outcome.calls += closing.calls
        if not closing.ended:
            _end(agent, outcome)
        break
    if outcome.episode_id and person.rates(config.rated_share):
        outcome.rated = person.rating(outcome.satisfied)
        try:
            agent.rate(outcome.episode_id, outcome.rated)
        except OutsideAgentError as exc:
            outcome.error, outcome.rated = str(exc), None
    return outcome


def _end(agent: ToolLoopAgent, outcome: Outcome) -> None:
    if outcome.episode_id:
        try:
            agent.end(outcome.episode_id)
        except OutsideAgentError as exc:
            outcome.error = outcome.error or str(exc)


@dataclass
class WeekResult:
    """Every user's outcome, and the figures the summary shows."""

    outcomes: list[Outcome]
    seconds: float

    def summary(self) -> dict[str, Any]:
        items = self.outcomes
        n = len(items) or 1
        per_version: dict[str, Counter] = {}
        for o in items:
            tally = per_version.setdefault(o.version or "-", Counter())
            tally["n"] += 1
            tally["satisfied"] += o.satisfied
            tally["right"] += o.right
            tally["rated"] += o.rated is not None
            tally["rated_up"] += o.rated == "up"
        reactions = Counter(r for o in items for r in o.reactions)
        return {"conversations": len(items), "model_calls": sum(o.calls for o in items),
                "seconds": round(self.seconds, 1),
                "answered": sum(o.answered for o in items), "right": sum(o.right for o in items),
                "satisfied_share": round(sum(o.satisfied for o in items) / n, 4),
                "rated": sum(o.rated is not None for o in items), "rated_up": sum(o.rated == "up" for o in items),
                "left_while_working": sum(o.left_while_working for o in items),
                "errors": sum(o.error is not None for o in items), "reactions": dict(reactions),
                "per_version": {v: dict(t) for v, t in sorted(per_version.items())}}


def run_users(agent: ToolLoopAgent, questions: Sequence[Question], openings: Callable[[int, Question], list],
              backends: Callable[[int, Question], Backend], config: UsersConfig, n: int, concurrency: int = 8,
              first_index: int = 0, progress: Callable[[int], None] | None = None,
              follow_ups: Callable[[int, Question], Question | None] | None = None) -> WeekResult:
    """`n` users, user i asking questions[(first_index + i) % len], `concurrency` of them at a time. `follow_ups`
    names the question a user may ask next (on another topic, answerable by that user's backend); without it
    nobody asks a follow-up."""
    if not questions:
        raise ValueError("no questions to ask")
    if n < 0 or concurrency < 1:
        raise ValueError("n must be >= 0 and concurrency >= 1")
    started = time.perf_counter()
    done, lock = [0], threading.Lock()

    def one(i: int) -> Outcome:
        index = first_index + i
        question = questions[index % len(questions)]
        outcome = converse(agent, openings(index, question), question, backends(index, question), config, index,
                           follow_ups(index, question) if follow_ups is not None else None)
        with lock:
            done[0] += 1
            if progress is not None:
                progress(done[0])
        return outcome

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        outcomes = list(pool.map(one, range(n)))
    return WeekResult(outcomes, time.perf_counter() - started)

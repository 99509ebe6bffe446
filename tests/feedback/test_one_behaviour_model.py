"""The bench's population (population.py) and the gateway demo's users (users.py) draw users from one behaviour
model (behaviour.py), at the same noise presets: a user's reactions come out alike in both worlds, the signals
follow the hidden truth the same way, and the labeler, fitted on each world's own ratings, is as well calibrated
against the truth in one as in the other (the demo's users here talk to a stand-in agent, not through the gateway:
bench/labels.py --world gateway measures the demo's own week)."""

from __future__ import annotations

import json
import math
import random

from agent_rl.simulated_users import behaviour, population, users
from agent_rl.simulated_users import conversations as talk
from agent_rl.feedback.labeler import LabelerConfig, against_truth, label_episodes
from agent_rl.simulated_users.outside_agent import Turn
from agent_rl.simulated_users.population import PopulationConfig, simulate
from agent_rl.feedback.signals import episode_signals, signals_from_messages
from agent_rl.simulated_users.users import Grounding, Question, UsersConfig, run_users
from tests.fake_agents import QuietEnding

# The agent's own noise set to none in both worlds: what is compared is the users.
QUIET_AGENT = dict(tool_error=(0.0, 0.0), agent_gives_up=(0.0, 0.0))
PRESET = behaviour.NoiseConfig(**{**behaviour.DEFAULT_NOISE.__dict__, "name": "default, quiet agent", **QUIET_AGENT})
FIRST = Question("Where is my order 4471 from last week?", lambda answer: answer.startswith("Right"))
FOLLOW_UP = Question("How long is the warranty on the kettle?", lambda answer: answer.startswith("Right"))


class StandInAgent(QuietEnding):
    """An outside agent that, per user message, makes one tool call and answers right at `accuracy` (its own draws,
    per conversation), as the population's scripted agent works: a call, its result, a reply."""

    def __init__(self, accuracy: float) -> None:
        self.accuracy, self.conversations, self.rngs = accuracy, {}, {}

    def work(self, messages, backend, session, leave=lambda _i: False, metadata=None) -> Turn:
        self.conversations[session] = messages
        rng = self.rngs.setdefault(session, random.Random(len(self.rngs)))  # one user at a time: deterministic
        call = {"id": f"call_{len(messages)}", "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"query": messages[-1]["content"][:40]})}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        if leave(0):
            return Turn(episode_id=session, version="v1", calls=1, pending=True)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": '{"found": true}'})
        answer = "Right: it ships on Monday." if rng.random() < self.accuracy else "Wrong: it ships on Friday."
        messages.append({"role": "assistant", "content": answer})
        return Turn(answer=answer, episode_id=session, version="v1", calls=2)


def _demo_users(n: int, accuracy: float, grounding: Grounding = Grounding(), seed: int = 5, rated_share: float = 0.0):
    """The demo's users (users.py) of a stand-in agent; (outcomes, agent: its conversations by episode id)."""
    config = UsersConfig(noise=PRESET, grounding=grounding, rated_share=rated_share, seed=seed)
    agent = StandInAgent(accuracy)
    week = run_users(agent, [FIRST], lambda _i, q: [{"role": "user", "content": q.text}], lambda _i, _q: None,
                     config, n=n, concurrency=1, follow_ups=lambda _i, _q: FOLLOW_UP)
    return week.outcomes, agent


def test_both_worlds_take_their_users_and_presets_from_the_behaviour_model():
    assert population.NOISE_PRESETS is behaviour.NOISE_PRESETS and users.DEFAULT_NOISE is behaviour.DEFAULT_NOISE
    assert PopulationConfig().max_rounds == UsersConfig().max_rounds == behaviour.MAX_ROUNDS
    config = UsersConfig()
    assert config.leave_rate(False) == behaviour.User(random.Random(0), behaviour.DEFAULT_NOISE).leave_rate(False)


def test_a_satisfied_users_first_reaction_is_alike_in_the_bench_and_the_demo():
    """Satisfied users thank after the first answer at the preset's share (give_up aside) in both worlds."""
    n = 1500
    expected = PRESET.satisfied.thank / (1 - PRESET.satisfied.give_up)
    bench = simulate(PopulationConfig(n_episodes=n, satisfied_share=1.0, rated_share=0.0, noise=PRESET, seed=2))
    answered = [e for e in bench if any(m["role"] == "assistant" and m.get("content") for m in e.episode.messages)]
    bench_thanks = sum(episode_signals(e.episode).thanks > 0 and _first_reaction_is_thanks(e.episode.messages)
                       for e in answered) / len(answered)
    outcomes, _ = _demo_users(n, accuracy=1.0, grounding=Grounding(satisfied_if_right=1.0, satisfied_if_wrong=0.0))
    demo_answered = [o for o in outcomes if o.answered]
    demo_thanks = sum(o.reactions[0] == "thank" for o in demo_answered) / len(demo_answered)
    tolerance = 4 * math.sqrt(expected * (1 - expected) / len(answered))
    assert abs(bench_thanks - expected) < tolerance and abs(demo_thanks - expected) < tolerance, (bench_thanks,
                                                                                                demo_thanks)


def _first_reaction_is_thanks(messages) -> bool:
    """Whether the user's first message after the agent's first answer is a thanks."""
    replies = [i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("content")]
    after = [m for m in messages[replies[0] + 1:] if m["role"] == "user"] if replies else []
    return bool(after) and after[0]["content"].rstrip(".!").lower() in {t.rstrip(".!").lower() for t in talk.THANKS}


def _worlds(seed: int, n: int = 3000, rated_share: float = 0.0):
    """A week of each world at the default preset (the agent's own noise aside): [(signals, truth)] for the bench's
    population and for the demo's users of an agent right 70% of the time."""
    bench = simulate(PopulationConfig(n_episodes=n, noise=PRESET, rated_share=rated_share, seed=seed))
    outcomes, agent = _demo_users(n, accuracy=0.7, seed=seed, rated_share=rated_share)
    return ([(episode_signals(e.episode), e.satisfied) for e in bench],
            [(signals_from_messages(agent.conversations[o.episode_id], episode_id=o.episode_id, feedback=o.rated),
              o.satisfied) for o in outcomes])


def test_signals_follow_the_hidden_truth_the_same_way_in_both_worlds():
    """Unhappy users correct, complain, re-ask and leave more, satisfied ones thank more, in the bench as in the demo.
    Follow-ups are left out: in the demo a follow-up is one more question to get right (the truth covers every
    question), so they need not mean the same thing in both worlds."""
    for world in _worlds(seed=1):
        def share(satisfied: bool, signal: str) -> float:
            group = [s for s, truth in world if truth is satisfied]
            return sum(bool(getattr(s, signal)) for s in group) / len(group)

        for signal in ("corrections", "complaints", "reasks", "abandoned"):
            assert share(False, signal) > share(True, signal), signal
        assert share(True, "thanks") > 2 * share(False, "thanks")


def test_the_labelers_calibration_against_the_truth_agrees_between_the_bench_and_the_demos_users():
    """The labeler, fitted on each world's own ratings (10% of 3,000 users), is calibrated against the hidden truth
    within 0.02 of the other world's, and within 0.05 in both (means over three weeks): what bench/labels.py
    reports is what the demo's users give. Measured 2026-11-29: 0.029 and 0.041."""
    eces: dict[str, list[float]] = {"bench": [], "demo": []}
    for seed in range(3):
        for name, world in zip(eces, _worlds(seed, rated_share=0.1)):
            result = label_episodes([s for s, _ in world], LabelerConfig())
            eces[name].append(against_truth(result.scored, {s.episode_id: t for s, t in world})["ece"])
    bench, demo = (sum(v) / len(v) for v in eces.values())
    assert bench <= 0.05 and demo <= 0.05 and abs(bench - demo) <= 0.02, eces

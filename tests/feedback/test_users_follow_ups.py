"""Simulated users who ask a follow-up question on another topic (agent_rl/simulated_users/users.py), against a scripted
stand-in for the outside agent (no gateway): the follow-up comes at the preset's share after an answer the user let
stand, the agent answers it in the same conversation, re-asks then restate it, and the hidden truth covers both
questions."""

from __future__ import annotations

import math

from agent_rl.simulated_users.outside_agent import Turn
from agent_rl.simulated_users.population import NoiseConfig, Reactions
from agent_rl.feedback.signals import signals_from_messages
from agent_rl.simulated_users.users import Grounding, Question, UsersConfig, run_users
from tests.fake_agents import QuietEnding

FIRST = Question("Where is my order 123?", lambda answer: "123" in answer)  # the agent quotes it: always right
FOLLOW_UP = Question("Is the kettle in stock in Denver?", lambda answer: False)  # always answered wrong
NOISE = dict(tool_error=(0.0, 0.0), agent_gives_up=(0.0, 0.0), rating_flip=0.0)


class ScriptedAgent(QuietEnding):
    """Answers by quoting the user's last message; keeps each conversation's messages by session."""

    def __init__(self) -> None:
        self.conversations: dict[str, list[dict]] = {}

    def work(self, messages, backend, session, leave=lambda _i: False, metadata=None) -> Turn:
        self.conversations[session] = messages
        answer = f"About {messages[-1]['content']!r}: here you go."
        messages.append({"role": "assistant", "content": answer})
        return Turn(answer=answer, episode_id=session, version="v1", calls=1)


def _reactions(**shares: float) -> Reactions:
    return Reactions(**{"thank": 0.0, "silent": 0.0, "reask": 0.0, "correct": 0.0, "complain": 0.0, "give_up": 0.0,
                        **shares})


def _week(n: int, follow_ups=lambda _index, _question: FOLLOW_UP, first: Question = FIRST, **noise):
    """`n` users asking `first`; right answers always satisfy, wrong ones never (by default satisfied users stay
    silent, unhappy ones re-ask, and 40% of satisfied users ask a follow-up)."""
    shares = {"satisfied": _reactions(silent=1.0), "unhappy": _reactions(reask=1.0), "follow_up": (0.4, 0.0), **noise}
    config = UsersConfig(noise=NoiseConfig(name="scripted", **NOISE, **shares), rated_share=0.0, max_rounds=3, seed=9,
                         grounding=Grounding(satisfied_if_right=1.0, satisfied_if_wrong=0.0))
    agent = ScriptedAgent()
    week = run_users(agent, [first], lambda _i, q: [{"role": "user", "content": q.text}], lambda _i, _q: None,
                     config, n=n, concurrency=2, follow_ups=follow_ups)
    return week, agent


def test_follow_ups_at_the_presets_share_answered_and_covered_by_the_truth():
    n = 1000
    week, agent = _week(n)
    asked = [o for o in week.outcomes if "follow_up" in o.reactions]
    assert abs(len(asked) - 0.4 * n) <= 4 * math.sqrt(n * 0.4 * 0.6)  # satisfied after the first answer: 40%
    for o in week.outcomes:
        messages = agent.conversations[o.episode_id]
        users = [m["content"] for m in messages if m["role"] == "user"]
        signals = signals_from_messages(messages)
        assert o.answered
        if o in asked:
            # The follow-up, answered by the agent; its wrong answer is re-asked (restating it), the last one left.
            assert o.reactions == ["silent", "follow_up", "reask", "silent"]
            assert all(FOLLOW_UP.text.lower().rstrip("?") in text.lower() for text in users[1:3])
            assert (signals.follow_ups, signals.reasks, signals.corrections) == (1, 1, 0)
            assert not o.satisfied and not o.right  # the first answer satisfied; the whole conversation did not
        else:
            assert o.reactions == ["silent"] and len(users) == 1 and o.satisfied and o.right
            assert signals.follow_ups == 0


def test_a_good_follow_up_answer_does_not_make_up_for_the_first():
    wrong_first = Question("Where is my order 123?", lambda answer: False)
    right_follow_up = Question("Is the kettle in stock in Denver?", lambda answer: "kettle" in answer.lower())
    week, _agent = _week(600, follow_ups=lambda _index, _question: right_follow_up, first=wrong_first,
                         unhappy=_reactions(silent=1.0), follow_up=(0.0, 0.5))
    asked = [o for o in week.outcomes if "follow_up" in o.reactions]
    assert abs(len(asked) - 300) <= 4 * math.sqrt(600 * 0.25)  # unhappy after the first answer: 50%
    assert all(o.reactions == ["silent", "follow_up", "silent"] for o in asked)
    assert not any(o.satisfied or o.right for o in week.outcomes)  # about the whole conversation


def test_no_follow_up_without_one_to_ask():
    week, _agent = _week(200, follow_ups=lambda _index, _question: None)
    assert all(o.reactions == ["silent"] and o.satisfied for o in week.outcomes)
    assert UsersConfig().describe()["follow_up"] == {"satisfied": 0.25, "unhappy": 0.10}

"""The simulated population (agent_rl/simulated_users/population.py): deterministic per seed, rating share as configured,
conversations in the gateway's wire shape, behaviour that depends on the hidden truth but overlaps, follow-up
questions on another topic at the configured shares."""

from __future__ import annotations

import math
import re

import pytest

from agent_rl.arbiter.gateway.wire import ChatRequest
from agent_rl.simulated_users import conversations as talk
from agent_rl.simulated_users.population import (
    DEFAULT_NOISE,
    NOISE_PRESETS,
    NOISY,
    VERY_NOISY,
    NoiseConfig,
    PopulationConfig,
    Reactions,
    simulate,
)
from agent_rl.feedback.signals import episode_signals


def _dumps(config: PopulationConfig) -> list[tuple[dict, bool]]:
    return [(e.episode.model_dump(mode="json"), e.satisfied) for e in simulate(config)]


def test_same_seed_same_week_other_seed_other_week():
    config = PopulationConfig(n_episodes=200, seed=7)
    assert _dumps(config) == _dumps(PopulationConfig(n_episodes=200, seed=7))
    assert _dumps(config) != _dumps(PopulationConfig(n_episodes=200, seed=8))


@pytest.mark.parametrize("share", [0.05, 0.2])
def test_rating_share_is_the_configured_one(share):
    n = 4000
    rated = sum(e.episode.feedback is not None for e in simulate(PopulationConfig(n_episodes=n, rated_share=share)))
    assert abs(rated - n * share) <= 4 * math.sqrt(n * share * (1 - share))  # a binomial draw, 4 sd


def test_nobody_or_everybody_rates():
    assert all(e.episode.feedback is None for e in simulate(PopulationConfig(n_episodes=100, rated_share=0.0)))
    week = simulate(PopulationConfig(n_episodes=100, rated_share=1.0))
    assert all(e.episode.feedback in ("up", "down") for e in week)
    # Ratings follow the hidden truth except for the preset's mis-clicks.
    agree = sum((e.episode.feedback == "up") == e.satisfied for e in week)
    assert agree >= 90


def test_satisfied_share_is_the_configured_one():
    week = simulate(PopulationConfig(n_episodes=2000, satisfied_share=0.3))
    assert abs(sum(e.satisfied for e in week) / 2000 - 0.3) < 0.04


def test_episodes_have_the_gateways_shape():
    for simulated in simulate(PopulationConfig(n_episodes=150, seed=2)):
        episode = simulated.episode
        assert episode.environment == "gateway" and episode.outcome == "unjudged" and episode.reward is None
        assert episode.tools and episode.question == episode.messages[1]["content"]
        assert episode.messages[-1]["role"] == "assistant"  # the gateway records each reply as the last message
        assert episode.turns == sum(m["role"] == "assistant" for m in episode.messages)
        # Every request the client sent is one the gateway accepts: the transcript up to each reply.
        for i, message in enumerate(episode.messages):
            if message["role"] == "assistant":
                request = {"model": "agent-rl", "messages": episode.messages[:i], "tools": episode.tools}
                ChatRequest.model_validate(request)
        answered = {c["id"] for m in episode.messages for c in m.get("tool_calls") or []}
        assert all(m["tool_call_id"] in answered for m in episode.messages if m["role"] == "tool")
        last = episode.messages[-1]
        assert episode.final_answer == (last.get("content") or None)


def test_behaviour_depends_on_the_truth_but_overlaps():
    week = simulate(PopulationConfig(n_episodes=3000, seed=1))
    signals = {e.episode.episode_id: episode_signals(e.episode) for e in week}

    def share(satisfied: bool, signal: str) -> float:
        group = [signals[e.episode.episode_id] for e in week if e.satisfied is satisfied]
        return sum(bool(getattr(s, signal)) for s in group) / len(group)

    for signal in ("reasks", "corrections", "abandoned", "tool_errors"):
        assert share(False, signal) > share(True, signal) > 0  # satisfied users do it too, less often
    assert share(True, "thanks") > share(False, "thanks") > 0


def _topic_of(request: str) -> str:
    """The topic whose phrasing a request is (the follow-up's opening words and careless typing aside)."""
    text = request.lower().rstrip(".?!")
    for prefix in talk.FOLLOW_UP_PREFIXES:
        text = text.removeprefix(prefix.lower())
    found = set()
    for topic in talk.TOPICS:
        for phrasing in topic.phrasings:
            parts = re.split(r"\{\w+\}", phrasing.lower().rstrip(".?!"))  # the literal text around the slots
            if re.fullmatch(".+".join(map(re.escape, parts)), text):
                found.add(topic.name)
    assert len(found) == 1, (request, found)
    return found.pop()


def test_follow_ups_come_at_the_configured_shares_on_another_topic():
    # Every answer is let stand, so each user asks a follow-up after the first answer at exactly the stated share.
    silent = Reactions(thank=0.0, silent=1.0, reask=0.0, correct=0.0, complain=0.0, give_up=0.0)
    noise = NoiseConfig(name="follow-ups", satisfied=silent, unhappy=silent, tool_error=(0.0, 0.0),
                        agent_gives_up=(0.0, 0.0), follow_up=(0.3, 0.1), rating_flip=0.0)
    n = 4000
    week = simulate(PopulationConfig(n_episodes=n, noise=noise, max_rounds=2, seed=11))
    for satisfied, share in ((True, 0.3), (False, 0.1)):
        group = [e for e in week if e.satisfied is satisfied]
        asked = [e for e in group if sum(m["role"] == "user" for m in e.episode.messages) == 2]
        assert abs(len(asked) - len(group) * share) <= 4 * math.sqrt(len(group) * share * (1 - share))
    followed = [e.episode for e in week if sum(m["role"] == "user" for m in e.episode.messages) == 2]
    for episode in followed:
        first, second = [m["content"] for m in episode.messages if m["role"] == "user"]
        assert _topic_of(first) != _topic_of(second)
        assert episode.messages[-1]["role"] == "assistant" and episode.final_answer  # the agent answered it
    signals = [episode_signals(e) for e in followed]
    assert sum(s.reasks for s in signals) <= 0.01 * len(followed)  # a shared product or city, now and then
    assert sum(s.corrections for s in signals) == 0
    assert sum(s.follow_ups for s in signals) >= 0.9 * len(followed)
    ids = {e.episode_id for e in followed}
    assert all(episode_signals(e.episode).follow_ups == 0 for e in week[:500] if e.episode.episode_id not in ids)


def test_satisfied_users_ask_more_follow_ups_in_every_preset():
    for noise in (DEFAULT_NOISE, NOISY, VERY_NOISY):
        assert noise.follow_up[0] > noise.follow_up[1] > 0
        week = simulate(PopulationConfig(n_episodes=2000, noise=noise, seed=3))
        shares = [sum(episode_signals(e.episode).follow_ups > 0 for e in week if e.satisfied is side)
                  / sum(e.satisfied is side for e in week) for side in (True, False)]
        assert shares[0] > shares[1] > 0, (noise.name, shares)


def test_noise_presets_are_stated_and_noisier_ones_separate_less():
    assert set(NOISE_PRESETS) == {"default", "noisy", "very_noisy"}
    gaps = [n.unhappy.silent for n in (DEFAULT_NOISE, NOISY, VERY_NOISY)]
    assert gaps == sorted(gaps)  # more unhappy users leave without a word
    thanks_gap = [n.satisfied.thank - n.unhappy.thank for n in (DEFAULT_NOISE, NOISY, VERY_NOISY)]
    assert thanks_gap == sorted(thanks_gap, reverse=True)


def test_configs_are_checked():
    with pytest.raises(ValueError):
        Reactions(thank=0.5, silent=0.5, reask=0.1, correct=0, complain=0, give_up=0)
    with pytest.raises(ValueError):
        PopulationConfig(rated_share=1.5)
    with pytest.raises(ValueError):
        PopulationConfig(max_rounds=0)

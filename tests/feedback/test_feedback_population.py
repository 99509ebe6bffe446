"""The simulated population (agent_rl/feedback/population.py): deterministic per seed, rating share as configured,
conversations in the gateway's wire shape, behaviour that depends on the hidden truth but overlaps."""

from __future__ import annotations

import math

import pytest

from agent_rl.arbiter.gateway_wire import ChatRequest
from agent_rl.feedback.population import (
    DEFAULT_NOISE,
    NOISE_PRESETS,
    NOISY,
    VERY_NOISY,
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

"""The simulated API incumbent: the rule-based agent plays a named model; its answers are judged like any policy's
(measured), its latency and cost per episode are the published figures, and it says it is a simulation."""

from __future__ import annotations

from collections import Counter

import pytest

from agent_rl.agent.api_models import api_model_profile, api_model_profiles
from agent_rl.environments.email.heuristic import HeuristicPolicy
from agent_rl.environments.runner import RunnerConfig
from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
from agent_rl.arbiter.policies import PolicyLoadError, load_policy
from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.records import Outcome
from agent_rl.environments.email.scenarios import generate_scenarios


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    store = open_inbox_store(f"sqlite:///{tmp_path_factory.mktemp('api') / 'inbox.db'}")
    scenarios = generate_scenarios(build_demo_corpus(store, seed=5, n_inboxes=3, n_emails=900), seed=5)
    yield store, scenarios
    store.close()


def test_every_profile_names_its_source_and_is_labelled_simulated():
    for name, profile in api_model_profiles().items():
        assert profile.source and profile.label()["simulated"] is True and profile.label()["model"] == name
    o3 = api_model_profile("o3")
    assert (o3.latency_ms, o3.cost_per_episode_usd) == (5600.0, pytest.approx(0.05519))


def test_the_simulated_model_answers_worse_than_the_plain_agent_and_costs_what_was_published(demo):
    store, scenarios = demo
    tasks = [EpisodeTask.from_scenario(s) for s in scenarios]
    simulated = run_episodes(load_policy("api-sim:o3"), tasks, store, RunnerConfig(batch_size=64))
    plain = run_episodes(HeuristicPolicy(), tasks, store, RunnerConfig(batch_size=64))
    correct = {name: Counter(e.outcome for e in eps)[Outcome.CORRECT] / len(eps)
               for name, eps in (("simulated", simulated), ("plain", plain))}
    assert correct["simulated"] < correct["plain"]
    assert abs(correct["plain"] - correct["simulated"] - 0.05) < 0.06  # the configured 5% extra wrong answers
    assert {e.latency_ms for e in simulated} == {5600.0}
    assert {round(e.cost_usd, 6) for e in simulated} == {0.05519}
    assert {e.policy_version for e in simulated} == {"api-sim:o3"}
    assert all(e.latency_ms < 5600.0 for e in plain)


def test_an_unknown_model_is_a_clear_error():
    with pytest.raises(PolicyLoadError, match="unknown simulated API model 'gpt-9'.*known: o3"):
        load_policy("api-sim:gpt-9")

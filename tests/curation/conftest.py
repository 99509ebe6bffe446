"""A small real environment for the curation tests: demo inboxes, scenarios and heuristic-policy episodes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass
class DemoEnvironment:
    emails: list
    scenarios: list
    episodes: list[dict]


@pytest.fixture(scope="session")
def demo_env(tmp_path_factory) -> DemoEnvironment:
    from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
    from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
    from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.environments.email.scenarios.generate import generate_scenarios

    path = tmp_path_factory.mktemp("curation") / "inbox.db"
    store = open_inbox_store(f"sqlite:///{path}")
    corpus = build_demo_corpus(store, seed=3, n_inboxes=2, n_emails=300)
    scenarios = generate_scenarios(corpus, seed=3)
    policy = HeuristicPolicy(HeuristicConfig(scenarios=scenarios, wrong_rate=0.15, idk_rate=0.1, seed=3), store=store)
    episodes = run_episodes(policy, [EpisodeTask.from_scenario(s) for s in scenarios], store)
    store.close()
    return DemoEnvironment(corpus.emails, scenarios, [e.model_dump(mode="json") for e in episodes])

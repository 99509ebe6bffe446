"""Shared training-test data: a small real demo inbox, heuristic-teacher SFT rows and GRPO rows (built once)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def train_data(tmp_path_factory) -> dict[str, Path | str]:
    from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
    from agent_rl.agent.models import build_tiny_model
    from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
    from agent_rl.curation.datasets import save_jsonl, sft_rows
    from agent_rl.environments.email.grpo_rows import grpo_rows
    from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.environments.email.scenarios.generate import generate_scenarios

    root = tmp_path_factory.mktemp("train-data")
    store_url = f"sqlite:///{root / 'inbox.db'}"
    store = open_inbox_store(store_url)
    corpus = build_demo_corpus(store, seed=0, n_inboxes=2, n_emails=200)
    scenarios = generate_scenarios(corpus)
    teacher = HeuristicPolicy(HeuristicConfig(scenarios=scenarios), store=store)
    episodes = run_episodes(teacher, [EpisodeTask.from_scenario(s) for s in scenarios[:12]], store)
    sft_path, grpo_path = root / "sft.jsonl", root / "grpo.jsonl"
    rows = sft_rows([e.model_dump(mode="json") for e in episodes], min_quality=0.0)
    assert rows, "the heuristic teacher should solve some demo scenarios"
    save_jsonl(rows[:8], sft_path)
    save_jsonl(grpo_rows(scenarios, split=None)[:8], grpo_path)
    store.close()
    return {"store_url": store_url, "sft": sft_path, "grpo": grpo_path,
            "tiny": build_tiny_model(root / "tiny"), "root": root}

"""The speed-ups keep behaviour: remembered email reads never cross stores nor hide later emails, and the
heuristic (which the runner spares the per-turn copy) neither edits conversations nor changes with warm caches."""

from __future__ import annotations

import copy
from datetime import datetime, timezone

import pytest

from agent_rl.environments.email.heuristic import HeuristicPolicy
from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
from agent_rl.environments.email.tools import cached_read, make_tools, tool_schemas
from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.environments.email.records import Email
from agent_rl.environments.email.scenarios import generate_scenarios

INBOX = "alice@example.com"


def _email(message_id: str, body: str) -> Email:
    return Email(message_id=message_id, inbox=INBOX, date=datetime(2001, 5, 3, tzinfo=timezone.utc),
                 subject="Budget", sender="carol@example.com", to=(INBOX,), body=body)  # fmt: skip


def test_remembered_reads_are_per_store_and_misses_are_not_remembered(tmp_path):
    first = open_inbox_store(f"sqlite:///{tmp_path / 'one.db'}")
    second = open_inbox_store(f"sqlite:///{tmp_path / 'two.db'}")
    try:
        first.add_emails([_email("<m1@x>", "The budget is $100.")])
        second.add_emails([_email("<m1@x>", "The budget is $900.")])  # same id, another store
        assert cached_read(first, INBOX, "<m1@x>").body == "The budget is $100."
        assert cached_read(second, INBOX, "<m1@x>").body == "The budget is $900."
        assert cached_read(first, INBOX, "<m1@x>") == first.read(INBOX, "<m1@x>")
        assert cached_read(first, "bob@example.com", "<m1@x>") is None  # scoped to the inbox

        assert cached_read(first, INBOX, "<m2@x>") is None
        first.add_emails([_email("<m2@x>", "Ingested later.")])
        assert cached_read(first, INBOX, "<m2@x>").body == "Ingested later."

        tools = make_tools(first, INBOX)
        assert tools.read_email("<m1@x>") == tools.read_email("<m1@x>")
        assert tools.trace.reads == ["<m1@x>", "<m1@x>"]  # every read is still recorded
    finally:
        first.close()
        second.close()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    store = open_inbox_store(f"sqlite:///{tmp_path_factory.mktemp('cache') / 'inbox.db'}")
    corpus = build_demo_corpus(store, seed=5, n_inboxes=2, n_emails=400)
    scenarios = generate_scenarios(corpus, seed=5)[:40]
    yield store, scenarios
    store.close()


def test_the_heuristic_never_edits_the_conversations_it_reads(demo):
    store, scenarios = demo
    policy = HeuristicPolicy()
    assert policy.reads_conversations_only is True
    episodes = run_episodes(policy, [EpisodeTask.from_scenario(s) for s in scenarios], store)
    for episode in episodes:
        for cut in range(2, len(episode.messages) + 1):  # every prefix the policy saw during the episode
            conversation = [dict(m) for m in episode.messages[:cut]]
            before = copy.deepcopy(conversation)
            policy.act([conversation], tool_schemas())
            assert conversation == before


def test_warm_caches_give_the_same_episodes(demo):
    store, scenarios = demo
    tasks = [EpisodeTask.from_scenario(s) for s in scenarios]
    cold = run_episodes(HeuristicPolicy(), tasks, store)
    warm = run_episodes(HeuristicPolicy(), tasks, store)
    again = run_episodes(HeuristicPolicy(), tasks[::-1], store)[::-1]  # other order, other batch mates
    for a, b, c in zip(cold, warm, again):
        assert a.messages == b.messages == c.messages
        assert (a.outcome, a.final_answer, a.sources, a.prompt_tokens) == (b.outcome, b.final_answer, b.sources, b.prompt_tokens)

"""The arbiter serving a plug-in environment (the customer-support store) instead of the email assistant: replayed
tasks over real HTTP are played in the environment by the routed version and judged against their expected state,
live requests are stored unjudged, contexts outside the store or a key's scope are refused, and a task named
under another request's text is not taken as its label."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agent_rl.arbiter.config import ArbiterConfig
from agent_rl.arbiter.replay import replay, select_tasks
from agent_rl.arbiter.server import running_arbiter
from agent_rl.environments.support import SupportEnvironment
from agent_rl.pool import PoolRepository
from agent_rl.records import Split
from arbiter_fixtures import API_TOKEN, api_key, bearer

ADMIN_TOKEN = "plugin-admin-token-77c1"


@pytest.fixture
def support_arbiter(sqlite_url, monkeypatch):
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    scoped = api_key("scoped-token-0c2f9", key_id="scoped", contexts=("store-9",))
    config = ArbiterConfig(pool_url=sqlite_url, environment="support", api_keys=(api_key(), scoped),
                           default_routing={"teacher": 1.0})
    pool = PoolRepository(sqlite_url)
    with running_arbiter(config) as url, httpx.Client(base_url=url, timeout=60, headers=bearer(API_TOKEN)) as client:
        response = client.put("/v1/routing", json={"weights": {"teacher": 1.0}, "specs": {"teacher": "teacher:support"},
                                                   "reason": "production", "actor": "test"},
                              headers=bearer(ADMIN_TOKEN))
        assert response.status_code == 200, response.text
        yield url, client, pool
    pool.close()


def test_replayed_support_tasks_are_played_in_the_store_and_judged_by_its_state(support_arbiter):
    url, client, pool = support_arbiter
    env = SupportEnvironment()
    tasks = select_tasks(env.tasks(Split.TEST), None, None)
    summary = asyncio.run(replay(url, tasks, concurrency=4, api_key=API_TOKEN))
    assert summary.sent == summary.ok == len(tasks), summary.as_dict()
    stored = [pool.get(episode_id) for episode_id, _ in summary.answered]
    assert {e.environment for e in stored} == {"support"} and {e.policy_version for e in stored} == {"teacher"}
    assert {e.context for e in stored} == {env.database.id}
    assert {e.task_category for e in stored} == set(env.categories)
    assert all(e.outcome.value == "correct" for e in stored)  # the teacher, judged by the resulting database
    assert all(e.messages[0]["role"] == "system" and e.messages[1]["role"] == "user" for e in stored)


def test_live_requests_are_stored_unjudged_and_foreign_contexts_refused(support_arbiter):
    _, client, pool = support_arbiter
    task = SupportEnvironment().tasks(Split.TEST)[0]
    live = client.post("/v1/ask", json={"inbox": task.context, "question": "Hello, what is your refund policy?"})
    assert live.status_code == 200, live.text
    episode = pool.get(live.json()["episode_id"])
    assert episode.environment == "support" and episode.reward is None and episode.outcome.value == "unjudged"

    # Naming a task with other text does not make that text's episode a label.
    other = client.post("/v1/ask", json={"inbox": task.context, "question": "Cancel everything.",
                                         "scenario_id": task.id})
    assert other.status_code == 200 and pool.get(other.json()["episode_id"]).reward is None

    unknown = client.post("/v1/ask", json={"inbox": "store-404", "question": "Where is my order?"})
    assert unknown.status_code == 404
    out_of_scope = client.post("/v1/ask", json={"inbox": task.context, "question": "Where is my order?"},
                               headers=bearer("scoped-token-0c2f9"))
    assert out_of_scope.status_code == 403 and task.context not in out_of_scope.text


def test_an_unknown_environment_is_refused_when_the_arbiter_is_configured():
    with pytest.raises(ValueError, match="environment 'suport': unknown"):
        ArbiterConfig(environment="suport")

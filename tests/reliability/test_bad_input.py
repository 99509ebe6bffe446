"""Bad input against the real arbiter (random bodies, hostile JSON, NUL bytes on PostgreSQL) and against the
episode validator: always a 4xx JSON error naming the problem, never a 500, never a partial write.

tests/arbiter/test_app.py holds the hand-picked cases for /v1/ask; this adds random bodies over every
endpoint and the JSON a parser chokes on.
"""

from __future__ import annotations

import json
import random

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
from agent_rl.arbiter.config import ArbiterConfig
from agent_rl.arbiter.server import running_arbiter
from agent_rl.curation.validate import config_for, validate_episodes
from agent_rl.environments.email.environment import EmailEnvironment
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.pool import PoolRepository
from agent_rl.arbiter.keys import ApiKey, hash_token
from reliability_support import API_TOKEN, build_world

ADMIN_TOKEN = "reliability-admin-token-9d2e7b"
ENDPOINTS = [("POST", "/v1/ask"), ("POST", "/v1/feedback"), ("PUT", "/v1/routing")]
API_KEYS = (ApiKey(id="bad-input", sha256=hash_token(API_TOKEN), tenant="tests", contexts=("*",), replay=True),)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("bad-input-world"))


class LiveArbiter:
    def __init__(self, client: httpx.Client, pool: PoolRepository) -> None:
        self.client = client
        self.pool = pool

    def send(self, method: str, path: str, body: bytes, content_type: str = "application/json") -> httpx.Response:
        """With the credentials the endpoint takes: the admin token for routing, the API key otherwise."""
        token = ADMIN_TOKEN if path == "/v1/routing" else API_TOKEN
        headers = {"Content-Type": content_type, "Authorization": f"Bearer {token}"}
        return self.client.request(method, path, content=body, headers=headers)


@pytest.fixture(scope="module")
def live(world, tmp_path_factory):
    """One arbiter for the module (hypothesis runs many examples against it); the admin token is set."""
    pool_url = f"sqlite:///{tmp_path_factory.mktemp('bad-input-pool') / 'pool.db'}"
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    config = ArbiterConfig(pool_url=pool_url, inbox_url=world.inbox_url, scenarios_path=world.scenarios_path,
                           api_keys=API_KEYS)
    pool = PoolRepository(pool_url)
    with running_arbiter(config, log_level="warning", access_log=False) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield LiveArbiter(client, pool)
    pool.close()
    monkeypatch.undo()


def assert_clear_refusal(response: httpx.Response) -> None:
    assert 400 <= response.status_code < 500, f"{response.status_code}: {response.text[:300]}"
    body = response.json()
    assert set(body) == {"error", "detail"} and body["error"] and body["detail"], body


def _state(live: LiveArbiter) -> tuple[int, int]:
    return live.pool.count(), len(live.pool.routing_history())


# -- JSON a parser chokes on -----------------------------------------------------------------------

HOSTILE = {
    "deeply nested": b"[" * 20_000 + b"]" * 20_000,
    "deeply nested object": b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
    "integer past the digit limit": b'{"inbox": "x", "question": ' + b"9" * 5_000 + b"}",
    "float overflow": b'{"weights": {"a": 1e999}, "reason": "x", "episode_id": "e", "verdict": "v", "inbox": "x", "question": "q"}',
    "NaN literal": b'{"weights": {"a": NaN}, "reason": "x", "episode_id": NaN, "verdict": "v", "inbox": NaN, "question": "q"}',
    "byte order mark": b'\xef\xbb\xbf{"inbox": "x", "question": "q"}',
    "UTF-16": '{"inbox": "x", "question": "q"}'.encode("utf-16"),
    "lone surrogate everywhere": b'{"inbox": "\\udc00", "question": "\\ud800", "episode_id": "\\ud800", '
                                 b'"verdict": "\\udfff", "weights": {"\\ud800": 1}, "reason": "\\ud800"}',
    "NUL bytes": b'{"inbox": "a\\u0000", "question": "\\u0000", "episode_id": "\\u0000", "verdict": "\\u0000", '
                 b'"weights": {"a\\u0000": 1}, "reason": "\\u0000"}',
    "raw control bytes": b'{"inbox": "a\x01\x02", "question": "q\x00"}',
    "empty body": b"",
    "only whitespace": b"   \n\t ",
    "a bare string": b'"hello"',
    "null": b"null",
    "duplicate keys": b'{"inbox": "x", "inbox": "y", "question": "q", "question": 1}',
    "trailing garbage": b'{"inbox": "x", "question": "q"} trailing',
}


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_json_is_a_clear_4xx_and_writes_nothing(live, method, path, case):
    before = _state(live)
    response = live.send(method, path, HOSTILE[case])
    assert_clear_refusal(response)
    assert _state(live) == before


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_wrong_content_types_and_oversized_bodies_are_refused(live, method, path):
    before = _state(live)
    assert_clear_refusal(live.send(method, path, b'{"x": 1}', content_type="text/plain"))
    assert_clear_refusal(live.send(method, path, b'{"x": 1}', content_type="multipart/form-data; boundary=zz"))
    huge = live.send(method, path, b'{"reason": "' + b"y" * 300_000 + b'"}')
    assert huge.status_code == 413
    assert_clear_refusal(huge)
    assert _state(live) == before


# -- random bodies -----------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=10,
)
field_names = st.sampled_from(["inbox", "question", "scenario_id", "request_key", "episode_id", "verdict",
                               "weights", "specs", "reason", "actor", "stats"]) | st.text(max_size=8)
shaped_bodies = st.dictionaries(field_names, json_values, max_size=6).map(lambda d: json.dumps(d).encode())
any_json = json_values.map(lambda v: json.dumps(v).encode())
raw_bytes = st.binary(max_size=300)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(endpoint=st.sampled_from(ENDPOINTS), body=shaped_bodies | any_json | raw_bytes)
def test_random_bodies_never_get_a_500_and_only_valid_ones_write(live, endpoint, body):
    method, path = endpoint
    before_count, before_changes = _state(live)
    response = live.send(method, path, body)
    assert response.status_code < 500, f"{response.status_code} for {body[:200]!r}: {response.text[:300]}"
    after_count, after_changes = _state(live)
    if response.status_code >= 400:
        assert_clear_refusal(response)
        assert (after_count, after_changes) == (before_count, before_changes)
    elif path == "/v1/ask":  # a random body that happens to name a real inbox is a real question
        assert after_count == before_count + 1 and live.pool.get(response.json()["episode_id"]) is not None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(question=st.text(min_size=1, max_size=300), request_key=st.none() | st.text(min_size=1, max_size=50))
def test_any_question_to_a_real_inbox_is_answered_or_refused_clearly(live, world, question, request_key):
    """Valid shape, arbitrary text (control characters, surrogates, emoji): answered and logged, or a clear 4xx."""
    body = {"inbox": world.scenarios[0].inbox_id, "question": question}
    if request_key is not None:
        body["request_key"] = request_key
    before = live.pool.count()
    response = live.send("POST", "/v1/ask", json.dumps(body).encode())
    if response.status_code == 200:
        stored = live.pool.get(response.json()["episode_id"])
        assert stored is not None and stored.question == question
        assert live.pool.count() == before + 1
    else:
        assert_clear_refusal(response)
        assert live.pool.count() == before


# -- text PostgreSQL cannot store ------------------------------------------------------------------


@pytest.mark.postgres
def test_nul_bytes_are_refused_up_front_on_postgres_and_do_not_sink_the_batch(world, pg_url, monkeypatch):
    """PostgreSQL text cannot hold NUL: such a question must be a 422, not a failed write that takes the
    other requests of its batch down with it."""
    import asyncio

    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    config = ArbiterConfig(pool_url=pg_url, inbox_url=world.inbox_url, scenarios_path=world.scenarios_path,
                           batch_window_ms=50, api_keys=API_KEYS)
    key = {"Authorization": f"Bearer {API_TOKEN}"}
    inbox = world.scenarios[0].inbox_id
    bodies = [{"inbox": inbox, "question": f"When is the meeting {i}?"} for i in range(6)]
    bodies.insert(3, {"inbox": inbox, "question": "When is the\u0000meeting?"})
    with running_arbiter(config, log_level="warning", access_log=False) as url:

        async def send_all() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=60, headers=key) as client:
                return await asyncio.gather(*(client.post("/v1/ask", json=b) for b in bodies))

        responses = asyncio.run(send_all())
        feedback = httpx.post(f"{url}/v1/feedback", json={"episode_id": "x\u0000", "verdict": "up"}, headers=key,
                              timeout=30)
        routing = httpx.put(f"{url}/v1/routing", json={"weights": {"heuristic": 1}, "reason": "nul\u0000"},
                            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
    statuses = [r.status_code for r in responses]
    assert statuses[3] == 422 and "NUL" in json.dumps(responses[3].json()), responses[3].text
    assert statuses[:3] + statuses[4:] == [200] * 6
    assert feedback.status_code in (404, 422) and routing.status_code == 422
    pool = PoolRepository(pg_url)
    assert pool.count() == 6 and pool.routing_history() == []
    pool.close()


# -- the validator on mutated real episodes --------------------------------------------------------


@pytest.fixture(scope="module")
def real_episodes(world):
    store = open_inbox_store(world.inbox_url)
    teacher = HeuristicPolicy(HeuristicConfig(scenarios=world.scenarios, wrong_rate=0.2), store=store)
    episodes = run_episodes(teacher, [EpisodeTask.from_scenario(s) for s in world.scenarios[:12]], store)
    store.close()
    return [e.model_dump(mode="json") for e in episodes]


junk = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20) \
    | st.lists(st.integers(), max_size=3) | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2)


def _paths(value, prefix=()):
    """Every (nested) location in an episode: top-level fields, messages, message fields, tool calls."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, prefix + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value[:6]):
            yield from _paths(child, prefix + (index,))


def _mutate(episode: dict, path: tuple, action: str, replacement) -> dict:
    episode = json.loads(json.dumps(episode))
    if not path:
        return episode
    parent = episode
    for step in path[:-1]:
        parent = parent[step]
    if action == "drop" and isinstance(parent, dict):
        parent.pop(path[-1], None)
    else:
        parent[path[-1]] = replacement
    return episode


# Few examples, many rows each: one validation run (a Great Expectations suite) costs about a second.
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_validator_never_raises_on_mutated_episodes_and_loses_none(real_episodes, data):
    rows = []
    for _ in range(data.draw(st.integers(4, 12))):
        episode = data.draw(st.sampled_from(real_episodes))
        paths = list(_paths(episode))
        for _ in range(data.draw(st.integers(1, 3))):
            path = data.draw(st.sampled_from(paths))
            episode = _mutate(episode, path, data.draw(st.sampled_from(["drop", "replace"])), data.draw(junk))
            paths = list(_paths(episode))
        rows.append(episode)
    result = validate_episodes(rows, config_for([EmailEnvironment()]))
    assert len(result.clean) + len(result.quarantined) == len(rows)
    assert all(reasons and all(isinstance(r, str) and r for r in reasons) for _, reasons in result.quarantined)


def test_unmutated_episodes_stay_clean(real_episodes):
    """The control for the test above: the mutations, not the episodes, are what gets quarantined."""
    result = validate_episodes(random.Random(0).sample(real_episodes, len(real_episodes)), config_for([EmailEnvironment()]))
    assert len(result.clean) == len(real_episodes) and result.quarantined == []

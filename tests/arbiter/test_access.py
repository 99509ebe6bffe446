"""Who may do what through the arbiter, over real HTTP on SQLite and PostgreSQL: API keys scoped to a tenant and
to contexts, scenario ids honoured only for replay keys with the scenario's own question, errors and log lines
that name nothing outside the caller's scope, strict routing weights, and no blank questions."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from agent_rl.arbiter.config import ArbiterConfig
from agent_rl.arbiter.server import running_arbiter
from arbiter_fixtures import api_key, bearer, demo_world, start_arbiter  # noqa: F401  (pytest fixtures)

ADMIN_TOKEN = "access-admin-token-0b61f2"
ALICE = "alice-key-token-6e0d3a91"  # the first inbox only, may not replay
REPLAYER = "replay-key-token-2f7c55e8"  # the first inbox only, may replay
ANY = "any-inbox-token-98a1c4d0"  # every inbox, may replay


def _inboxes(demo_world) -> tuple[str, str]:
    first = demo_world.scenarios[0].inbox_id
    return first, next(s.inbox_id for s in demo_world.scenarios if s.inbox_id != first)


@pytest.fixture
def scoped(start_arbiter, demo_world, store_url):
    """An arbiter on either backend with three keys of two tenants."""
    home, _ = _inboxes(demo_world)
    keys = (
        api_key(ALICE, key_id="alice", tenant="acme", contexts=(home,), replay=False),
        api_key(REPLAYER, key_id="replayer", tenant="acme", contexts=(home,), replay=True),
        api_key(ANY, key_id="ops", tenant="ops", contexts=("*",), replay=True),
    )
    with start_arbiter(pool_url=store_url, api_keys=keys) as live:
        yield live


def _ask(live, token: str | None, **body) -> httpx.Response:
    headers = bearer(token) if token else {"Authorization": ""}
    return live.client.post("/v1/ask", json=body, headers=headers)


# -- 1. keys and their scope -------------------------------------------------------------------------


def test_ask_needs_a_valid_api_key(scoped, demo_world, monkeypatch):
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    home, _ = _inboxes(demo_world)
    question = {"inbox": home, "question": "When is the meeting?"}
    missing = httpx.post(f"{scoped.url}/v1/ask", json=question)
    assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
    assert _ask(scoped, "not-a-key", **question).status_code == 401
    assert _ask(scoped, ADMIN_TOKEN, **question).status_code == 401  # the admin token is for routing only
    assert _ask(scoped, ALICE[:-1], **question).status_code == 401
    # Bodies are read only after authentication: a stranger's malformed body says nothing about the format.
    garbage = httpx.post(f"{scoped.url}/v1/ask", content=b"{oops", headers={"Content-Type": "application/json"})
    assert garbage.status_code == 401
    assert scoped.pool.count() == 0
    answered = _ask(scoped, ALICE, **question)
    assert answered.status_code == 200, answered.text
    stored = scoped.pool.get(answered.json()["episode_id"])
    assert stored.tenant == "acme" and stored.inbox_id == home


def test_a_key_outside_its_contexts_gets_a_bare_403(scoped, demo_world, caplog):
    caplog.set_level(logging.INFO)
    home, other = _inboxes(demo_world)
    foreign = _ask(scoped, ALICE, inbox=other, question="What did they sign?")
    missing = _ask(scoped, ALICE, inbox="nobody@nowhere.example", question="What did they sign?")
    # Another tenant's inbox and an inbox that does not exist read the same: no existence oracle.
    assert foreign.status_code == missing.status_code == 403
    assert foreign.json() == missing.json() and foreign.json()["error"] == "forbidden"
    assert other not in foreign.text and "nobody@" not in missing.text
    assert other not in caplog.text and "nobody@" not in caplog.text
    assert scoped.pool.count() == 0
    # A wildcard key may ask anywhere; an unknown inbox is then a 404, whose log line has no address either.
    assert _ask(scoped, ANY, inbox=other, question="What did they sign?").status_code == 200
    unknown = _ask(scoped, ANY, inbox="nobody@nowhere.example", question="What did they sign?")
    assert unknown.status_code == 404 and "nobody@" not in caplog.text


def test_feedback_reaches_only_episodes_in_the_keys_scope(scoped, demo_world):
    home, other = _inboxes(demo_world)
    own = _ask(scoped, ALICE, inbox=home, question="When is the meeting?").json()["episode_id"]
    elsewhere = _ask(scoped, ANY, inbox=other, question="When is the meeting?").json()["episode_id"]
    same_inbox_other_tenant = _ask(scoped, ANY, inbox=home, question="When is the meeting?").json()["episode_id"]

    def feedback(token: str | None, episode_id: str) -> httpx.Response:
        headers = bearer(token) if token else {"Authorization": ""}
        return scoped.client.post("/v1/feedback", json={"episode_id": episode_id, "verdict": "down"}, headers=headers)

    assert feedback(None, own).status_code == 401
    unknown = feedback(ALICE, "no-such-episode")
    for episode_id in (elsewhere, same_inbox_other_tenant):
        refused = feedback(ALICE, episode_id)
        assert refused.status_code == 404 and refused.json()["error"] == unknown.json()["error"] == "unknown episode"
        assert scoped.pool.get(episode_id).feedback is None
    assert feedback(ALICE, own).status_code == 200 and scoped.pool.get(own).feedback == "down"
    assert feedback(ANY, elsewhere).status_code == 200


def test_without_configured_keys_asking_is_disabled(start_arbiter, demo_world, monkeypatch):
    monkeypatch.delenv("AGENT_RL_API_KEYS", raising=False)
    monkeypatch.delenv("AGENT_RL_API_KEYS_FILE", raising=False)
    with start_arbiter(api_keys=None) as live:
        response = _ask(live, "anything", inbox=demo_world.scenarios[0].inbox_id, question="When?")
        assert response.status_code == 403 and "AGENT_RL_API_KEYS" in response.json()["detail"]
        assert live.pool.count() == 0


def test_keys_are_read_from_the_file_named_in_the_environment(demo_world, sqlite_url, tmp_path, monkeypatch):
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps([api_key(ALICE, key_id="alice", tenant="acme", replay=False).model_dump(mode="json")]))
    monkeypatch.setenv("AGENT_RL_API_KEYS_FILE", str(keys_file))
    config = ArbiterConfig(pool_url=sqlite_url, inbox_url=demo_world.inbox_url)
    with running_arbiter(config) as url:
        body = {"inbox": demo_world.scenarios[0].inbox_id, "question": "When is the meeting?"}
        assert httpx.post(f"{url}/v1/ask", json=body, headers=bearer(ALICE), timeout=60).status_code == 200
        assert httpx.post(f"{url}/v1/ask", json=body, headers=bearer(ANY), timeout=60).status_code == 401
    assert ALICE not in keys_file.read_text()  # at rest a key is its hash


# -- 2. scenario ids cannot poison training labels ---------------------------------------------------


def test_only_replay_keys_with_the_scenarios_own_question_get_judged(scoped, demo_world):
    home, _ = _inboxes(demo_world)
    scenario = next(s for s in demo_world.scenarios if s.inbox_id == home and s.answerable)
    other_question = next(s.question for s in demo_world.scenarios if s.inbox_id == home and s.question != scenario.question)
    unjudged = [
        (ALICE, "Which restaurant did they pick for Friday?"),  # a made-up question under a real scenario's id
        (ALICE, other_question),
        (ALICE, scenario.question),  # even its own question: this key may not replay
        (REPLAYER, other_question),  # a replay key asking something else under the scenario's name
    ]
    for token, question in unjudged:
        response = _ask(scoped, token, inbox=home, question=question, scenario_id=scenario.id)
        assert response.status_code == 200, response.text
        assert response.json()["reward"] is None and response.json()["outcome"] != "correct"
        stored = scoped.pool.get(response.json()["episode_id"])
        assert stored.scenario_id is None and stored.reward is None and stored.outcome != "correct", (token, question)
        assert stored.question == question

    judged = _ask(scoped, REPLAYER, inbox=home, question=scenario.question, scenario_id=scenario.id)
    stored = scoped.pool.get(judged.json()["episode_id"])
    assert stored.scenario_id == scenario.id and stored.reward is not None
    # A caller that may not replay learns nothing about scenario ids either: an unknown one is just ignored.
    ignored = _ask(scoped, ALICE, inbox=home, question="When?", scenario_id="no-such-scenario")
    assert ignored.status_code == 200 and scoped.pool.get(ignored.json()["episode_id"]).scenario_id is None


# -- 3. errors name nothing the caller may not see ----------------------------------------------------


def test_scenario_errors_name_no_other_inbox(scoped, demo_world, caplog):
    caplog.set_level(logging.DEBUG)
    home, other = _inboxes(demo_world)
    foreign = next(s for s in demo_world.scenarios if s.inbox_id == other)
    own = next(s for s in demo_world.scenarios if s.inbox_id == home)

    mismatch = _ask(scoped, ANY, inbox=home, question=foreign.question, scenario_id=foreign.id)
    assert mismatch.status_code == 422 and mismatch.json()["error"] == "task does not match context"
    assert other not in mismatch.text and other not in caplog.text

    # For a key limited to `home`, another inbox's scenario does not exist.
    hidden = _ask(scoped, REPLAYER, inbox=home, question=foreign.question, scenario_id=foreign.id)
    unknown = _ask(scoped, REPLAYER, inbox=home, question=own.question, scenario_id="no-such-scenario")
    assert hidden.status_code == unknown.status_code == 404
    assert hidden.json()["error"] == unknown.json()["error"] == "unknown task"
    assert other not in hidden.text and other not in caplog.text
    assert scoped.pool.count() == 0


# -- 4. routing weights are JSON numbers in [0, 1] ---------------------------------------------------


@pytest.mark.parametrize(
    "weights",
    [b'{"a": true, "b": 0.5}', b'{"a": "1", "b": 0}', b'{"a": "0.5", "b": 0.5}', b'{"a": null}', b'{"a": 1.5}',
     b'{"a": -0.1, "b": 1}', b'{"a": NaN}', b'{"a": Infinity}', b'{"a": [1]}', b"{}", b"[1]"],
)
def test_routing_weights_must_be_numbers_in_0_1(start_arbiter, monkeypatch, weights):
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    body = b'{"weights": ' + weights + b', "specs": {"a": "heuristic", "b": "heuristic"}, "reason": "probe"}'
    with start_arbiter() as live:
        response = live.client.put("/v1/routing", content=body,
                                   headers={**bearer(ADMIN_TOKEN), "Content-Type": "application/json"})
        assert response.status_code == 422, response.text
        assert response.json()["error"] == "invalid routing" and "weights" in json.dumps(response.json()["detail"])
        assert live.pool.routing_history() == [] and live.client.get("/v1/routing", headers=bearer(ADMIN_TOKEN)).json()["default"] is True
        ok = live.client.put("/v1/routing", json={"weights": {"a": 0.25, "b": 0.75}, "specs": {"a": "heuristic", "b": "heuristic"},
                                                  "reason": "fine"}, headers=bearer(ADMIN_TOKEN))
        assert ok.status_code == 200 and ok.json()["weights"] == {"a": 0.25, "b": 0.75}


SECRET_SPECS = [
    'openai:{"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key": "sk-live-routing-secret-77aa"}',
    'openai:{"base_url": "http://127.0.0.1:9/v1", "model": "m", "headers": {"Authorization": "hunter2-routing"}}',
    'openai:{"base_url": "http://user:hunter2-routing@127.0.0.1:9/v1", "model": "m"}',
    "lora:Bearer abcdefghijklmnop-routing",
]


@pytest.mark.parametrize("spec", SECRET_SPECS)
def test_a_spec_carrying_a_credential_is_refused_at_any_weight_and_never_stored(start_arbiter, monkeypatch, spec):
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    with start_arbiter() as live:
        for weights in ({"a": 1.0, "staged": 0.0}, {"staged": 1.0}):
            response = live.client.put("/v1/routing", headers=bearer(ADMIN_TOKEN), json={
                "weights": weights, "specs": {"a": "heuristic", "staged": spec} if "a" in weights else {"staged": spec},
                "reason": "stage an upstream at 0%"})
            assert response.status_code == 422, response.text
            assert "staged" in response.text
            assert "hunter2" not in response.text and "secret-77aa" not in response.text
        assert live.pool.routing_history() == []
        with pytest.raises(ValueError, match="nothing was stored"):
            live.pool.set_routing({"a": 1.0, "staged": 0.0}, {"a": "heuristic", "staged": spec}, reason="r", actor="t")
        assert live.pool.routing_history() == [] and "staged" not in live.pool.get_routing().specs


# -- 6. blank questions ---------------------------------------------------------------------------------

BLANK = ["   ", "\t\n", "\u00a0\u00a0", "\u200b", "\u200b\u200c\u200d\u2060\ufeff", "\u3000 \u2007", "\u00ad", "\u0301",
         " \u200b\u00a0\u202f\u3164 "]


def test_blank_questions_and_verdicts_are_422_and_store_nothing(scoped, demo_world):
    home, _ = _inboxes(demo_world)
    for question in BLANK:
        response = _ask(scoped, ALICE, inbox=home, question=question)
        assert response.status_code == 422, (question, response.text)
        assert response.json()["detail"][0]["loc"] == ["question"] and "visible" in response.json()["detail"][0]["msg"]
    assert scoped.pool.count() == 0
    answered = _ask(scoped, ALICE, inbox=home, question="\u200bWhen\u00a0is the meeting?")
    assert answered.status_code == 200
    episode_id = answered.json()["episode_id"]
    for verdict in BLANK:
        refused = scoped.client.post("/v1/feedback", json={"episode_id": episode_id, "verdict": verdict}, headers=bearer(ALICE))
        assert refused.status_code == 422, (verdict, refused.text)
    assert scoped.pool.get(episode_id).feedback is None


def test_feedback_outside_what_the_loop_can_use_is_422_naming_the_field_and_stores_nothing(scoped, demo_world):
    home, _ = _inboxes(demo_world)
    episode_id = _ask(scoped, ALICE, inbox=home, question="When is the meeting?").json()["episode_id"]
    for verdict in ("7", "-3", "1.5", "nan", "inf", "-inf", "maybe", '{"reward": 2}', '{"reward": "NaN"}'):
        refused = scoped.client.post("/v1/feedback", json={"episode_id": episode_id, "verdict": verdict},
                                     headers=bearer(ALICE))
        assert refused.status_code == 422, (verdict, refused.text)
        detail = refused.json()["detail"][0]
        assert detail["loc"] == ["verdict"] and ("not a verdict" in detail["msg"] or "out of range" in detail["msg"])
    assert scoped.pool.get(episode_id).feedback is None
    for verdict in ("up", "thumbs_down", "0.5", "-1", '{"reward": 0.25}'):
        ok = scoped.client.post("/v1/feedback", json={"episode_id": episode_id, "verdict": verdict},
                                headers=bearer(ALICE))
        assert ok.status_code == 200, (verdict, ok.text)


def test_a_failed_pool_write_logs_no_question(start_arbiter, demo_world, store_url, caplog):
    """The database error names the statement; its parameters (the question, the messages) stay out of the log."""
    from sqlalchemy import text

    caplog.set_level(logging.DEBUG)
    secret = "Is Dana's medical leave approved until March?"
    with start_arbiter(pool_url=store_url) as live:
        with live.pool.engine.begin() as conn:
            conn.execute(text("DROP TABLE episodes"))
        response = live.client.post("/v1/ask", json={"inbox": demo_world.scenarios[0].inbox_id, "question": secret})
        assert response.status_code == 503 and secret not in response.text
    assert "pool write of 1 episodes failed" in caplog.text  # the failure was logged...
    assert "Dana" not in caplog.text  # ...without what was asked

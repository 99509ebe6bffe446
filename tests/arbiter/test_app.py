"""The arbiter over real HTTP: ask, feedback, routing with its admin token, and refusal of bad input."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import httpx
import pytest
from sqlalchemy import text

from arbiter_fixtures import arbiter, demo_world, start_arbiter  # noqa: F401  (pytest fixtures)

from agent_rl.arbiter.policies import PolicyLoadError, register_policy_loader

ADMIN_TOKEN = "s3cret-admin-token-4f1c9a"  # set as AGENT_RL_ADMIN_TOKEN by the tests that need it


def _scenario(demo_world, answerable: bool = True):
    return next(s for s in demo_world.scenarios if s.answerable == answerable)


def test_ask_serves_an_answer_and_logs_the_episode(arbiter, demo_world):
    scenario = _scenario(demo_world)
    response = arbiter.client.post(
        "/v1/ask", json={"inbox": scenario.inbox_id, "question": scenario.question, "scenario_id": scenario.id}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["policy_version"] == "heuristic"  # the default routing while the table is empty
    assert body["outcome"] in {"correct", "wrong", "idk", "format_error", "ran_out"}
    assert "episode;dur=" in response.headers["server-timing"]

    stored = arbiter.pool.get(body["episode_id"])
    assert stored is not None
    assert stored.policy_version == "heuristic" and stored.task_id == stored.scenario_id == scenario.id
    assert stored.question == scenario.question and stored.inbox_id == scenario.inbox_id
    assert stored.final_answer == body["answer"] and stored.sources == body["sources"]
    assert stored.reward is not None and stored.reward == body["reward"]  # judged: the scenario is known
    assert stored.messages[0]["role"] == "system"


def test_live_traffic_without_scenario_has_no_reward(arbiter, demo_world):
    scenario = _scenario(demo_world)
    body = arbiter.client.post("/v1/ask", json={"inbox": scenario.inbox_id, "question": "What is new?"}).json()
    stored = arbiter.pool.get(body["episode_id"])
    assert stored.reward is None and stored.task_id is None


def test_feedback_is_recorded_and_unknown_episodes_are_404(arbiter, demo_world):
    scenario = _scenario(demo_world)
    episode_id = arbiter.client.post("/v1/ask", json={"inbox": scenario.inbox_id, "question": scenario.question}).json()["episode_id"]
    response = arbiter.client.post("/v1/feedback", json={"episode_id": episode_id, "verdict": "down"})
    assert response.status_code == 200
    assert arbiter.pool.get(episode_id).feedback == "down"

    missing = arbiter.client.post("/v1/feedback", json={"episode_id": "no-such-episode", "verdict": "up"})
    assert missing.status_code == 404
    assert missing.json()["error"] == "unknown episode" and "no-such-episode" in missing.json()["detail"]


def test_routing_changes_are_refused_without_a_configured_token(arbiter, monkeypatch):
    monkeypatch.delenv("AGENT_RL_ADMIN_TOKEN", raising=False)
    response = arbiter.client.put(
        "/v1/routing", json={"weights": {"heuristic": 1}, "reason": "x"}, headers={"Authorization": "Bearer anything"}
    )
    assert response.status_code == 403
    assert "AGENT_RL_ADMIN_TOKEN" in response.json()["detail"]
    assert arbiter.pool.routing_history() == []


def test_routing_needs_the_right_bearer_token_which_is_never_logged(arbiter, monkeypatch, caplog):
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    caplog.set_level(logging.DEBUG)
    update = {"weights": {"main": 0.75, "cand": 0.25}, "specs": {"main": "heuristic", "cand": "heuristic"}, "reason": "A/B", "actor": "lead"}

    assert httpx.put(f"{arbiter.url}/v1/routing", json=update).status_code == 401
    assert arbiter.client.put("/v1/routing", json=update).status_code == 403  # an API key is not the admin token
    wrong = arbiter.client.put("/v1/routing", json=update, headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 403 and wrong.json()["error"] == "forbidden"
    assert arbiter.client.put("/v1/routing", json=update, headers={"Authorization": ADMIN_TOKEN}).status_code == 401
    assert arbiter.pool.routing_history() == []

    ok = arbiter.client.put("/v1/routing", json=update, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert ok.status_code == 200, ok.text
    assert ok.json()["weights"] == pytest.approx({"main": 0.75, "cand": 0.25})
    assert arbiter.client.get("/v1/routing").json()["weights"] == pytest.approx({"main": 0.75, "cand": 0.25})
    [change] = arbiter.pool.routing_history()
    assert change.actor == "lead" and change.reason == "A/B"

    assert "routing changed by lead" in caplog.text  # the log was captured...
    assert ADMIN_TOKEN not in caplog.text and "not-the-token" not in caplog.text  # ...and holds no token


def test_bad_routing_is_422_naming_the_problem(arbiter, monkeypatch):
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    negative = arbiter.client.put("/v1/routing", json={"weights": {"a": -1, "b": 1}, "reason": "x"}, headers=auth)
    assert negative.status_code == 422 and [d["loc"] for d in negative.json()["detail"]] == [["weights", "a"]]
    nothing = arbiter.client.put("/v1/routing", json={"weights": {"a": 0, "b": 0}, "reason": "x"}, headers=auth)
    assert nothing.status_code == 422 and "sum" in nothing.json()["detail"]
    unloadable = arbiter.client.put(
        "/v1/routing", json={"weights": {"reg": 1}, "specs": {"reg": "mlflow:challenger"}, "reason": "x"}, headers=auth
    )
    assert unloadable.status_code == 422 and "mlflow" in unloadable.json()["detail"]
    attempts = []

    def broken(rest: str):
        attempts.append(rest)
        raise PolicyLoadError("its weights are not there")

    register_policy_loader("broken", broken)
    split = {"weights": {"a": 1, "b": 1}, "specs": {"a": "heuristic", "b": "broken:x"}, "reason": "x"}
    refused = arbiter.client.put("/v1/routing", json=split, headers=auth)
    assert refused.status_code == 422 and "weights are not there" in refused.json()["detail"]
    assert attempts == ["x"]  # loaded once (placing it and checking it are one attempt: an engine start is a minute)
    no_reason = arbiter.client.put("/v1/routing", json={"weights": {"a": 1}}, headers=auth)
    assert no_reason.status_code == 422 and "reason" in str(no_reason.json()["detail"])
    assert arbiter.client.put("/v1/routing", content=b"{oops", headers=auth).status_code == 400
    assert arbiter.pool.routing_history() == []


def test_request_keys_are_sticky(arbiter, demo_world, monkeypatch):
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    arbiter.client.put(
        "/v1/routing",
        json={"weights": {"a": 1, "b": 1}, "specs": {"a": "heuristic", "b": "heuristic"}, "reason": "sticky test"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ).raise_for_status()
    scenario = _scenario(demo_world)

    def version(key: str) -> str:
        body = {"inbox": scenario.inbox_id, "question": scenario.question, "request_key": key}
        return arbiter.client.post("/v1/ask", json=body).json()["policy_version"]

    for key in ("user-1", "user-2", "user-3"):
        assert len({version(key) for _ in range(4)}) == 1
    assert len({version(f"user-{i}") for i in range(20)}) == 2  # different keys do spread over both


BAD_REQUESTS = [
    ("malformed JSON", b'{"inbox": "a", "question": ', 400),
    ("invalid UTF-8", b'{"inbox": "\xff\xfe", "question": "q"}', 400),
    ("lone surrogate", b'{"inbox": "INBOX", "question": "\\ud800 when?"}', 422),
    ("wrong type", b'{"inbox": 42, "question": "when?"}', 422),
    ("missing field", b'{"inbox": "INBOX"}', 422),
    ("unknown field", b'{"inbox": "INBOX", "question": "q", "admin": true}', 422),
    ("not an object", b'["INBOX", "q"]', 422),
    ("empty question", b'{"inbox": "INBOX", "question": ""}', 422),
    ("unknown context", b'{"context": "nobody@nowhere.example", "question": "when?"}', 404),
    ("unknown inbox (the old name)", b'{"inbox": "nobody@nowhere.example", "question": "when?"}', 404),
    ("unknown task", b'{"context": "INBOX", "question": "q", "task_id": "no-such-scenario"}', 404),
    ("unknown scenario (the old name)", b'{"inbox": "INBOX", "question": "q", "scenario_id": "no-such-scenario"}', 404),
    ("a context under both names", b'{"context": "INBOX", "inbox": "INBOX", "question": "q"}', 422),
    ("huge body", b'{"inbox": "INBOX", "question": "' + b"x" * 200_000 + b'"}', 413),
]


@pytest.mark.parametrize(("case", "body", "status"), BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requests_get_a_clear_4xx_and_write_nothing(arbiter, demo_world, case, body, status):
    body = body.replace(b"INBOX", demo_world.scenarios[0].inbox_id.encode())
    response = arbiter.client.post("/v1/ask", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()
    assert set(error) == {"error", "detail"} and error["error"]
    assert arbiter.pool.count() == 0


def test_chunked_oversize_body_and_wrong_content_type_are_refused(arbiter, demo_world):
    chunks = (b"x" * 10_000 for _ in range(20))  # no Content-Length: the limit is enforced while reading
    response = arbiter.client.post("/v1/ask", content=chunks, headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"] == "request body too large"
    plain = arbiter.client.post("/v1/ask", content=b'{"inbox": "a", "question": "b"}', headers={"Content-Type": "text/plain"})
    assert plain.status_code == 415
    assert arbiter.pool.count() == 0


def test_pool_write_failure_is_503_not_500(arbiter, demo_world):
    scenario = _scenario(demo_world)
    with arbiter.pool.engine.begin() as conn:  # the database loses its table under the running arbiter
        conn.execute(text("DROP TABLE episodes"))
    response = arbiter.client.post("/v1/ask", json={"inbox": scenario.inbox_id, "question": scenario.question})
    assert response.status_code == 503
    assert response.json()["error"] == "benchmark pool unavailable"
    assert arbiter.client.get("/healthz").status_code == 200


def test_unknown_routes_and_methods_answer_json(arbiter):
    missing = arbiter.client.get("/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"] == "not found"
    wrong_method = arbiter.client.delete("/v1/ask")
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


def test_a_version_whose_engine_is_down_answers_503_stores_nothing_and_holds_the_rollout(arbiter, demo_world,
                                                                                      monkeypatch, caplog):
    """An engine resting after its restarts is an outage, not the model's answers: the request is 503 with
    Retry-After (the cause, which names the engine's address, only in the log), no episode is stored for the A/B
    test to score, the unserved request is counted for the rollout controller, and /healthz shows the engine."""
    from agent_rl.agent.policy import Policy
    from agent_rl.environments.policy import PolicyUnavailable

    class Resting(Policy):
        version = "resting"

        def act(self, conversations, tools, max_new_tokens=256):
            raise PolicyUnavailable("the engine at http://127.0.0.1:9/v1 died again after 2 restarts", 42.5)

        def health(self):
            return {"state": "resting", "restarts": 2, "retry_after_s": 42.5}

    register_policy_loader("resting", lambda rest: Resting())
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    arbiter.client.put("/v1/routing", json={"weights": {"v2": 1}, "specs": {"v2": "resting:x"}, "reason": "down"},
                       headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).raise_for_status()
    scenario = _scenario(demo_world)
    before = arbiter.pool.count()
    caplog.set_level(logging.INFO)
    response = arbiter.client.post("/v1/ask", json={"inbox": scenario.inbox_id, "question": scenario.question,
                                                    "scenario_id": scenario.id})
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "43"
    assert response.json()["error"] == "policy unavailable" and "127.0.0.1:9" not in response.text
    assert "died again after 2 restarts" in caplog.text
    assert arbiter.pool.count() == before  # nothing for the A/B test to read as the model's failure
    assert sum(arbiter.pool.serving_failures(datetime(2000, 1, 1, tzinfo=timezone.utc)).values()) == 1
    health = arbiter.client.get("/healthz").json()
    assert health["serving"]["engines"]["v2"]["state"] == "resting"
    metrics = arbiter.client.get("/metrics").text
    assert 'engine_serving{version="v2"} 0' in metrics

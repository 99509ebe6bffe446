"""An outage is not evidence: while a version in the A/B test could not serve (its engine down, its requests
answered 503 and counted by the arbiter in the pool), the rollout controller holds the step; once the outage is
older than `outage_hold`, the same evidence moves it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from agent_rl import registry, settings
from agent_rl.ab.controller import RolloutController
from agent_rl.ab.rollout import RolloutConfig
from agent_rl.pool.repository import PoolRepository
from agent_rl.records import Episode, Outcome

START = datetime(2026, 11, 24, tzinfo=timezone.utc)
RULES = "heuristic:" + json.dumps({"wrong_rate": 0.1, "version": "rules"})
CONFIG = RolloutConfig(min_samples_per_arm=100, min_samples_per_step=100, max_step_duration=timedelta(days=3))


def _episodes(version: str, correct: int, n: int) -> list[Episode]:
    return [Episode(episode_id=f"{version}-{i}", created_at=START + timedelta(minutes=1, seconds=i), context="c",
                    question="q", policy_version=version, outcome=Outcome.CORRECT if i < correct else Outcome.WRONG,
                    latency_ms=100.0) for i in range(n)]


def test_the_controller_holds_the_step_while_a_version_in_the_test_could_not_serve(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    pool = PoolRepository(settings.pool_url())
    try:
        pool.set_routing({"heuristic": 1.0}, specs={}, reason="production", actor="test")
        assert registry.register_policy_spec(RULES, tracking_uri=uri).version == "1"
        controller = RolloutController(pool, CONFIG, tracking_uri=uri)
        state = controller.start_if_new_challenger(now=START)
        assert state is not None and state.weights() == {"heuristic": 0.9, "v1": 0.1}
        pool.insert_episodes(_episodes("heuristic", 990, 1800) + _episodes("v1", 170, 200))
        pool.record_serving_failure("v1", 4, "EngineUnavailable", at=START + timedelta(hours=2))

        held = controller.evaluate(now=START + timedelta(hours=2, minutes=5))
        assert (held.action, held.cause) == ("hold", "serving_unavailable") and held.stats["unserved"] == {"v1": 4}
        assert pool.get_routing().weights == {"heuristic": 0.9, "v1": 0.1}  # nothing moved onto a version that is down

        moved = controller.evaluate(now=START + timedelta(hours=3))  # the outage is older than outage_hold (10 min)
        assert (moved.action, moved.cause) == ("advance", "significantly_better")
        assert pool.get_routing().weights == {"heuristic": 0.5, "v1": 0.5}
    finally:
        pool.close()

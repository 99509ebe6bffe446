"""Two agents in one home: each has its own registered model, numbered from v1, and the A/B state both write in
the pool's routing history. The support agent's first challenger was taken for the email agent's v1 ("no new
challenger") and never tested."""

from __future__ import annotations

import json

from agent_rl import registry, settings
from agent_rl.ab.controller import RolloutController
from agent_rl.ab.rollout import RolloutConfig
from agent_rl.pool.repository import PoolRepository

RULES = "heuristic:" + json.dumps({"wrong_rate": 0.1, "version": "rules"})


def test_each_agents_first_challenger_is_tested_although_both_are_v1(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    pool = PoolRepository(settings.pool_url())
    try:
        pool.set_routing({"heuristic": 1.0}, specs={}, reason="production", actor="test")
        email = RolloutController(pool, RolloutConfig(), tracking_uri=uri, model_name="agent-rl-email")
        support = RolloutController(pool, RolloutConfig(), tracking_uri=uri, model_name="agent-rl-support")
        for name in ("agent-rl-email", "agent-rl-support"):
            assert registry.register_policy_spec(RULES, tracking_uri=uri, name=name).version == "1"
        first = email.start_if_new_challenger()
        assert first is not None and first.challenger == "v1" and first.model_name == "agent-rl-email"
        assert email.start_if_new_challenger() is None  # the same challenger is not started twice
        pool.set_routing({"heuristic": 1.0}, specs={}, reason="email's test ended", actor="test",
                         stats={"rollout_state": json.loads(first.model_copy(update={"status": "rolled_back"})
                                                            .model_dump_json())})
        second = support.start_if_new_challenger()
        assert second is not None and second.challenger == "v1" and second.model_name == "agent-rl-support"
    finally:
        pool.close()

"""A pool written by the release before environments were plug-ins is upgraded in place on first use, on
SQLite and PostgreSQL: every episode, its feedback, the routing table, its history and the quarantine survive,
old episodes belong to the email environment, and the upgraded pool takes new episodes of any environment."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import create_engine, func, select

from agent_rl.pool import PoolRepository, schema
from agent_rl.records import Outcome
from tests.pool import schema_v1
from tests.pool.test_repository import make_episode

T0 = datetime(2025, 3, 3, 12, 0, tzinfo=timezone.utc)


def _old_pool(url: str) -> None:
    engine = create_engine(url)
    schema_v1.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(schema_v1.schema_version.insert().values(version=1, applied_at=T0))
        for i in range(3):
            conn.execute(schema_v1.episodes.insert().values(
                episode_id=f"old-{i}", created_at=T0, tenant="default", inbox_id=f"jane{i}@example.com",
                task_category="date", scenario_id=f"sc-{i}", question=f"When is meeting {i}?",
                policy_version="heuristic", messages=[{"role": "user", "content": f"When is meeting {i}?"}],
                final_answer="Tuesday", sources=[f"<m{i}@example.com>"], outcome="correct", reward=1.0,
                reward_components={"answer": 1.0}, turns=2, prompt_tokens=10, completion_tokens=5, latency_ms=1.0,
                cost_usd=0.0, feedback="thumbs_up" if i == 0 else None, feedback_at=T0 if i == 0 else None))
        conn.execute(schema_v1.routing.insert().values(policy_version="heuristic", weight=1.0, spec="heuristic",
                                                        updated_at=T0))
        conn.execute(schema_v1.routing_history.insert().values(
            changed_at=T0, actor="test", reason="seed", old_weights={}, new_weights={"heuristic": 1.0},
            specs={"heuristic": "heuristic"}))
        conn.execute(schema_v1.quarantine.insert().values(
            row_key="k1", episode_id="bad", payload="{}", reasons=["missing question"], partition="2025-03-03",
            created_at=T0))
    engine.dispose()


def test_an_old_pool_is_upgraded_in_place_and_loses_nothing(store_url):
    _old_pool(store_url)
    pool = PoolRepository(store_url)
    try:
        assert pool.schema_version() == schema.SCHEMA_VERSION == 5
        old = [pool.get(f"old-{i}") for i in range(3)]
        assert [e.context for e in old] == ["jane0@example.com", "jane1@example.com", "jane2@example.com"]
        assert [e.task_id for e in old] == ["sc-0", "sc-1", "sc-2"]
        assert pool.count(task_id="sc-1") == 1
        assert [e.citations for e in old] == [["<m0@example.com>"], ["<m1@example.com>"], ["<m2@example.com>"]]
        assert {e.environment for e in old} == {"email"}
        assert old[0].feedback == "thumbs_up" and old[0].outcome == Outcome.CORRECT
        assert pool.get_routing().weights == {"heuristic": 1.0}
        assert len(pool.routing_history()) == 1
        assert [q.episode_id for q in pool.quarantined()] == ["bad"]

        # The upgraded pool stores episodes of other environments, with categories they declare.
        pool.insert_episodes([make_episode(1, environment="support", context="store-1",
                                           task_category="refuse_by_policy", sources=[])])
        new = pool.get("ep-00001")
        assert (new.environment, new.context, new.task_category) == ("support", "store-1", "refuse_by_policy")
        pool.record_feedback("old-1", "thumbs_down", contexts=["jane1@example.com"])
        assert pool.get("old-1").feedback == "thumbs_down"
    finally:
        pool.close()

    # Opening it again is a no-op: one row per version, nothing applied twice.
    again = PoolRepository(store_url)
    try:
        with again.engine.connect() as conn:
            versions = conn.execute(select(schema.schema_version.c.version).order_by(
                schema.schema_version.c.version)).scalars().all()
            assert versions == [1, 2, 3, 4, 5]
            assert conn.execute(select(func.count()).select_from(schema.episodes)).scalar() == 4
    finally:
        again.close()


def test_a_version_2_pool_gains_the_gateways_live_table(store_url):
    """Version 3 adds `gateway_live` (the gateway's live episodes, shared by its worker processes) and changes
    nothing else: a pool written at version 2 is upgraded in place and takes live episodes."""
    from sqlalchemy import inspect

    from agent_rl.pool.live import LiveStore
    from agent_rl.records import utcnow

    pool = PoolRepository(store_url)
    pool.insert_episodes([make_episode(7)])
    with pool.engine.begin() as conn:  # as a release before version 3 left it (but for the task_id of version 4)
        schema.gateway_live.drop(conn)
        conn.execute(schema.schema_version.delete())
        conn.execute(schema.schema_version.insert().values(version=2, applied_at=T0))
    pool.close()
    assert not inspect(create_engine(store_url)).has_table("gateway_live")
    pool = PoolRepository(store_url)
    try:
        assert pool.schema_version() == 5 and pool.get("ep-00007") is not None
        store = LiveStore(pool)
        now = utcnow()
        assert store.insert({"episode_id": "live-1", "tenant": "t", "context": "c", "session": "s", "prefix": None,
                             "row_version": 1, "policy_version": "v", "spec": "v", "environment": "gateway",
                             "task_category": None, "task": "q", "final_tool": None, "tools": None,
                             "messages": [{"role": "user", "content": "hi"}], "calls": 1, "prompt_tokens": 1,
                             "completion_tokens": 1, "latency_ms": 1.0, "created_at": now, "last_active": now})
        assert store.find_session("t", "c", "s")["episode_id"] == "live-1"
        store.close()
    finally:
        pool.close()


def test_a_version_3_pool_names_its_task_ids_task_id(store_url):
    """Version 4 renames `scenario_id`, the email assistant's name, to `task_id` (and its index); the ids stay."""
    from sqlalchemy import inspect
    from sqlalchemy import text as sql_text

    pool = PoolRepository(store_url)
    pool.insert_episodes([make_episode(i) for i in range(3)])
    ids = [pool.get(f"ep-{i:05d}").task_id for i in range(3)]
    with pool.engine.begin() as conn:  # as version 3 left it
        conn.execute(sql_text("DROP INDEX ix_episodes_task_id"))
        conn.execute(sql_text("ALTER TABLE episodes RENAME COLUMN task_id TO scenario_id"))
        conn.execute(sql_text("CREATE INDEX ix_episodes_scenario_id ON episodes (scenario_id)"))
        conn.execute(schema.schema_version.delete())
        conn.execute(schema.schema_version.insert().values(version=3, applied_at=T0))
    pool.close()
    pool = PoolRepository(store_url)
    try:
        assert pool.schema_version() == 5
        assert [pool.get(f"ep-{i:05d}").task_id for i in range(3)] == ids and all(ids)
        columns = {c["name"] for c in inspect(pool.engine).get_columns("episodes")}
        indexes = {i["name"] for i in inspect(pool.engine).get_indexes("episodes")}
        assert "task_id" in columns and "scenario_id" not in columns
        assert "ix_episodes_task_id" in indexes and "ix_episodes_scenario_id" not in indexes
    finally:
        pool.close()


def test_a_version_4_pool_counts_unserved_requests_and_keeps_its_episodes(store_url):
    """Version 5 adds `serving_failures` (requests a version could not serve): nothing existing changes."""
    from datetime import timedelta

    from sqlalchemy import text as sql_text

    pool = PoolRepository(store_url)
    pool.insert_episodes([make_episode(i) for i in range(3)])
    with pool.engine.begin() as conn:  # as version 4 left it
        conn.execute(sql_text("DROP TABLE serving_failures"))
        conn.execute(schema.schema_version.delete())
        conn.execute(schema.schema_version.insert().values(version=4, applied_at=T0))
    pool.close()
    pool = PoolRepository(store_url)
    try:
        assert pool.schema_version() == 5 and pool.count() == 3
        pool.record_serving_failure("v2", 3, "EngineUnavailable", at=T0)
        pool.record_serving_failure("v2", 2, "EngineUnavailable", at=T0 + timedelta(minutes=5))
        pool.record_serving_failure("v1", 1, "EngineUnavailable", at=T0 + timedelta(minutes=5))
        assert pool.serving_failures(T0) == {"v1": 1, "v2": 5}
        assert pool.serving_failures(T0 + timedelta(minutes=1)) == {"v1": 1, "v2": 2}
        with pytest.raises(ValueError, match="at least 1"):
            pool.record_serving_failure("v2", 0, "EngineUnavailable")
    finally:
        pool.close()

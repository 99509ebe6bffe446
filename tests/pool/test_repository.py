"""The benchmark pool on real SQLite and PostgreSQL: idempotent inserts, cursor export, routing, quarantine, schema."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import update

from agent_rl.pool import ExportCursor, PoolRepository, SchemaVersionError, UnknownEpisodeError, schema
from agent_rl.records import Episode, Outcome
from agent_rl.environments.email.records import Category

T0 = datetime(2025, 3, 3, 12, 0, tzinfo=timezone.utc)


def make_episode(i: int, created_at: datetime | None = None, **overrides) -> Episode:
    fields = dict(
        episode_id=f"ep-{i:05d}",
        created_at=created_at or T0 + timedelta(seconds=i),
        inbox_id="jane@example.com",
        task_category=Category.DATE,
        task_id=f"sc-{i % 7}",
        question=f"When is meeting {i}?",
        policy_version="heuristic" if i % 3 else "candidate",
        messages=[
            {"role": "user", "content": f"When is meeting {i}?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "search_emails", "arguments": {"keywords": ["meeting"], "max_results": 5}}}
                ],
            },
            {"role": "tool", "content": "[]", "name": "search_emails"},
        ],
        final_answer="Tuesday",
        sources=["<m1@example.com>"],
        outcome=Outcome.CORRECT,
        reward=1.2,
        reward_components={"answer": 1.0, "sources": 0.2},
        turns=3,
        prompt_tokens=120,
        completion_tokens=40,
        latency_ms=12.5,
        cost_usd=0.0001,
    )
    fields.update(overrides)
    return Episode(**fields)


@pytest.fixture
def pool(store_url):
    repo = PoolRepository(store_url)
    yield repo
    repo.close()


def test_insert_is_idempotent_and_round_trips(pool):
    episodes = [make_episode(i) for i in range(10)]
    assert pool.insert_episodes(episodes) == 10
    # The same ids again (plus one new, plus a duplicate inside the batch) insert only the new one.
    again = episodes[:5] + [make_episode(10), make_episode(10)]
    assert pool.insert_episodes(again) == 1
    assert pool.count() == 11

    got = pool.get("ep-00004")
    assert got == episodes[4]
    assert got.created_at.tzinfo is not None
    # Tool-call arguments come back in the order the model wrote them.
    args = got.messages[1]["tool_calls"][0]["function"]["arguments"]
    assert list(args) == ["keywords", "max_results"]
    assert pool.get("nope") is None


def test_insert_accepts_dicts_and_rejects_bad_records_by_field(pool):
    row = make_episode(1).model_dump(mode="json")
    assert pool.insert_episodes([row]) == 1
    bad = dict(row, episode_id="ep-bad", outcome="maybe")
    with pytest.raises(ValueError, match="outcome"):
        pool.insert_episodes([bad])
    assert pool.get("ep-bad") is None


def test_export_pages_return_every_row_exactly_once(pool):
    # Many rows share a timestamp so the cursor must break ties by episode_id.
    episodes = [make_episode(i, created_at=T0 + timedelta(seconds=i // 4)) for i in range(53)]
    pool.insert_episodes(reversed(episodes))
    seen: list[str] = []
    cursor = None
    while True:
        page = pool.export(T0, T0 + timedelta(days=1), after_cursor=cursor, limit=5)
        seen += [e.episode_id for e in page.episodes]
        if page.exhausted:
            break
        cursor = ExportCursor.from_token(page.cursor.to_token())  # survives a round trip through text
    assert sorted(seen) == sorted(e.episode_id for e in episodes)
    assert len(seen) == len(set(seen)) == 53
    # Incremental: rows added later with later timestamps appear after the saved cursor, and only them.
    pool.insert_episodes([make_episode(100, created_at=T0 + timedelta(hours=1))])
    page = pool.export(T0, T0 + timedelta(days=1), after_cursor=cursor, limit=100)
    tail = [e.episode_id for e in page.episodes]
    assert tail[-1] == "ep-00100" and len(set(tail) & set(seen[:-5])) == 0


def test_export_and_count_respect_the_time_range(pool):
    pool.insert_episodes([make_episode(i, created_at=T0 + timedelta(days=i)) for i in range(10)])
    start, end = T0 + timedelta(days=2), T0 + timedelta(days=5)  # half-open: days 2, 3, 4
    ids = [e.episode_id for page in pool.iter_export(start, end, page_size=2) for e in page.episodes]
    assert ids == ["ep-00002", "ep-00003", "ep-00004"]
    assert pool.count(start, end) == 3
    assert pool.count(policy_version="candidate") == 4  # i = 0, 3, 6, 9
    assert pool.count_by_version() == {"candidate": 4, "heuristic": 6}
    # A naive datetime is read as UTC.
    assert pool.count(start.replace(tzinfo=None), end.replace(tzinfo=None)) == 3


def test_feedback_updates_the_episode_and_unknown_ids_fail_clearly(pool):
    pool.insert_episodes([make_episode(1)])
    pool.record_feedback("ep-00001", "thumbs_down")
    assert pool.get("ep-00001").feedback == "thumbs_down"
    with pytest.raises(UnknownEpisodeError, match="ep-missing"):
        pool.record_feedback("ep-missing", "thumbs_up")
    with pytest.raises(ValueError, match="verdict"):
        pool.record_feedback("ep-00001", "   ")


def test_routing_is_normalized_validated_and_historized(pool):
    assert pool.get_routing().weights == {}
    routing = pool.set_routing({"heuristic": 9, "cand": 1}, specs={"cand": "/models/cand"}, reason="start A/B", actor="lead")
    assert routing.weights == pytest.approx({"heuristic": 0.9, "cand": 0.1})
    assert pool.get_routing().specs == {"cand": "/models/cand", "heuristic": "heuristic"}

    # The spec of a known version is kept when not given again.
    pool.set_routing({"heuristic": 0.5, "cand": 0.5}, reason="ramp", actor="sensor", stats={"p_value": 0.01, "n": 400})
    assert pool.get_routing().specs["cand"] == "/models/cand"

    history = pool.routing_history()
    assert [h.reason for h in history] == ["start A/B", "ramp"]
    assert history[0].old_weights == {}
    assert history[1].old_weights == pytest.approx({"heuristic": 0.9, "cand": 0.1})
    assert history[1].new_weights == pytest.approx({"heuristic": 0.5, "cand": 0.5})
    assert history[1].stats == {"p_value": 0.01, "n": 400} and history[1].actor == "sensor"
    assert [h.reason for h in pool.routing_history(limit=1)] == ["ramp"]


@pytest.mark.parametrize(
    ("weights", "specs", "field"),
    [
        ({}, None, "weights"),
        ({"a": -1, "b": 2}, None, "weights\\['a'\\]"),
        ({"a": 0, "b": 0}, None, "sum"),
        ({"a": float("nan")}, None, "weights\\['a'\\]"),
        ({"a": "heavy"}, None, "weights\\['a'\\]"),
        ({"": 1.0}, None, "policy version"),
        ({"a": 1.0}, {"b": "heuristic"}, "specs\\['b'\\]"),
        ({"a": 1.0}, {"a": ""}, "specs\\['a'\\]"),
    ],
)
def test_bad_routing_is_refused_naming_the_field(pool, weights, specs, field):
    pool.set_routing({"heuristic": 1.0}, reason="initial", actor="lead")
    with pytest.raises(ValueError, match=field):
        pool.set_routing(weights, specs=specs, reason="bad", actor="lead")
    assert pool.get_routing().weights == {"heuristic": 1.0}
    assert len(pool.routing_history()) == 1


def test_routing_change_needs_reason_and_actor(pool):
    with pytest.raises(ValueError, match="reason"):
        pool.set_routing({"a": 1.0}, reason="", actor="lead")
    with pytest.raises(ValueError, match="actor"):
        pool.set_routing({"a": 1.0}, reason="why", actor=" ")


def test_quarantine_keeps_malformed_rows_with_reasons(pool):
    rows = [
        ({"episode_id": "ep-1", "outcome": "maybe", "when": T0}, ["outcome: not a known outcome"]),
        ("{not json at all \ud800", ["unparseable row"]),  # even a lone surrogate fits
        ({"payload": {"episode_id": "ep-2"}, "reasons": "missing question"}),
    ]
    assert pool.quarantine(rows, partition="2025-03-03") == 3
    assert pool.quarantine(rows[:1], partition="2025-03-03") == 0  # re-running a partition adds nothing
    assert pool.quarantine(rows[:1], partition="2025-03-10") == 1
    parked = pool.quarantined("2025-03-03")
    assert [q.episode_id for q in parked] == ["ep-1", None, "ep-2"]
    assert parked[0].reasons == ["outcome: not a known outcome"]
    assert "maybe" in parked[0].payload and parked[1].payload.startswith("{not json")
    assert parked[2].reasons == ["missing question"]
    assert len(pool.quarantined()) == 4
    with pytest.raises(ValueError, match="reason"):
        pool.quarantine([({"x": 1}, [])], partition="p")
    with pytest.raises(ValueError, match="partition"):
        pool.quarantine([({"x": 1}, ["r"])], partition="")


def test_schema_version_is_recorded_and_newer_versions_are_refused(store_url):
    repo = PoolRepository(store_url)
    assert repo.schema_version() == schema.SCHEMA_VERSION == 5
    with repo.engine.begin() as conn:
        conn.execute(update(schema.schema_version).values(version=schema.SCHEMA_VERSION + 1))
    repo.close()
    with pytest.raises(SchemaVersionError, match=f"schema version {schema.SCHEMA_VERSION + 1}.*supports up to {schema.SCHEMA_VERSION}"):
        PoolRepository(store_url)
    # Reopening an up-to-date pool is harmless.
    with repo.engine.begin() as conn:
        conn.execute(update(schema.schema_version).values(version=schema.SCHEMA_VERSION))
    assert PoolRepository(store_url).schema_version() == 5


def test_concurrent_writers_lose_nothing(pool):
    def write(worker: int) -> None:
        for batch in range(5):
            pool.insert_episodes([make_episode(worker * 1000 + batch * 10 + k) for k in range(10)])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.count() == 200


def test_default_url_is_a_sqlite_file_under_agent_rl_home(tmp_path):
    repo = PoolRepository()
    assert repo.engine.dialect.name == "sqlite"
    assert str(tmp_path / "home") in repo.url
    repo.close()


@pytest.mark.postgres
def test_postgres_insert_survives_connections_the_server_closed(pg_url, pg_admin_url):
    """Inserts skip the connection ping; a connection the server dropped is replaced, nothing is lost."""
    from sqlalchemy import create_engine

    name = f"agent_rl_test_{uuid.uuid4().hex[:8]}"
    pool = PoolRepository(f"{pg_url}&application_name={name}")
    try:
        assert pool.insert_episodes([make_episode(0)]) == 1
        admin = create_engine(pg_admin_url)
        with admin.begin() as conn:  # what a server restart or an idle timeout does to pooled connections
            killed = conn.exec_driver_sql(
                f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '{name}'"
            ).scalar()
        admin.dispose()
        assert killed >= 1
        assert pool.insert_episodes([make_episode(1), make_episode(0)]) == 1
        assert pool.count() == 2
    finally:
        pool.close()

"""Shared fixtures: a real PostgreSQL schema per test, the Enron sample in tests/data, an isolated AGENT_RL_HOME."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# Test data lives in the repository so the suite runs on any fresh machine: the public Enron sample
# (103 Kaggle rows and 48 annotated emails) and a few hand-written questions in the ART-E style.
DATA = ROOT / "tests" / "data"
ENRON_CSV = DATA / "emails_sample.csv"
ENRON_ANNOTATED = DATA / "enron_annotated.json"
ART_E_STYLE_QUESTIONS = DATA / "art_e_style_questions.jsonl"
PG_ADMIN_URL = os.environ.get("AGENT_RL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Every test gets its own AGENT_RL_HOME so nothing leaks between tests or into .data/."""
    monkeypatch.setenv("AGENT_RL_HOME", str(tmp_path / "home"))
    for var in ("AGENT_RL_POOL_URL", "AGENT_RL_INBOX_URL", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def pg_url():
    """A fresh schema in the shared `test` database, selected through search_path, dropped afterwards."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = sqlalchemy.create_engine(PG_ADMIN_URL)
    schema = f"t_{uuid.uuid4().hex[:12]}"
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    except Exception as exc:  # the server is part of the test machine; say so loudly
        pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is not reachable: {exc}")
    yield f"{PG_ADMIN_URL}?options=-csearch_path%3D{schema}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    """Parametrize a test over both real backends."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    request.applymarker(pytest.mark.postgres)
    return request.getfixturevalue("pg_url")

"""Shared fixtures: a real PostgreSQL schema per test, the Enron sample in tests/data, an isolated AGENT_RL_HOME."""

from __future__ import annotations

import atexit
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg_server import INSTALL_HINT, TestPostgres, answers, postgres_bin

ROOT = Path(__file__).resolve().parents[1]
# The suite's models generate with the torch decoder (module fixtures too, which run before the per-test
# environment below); tests of the serving engine (vLLM, agent/engine.py) ask for it themselves.
os.environ.setdefault("AGENT_RL_ENGINE", "torch")


# Test data lives in the repository so the suite runs on any fresh machine: the public Enron sample
# (103 Kaggle rows and 48 annotated emails) and a few hand-written questions in the ART-E style.
DATA = ROOT / "tests" / "data"
ENRON_CSV = DATA / "emails_sample.csv"
ENRON_ANNOTATED = DATA / "enron_annotated.json"
ART_E_STYLE_QUESTIONS = DATA / "art_e_style_questions.jsonl"
# Where the postgres tests look first; when nothing answers there, they get a throwaway server (pg_admin_url).
PG_ADMIN_URL = os.environ.get("AGENT_RL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
_PG_USED: list[str] = []  # which server the postgres tests used, for the end-of-run summary


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Every test gets its own AGENT_RL_HOME so nothing leaks between tests or into .data/."""
    monkeypatch.setenv("AGENT_RL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AGENT_RL_ENGINE", "torch")
    for var in ("AGENT_RL_POOL_URL", "AGENT_RL_STORE_URL", "AGENT_RL_INBOX_URL", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


def _shown(url) -> str:
    return url.render_as_string(hide_password=True)


def _unusable(url: str) -> str:
    """Why SQL cannot be run at `url` ("" when it can)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return ""
    except Exception as exc:  # noqa: BLE001 - any failure means: not this server
        return f"{type(exc).__name__}: {getattr(exc, 'orig', exc)}"
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """AGENT_RL_TEST_PG when a server answers there; else a throwaway server for this run, stopped at its end.

    Postgres tests never skip: without a server and without the binaries to start one, they fail and say why.
    """
    from sqlalchemy.engine import make_url

    wanted = make_url(PG_ADMIN_URL)
    problem = "nothing answers there"
    if answers(wanted.host or "127.0.0.1", wanted.port or 5432):
        problem = _unusable(PG_ADMIN_URL)
        if not problem:
            source = "AGENT_RL_TEST_PG" if "AGENT_RL_TEST_PG" in os.environ else "the default of AGENT_RL_TEST_PG"
            _PG_USED.append(f"the server at {_shown(wanted)} ({source})")
            yield PG_ADMIN_URL
            return
        if "AGENT_RL_TEST_PG" in os.environ:  # the server asked for: its problem is the answer
            pytest.fail(f"PostgreSQL at {_shown(wanted)} (AGENT_RL_TEST_PG) answers but is not usable: {problem}")
        # Only the default was tried: port 5432 may hold the distribution's own cluster (password auth, no `test`).
    if postgres_bin() is None:
        pytest.fail(f"PostgreSQL at {_shown(wanted)} (AGENT_RL_TEST_PG) is not usable ({problem}) and no server "
                    f"binaries are installed to start a throwaway one; {INSTALL_HINT}")
    server = TestPostgres(superuser=wanted.username or "postgres")
    atexit.register(server.destroy)  # also when the run is cut short
    try:
        server.init().start()
        server.create_database(wanted.database or "test")
        url = wanted.set(host="127.0.0.1", port=server.port, password=None)
        _PG_USED.append(f"a throwaway server on port {server.port} (at {_shown(wanted)}: {problem})")
        yield url.render_as_string(hide_password=False)
    finally:
        server.destroy()


@pytest.fixture
def pg_url(pg_admin_url):
    """A fresh schema in the `test` database, selected through search_path, dropped afterwards."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(pg_admin_url)
    schema = f"t_{uuid.uuid4().hex[:12]}"
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    except Exception as exc:  # the server is part of the test machine; say so loudly
        shown = _shown(sqlalchemy.engine.make_url(pg_admin_url))
        pytest.fail(f"PostgreSQL at {shown} is not usable: {type(exc).__name__}: {getattr(exc, 'orig', exc)}")
    yield f"{pg_admin_url}?options=-csearch_path%3D{schema}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    engine.dispose()


def pytest_terminal_summary(terminalreporter):
    for used in _PG_USED:
        terminalreporter.write_line(f"postgres tests used {used}")


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    """Parametrize a test over both real backends."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    request.applymarker(pytest.mark.postgres)
    return request.getfixturevalue("pg_url")


# The longest test files (minutes each on 2 CPU cores), longest first: `make test` runs them before the rest
# (with --no-loadscope-reorder, xdist hands out files in this order), so its two workers finish together instead
# of one running the last long file alone (38.5 min before, with the many-agents demo last).
LONG_FIRST = (
    "tests/test_demo_many_agents.py",
    "tests/reliability/test_demo_stops.py",
    "tests/test_demo_promotion.py",
    "tests/train/test_two_processes.py",
    "tests/agent/test_shared_base.py",
    "tests/ui/test_browser.py",
    "tests/train/test_smollm2_slow.py",
    "tests/arbiter/test_engine_serving.py",
    "tests/test_demo_gateway.py",
    "tests/train/test_training_matches_serving.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest keep order

"""The suite's own PostgreSQL: a throwaway server when AGENT_RL_TEST_PG has none, gone afterwards; a server
that was asked for by name and is not usable fails the postgres tests loudly instead of skipping them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import sqlalchemy

from tests.conftest import ROOT
from tests.pg_server import answers, free_port, private_postgres

PROBE = "tests/inbox/test_inbox_store.py::test_plain_postgresql_url_is_accepted"


def _pytest(env_url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENT_RL_TEST_PG": env_url, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", PROBE],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.postgres
def test_private_server_serves_sql_and_leaves_nothing_behind():
    with private_postgres() as server:
        server.create_database("scratch")
        engine = sqlalchemy.create_engine(server.url_for("scratch"))
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT current_database()").scalar() == "scratch"
        engine.dispose()
        root, port = server.root, server.port
    assert not root.exists() and not answers("127.0.0.1", port, timeout_s=0.5)


@pytest.mark.postgres
def test_suite_starts_a_throwaway_server_when_none_answers():
    port = free_port()  # nothing listens here
    done = _pytest(f"postgresql+psycopg://postgres:not-shown@127.0.0.1:{port}/test")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout and "postgres tests used a throwaway server on port" in done.stdout
    assert "not-shown" not in done.stdout + done.stderr  # the password in the URL is never printed


@pytest.mark.postgres
def test_a_named_server_that_is_not_usable_fails_loudly():
    with private_postgres() as server:  # answers, but has no database `missing`
        done = _pytest(f"postgresql+psycopg://postgres:not-shown@127.0.0.1:{server.port}/missing")
    assert done.returncode != 0 and "skipped" not in done.stdout
    assert "answers but is not usable" in done.stdout and 'database "missing" does not exist' in done.stdout
    assert "not-shown" not in done.stdout + done.stderr

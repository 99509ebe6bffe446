"""A PostgreSQL server owned by the tests: initdb + pg_ctl on a private data directory and a free port.

The suite uses one when no server answers at AGENT_RL_TEST_PG (so a fresh machine needs only the
binaries, which `make test` installs); the reliability tests and bench/load.py use their own to stop
and restart it mid-run. Never the shared server at 5432.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

INSTALL_HINT = "`make test` installs them (apt-get install postgresql)"


def postgres_bin() -> Path | None:
    """The newest Debian PostgreSQL bin folder, or None when the server binaries are not installed."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: _version(p.parents[1].name))
    return found[-1].parent if found else None


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answers(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Does anything accept TCP connections at host:port? (Whether it is a usable PostgreSQL is for the
    tests to find out: a server that answers but refuses us is a loud failure, not a reason to start another.)"""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _unprivileged_user() -> str | None:
    """PostgreSQL refuses to run as root: as root, the cluster belongs to `postgres` (else `nobody`)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root and neither a `postgres` nor a `nobody` user exists to own the test server")


class TestPostgres:
    """One private cluster: trust auth on 127.0.0.1 only, fsync off (it is thrown away)."""

    __test__ = False  # not a pytest test class

    def __init__(self, port: int | None = None, superuser: str = "postgres") -> None:
        bin_dir = postgres_bin()
        if bin_dir is None:
            raise RuntimeError(f"no PostgreSQL binaries under /usr/lib/postgresql/*/bin; {INSTALL_HINT}")
        self.bin = bin_dir
        self.superuser = superuser
        # Its own folder under /tmp: the postgres user cannot enter pytest's 0700 tmp dirs.
        self.root = Path(tempfile.mkdtemp(prefix="agent-rl-test-pg-"))
        self.data = self.root / "pgdata"
        self.socket_dir = self.root / "pgsock"
        self.port = port or free_port()
        self.log = self.root / "postgres.log"
        self.as_user = _unprivileged_user()

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg://{self.superuser}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(self.bin / args[0]), *args[1:]]
        if self.as_user:
            command = ["runuser", "-u", self.as_user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.root)
        if check and done.returncode != 0:
            tail = (done.stderr or done.stdout)[-2000:]
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {tail}")
        return done

    def init(self) -> TestPostgres:
        self.socket_dir.mkdir(exist_ok=True)
        if self.as_user:
            shutil.chown(self.root, self.as_user)
            shutil.chown(self.socket_dir, self.as_user)
        # C.UTF-8 like Debian's default cluster: full-text search must see non-ASCII letters as letters.
        self._run("initdb", "-D", str(self.data), "-U", self.superuser, "--auth=trust", "-E", "UTF8",
                  "--locale=C.UTF-8", "--no-sync")
        return self

    def _options(self) -> str:
        return f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"

    def start(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", self._options(), "-w", "-t", "60", "start")
        except RuntimeError as exc:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{exc}\nserver log:\n{log}") from exc

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop", check=False)

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def create_database(self, name: str) -> None:
        """CREATE DATABASE `name` unless it exists (psycopg is a dependency anyway; psql may not be installed)."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.superuser, dbname="postgres",
                             autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                quoted = name.replace('"', '""')
                conn.execute(f'CREATE DATABASE "{quoted}"')

    def destroy(self) -> None:
        """Stop the server (immediately) and remove its files; safe to call twice."""
        if (self.data / "postmaster.pid").exists():
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def private_postgres() -> Iterator[TestPostgres]:
    server = TestPostgres().init()
    try:
        server.start()
        yield server
    finally:
        server.destroy()

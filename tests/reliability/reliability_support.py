"""Shared parts of the reliability suite: a demo world on disk, the arbiter as a real server process, a light
load driver that records every request's fate, and (from tests/pg_server.py) a PostgreSQL instance owned by
the test on its own port.

Imported by name from the tests and by bench/load.py (it puts this folder on sys.path).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from agent_rl.arbiter.keys import ApiKey, hash_token
from agent_rl.arbiter.server import free_port, stop_arbiter, wait_until_serving
from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.environments.email.records import Scenario
from agent_rl.environments.email.scenarios import generate_scenarios, save_scenarios
from tests.pg_server import TestPostgres, postgres_bin, private_postgres  # noqa: F401 - one helper, re-exported

ROOT = Path(__file__).resolve().parents[2]
# The key the suite's arbiters admit and its load driver sends: every inbox, may replay scenarios.
API_TOKEN = "reliability-api-key-3e91d7a0"


def api_keys_json(token: str = API_TOKEN, contexts: tuple[str, ...] = ("*",), replay: bool = True) -> str:
    """$AGENT_RL_API_KEYS for an arbiter process that admits `token` with this scope."""
    entry = ApiKey(id="reliability", sha256=hash_token(token), tenant="tests", contexts=contexts, replay=replay)
    return json.dumps([entry.model_dump(mode="json")])


# -- the demo world ------------------------------------------------------------------------------


@dataclass
class World:
    inbox_url: str
    scenarios_path: Path
    scenarios: list[Scenario]

    def ask_bodies(self, n: int) -> list[bytes]:
        """n /v1/ask bodies cycling over the scenarios (judged: they name their scenario)."""
        items = [
            json.dumps({"inbox": s.inbox_id, "question": s.question, "scenario_id": s.id}).encode()
            for s in self.scenarios
        ]
        return [items[i % len(items)] for i in range(n)]


def build_world(root: Path, n_inboxes: int = 2, n_emails: int = 200, seed: int = 0) -> World:
    root.mkdir(parents=True, exist_ok=True)
    inbox_url = f"sqlite:///{root / 'inbox.db'}"
    store = open_inbox_store(inbox_url)
    corpus = build_demo_corpus(store, seed=seed, n_inboxes=n_inboxes, n_emails=n_emails)
    store.close()
    scenarios = generate_scenarios(corpus, seed=seed)
    return World(inbox_url, save_scenarios(scenarios, root / "scenarios.jsonl"), scenarios)


# -- the arbiter as its own process --------------------------------------------------------------


@dataclass
class ArbiterProcess:
    url: str
    host: str
    port: int
    process: subprocess.Popen
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def arbiter_process(
    world: World,
    pool_url: str,
    log_path: Path,
    workers: int = 1,
    log_level: str = "info",
    access_log: bool = False,
    env: dict[str, str] | None = None,
) -> Iterator[ArbiterProcess]:
    """`python -m agent_rl.cli arbiter serve` on a free loopback port; stdout+stderr go to `log_path`.

    It admits API_TOKEN unless `env` gives its own AGENT_RL_API_KEYS."""
    host, port = "127.0.0.1", free_port()
    command = [
        sys.executable, "-m", "agent_rl.cli", "arbiter", "serve", "--host", host, "--port", str(port),
        "--pool-url", pool_url, "--store-url", world.inbox_url, "--tasks", str(world.scenarios_path),
        "--workers", str(workers), "--log-level", log_level, "--access-log" if access_log else "--no-access-log",
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "AGENT_RL_API_KEYS": api_keys_json(),
                **(env or {})}
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)
    url = f"http://{host}:{port}"
    try:
        try:
            wait_until_serving(url, process)
        except (RuntimeError, TimeoutError) as exc:
            raise type(exc)(f"{exc}:\n{log_path.read_text()[-3000:]}") from None
        yield ArbiterProcess(url, host, port, process, log_path)
    finally:
        stop_arbiter(process, timeout_s=90)  # graceful: answered episodes are committed before exit


# -- the load driver -----------------------------------------------------------------------------


@dataclass
class Outcome:
    """What happened to one request: an HTTP status and body, or a transport error."""

    status: int | None
    body: dict | None = None
    transport_error: str | None = None
    attempts: int = 1

    @property
    def answered(self) -> bool:
        return self.status == 200

    @property
    def clear_error(self) -> bool:
        """A refusal the client can act on: a JSON error naming what went wrong."""
        return (
            self.status is not None and self.status >= 400 and isinstance(self.body, dict)
            and bool(self.body.get("error")) and "detail" in self.body
        )


@dataclass
class LoadReport:
    outcomes: list[Outcome]
    elapsed_s: float
    latency_ms: list[float] = field(default_factory=list)

    @property
    def statuses(self) -> dict[str, int]:
        return dict(Counter(str(o.status) if o.status is not None else "transport" for o in self.outcomes))

    @property
    def answered_ids(self) -> list[str]:
        return [o.body["episode_id"] for o in self.outcomes if o.answered]

    @property
    def rps(self) -> float:
        return len(self.outcomes) / self.elapsed_s if self.elapsed_s else 0.0

    def unclear(self) -> list[Outcome]:
        """Requests that got neither an answer nor a clear error."""
        return [o for o in self.outcomes if not o.answered and not o.clear_error]


_CONTENT_LENGTH = re.compile(rb"content-length: *(\d+)", re.IGNORECASE)


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, body: bytes,
                    api_token: str = API_TOKEN) -> tuple[int, dict | None]:
    head = (f"POST /v1/ask HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {api_token}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    writer.write(head + body)
    header = await reader.readuntil(b"\r\n\r\n")
    match = _CONTENT_LENGTH.search(header)
    payload = await reader.readexactly(int(match.group(1))) if match else b""
    try:
        parsed = json.loads(payload) if payload else None
    except ValueError:
        parsed = None
    return int(header[9:12]), parsed


async def drive_async(
    host: str, port: int, bodies: list[bytes], concurrency: int, retries: int = 0, retry_pause_s: float = 0.2,
    timeout_s: float = 60.0,
) -> LoadReport:
    """POST every body to /v1/ask over `concurrency` keep-alive connections (a raw HTTP/1.1 client: cheap on CPU).

    With `retries`, a 503 or a transport error is retried on a fresh connection after a pause,
    as a well-behaved client does during an outage; the outcome keeps the last attempt.
    """
    outcomes: list[Outcome | None] = [None] * len(bodies)
    latency_ms: list[float] = []
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        reader = writer = None
        while next_index < len(bodies):
            index = next_index
            next_index += 1
            outcome: Outcome | None = None
            for attempt in range(1, retries + 2):
                started = time.perf_counter()
                try:
                    if writer is None:
                        reader, writer = await asyncio.open_connection(host, port)
                    status, body = await asyncio.wait_for(_exchange(reader, writer, host, bodies[index]), timeout_s)
                    outcome = Outcome(status, body, attempts=attempt)
                    latency_ms.append((time.perf_counter() - started) * 1000)
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError) as exc:
                    outcome = Outcome(None, transport_error=f"{type(exc).__name__}: {exc}", attempts=attempt)
                    if writer is not None:
                        writer.close()
                    reader = writer = None
                if outcome.status not in (None, 503):
                    break
                if attempt <= retries:
                    await asyncio.sleep(retry_pause_s)
            outcomes[index] = outcome
        if writer is not None:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LoadReport([o for o in outcomes if o is not None], time.perf_counter() - started, latency_ms)


def drive(host: str, port: int, bodies: list[bytes], concurrency: int = 32, **options) -> LoadReport:
    return asyncio.run(drive_async(host, port, bodies, concurrency, **options))


def pool_episode_ids(pool_url: str) -> Counter:
    """How often each episode id occurs in the pool (read straight from the table)."""
    from sqlalchemy import create_engine, text

    from agent_rl import settings

    engine = create_engine(settings.sqlalchemy_url(pool_url))
    try:
        with engine.connect() as conn:
            return Counter(row[0] for row in conn.execute(text("SELECT episode_id FROM episodes")))
    finally:
        engine.dispose()

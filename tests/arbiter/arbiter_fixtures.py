"""Fixtures for the arbiter tests (imported by name: a conftest.py here would shadow tests/conftest.py for `from conftest import ...`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from agent_rl.arbiter.config import ArbiterConfig
from agent_rl.arbiter.keys import ApiKey, hash_token
from agent_rl.arbiter.server import running_arbiter
from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.pool import PoolRepository
from agent_rl.environments.email.records import Scenario
from agent_rl.environments.email.scenarios import generate_scenarios, save_scenarios



API_TOKEN = "tests-api-key-5b8e20c4"  # the fixture arbiter's key: every inbox, may replay scenarios


def api_key(token: str = API_TOKEN, key_id: str = "tests", tenant: str = "tests", contexts: tuple[str, ...] = ("*",),
            replay: bool = True) -> ApiKey:
    """A configured key entry for `token` (tests create their keys explicitly, like a deployment)."""
    return ApiKey(id=key_id, sha256=hash_token(token), tenant=tenant, contexts=contexts, replay=replay)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class DemoWorld:
    inbox_url: str
    scenarios_path: Path
    scenarios: list[Scenario]


@pytest.fixture(scope="session")
def demo_world(tmp_path_factory) -> DemoWorld:
    root = tmp_path_factory.mktemp("demo")
    inbox_url = f"sqlite:///{root / 'inbox.db'}"
    store = open_inbox_store(inbox_url)
    corpus = build_demo_corpus(store, seed=0)
    store.close()
    scenarios = generate_scenarios(corpus, seed=0)
    path = save_scenarios(scenarios, root / "scenarios.jsonl")
    return DemoWorld(inbox_url, path, scenarios)


@dataclass
class Arbiter:
    url: str
    client: httpx.Client
    pool: PoolRepository


@pytest.fixture
def start_arbiter(demo_world, sqlite_url) -> Callable[..., object]:
    """Context manager factory: a live arbiter with its HTTP client and a handle on its pool."""

    @contextmanager
    def start(pool_url: str = sqlite_url, **options) -> Iterator[Arbiter]:
        """The client sends API_TOKEN unless a request gives its own Authorization header."""
        options.setdefault("api_keys", (api_key(),))
        config = ArbiterConfig(
            pool_url=pool_url, inbox_url=demo_world.inbox_url, scenarios_path=demo_world.scenarios_path, **options
        )
        pool = PoolRepository(pool_url)
        with running_arbiter(config) as url, httpx.Client(base_url=url, timeout=60, headers=bearer(API_TOKEN)) as client:
            yield Arbiter(url, client, pool)
        pool.close()

    return start


@pytest.fixture
def arbiter(start_arbiter) -> Iterator[Arbiter]:
    with start_arbiter() as live:
        yield live

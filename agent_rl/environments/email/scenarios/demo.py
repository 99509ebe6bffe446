"""The demo environment in one call: the generated corpus in the store and its scenarios on disk.

The scenarios asset, `agent-rl inbox build-demo`, `agent-rl eval` and the demo all use this, so
they agree on where scenarios live (AGENT_RL_HOME/artifacts/scenarios/all/scenarios.jsonl).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from agent_rl import settings
from agent_rl.environments.email.inbox.demo_corpus import DemoCorpus, build_demo_corpus, generate_demo_corpus
from agent_rl.environments.email.inbox.store_interface import InboxStore
from agent_rl.environments.email.records import Scenario
from agent_rl.environments.email.scenarios.generate import generate_scenarios, load_scenarios, save_scenarios


def scenarios_path() -> Path:
    return settings.artifact_dir("scenarios") / "scenarios.jsonl"


@dataclass
class DemoEnvironment:
    corpus: DemoCorpus
    scenarios: list[Scenario]
    path: Path
    content_hash: str


def write_demo_scenarios(seed: int = 0, n_inboxes: int = 8, n_emails: int = 4000,
                         corpus: DemoCorpus | None = None) -> DemoEnvironment:
    """Regenerate the (seeded, pure) corpus and write its scenarios; no store needed."""
    corpus = corpus or generate_demo_corpus(seed=seed, n_inboxes=n_inboxes, n_emails=n_emails)
    scenarios = generate_scenarios(corpus, seed=seed)
    path = save_scenarios(scenarios, scenarios_path())
    return DemoEnvironment(corpus, scenarios, path, hashlib.sha256(path.read_bytes()).hexdigest())


def build_demo_environment(store: InboxStore, seed: int = 0, n_inboxes: int = 8, n_emails: int = 4000) -> DemoEnvironment:
    """Write the demo corpus into `store` (idempotent) and its scenarios to the default path."""
    corpus = build_demo_corpus(store, seed=seed, n_inboxes=n_inboxes, n_emails=n_emails)
    return write_demo_scenarios(seed, corpus=corpus)


def load_default_scenarios(path: str | Path | None = None) -> list[Scenario]:
    path = Path(path) if path else scenarios_path()
    if not path.exists():
        raise FileNotFoundError(
            f"no scenarios at {path}: run `agent-rl inbox build-demo` or materialize the `scenarios` asset first"
        )
    return load_scenarios(path)

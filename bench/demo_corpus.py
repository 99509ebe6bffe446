"""Benchmark of the demo corpus: seconds to generate 4,000 emails and their scenarios, and to write them
into a fresh SQLite inbox store. Target: generation under 3 s on one core. Last line: JSON report.

    OMP_NUM_THREADS=1 .venv/bin/python bench/demo_corpus.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus, generate_demo_corpus  # noqa: E402
from agent_rl.environments.email.inbox.store import open_inbox_store  # noqa: E402
from agent_rl.environments.email.scenarios import generate_scenarios  # noqa: E402

TARGET_S = 3.0


def main() -> None:
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        corpus = generate_demo_corpus(seed=0)
        runs.append(time.perf_counter() - start)
    start = time.perf_counter()
    scenarios = generate_scenarios(corpus, seed=0)
    scenario_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        store = open_inbox_store(f"sqlite:///{tmp}/inbox.db")
        start = time.perf_counter()
        build_demo_corpus(store, seed=0)
        build_s = time.perf_counter() - start
        stored = store.count()
        store.close()
    generate_s = min(runs)
    print(json.dumps({
        "emails": len(corpus.emails), "inboxes": len(corpus.inboxes), "facts": len(corpus.facts),
        "scenarios": len(scenarios), "generate_s": round(generate_s, 3), "scenarios_s": round(scenario_s, 3),
        "build_into_sqlite_s": round(build_s, 3), "stored": stored, "target_generate_s": TARGET_S,
        "meets_target": generate_s < TARGET_S and stored == len(corpus.emails),
    }))  # fmt: skip


if __name__ == "__main__":
    main()

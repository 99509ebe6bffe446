"""Building the email assistant's world for a run: the inbox store (the seeded demo corpus, or a real export
ingested) and the scenarios about it (generated from the demo corpus's facts, or written by an LLM for a real
corpus, ART-E style). `EmailWorld.build` / `build_tasks` call these; the Dagster assets only ask the
environment."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

from agent_rl.environments.email.inbox.store_interface import InboxStore
from agent_rl.environments.email.scenarios.generate import save_scenarios
from agent_rl.environments.email.records import Scenario


def build_inboxes(store: InboxStore, seed: int = 0, n_inboxes: int = 8, n_emails: int = 4000,
                  ingest_path: str = "", **_: Any) -> dict[str, Any]:
    """Fill `store` from the export at `ingest_path`, or with the seeded demo corpus (idempotent); what it holds."""
    if ingest_path:
        from agent_rl.environments.email.inbox.ingest import ingest

        report = ingest(ingest_path, store, progress=False)
        meta: dict[str, Any] = {"seen": report.seen, "inserted": report.inserted, "duplicates": report.duplicates,
                                "skipped": len(report.skipped)}
    else:
        from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus

        corpus = build_demo_corpus(store, seed=seed, n_inboxes=n_inboxes, n_emails=n_emails)
        meta = {"generated_emails": len(corpus.emails), "facts": len(corpus.facts)}
    per_inbox = {address: store.count(address) for address in store.inboxes()}
    return {**meta, "inboxes": len(per_inbox), "emails": sum(per_inbox.values()),
            "per_inbox": "| inbox | emails |\n|---|---|\n" + "\n".join(f"| {a} | {n} |" for a, n in per_inbox.items())}


def write_scenarios(store: InboxStore, path: Path, seed: int = 0, n_inboxes: int = 8, n_emails: int = 4000,
                    ingest_path: str = "", llm_base_url: str = "", llm_model: str = "",
                    llm_api_key_env: str = "OPENAI_API_KEY", **_: Any) -> tuple[list[Scenario], dict[str, Any]]:
    """The scenarios of the world `build_inboxes` built with the same options, written to `path`, and what was
    written: the demo corpus's facts regenerated from its seed (no store read), or an LLM's questions about an
    ingested corpus (the fact-based generator only knows the demo corpus)."""
    extra: dict[str, Any] = {}
    if ingest_path:
        items, extra = _llm_scenarios(store, seed, llm_base_url, llm_model, llm_api_key_env)
    else:
        from agent_rl.environments.email.inbox.demo_corpus import generate_demo_corpus
        from agent_rl.environments.email.scenarios.generate import generate_scenarios

        items = generate_scenarios(generate_demo_corpus(seed=seed, n_inboxes=n_inboxes, n_emails=n_emails), seed=seed)
    path = save_scenarios(items, path)
    by_cat = Counter((s.category.value, s.split.value) for s in items)
    table = "| category | train | test |\n|---|---|---|\n" + "\n".join(
        f"| {c} | {by_cat[(c, 'train')]} | {by_cat[(c, 'test')]} |" for c in sorted({c for c, _ in by_cat}))
    return items, {**extra, "path": str(path), "content_hash": hashlib.sha256(path.read_bytes()).hexdigest(),
                   "per_category": table,
                   "sample": "\n".join(f"- [{s.category.value}] {s.question} → {s.answer}" for s in items[:8])}


def _llm_scenarios(store: InboxStore, seed: int, base_url: str, model: str,
                   api_key_env: str) -> tuple[list[Scenario], dict[str, Any]]:
    if not (base_url and model):
        raise ValueError("an ingested corpus needs an LLM endpoint to write scenarios: set llm_base_url and llm_model")
    from agent_rl.chat_client import ChatEndpoint
    from agent_rl.environments.email.scenarios.llm_generator import LLMGeneratorConfig, generate_llm_scenarios

    emails = [email for address in store.inboxes() for email in store.iter_emails(address)]
    endpoint = ChatEndpoint(base_url=base_url, model=model, api_key_env=api_key_env)
    items, report = generate_llm_scenarios(emails, LLMGeneratorConfig(endpoint=endpoint, seed=seed))
    if not items:
        raise ValueError(f"the LLM wrote no usable scenario: {report}")
    return items, {"generator": "llm", "llm_model": model, "generation_report": {
        "batches": report.batches, "accepted": report.accepted, "failed_batches": report.failed_batches,
        "dropped": {": ".join(map(str, k)) if isinstance(k, tuple) else str(k): n for k, n in report.dropped.items()}}}

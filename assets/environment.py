"""The environment the agent acts in: the inbox store and the scenarios (questions with golden answers)."""


from collections import Counter

import dagster as dg
from pydantic import Field

from agent_rl.inbox.demo_corpus import build_demo_corpus
from agent_rl.scenarios.demo import write_demo_scenarios
from resources.stores import InboxStoreResource


class CorpusConfig(dg.Config):
    """The demo corpus is generated from a seed, so scenarios can be regenerated without reading it back."""

    seed: int = Field(default=0, description="seed of the generated demo corpus")
    n_inboxes: int = Field(default=8, ge=1)
    n_emails: int = Field(default=4000, ge=10)
    ingest_path: str = Field(default="", description="ingest a real corpus (maildir, .tar.gz, CSV) instead")


@dg.asset(group_name="environment", description="Email inboxes the agent searches (demo corpus or ingested).")
def inbox(context: dg.AssetExecutionContext, config: CorpusConfig, inbox_store: InboxStoreResource):
    store = inbox_store.open()
    if config.ingest_path:
        from agent_rl.inbox.ingest import ingest

        report = ingest(config.ingest_path, store, progress=False)
        meta = {"seen": report.seen, "inserted": report.inserted, "duplicates": report.duplicates,
                "skipped": len(report.skipped)}
    else:
        corpus = build_demo_corpus(store, seed=config.seed, n_inboxes=config.n_inboxes, n_emails=config.n_emails)
        meta = {"generated_emails": len(corpus.emails), "facts": len(corpus.facts)}
    per_inbox = {address: store.count(address) for address in store.inboxes()}
    table = "| inbox | emails |\n|---|---|\n" + "\n".join(f"| {a} | {n} |" for a, n in per_inbox.items())
    return dg.MaterializeResult(metadata={
        **meta,
        "store": inbox_store.resolved_url(),
        "inboxes": len(per_inbox),
        "emails": sum(per_inbox.values()),
        "per_inbox": dg.MetadataValue.md(table),
    })


@dg.asset(group_name="environment", deps=[inbox],
          description="Questions with golden answers and source emails, split train/test by fact.")
def scenarios(context: dg.AssetExecutionContext, config: CorpusConfig):
    env = write_demo_scenarios(seed=config.seed, n_inboxes=config.n_inboxes, n_emails=config.n_emails)
    items, path, digest = env.scenarios, env.path, env.content_hash
    by_cat = Counter((s.category.value, s.split.value) for s in items)
    cats = sorted({c for c, _ in by_cat})
    table = "| category | train | test |\n|---|---|---|\n" + "\n".join(
        f"| {c} | {by_cat[(c, 'train')]} | {by_cat[(c, 'test')]} |" for c in cats)
    sample = "\n".join(f"- [{s.category.value}] {s.question} → {s.answer}" for s in items[:8])
    return dg.MaterializeResult(metadata={
        "path": str(path),
        "content_hash": str(digest),
        "scenarios": len(items),
        "train": sum(1 for s in items if s.split.value == "train"),
        "test": sum(1 for s in items if s.split.value == "test"),
        "per_category": dg.MetadataValue.md(table),
        "sample": dg.MetadataValue.md(sample),
    })

"""The email assistant's privacy pass (`EmailWorld.anonymize`): its world is an inbox store, too large to
copy whole and pickle, whose every header says who is a person. So it runs its own pass (privacy.py's
`anonymize_partition`: one Anonymizer over the episodes, the inboxes they and the scenarios touch, and the
scenarios; the directory from every inbox's headers; a canary email planted in the world) and
writes the anonymized inbox (`inbox.db`, replaced whole) and scenarios (`scenarios.jsonl`) where training and
evaluation open them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agent_rl.environments.core import AnonymizerConfig, WorldPrivacy
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.environments.email.inbox.store_interface import InboxStore
from agent_rl.environments.email.privacy import anonymize_partition
from agent_rl.jsonl import save_jsonl
from agent_rl.environments.email.records import Scenario

# The anonymized world this pass writes under a partition's folder, where `EmailWorld.reopen` reopens it.
STORE_FILE = "inbox.db"
SCENARIOS_FILE = "scenarios.jsonl"


def anonymize_inboxes(store: InboxStore, scenarios: list[Scenario], episodes: list[dict[str, Any]], out_dir: Path,
                      canaries: list[str], config: AnonymizerConfig) -> WorldPrivacy:
    """Anonymized episodes with the inboxes and scenarios they share pseudonyms with, written under `out_dir`."""
    inboxes = sorted({e["context"] for e in episodes} | {s.inbox_id for s in scenarios})
    emails = [email for address in inboxes for email in store.iter_emails(address)]
    # Every inbox's headers say who is a person, not just those of the inboxes in this partition.
    everyone = (email for address in store.inboxes() for email in store.iter_emails(address))
    result = anonymize_partition(episodes, emails, scenarios, canaries=canaries, directory_emails=everyone,
                                 config=config)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp_db = out_dir / f"{STORE_FILE}.tmp"
    tmp_db.unlink(missing_ok=True)
    anon_store = open_inbox_store(f"sqlite:///{tmp_db}")
    anon_store.add_emails(result.emails)
    anon_store.close()
    os.replace(tmp_db, out_dir / STORE_FILE)  # whole or nothing: a killed run leaves the old store
    scenarios_hash = save_jsonl([s.model_dump(mode="json") for s in result.scenarios], out_dir / SCENARIOS_FILE)
    return WorldPrivacy(result.episodes, result.report, result.leaks, world={
        "emails": len(result.emails), "scenarios": len(result.scenarios), "inboxes": len(inboxes),
        "store": str(out_dir / STORE_FILE), "scenarios_hash": scenarios_hash})

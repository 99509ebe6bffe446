"""The audit helpers every privacy pass uses (the plug-in pass, plugin_privacy.py, and an environment's own, such
as the email assistant's, environments/email/privacy.py): the independent leak auditor salted from the pseudonym
key, the canary seed that makes a rerun plant the same canaries, the scan of a pass's anonymized records (its
planted canary scanned under its own name and not written) and the count of leaks by kind. They live in curation
so every pass audits the same way; what a pass anonymizes and where it writes it are the pass's own.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable
from typing import Any

from agent_rl.privacy.leak_check import CANARY_ADDRESS, Finding, LeakAuditor

# Where every pass's anonymized episodes are written (assets/curation.py), and the name its planted canary is
# scanned under; findings name these.
EPISODES_FILE = "anonymized_episodes/episodes.jsonl"
CANARY_FILE = "planted canary"


def leak_auditor(key: bytes, public: Iterable[str] = ()) -> LeakAuditor:
    """The independent auditor of one privacy pass, salted from the pseudonym key; `public` are the pass's
    declared public terms: only a whole one is not taken for a person's name."""
    return LeakAuditor(hmac.new(key, b"leak-check salt", hashlib.sha256).digest(), synthetic=[CANARY_ADDRESS],
                       public=public)


def canary_seed(key: bytes, episodes: list[dict[str, Any]], other_ids: Iterable[str]) -> str:
    """The canaries depend on the key and the input (episode ids, then the ids of the world's records), so a
    rerun plants the same ones (idempotent output)."""
    digest = hmac.new(key, b"canary", hashlib.sha256)
    for episode in episodes:
        digest.update(str(episode.get("episode_id", "")).encode())
    for value in other_ids:
        digest.update(value.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def scan_records(auditor: LeakAuditor, records: list[Any], file: str, label: str, planted_last: bool,
                 dump: Callable[[Any], Any] = lambda record: record) -> tuple[list[Any], list[Finding]]:
    """(records to write, leaks found) of anonymized records whose last one is this pass's canary when
    `planted_last`: every record is scanned, the canary is scanned under its own name and not written."""
    kept: list[Any] = []
    leaks: list[Finding] = []
    for i, record in enumerate(records):
        canary = planted_last and i == len(records) - 1
        leaks += auditor.scan(CANARY_FILE if canary else file, f"{label} {i + 1}", dump(record))
        if not canary:
            kept.append(record)
    return kept, leaks


def count_kinds(kinds: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for kind in kinds:
        out[kind] = out.get(kind, 0) + 1
    return out

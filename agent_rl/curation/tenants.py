"""No tenant steers a week alone: a cap on each tenant's share of what the week trains on and validates against.

A gateway serves many tenants' agents from one loop. Without a cap, one tenant that sends ten times the traffic
(or rates its own wrong answers "up") sets most of the week's SFT rows and most of the held-out replay set, and the
other tenants' agents learn and are judged by its conversations. The data-poisoning literature on instruction
tuning and RLHF (Wan et al. 2023, "Poisoning Language Models During Instruction Tuning"; Rando & Tramer 2024,
"Universal Jailbreak Backdoors from Poisoned Human Feedback") finds that a small share of poisoned rows (about a
hundred examples, or well under 5% of the preference data) moves a model, and that the defences it tried (filtering
rows by loss, fewer epochs) cost accuracy and stop only part of the effect. Bounding how much any one source
contributes needs no judgement of single rows: the cap below is that bound; the labeler is fitted per tenant
(curation/live.py), so one tenant's ratings never set another tenant's labels; and a tenant whose ratings disagree
with the evidence it does not control loses them for the week (tenant_agreement.py).

`cap_tenant_share` keeps every row when one tenant holds them all (its own week) or none holds more than the cap.
Otherwise each tenant keeps at most `c` rows, with `c` the largest count such that a tenant at `c` holds at most
`max(max_share, 1 / tenants)` of the kept rows; which rows a capped tenant keeps is a stable hash of their ids, so
re-runs agree.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_TENANT_SHARE = 0.5


@dataclass(frozen=True)
class TenantShare:
    tenant: str
    before: int
    after: int


def _tenant(row: Mapping[str, Any]) -> str:
    return str(row.get("tenant") or "default")


def _order(row: Mapping[str, Any]) -> bytes:
    return hashlib.sha256(f"tenant-cap:{row.get('episode_id')}".encode()).digest()


def per_tenant_cap(counts: Mapping[str, int], max_share: float) -> int | None:
    """The most rows any tenant keeps (None: no cap needed)."""
    if not 0 < max_share <= 1:
        raise ValueError(f"max tenant share must be in (0, 1], got {max_share}")
    if len(counts) < 2:
        return None
    share = max(max_share, 1 / len(counts))
    total = sum(counts.values())
    if max(counts.values()) <= share * total:
        return None
    low, high = 0, max(counts.values())
    while low < high:  # the largest c with c <= share * sum(min(n, c)): the left side grows faster past it
        middle = (low + high + 1) // 2
        if middle <= share * sum(min(n, middle) for n in counts.values()) + 1e-9:
            low = middle
        else:
            high = middle - 1
    return low


def cap_tenant_share(rows: Iterable[Mapping[str, Any]], max_share: float = DEFAULT_MAX_TENANT_SHARE
                     ) -> tuple[list[dict[str, Any]], list[TenantShare]]:
    """The rows with each tenant's share capped (input order kept), and each tenant's count before and after."""
    rows = [dict(r) for r in rows]
    counts = Counter(_tenant(r) for r in rows)
    cap = per_tenant_cap(counts, max_share)
    if cap is None:
        return rows, [TenantShare(t, n, n) for t, n in sorted(counts.items())]
    by_tenant: dict[str, list[int]] = defaultdict(list)
    for index, row in enumerate(rows):
        by_tenant[_tenant(row)].append(index)
    keep: set[int] = set()
    for indices in by_tenant.values():
        keep.update(sorted(indices, key=lambda i: _order(rows[i]))[:cap])
    kept = [row for index, row in enumerate(rows) if index in keep]
    after = Counter(_tenant(r) for r in kept)
    return kept, [TenantShare(t, n, after.get(t, 0)) for t, n in sorted(counts.items())]


def share_table(shares: list[TenantShare]) -> list[dict[str, Any]]:
    """Rows for a metadata table: tenant, before, after, share of the kept rows."""
    total = sum(s.after for s in shares) or 1
    return [{"tenant": s.tenant, "before": s.before, "after": s.after, "share": round(s.after / total, 4)}
            for s in shares]

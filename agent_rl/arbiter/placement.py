"""Which cores each routed version's engine computes on.

While a test routes two versions of ours, each on an engine of its own, two engines computing on every core
oversubscribe the machine: on 2 cores of an Intel Xeon the pair served 14% less than with a core each, and the
later engine's requests came out 25-35% slower at p95 than the same model alone (docs/experiments.md, 2026-11-30).
A latency guardrail then judges the arrangement, not the candidate. So the cores are shared out: in proportion to
each version's traffic, at least one each, contiguous; one version alone (or more versions than cores) computes on
every core.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence


def machine_cores() -> tuple[int, ...]:
    """The CPU ids this process may run on (its affinity, not the machine's count)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return tuple(range(os.cpu_count() or 1))


def core_shares(weights: Mapping[str, float], cores: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """{spec: its cores} for the specs in `weights` (traffic shares > 0), or {} when there is nothing to split:
    fewer than two specs, or fewer cores than specs. Largest remainder over the cores left after one each."""
    live = {spec: weight for spec, weight in weights.items() if weight > 0}
    if len(live) < 2 or len(cores) < len(live):
        return {}
    total = sum(live.values())
    spare = len(cores) - len(live)
    exact = {spec: spare * weight / total for spec, weight in live.items()}
    counts = {spec: 1 + int(share) for spec, share in exact.items()}
    left = len(cores) - sum(counts.values())
    for spec in sorted(live, key=lambda s: exact[s] - int(exact[s]), reverse=True)[:left]:
        counts[spec] += 1
    shares, start = {}, 0
    for spec in sorted(live):  # by name, not by the order a writer listed them: the same split, the same cores
        shares[spec] = tuple(cores[start:start + counts[spec]])
        start += counts[spec]
    return shares

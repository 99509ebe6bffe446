"""No tenant steers a gateway week alone: a flooding tenant's share of the SFT rows and of the held-out replay set
stays within the cap, and its ratings do not move another tenant's labels."""

from __future__ import annotations

from collections import Counter

import pytest

from agent_rl.curation.live import judge_by_feedback, label_unrated, split_live
from agent_rl.curation.tenants import cap_tenant_share, per_tenant_cap
from tests.curation.test_live import live_episode


def rows_of(tenant: str, count: int, start: int, feedback: str = "up") -> list[dict]:
    return [judge_by_feedback({**live_episode(start + i, feedback), "tenant": tenant}) for i in range(count)]


def shares(rows: list[dict]) -> dict[str, float]:
    counts = Counter(r["tenant"] for r in rows)
    return {tenant: n / len(rows) for tenant, n in counts.items()}


def test_a_flooding_tenant_keeps_at_most_its_share_of_rows_and_of_the_held_out_set():
    flood, honest = rows_of("flood", 300, 0), rows_of("honest", 30, 10_000)
    kept, table = cap_tenant_share(flood + honest, max_share=0.5)
    assert {s.tenant: (s.before, s.after) for s in table} == {"flood": (300, 30), "honest": (30, 30)}
    assert max(shares(kept).values()) <= 0.5
    # A third tenant: the flood may hold half of what is kept, never more.
    third = rows_of("third", 30, 20_000)
    kept, _ = cap_tenant_share(flood + honest + third, max_share=0.5)
    assert Counter(r["tenant"] for r in kept) == {"flood": 60, "honest": 30, "third": 30}
    assert shares(kept)["flood"] <= 0.5
    # The held-out replay set: the rated-good episodes kept for validation, capped the same way.
    _, held_out = split_live(flood + honest + third, share=0.5)
    capped, _ = cap_tenant_share(held_out, max_share=0.4)
    assert max(shares(capped).values()) <= 0.4 + 1e-9
    # Stable: the same rows on a re-run, in input order.
    again, _ = cap_tenant_share(flood + honest, max_share=0.5)
    assert [r["episode_id"] for r in again] == [r["episode_id"] for r in cap_tenant_share(flood + honest, 0.5)[0]]


def test_one_tenant_alone_or_within_the_cap_keeps_everything():
    alone = rows_of("only", 50, 0)
    assert cap_tenant_share(alone, 0.2)[0] == alone
    even = rows_of("a", 20, 0) + rows_of("b", 20, 100)
    assert cap_tenant_share(even, 0.5)[0] == even
    assert per_tenant_cap({"a": 10, "b": 90}, 0.3) == 10  # two tenants: at least 1/2 each is allowed
    with pytest.raises(ValueError, match="max tenant share"):
        per_tenant_cap({"a": 1, "b": 2}, 0.0)


def test_a_tenants_ratings_do_not_move_another_tenants_labels():
    from agent_rl.feedback.labeler import LabelerConfig
    from agent_rl.simulated_users.population import PopulationConfig, simulate

    simulated = simulate(PopulationConfig(n_episodes=1200, rated_share=0.25, seed=4))
    honest = [judge_by_feedback({**s.episode.model_dump(mode="json"), "tenant": "honest"}) for s in simulated]
    config = LabelerConfig(min_auc=0.7, max_ece=0.1)
    alone, report_alone = label_unrated(honest, config)
    assert report_alone.passed, report_alone.reason
    # Another tenant floods the week with conversations it rates "up" whatever happened in them.
    flood_sim = simulate(PopulationConfig(n_episodes=1200, rated_share=0.8, seed=9))
    flood = []
    for s in flood_sim:
        row = {**s.episode.model_dump(mode="json"), "tenant": "flood", "episode_id": f"flood-{s.episode.episode_id}"}
        if row.get("feedback") is not None:
            row["feedback"] = "up"
        flood.append(judge_by_feedback(row))
    together, report = label_unrated(honest + flood, config)
    honest_after = [r for r in together if r["tenant"] == "honest"]
    assert honest_after == alone  # every label of the honest tenant is what its own ratings gave
    assert set(report.per_tenant) == {"flood", "honest"} and report.per_tenant["honest"]["passed"]

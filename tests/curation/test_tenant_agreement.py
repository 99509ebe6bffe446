"""No tenant steers the week alone, by its ratings either: a tenant whose "up" ratings disagree with the evidence it
does not control is flagged and, by default, loses its ratings for the week; honest tenants are not flagged
(curation/tenant_agreement.py)."""

from __future__ import annotations

import json

import dagster as dg

from agent_rl.curation.datasets import quality
from agent_rl.curation.live import judge_by_feedback, label_unrated, split_live
from agent_rl.curation.tenant_agreement import (
    DISAGREES,
    FIXED_READING,
    NOT_CHECKED,
    AgreementConfig,
    check_tenant_agreement,
    check_week,
    summary,
)
from agent_rl.curation.tenants import cap_tenant_share
from agent_rl.feedback.labeler import LabelerConfig
from agent_rl.simulated_users.population import PopulationConfig, simulate
from tests.curation.test_tenants import rows_of


def tenant_week(tenant: str, config: PopulationConfig, rate_all: str | None = None) -> list[dict]:
    """A tenant's gateway week from the simulated users (as test_tenants builds it); `rate_all`: every rating it
    sends says this, whatever happened in the conversation."""
    rows = []
    for s in simulate(config):
        row = {**s.episode.model_dump(mode="json"), "tenant": tenant, "episode_id": f"{tenant}-{s.episode.episode_id}"}
        if rate_all is not None and row.get("feedback") is not None:
            row["feedback"] = rate_all
        rows.append(judge_by_feedback(row))
    return rows


def flooded_week() -> list[dict]:
    """The issue's attack: one tenant sends 300 conversations whose answers all went wrong, each rated "up"; the
    other 30 good ones, rated."""
    flood = tenant_week("flood", PopulationConfig(n_episodes=300, rated_share=1.0, satisfied_share=0.0, seed=9), "up")
    honest = tenant_week("honest", PopulationConfig(n_episodes=30, rated_share=1.0, satisfied_share=1.0, seed=4))
    return flood + honest


def trained_and_held_out(rows: list[dict]) -> tuple[set[str], set[str]]:
    """The tenants whose episodes reach the SFT rows and the held-out set, as curation's assets choose them."""
    rows, _ = label_unrated(rows, LabelerConfig(min_auc=0.7, max_ece=0.1))
    train, held_out = split_live(rows)
    sft, _ = cap_tenant_share([e for e in train if quality(e) >= 0.8], 0.5)
    held_out, _ = cap_tenant_share(held_out, 0.5)
    return {r["tenant"] for r in sft}, {r["tenant"] for r in held_out}


def test_the_flooding_tenant_is_flagged_and_its_rows_leave_the_week():
    rows = flooded_week()
    assert trained_and_held_out(rows) == ({"flood", "honest"}, {"flood", "honest"})  # unchecked, the flood trains
    kept, report = check_week(rows)
    assert report["flagged"] == ["flood"] and report["ratings_dropped"] == 300
    flood = next(t for t in report["tenants"] if t["tenant"] == "flood")
    honest = next(t for t in report["tenants"] if t["tenant"] == "honest")
    # The honest tenant's 30 ratings are all "up": no labeler fits on them, the signals' fixed reading scores both.
    assert flood["evidence"] == honest["evidence"] == FIXED_READING
    assert flood["effect"] > 0.75 and flood["p"] < 1e-6 and honest["status"] == "agrees"
    assert trained_and_held_out(kept) == ({"honest"}, {"honest"})
    honest_before = [r for r in rows if r["tenant"] == "honest"]
    assert [r for r in kept if r["tenant"] == "honest"] == honest_before  # untouched
    flood_after = [r for r in kept if r["tenant"] == "flood"]
    assert len(flood_after) == 300 and all(r["outcome"] == "unjudged" and r["feedback"] is None for r in flood_after)
    assert "flood: effect 0.8" in summary(report) and "300 ratings dropped" in summary(report)


def test_honest_tenants_of_different_volumes_are_not_flagged():
    flagged = []
    for seed in range(10):
        big = tenant_week("big", PopulationConfig(n_episodes=800, rated_share=0.3, seed=seed))
        small = tenant_week("small", PopulationConfig(n_episodes=200, rated_share=0.4, seed=100 + seed))
        report = check_tenant_agreement(big + small)
        assert all(t.status != NOT_CHECKED for t in report.tenants), report.table()
        assert any(t.evidence.startswith("labeler fitted on") for t in report.tenants)  # the labeler path runs
        flagged.append(bool(report.flagged))
    assert sum(flagged) <= 1, flagged  # alpha 0.01 per tenant: 20 checks expect 0.2 false flags


def test_a_tenant_with_too_few_ratings_or_nobody_to_compare_with_is_not_checked():
    rows = flooded_week() + rows_of("tiny", 5, 50_000)
    tiny = next(t for t in check_tenant_agreement(rows).tenants if t.tenant == "tiny")
    assert (tiny.status, tiny.reason, tiny.p) == (NOT_CHECKED, "too few ratings: 5 < 20", None)
    alone = check_tenant_agreement([r for r in rows if r["tenant"] == "flood"]).tenants
    assert [(t.tenant, t.status) for t in alone] == [("flood", NOT_CHECKED)] and "no other tenant" in alone[0].reason
    few_up = check_tenant_agreement(rows, AgreementConfig(min_up=50)).tenants
    assert next(t for t in few_up if t.tenant == "honest").reason.startswith("too few 'up' ratings to compare: 30")


def test_with_distrust_off_nothing_is_dropped_but_the_flag_is_reported():
    rows = flooded_week()
    kept, report = check_week(rows, distrust_flagged=False)
    assert kept == rows and report["flagged"] == ["flood"] and report["ratings_dropped"] == 0
    assert "ratings kept (distrust_disagreeing_tenants is off)" in summary(report)


def test_the_curation_asset_warns_and_the_other_tenants_week_goes_on():
    from assets import curation
    from assets.partitions import weekly
    from assets.stages import PoolExport, ValidatedEpisodes
    from agent_rl.curation.datasets import load_jsonl, save_jsonl
    from resources.curation import CurationResource
    from resources.environment import EnvironmentResource
    from resources.stores import PoolResource

    partition = weekly.get_partition_keys()[-1]
    save_jsonl(flooded_week(), PoolExport(partition).episodes)
    result = dg.materialize(
        [curation.validated_episodes, curation.tenant_ratings_agree], partition_key=partition, raise_on_error=False,
        resources={"environment": EnvironmentResource(name="gateway"), "pool": PoolResource(),
                   "curation": CurationResource(min_points=1, min_categories=1, label_unrated=False)})
    assert result.success
    check = next(e for e in result.get_asset_check_evaluations() if e.check_name == "tenant_ratings_agree")
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN and "flood" in check.description
    assert check.metadata["ratings_dropped"].value == 300
    metadata = result.asset_materializations_for_node("validated_episodes")[0].metadata
    assert "| flood | 300 | 300 |" in metadata["tenant_agreement"].value
    clean = load_jsonl(ValidatedEpisodes(partition).episodes)
    assert {r["tenant"] for r in clean if r["outcome"] == "correct"} == {"honest"}
    report = json.loads(ValidatedEpisodes(partition).report.read_text())
    assert report["tenant_agreement"]["flagged"] == ["flood"] and DISAGREES in json.dumps(report["tenant_agreement"])

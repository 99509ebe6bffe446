"""The labeler an A/B test reads (issue 64): the model curation labeled the week with, kept by curation, copied when
the test starts, read by every look of that test whatever later weeks keep; the decision's evidence in the
routing history, the log and MLflow. Simulated conversations (agent_rl/simulated_users/population.py), a logistic labeler, the
rule-based agent registered as challenger: no language model."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from agent_rl import registry, settings
from agent_rl.ab.controller import RolloutController
from agent_rl.ab.rollout import LabelSettings, RolloutConfig
from agent_rl.curation.live import LABELER, judge_by_feedback, label_unrated
from agent_rl.curation.week_labeler import freeze_week_labeler
from agent_rl.feedback.frozen import TEST_STAGE, WEEK_STAGE, FrozenLabeler
from agent_rl.feedback.labeler import LabelerConfig
from agent_rl.simulated_users.population import PopulationConfig, simulate
from agent_rl.pool.repository import PoolRepository

WEEK = datetime(2026, 11, 16, tzinfo=timezone.utc)
TEST_START = datetime(2026, 11, 24, tzinfo=timezone.utc)
LABELER_CONFIG = LabelerConfig(min_auc=0.7, max_ece=0.1)
RULES = "heuristic:" + json.dumps({"wrong_rate": 0.1, "version": "rules"})
CONFIG = RolloutConfig(min_samples_per_arm=50, min_samples_per_step=50, max_step_duration=timedelta(days=30),
                       labels=LabelSettings(min_rated_per_arm=10))


@pytest.fixture(scope="module")
def week():
    """The week before the test: 2,000 conversations, a quarter rated; curation's rows, labeled rows and report."""
    rows = [judge_by_feedback(s.episode.model_dump(mode="json"))
            for s in simulate(PopulationConfig(n_episodes=2000, rated_share=0.25, seed=4, week_start=WEEK))]
    labeled, report = label_unrated(rows, LABELER_CONFIG)
    assert report.passed, report.reason
    return rows, labeled, report


def test_the_frozen_labeler_is_the_model_curation_labeled_the_week_with(week, tmp_path):
    rows, labeled, report = week
    frozen = freeze_week_labeler(rows, LABELER_CONFIG, report, week="2026-11-16")
    assert frozen is not None and frozen.passed and frozen.models.keys() == {"acme"}
    assert frozen.fitted_through is not None and WEEK <= frozen.fitted_through < WEEK + timedelta(days=7)
    given = [r for r in labeled if LABELER in (r.get("reward_components") or {})]
    assert len(given) > 200
    mine = frozen.probabilities(given)
    assert np.allclose(mine, [r["reward_components"][LABELER] for r in given], atol=1e-4)
    again = FrozenLabeler.load(frozen.save(tmp_path / "labeler"))
    assert np.array_equal(again.probabilities(given), mine) and again.summary() == frozen.summary()
    assert again.summary()["auc"] == pytest.approx(report.auc)
    # A tenant the week did not see is scored at the week's share of good ratings: a constant, corrected like any.
    stranger = {**given[0], "tenant": "newcomer"}
    assert again.probabilities([stranger])[0] == pytest.approx(frozen.base_rates[""])
    assert freeze_week_labeler(rows, object(), report) is None  # a model judge's labeler is not frozen


def _traffic(version: str, satisfied: float, n: int, seed: int) -> list:
    simulated = simulate(PopulationConfig(n_episodes=n, satisfied_share=satisfied, rated_share=0.05, seed=seed,
                                          week_start=TEST_START + timedelta(minutes=1)))
    return [s.episode.model_copy(update={"policy_version": version}) for s in simulated]


def test_a_test_reads_the_labeler_frozen_when_it_started_and_shows_its_evidence(week, tmp_path):
    rows, _, report = week
    home = settings.home()
    kept = freeze_week_labeler(rows, LABELER_CONFIG, report, week="2026-11-16")
    kept.save(home / "artifacts" / WEEK_STAGE / "2026-11-16")
    # A later week whose ratings reach past the test's start (it may have learned from the test's traffic): refused.
    dataclasses.replace(kept, week="2026-11-23", fitted_through=TEST_START + timedelta(hours=1)).save(
        home / "artifacts" / WEEK_STAGE / "2026-11-23")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logs: list[str] = []
    pool = PoolRepository(settings.pool_url())
    try:
        pool.set_routing({"heuristic": 1.0}, specs={}, reason="production", actor="test")
        assert registry.register_policy_spec(RULES, tracking_uri=uri).version == "1"
        controller = RolloutController(pool, CONFIG, tracking_uri=uri, log=logs.append)
        state = controller.start_if_new_challenger(now=TEST_START)
        assert state is not None and state.labeler is not None and state.labeler.startswith(f"artifacts/{TEST_STAGE}/")
        assert "week 2026-11-16" in state.labeler_note and "passed its check" in state.labeler_note
        assert "week 2026-11-16" in logs[-1]
        # Curation of a later run overwrites the week's labeler with one that failed: the running test keeps its own.
        dataclasses.replace(kept, models={}, passed=False, reason="AUC 0.5 < 0.85").save(
            home / "artifacts" / WEEK_STAGE / "2026-11-16")

        pool.insert_episodes(_traffic("heuristic", 0.45, 2400, seed=11) + _traffic("v1", 0.9, 600, seed=12))
        decision = controller.evaluate(now=TEST_START + timedelta(days=8))
        assert decision is not None
        evidence = decision.stats["evidence"]
        assert evidence["source"] == "ratings+labels" and evidence["labeler"]["week"] == "2026-11-16"
        champion, challenger = evidence["champion"], evidence["challenger"]
        assert champion["episodes"] == 2400 and challenger["episodes"] == 600
        assert 10 <= challenger["rated"] < 60 and challenger["labeled"] == 600 - challenger["rated"]
        assert evidence["ratings_lift"] > 0 and evidence["labels_lift"] > 0 and not evidence["disagreement"]["disagree"]
        # Labels moved the test where ratings alone (50 rated per arm) were still collecting.
        assert decision.action == "advance" and decision.cause == "significantly_better"
        assert evidence["ratings_test"]["n_challenger"] < CONFIG.min_samples_per_arm

        line = logs[-1]
        for part in ("advance (significantly_better)", "evidence: ratings and labels",
                     f"v1: {challenger['rated']} rated + {challenger['labeled']} labeled", "lifts: ratings +",
                     "msprt_ppi lift +"):
            assert part in line, line
        recorded = pool.routing_history()[-1].stats["decision"]["evidence"]
        assert recorded["challenger"]["labeled"] == challenger["labeled"]
        tags = registry.get_version(version="1", tracking_uri=uri).tags
        assert tags["rollout.evidence"] == "ratings+labels" and tags["rollout.method"] == "msprt_ppi"
        assert tags["rollout.challenger.rated"] == str(challenger["rated"])
        assert tags["rollout.challenger.labeled"] == str(challenger["labeled"])
        assert float(tags["rollout.ratings_lift"]) > 0 and float(tags["rollout.labels_lift"]) > 0
        assert tags["rollout.labeler"].startswith("week 2026-11-16: passed, AUC")
        assert tags["rollout.evidence.summary"] == evidence["summary"][:500]
    finally:
        pool.close()


def test_without_a_kept_labeler_the_sensors_read_ratings_alone_and_say_why(tmp_path):
    import dagster as dg

    from pipelines.sensors import challenger_sensor, rollout_sensor
    from resources.registry import MlflowResource
    from resources.rollout import RolloutResource
    from resources.stores import PoolResource

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    resources = {"pool": PoolResource(), "mlflow": MlflowResource(tracking_uri=uri),
                 "rollout": RolloutResource(min_samples_per_arm=50, min_samples_per_step=50)}
    pool = PoolRepository(settings.pool_url())
    try:
        pool.set_routing({"heuristic": 1.0}, specs={}, reason="production", actor="test")
        registry.register_policy_spec(RULES, tracking_uri=uri)
        started = challenger_sensor(dg.build_sensor_context(resources=resources))
        assert "A/B test started" in started.skip_message
        state = RolloutController(pool).current_state()
        assert state is not None and state.labeler is None and "no labeler saved by curation" in state.labeler_note
        soon = datetime.now(timezone.utc) + timedelta(minutes=1)
        pool.insert_episodes([e.model_copy(update={"created_at": soon}) for e in
                              _traffic("heuristic", 0.45, 400, seed=11) + _traffic("v1", 0.9, 100, seed=12)])
        said = rollout_sensor(dg.build_sensor_context(resources=resources)).skip_message
        assert said.startswith("hold (collecting)") and "evidence: ratings alone (heuristic: " in said
        assert "ratings alone: no labeler saved by curation" in said and " rated of 100" in said
    finally:
        pool.close()


def test_curation_keeps_the_weeks_labeler_and_its_rows_are_those_label_unrated_gives(week):
    import dagster as dg

    from agent_rl.curation.datasets import load_jsonl, save_jsonl
    from assets import curation
    from assets.partitions import weekly
    from assets.stages import PoolExport, ValidatedEpisodes
    from resources.curation import CurationResource
    from resources.environment import EnvironmentResource
    from resources.stores import PoolResource

    rows, labeled, report = week
    partition = weekly.get_partition_keys()[-1]
    save_jsonl([{k: v for k, v in r.items()} for r in rows], PoolExport(partition).episodes)
    result = dg.materialize(
        [curation.validated_episodes], partition_key=partition, raise_on_error=False,
        resources={"environment": EnvironmentResource(name="gateway"), "pool": PoolResource(),
                   "curation": CurationResource(min_points=1, min_categories=1, labeler_min_auc=0.7,
                                                labeler_max_ece=0.1, distrust_disagreeing_tenants=False)})
    assert result.success
    kept = FrozenLabeler.load(settings.home() / "artifacts" / WEEK_STAGE / partition)
    assert kept.passed and kept.week == partition and kept.summary()["auc"] == pytest.approx(report.auc)
    clean = load_jsonl(ValidatedEpisodes(partition).episodes)
    given = [r for r in clean if LABELER in (r.get("reward_components") or {})]
    assert len(given) == report.n_labeled  # curation labeled as label_unrated does, the save changed nothing
    assert np.allclose(kept.probabilities(given), [r["reward_components"][LABELER] for r in given], atol=1e-4)

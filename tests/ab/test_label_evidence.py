"""Outcomes from ratings and labels (agent_rl/ab/evidence.py, issue 64): the rollout reads the frozen labeler's
probabilities beside the few ratings, prediction-powered. Constructed outcomes, no models: each episode gets a
labeler probability and, for one in twenty, a rating drawn from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from agent_rl.ab.evidence import LabeledArm, disagreement, evidence_line, ppi_estimate
from agent_rl.ab.rollout import LabelSettings, Labels, RolloutConfig, RolloutState, apply_decision, decide
from agent_rl.ab.stats import ArmStats

T0 = datetime(2026, 11, 30, tzinfo=timezone.utc)
CONFIG = RolloutConfig(min_samples_per_arm=100, min_samples_per_step=100, max_step_duration=timedelta(days=60))
PASSED = {"week": "2026-11-23", "passed": True, "reason": "", "auc": 0.91, "ece": 0.03}
FAILED = {"week": "2026-11-23", "passed": False, "reason": "AUC 0.702 < 0.85 on 140 rated episodes (out of fold)"}


@dataclass
class Traffic:
    """An agent whose episodes look good to the labeler (probability `sure`) with probability `looks_good`, bad
    (1 - `sure`) otherwise; a user's rating is drawn from that probability (the labeler is calibrated), unless
    `true_rate` is set: then every rating is good with that probability, whatever the labels say."""

    looks_good: float
    sure: float = 0.9
    true_rate: float | None = None


@dataclass
class Served:
    """One arm's cumulative episodes: labels, ratings (None: unrated)."""

    labels: list[float] = field(default_factory=list)
    ratings: list[int | None] = field(default_factory=list)

    def add(self, rng: np.random.Generator, traffic: Traffic, n: int, rated_share: float = 0.05) -> None:
        good_looking = rng.random(n) < traffic.looks_good
        f = np.where(good_looking, traffic.sure, 1 - traffic.sure)
        p = f if traffic.true_rate is None else np.full(n, traffic.true_rate)
        y = (rng.random(n) < p).astype(int)
        rated = rng.random(n) < rated_share
        self.labels.extend(f.tolist())
        self.ratings.extend(int(v) if r else None for v, r in zip(y, rated))

    def arm(self) -> LabeledArm:
        return LabeledArm(labels=tuple(self.labels), ratings=tuple(self.ratings))

    def stats(self) -> ArmStats:
        """What the ratings-only test counts: the rated episodes."""
        rated = [y for y in self.ratings if y is not None]
        return ArmStats(successes=sum(rated), trials=len(rated))


def labels_of(served: dict[str, Served], labeler: dict = PASSED) -> Labels:
    return Labels(champion=served["v1"].arm(), challenger=served["v2"].arm(), labeler=labeler)


def drive(champion: Traffic, challenger: Traffic, config: RolloutConfig = CONFIG, seed: int = 0, batch: int = 200,
          hours: int = 24 * 40):
    """Serve hour by hour at the rollout's share, deciding on ratings and labels after every batch until it ends;
    at every look, also the decision ratings alone would take from the same state on the same data.
    Returns the final state and (with labels, ratings alone) per look."""
    rng = np.random.default_rng(seed)
    state = RolloutState.start("v1", "v2", config, now=T0)
    served = {"v1": Served(), "v2": Served()}
    looks = []
    for hour in range(1, hours):
        to_challenger = int(rng.binomial(batch, state.step_share))
        served["v2"].add(rng, challenger, to_challenger)
        served["v1"].add(rng, champion, batch - to_challenger)
        now = T0 + timedelta(hours=hour)
        stats = (served["v1"].stats(), served["v2"].stats())
        with_labels = decide(state, *stats, config, now=now, labels=labels_of(served))
        ratings_alone = decide(state, *stats, config, now=now)
        looks.append((with_labels, ratings_alone))
        state = apply_decision(state, with_labels)
        if state.finished:
            break
    return state, looks, served


def test_a_clearly_better_challenger_is_promoted_on_labels_while_ratings_alone_still_hold():
    state, looks, served = drive(Traffic(0.5), Traffic(0.8))  # success 50% -> 74%, 5% of users rate
    assert state.status == "promoted"
    assert [e.action for e in state.history] == ["start", "advance", "promote"]
    moved = [(labels, ratings) for labels, ratings in looks if labels.action != "hold"]
    for labels, ratings in moved:  # every move on labels was one ratings alone would not have made yet
        assert labels.cause == "significantly_better" and labels.stats["evidence"]["source"] == "ratings+labels"
        assert ratings.action == "hold", ratings.reason
        assert ratings.stats["evidence"]["source"] == "ratings"
        assert labels.stats["test"]["p_value"] <= CONFIG.alpha < ratings.stats["test"]["p_value"]
    final = looks[-1][0].stats["evidence"]
    assert final["challenger"]["labeled"] > 10 * final["challenger"]["rated"] > 0
    assert final["ratings_lift"] > 0 and final["labels_lift"] > 0 and final["test"]["method"] == "msprt_ppi"
    assert final["ratings_test"]["method"] == "msprt"
    # The same seed on ratings alone: promoted too, but later (more episodes served).
    ratings_state, ratings_looks = _drive_ratings_alone(Traffic(0.5), Traffic(0.8))
    assert ratings_state.status == "promoted" and len(ratings_looks) > 1.5 * len(looks)


def _drive_ratings_alone(champion: Traffic, challenger: Traffic, seed: int = 0, batch: int = 200):
    config = CONFIG.model_copy(update={"labels": LabelSettings(use=False)})
    state, looks, _ = drive(champion, challenger, config=config, seed=seed, batch=batch)
    assert all(labels.stats["evidence"]["source"] == "ratings" for labels, _ in looks)
    assert "use_labels false" in looks[-1][0].stats["evidence"]["note"]
    return state, looks


def test_a_clearly_worse_challenger_is_rolled_back_on_labels():
    state, looks, _ = drive(Traffic(0.8), Traffic(0.3))  # success 74% -> 34%
    assert state.status == "rolled_back"
    labels, ratings = looks[-1]
    assert labels.cause == "significantly_worse" and labels.stats["evidence"]["source"] == "ratings+labels"
    assert labels.stats["test"]["lift"] < -0.2 and labels.stats["test"]["ci_high"] < 0
    assert labels.new_weights == {"v1": 1.0}
    assert ratings.action == "hold"  # ratings alone had not seen it yet


def served_at_ten_percent(seed: int = 2, hours: int = 40) -> dict[str, Served]:
    """A better challenger's first step: enough for labels to advance, not for ratings alone."""
    rng = np.random.default_rng(seed)
    served = {"v1": Served(), "v2": Served()}
    for _ in range(hours):
        served["v2"].add(rng, Traffic(0.8), 20)
        served["v1"].add(rng, Traffic(0.5), 180)
    return served


def test_a_labeler_that_failed_its_check_leaves_the_test_on_ratings_alone():
    served = served_at_ten_percent()
    state = RolloutState.start("v1", "v2", CONFIG, now=T0)
    now = T0 + timedelta(hours=40)
    stats = (served["v1"].stats(), served["v2"].stats())
    passed = decide(state, *stats, CONFIG, now=now, labels=labels_of(served, PASSED))
    failed = decide(state, *stats, CONFIG, now=now, labels=labels_of(served, FAILED))
    alone = decide(state, *stats, CONFIG, now=now)
    assert passed.action == "advance" and passed.stats["evidence"]["source"] == "ratings+labels"
    assert failed.action == alone.action == "hold"
    assert (failed.cause, failed.reason) == (alone.cause, alone.reason)
    assert failed.stats["test"] == alone.stats["test"] and failed.stats["test"]["method"] == "msprt"
    evidence = failed.stats["evidence"]
    assert evidence["source"] == "ratings" and evidence["labels_lift"] is None
    assert "failed its check" in evidence["note"] and FAILED["reason"] in evidence["note"]
    assert "ratings alone" in failed.message() and "failed its check" in failed.message()
    # The episodes nobody rated are still counted, as unused.
    assert evidence["challenger"]["rated"] < evidence["challenger"]["episodes"] == len(served["v2"].labels)


def test_labels_whose_lift_disagrees_in_sign_with_the_ratings_hold_the_test():
    """A labeler the challenger learned to please: its episodes look good to it, and users rate them worse."""
    rng = np.random.default_rng(5)
    served = {"v1": Served(), "v2": Served()}
    served["v1"].add(rng, Traffic(0.5, true_rate=0.7), 3000, rated_share=0.05)
    served["v2"].add(rng, Traffic(0.9, true_rate=0.35), 1500, rated_share=0.05)
    state = RolloutState.start("v1", "v2", CONFIG, now=T0)
    decision = decide(state, served["v1"].stats(), served["v2"].stats(), CONFIG, now=T0 + timedelta(hours=20),
                      labels=labels_of(served))
    check = decision.stats["evidence"]["disagreement"]
    assert decision.action == "hold" and decision.cause == "labels_disagree_with_ratings"
    assert check["disagree"] and check["ratings_lift"] < 0 < check["labels_lift"] and abs(check["z"]) > 1.96
    assert "disagree in sign" in decision.reason and "ratings are the ground truth" in decision.reason
    # Without the check the labels would have moved the test: PPI alone is significant here.
    assert decision.stats["test"]["p_value"] <= CONFIG.alpha
    # Same sign, different sizes: no hold (the ratings and labels agree on the direction).
    agreeing = {"v1": Served(), "v2": Served()}
    agreeing["v1"].add(rng, Traffic(0.3, true_rate=0.45), 3000)
    agreeing["v2"].add(rng, Traffic(0.9, true_rate=0.7), 1500)
    moved = decide(state, agreeing["v1"].stats(), agreeing["v2"].stats(), CONFIG, now=T0 + timedelta(hours=20),
                   labels=labels_of(agreeing))
    assert moved.cause != "labels_disagree_with_ratings" and not moved.stats["evidence"]["disagreement"]["disagree"]


def test_the_disagreement_test_needs_ratings_on_both_sides_and_noise_beyond_its_threshold():
    few = LabeledArm(labels=(0.9, 0.9, 0.9), ratings=(1, None, None))
    many = LabeledArm(labels=(0.2,) * 40, ratings=(1, 0) * 20)
    assert disagreement(few, many) is None  # one rated episode: nothing to compare
    # Opposite signs, but four ratings a side cannot tell: no disagreement.
    a = LabeledArm(labels=(0.4,) * 4, ratings=(1, 1, 0, 1))
    b = LabeledArm(labels=(0.6,) * 4, ratings=(1, 0, 1, 0))
    check = disagreement(a, b)
    assert check is not None and check.ratings_lift < 0 < check.labels_lift and not check.disagree


def test_ppi_is_unbiased_under_a_miscalibrated_labeler():
    """Over 300 seeds: the labeler is overconfident and 12 points too kind; the labels' mean is that far off, the
    prediction-powered estimate is not, and its variance is the variance it shows."""
    errors, variances, label_errors = [], [], []
    for seed in range(300):
        rng = np.random.default_rng(seed)
        z = rng.normal(0.3, 1.5, 2000)
        truth = 1 / (1 + np.exp(-z))
        y = (rng.random(truth.size) < truth).astype(int)
        f = 1 / (1 + np.exp(-(2.0 * z + 1.0)))  # twice too steep, shifted towards good
        rated = rng.random(truth.size) < 0.05
        estimate = ppi_estimate(LabeledArm(labels=tuple(f), ratings=tuple(int(v) if r else None
                                                                          for v, r in zip(y, rated))))
        errors.append(estimate.estimate - truth.mean())
        variances.append(estimate.variance)
        label_errors.append(estimate.labels_rate - truth.mean())
    errors = np.array(errors)
    assert np.mean(label_errors) > 0.08  # the labeler really is miscalibrated
    assert abs(errors.mean()) < 3 * errors.std() / np.sqrt(errors.size) and abs(errors.mean()) < 0.01
    assert errors.var() == pytest.approx(np.mean(variances), rel=0.2)
    assert np.mean(np.abs(errors) <= 1.96 * np.sqrt(variances)) == pytest.approx(0.95, abs=0.04)


def test_every_rated_reduces_to_the_ratings_and_judged_episodes_keep_their_outcome():
    y = (1, 0, 1, 1, 0, 1, 1, 1)
    all_rated = ppi_estimate(LabeledArm(labels=(0.9, 0.1, 0.5, 0.7, 0.3, 0.8, 0.6, 0.99), ratings=y))
    assert all_rated.estimate == pytest.approx(np.mean(y)) and all_rated.ratings_rate == pytest.approx(np.mean(y))
    judged_only = ppi_estimate(LabeledArm(judged=(1, 1, 0, 1)))
    assert judged_only.estimate == pytest.approx(0.75) and judged_only.labels_rate == pytest.approx(0.75)
    mixed = ppi_estimate(LabeledArm(labels=(0.9, 0.1, 0.9, 0.1), ratings=(1, 0, None, None), judged=(0, 0)))
    assert mixed.episodes == 6 and (mixed.rated, mixed.labeled, mixed.judged) == (2, 2, 2)
    assert mixed.estimate == pytest.approx((4 * 0.5 + 2 * 0.0) / 6)
    one_rated = ppi_estimate(LabeledArm(labels=(0.9, 0.1), ratings=(1, None)))
    assert one_rated.estimate is None and one_rated.to_dict()["variance"] is None


def test_the_evidence_line_names_both_lifts_the_counts_and_the_statistic():
    served = served_at_ten_percent()
    state = RolloutState.start("v1", "v2", CONFIG, now=T0)
    decision = decide(state, served["v1"].stats(), served["v2"].stats(), CONFIG, now=T0 + timedelta(hours=40),
                      labels=labels_of(served))
    evidence = decision.stats["evidence"]
    line = evidence_line(evidence)
    assert line == evidence["summary"] and line in decision.message()
    for part in (f"v1: {evidence['champion']['rated']} rated + {evidence['champion']['labeled']} labeled",
                 f"v2: {evidence['challenger']['rated']} rated + {evidence['challenger']['labeled']} labeled",
                 f"ratings {evidence['ratings_lift']:+.3f}", f"labels {evidence['labels_lift']:+.3f}",
                 f"msprt_ppi lift {evidence['test']['lift']:+.3f}"):
        assert part in line


def test_with_labels_the_minimum_samples_count_episodes_and_each_arm_needs_its_rated_ones():
    served = {"v1": Served(), "v2": Served()}
    rng = np.random.default_rng(0)
    served["v1"].add(rng, Traffic(0.5), 1000, rated_share=0.05)
    served["v2"].add(rng, Traffic(0.9), 150, rated_share=0.0)  # plenty of episodes, nobody rated them
    served["v2"].ratings[:5] = [1] * 5
    state = RolloutState.start("v1", "v2", CONFIG, now=T0)
    decision = decide(state, served["v1"].stats(), served["v2"].stats(), CONFIG, now=T0 + timedelta(hours=1),
                      labels=labels_of(served))
    assert decision.cause == "collecting" and "10 rated per arm" in decision.reason and "5 rated" in decision.reason

"""bench/labels.py fits the labeler on the rows curation fits it on (agent_rl/curation/live.py `labeler_fit_rows`), so
its figures are those of the labels the gateway demo trains on, and scores them with the function the demo's
summary uses."""

from __future__ import annotations

from agent_rl.curation.live import held_out, judge_by_feedback, labeler_fit_rows
from agent_rl.feedback.labeler import LabelerConfig
from agent_rl.simulated_users.population import PopulationConfig, simulate
from agent_rl.feedback.signals import episode_signals
from bench.labels import fit_rows, score_week


def test_the_bench_fits_the_labeler_on_curations_rows():
    week = simulate(PopulationConfig(n_episodes=600, rated_share=0.5, seed=6))
    rows = [judge_by_feedback(e.episode.model_dump(mode="json")) for e in week]
    curation = {r["episode_id"] for r in labeler_fit_rows(rows)}
    signals = [episode_signals(r) for r in rows]
    assert {s.episode_id for s in fit_rows(signals, "curation")} == curation
    dropped = {s.episode_id for s in signals} - curation  # held out by id, rated good and rated bad alike
    assert all(s.rated and held_out(s.episode_id) for s in signals if s.episode_id in dropped)
    assert {s.rating > 0 for s in signals if s.episode_id in dropped} == {True, False}
    good_out = {s.episode_id for s in fit_rows(signals, "good-out")}  # the old fit: only the good ones left out
    assert curation < good_out and all(s.rating < 0 for s in signals if s.episode_id in good_out - curation)
    assert fit_rows(signals, "all") == signals


def test_a_week_is_scored_against_the_hidden_truth_on_the_unrated_episodes():
    week = simulate(PopulationConfig(n_episodes=3000, rated_share=0.1, seed=2))
    truth = {e.episode.episode_id: e.satisfied for e in week}
    scores = score_week([episode_signals(e.episode) for e in week], truth, LabelerConfig(), "curation")
    kept = [e for e in week if e.episode.feedback in ("up", "down") and not held_out(e.episode.episode_id)]
    assert scores["rows_ratings_only"] == len(kept)  # the ratings curation's labeler learns from
    assert 0.8 < scores["auc_truth"] < 1 and 0 < scores["ece_truth"] < 0.1
    assert abs(scores["truth_share"] - sum(truth.values()) / len(truth)) < 0.02

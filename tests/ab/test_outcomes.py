"""Pool rows -> per-version A/B counts, including feedback verdicts and the `since` cut."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from agent_rl.ab.outcomes import arm_stats_from_episodes, feedback_verdict
from agent_rl.pool.repository import PoolRepository
from agent_rl.records import Episode, Outcome

START = datetime(2025, 3, 3, 12, tzinfo=timezone.utc)


def row(version: str, outcome: str, minutes: int = 0, latency: float = 100.0, feedback=None) -> dict:
    return {
        "policy_version": version,
        "outcome": outcome,
        "latency_ms": latency,
        "created_at": START + timedelta(minutes=minutes),
        "feedback": feedback,
    }


def test_outcomes_map_to_success_hallucination_and_error():
    rows = [
        row("a", "correct"),
        row("a", "wrong"),
        row("a", "idk"),
        row("a", "format_error"),
        row("a", "ran_out"),
        row("b", "correct", latency=300.0),
    ]
    stats = arm_stats_from_episodes(rows)
    a = stats["a"]
    assert (a.trials, a.successes, a.hallucinations, a.errors) == (5, 1, 1, 2)
    assert stats["b"].successes == 1 and stats["b"].latencies_ms == (300.0,)


def test_each_latency_is_tagged_with_the_step_its_request_began_in():
    """A row is recorded when its episode ends: one that began before an advance and ended after it belongs to the
    step it was routed in."""
    advanced = START + timedelta(minutes=10)
    rows = [
        row("a", "correct", minutes=5),  # began and ended in step 0
        row("a", "correct", minutes=10, latency=60_000.0),  # began a minute before the advance
        row("a", "correct", minutes=12),  # step 1
        row("a", "correct", minutes=-1),  # before the test: not counted
    ]
    stats = arm_stats_from_episodes(rows, since=START, step_starts=[START, advanced])
    assert stats["a"].latency_steps == (0, 0, 1)
    assert arm_stats_from_episodes(rows, since=START)["a"].latency_steps == ()


def test_feedback_verdict_overrides_the_judged_outcome_but_not_errors():
    rows = [
        row("a", "correct", feedback="wrong"),  # user says the answer was wrong: a hallucination
        row("a", "wrong", feedback="thumbs_up"),  # user says it was right after all
        row("a", "idk", feedback='{"verdict": "correct"}'),  # "I don't know" was the right answer
        row("a", "format_error", feedback="good"),  # no answer was given: still an error
        row("a", "correct", feedback="thanks, very fast!"),  # a comment, not a verdict
    ]
    a = arm_stats_from_episodes(rows)["a"]
    assert (a.trials, a.successes, a.hallucinations, a.errors) == (5, 3, 1, 1)


@pytest.mark.parametrize(
    ("feedback", "verdict"),
    [("correct", True), ("Thumbs Down", False), ("+1", True), ("-1", False), ({"rating": 0}, False), (None, None), ("meh", None)],
)
def test_feedback_verdicts(feedback, verdict):
    assert feedback_verdict(feedback) is verdict


def test_since_cut_accepts_naive_utc_and_iso_strings():
    rows = [row("a", "correct", minutes=-5), row("a", "wrong", minutes=0), row("a", "correct", minutes=5)]
    rows[2]["created_at"] = rows[2]["created_at"].isoformat()
    stats = arm_stats_from_episodes(rows, since=START.replace(tzinfo=None))
    assert (stats["a"].trials, stats["a"].successes) == (2, 1)


def test_bad_rows_name_the_row_and_field():
    with pytest.raises(ValueError, match="row 1: missing 'outcome'"):
        arm_stats_from_episodes([row("a", "correct"), {"policy_version": "a", "created_at": START}])
    with pytest.raises(ValueError, match="row 0: unknown outcome 'maybe'"):
        arm_stats_from_episodes([row("a", "maybe")])
    with pytest.raises(ValueError, match="not an ISO datetime"):
        arm_stats_from_episodes([{**row("a", "correct"), "created_at": "yesterday"}], since=START)


def test_counts_from_a_real_pool_export(sqlite_url):
    pool = PoolRepository(sqlite_url)
    outcomes = [Outcome.CORRECT] * 6 + [Outcome.WRONG] * 3 + [Outcome.RAN_OUT]
    episodes = [
        Episode(inbox_id="x@y", question="q", policy_version=version, outcome=outcome, latency_ms=50.0 * i,
                created_at=START + timedelta(minutes=i))
        for i, outcome in enumerate(outcomes)
        for version in ("champion-1", "challenger-2")
    ]
    pool.insert_episodes(episodes)
    pool.record_feedback(episodes[1].episode_id, "wrong")  # challenger's first correct answer, overruled
    exported = [e for page in pool.iter_export(start=START) for e in page.episodes]
    stats = arm_stats_from_episodes(exported, since=START + timedelta(minutes=1))
    assert (stats["champion-1"].trials, stats["champion-1"].successes, stats["champion-1"].hallucinations) == (9, 5, 3)
    assert stats["challenger-2"].errors == 1 and stats["challenger-2"].successes == 5
    # the same rows as plain dicts give the same counts
    assert arm_stats_from_episodes([e.model_dump() for e in exported], since=START + timedelta(minutes=1)) == stats
    pool.close()

"""Turn benchmark-pool rows into per-version A/B counts (success, hallucination, error, latency).

Scoring rules, in order:
- error: outcome `format_error` or `ran_out` (the agent produced no usable answer). Errors are
  never successes, whatever the feedback says.
- success: the user's feedback verdict when it is a recognizable one (live traffic has no golden
  answer, so a human verdict is the best ground truth), else outcome == "correct".
- hallucination: a confident wrong answer: outcome "wrong" without a positive verdict, or outcome
  "correct" overruled by a negative verdict. "I don't know" is never a hallucination.
- unjudged (live gateway traffic, nobody scored it): counts only with a verdict (success or failure,
  never a hallucination: whether it answered at all is unknown); without one it is no trial at all.
Feedback text that is not a verdict (a free comment) is ignored.

`labeled_arms_from_episodes` gives the label-aware test (evidence.py) the same episodes with a labeler's
probability on every unjudged one, rated or not: the unjudged are the episodes users could rate; the others keep
their outcome by the rules above.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from agent_rl.ab.evidence import LabeledArm
from agent_rl.ab.stats import ArmStats
from agent_rl.records import Episode
from agent_rl.utc import as_utc, parse_utc

POSITIVE_VERDICTS = frozenset({"correct", "right", "good", "up", "thumbs_up", "+1", "positive", "yes", "true", "1"})
NEGATIVE_VERDICTS = frozenset({"wrong", "incorrect", "bad", "down", "thumbs_down", "-1", "negative", "no", "false", "0"})
ERROR_OUTCOMES = frozenset({"format_error", "ran_out"})
UNJUDGED = "unjudged"
KNOWN_OUTCOMES = frozenset({"correct", "wrong", "idk", UNJUDGED}) | ERROR_OUTCOMES


def feedback_verdict(feedback: Any) -> bool | None:
    """True / False for a recognizable verdict, None for no feedback or a free comment.
    Accepts plain words ("correct", "thumbs_down", "+1"), booleans, or JSON like {"verdict": "wrong"}."""
    if feedback is None:
        return None
    if isinstance(feedback, bool):
        return feedback
    if isinstance(feedback, Mapping):
        for key in ("verdict", "correct", "rating", "label"):
            if key in feedback:
                return feedback_verdict(feedback[key])
        return None
    if isinstance(feedback, (int, float)):
        return feedback > 0
    text = str(feedback).strip()
    if text.startswith("{"):
        try:
            return feedback_verdict(json.loads(text))
        except json.JSONDecodeError:
            return None
    word = text.lower().replace(" ", "_").replace("-", "_") if text not in {"+1", "-1"} else text
    if word in POSITIVE_VERDICTS:
        return True
    if word in NEGATIVE_VERDICTS:
        return False
    return None


def _checked_rows(episodes: Iterable[Mapping[str, Any] | Episode], since: datetime | None
                  ) -> Iterator[tuple[Mapping[str, Any] | Episode, Mapping[str, Any], str, datetime]]:
    """Each episode created at or after `since` as (the item, its row as a mapping, its outcome's name, when it
    was recorded in UTC); a
    ValueError naming the row for one without policy_version, outcome or created_at, or with an unknown outcome."""
    since_utc = parse_utc(since, "since") if since is not None else None
    for index, item in enumerate(episodes):
        row = item.model_dump() if isinstance(item, Episode) else item
        for key in ("policy_version", "outcome", "created_at"):
            if key not in row or row[key] is None:
                raise ValueError(f"episode row {index}: missing {key!r}")
        created = parse_utc(row["created_at"], f"episode row {index}: created_at")
        if since_utc is not None and created < since_utc:
            continue
        outcome = str(getattr(row["outcome"], "value", row["outcome"]))
        if outcome not in KNOWN_OUTCOMES:
            raise ValueError(
                f"episode row {index}: unknown outcome {outcome!r}; expected one of {sorted(KNOWN_OUTCOMES)}"
            )
        yield item, row, outcome, created


def arm_stats_from_episodes(
    episodes: Iterable[Mapping[str, Any] | Episode], since: datetime | None = None,
    step_starts: Sequence[datetime] = (),
) -> dict[str, ArmStats]:
    """Counts per policy_version over pool rows created at or after `since` (naive = UTC).

    Rows are dicts (or mappings, e.g. SQLAlchemy row mappings) with policy_version, outcome,
    latency_ms, created_at and feedback, or `Episode` records as the pool's export returns
    them; other keys are ignored. `step_starts`: when each rollout step began, oldest first; each latency is
    then tagged with the step its request was routed in (a row is recorded when its episode ends, so the
    request began `latency_ms` before `created_at`)."""
    starts = sorted(as_utc(start) for start in step_starts)
    tallies: dict[str, dict[str, Any]] = {}
    for _, row, outcome, created in _checked_rows(episodes, since):
        verdict = feedback_verdict(row.get("feedback"))
        if outcome == UNJUDGED and verdict is None:
            continue  # no evidence either way
        tally = tallies.setdefault(
            str(row["policy_version"]),
            {"successes": 0, "trials": 0, "hallucinations": 0, "errors": 0, "lat": [], "steps": []},
        )
        tally["trials"] += 1
        latency = row.get("latency_ms")
        if latency is not None:
            tally["lat"].append(float(latency))
            if starts:
                began = created - timedelta(milliseconds=float(latency))
                tally["steps"].append(max(bisect_right(starts, began) - 1, 0))
        if outcome in ERROR_OUTCOMES:
            tally["errors"] += 1
            continue
        success = (outcome == "correct") if verdict is None else verdict
        if success:
            tally["successes"] += 1
        elif outcome in {"correct", "wrong"}:
            tally["hallucinations"] += 1
    return {
        version: ArmStats(
            successes=t["successes"],
            trials=t["trials"],
            hallucinations=t["hallucinations"],
            errors=t["errors"],
            latencies_ms=tuple(t["lat"]),
            latency_steps=tuple(t["steps"]),
        )
        for version, t in tallies.items()
    }


def labeled_arms_from_episodes(
    episodes: Iterable[Mapping[str, Any] | Episode],
    score: Callable[[list[Mapping[str, Any] | Episode]], Sequence[float]],
    since: datetime | None = None,
) -> dict[str, LabeledArm]:
    """Per policy_version, the episodes created at or after `since` as the label-aware test reads them: every
    unjudged episode with `score`'s probability of a good outcome (one call, all versions' unjudged episodes in
    order) and its rating (the verdict, or None), every other one with its outcome by the module's rules (an error
    is a failure, a verdict overrules the judgment)."""
    ratable: list[tuple[str, Mapping[str, Any] | Episode, int | None]] = []
    judged: dict[str, list[int]] = {}
    versions: dict[str, None] = {}
    for item, row, outcome, _ in _checked_rows(episodes, since):
        version = str(row["policy_version"])
        versions[version] = None
        verdict = feedback_verdict(row.get("feedback"))
        if outcome == UNJUDGED:
            ratable.append((version, item, None if verdict is None else int(verdict)))
        elif outcome in ERROR_OUTCOMES:
            judged.setdefault(version, []).append(0)
        else:
            judged.setdefault(version, []).append(int((outcome == "correct") if verdict is None else verdict))
    probabilities = list(score([item for _, item, _ in ratable])) if ratable else []
    if len(probabilities) != len(ratable):
        raise ValueError(f"score gave {len(probabilities)} probabilities for {len(ratable)} unjudged episodes")
    labels: dict[str, list[float]] = {}
    ratings: dict[str, list[int | None]] = {}
    for (version, _, rating), probability in zip(ratable, probabilities):
        labels.setdefault(version, []).append(float(probability))
        ratings.setdefault(version, []).append(rating)
    return {version: LabeledArm(labels=tuple(labels.get(version, ())), ratings=tuple(ratings.get(version, ())),
                                judged=tuple(judged.get(version, ())))
            for version in versions}

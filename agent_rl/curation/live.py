"""Live episodes from the gateway: traffic of an agent that is no plug-in of ours, judged only by its users.

The gateway stores such an episode `unjudged` with no reward (environment "gateway"). Curation turns the
feedback users sent on it (`POST /v1/feedback`) into its outcome here, and nothing else: a thumbs-up (or a
positive reward) makes it correct, a thumbs-down (or a reward <= 0) wrong, and an episode nobody rated stays
unjudged, so it is clean data that never becomes an SFT positive (unless the week's labeler, checked against the
ratings, labels it). A fixed share of the good episodes, chosen by a hash of the episode id, is held out: SFT
never sees it and validation replays it (evaluate/replay.py). GRPO needs tools it can run itself; a gateway
agent's tools run in the client, so the loop skips GRPO for these episodes and registers the SFT model.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from typing import Any

from agent_rl.agent.tool_calls import call_name
from agent_rl.environments.core import UNCATEGORIZED
from agent_rl.environments.registry import capabilities_of
from agent_rl.feedback.ratings import feedback_reward
from agent_rl.records import Outcome

# Rewards a user may send as feedback ({"reward": x} or a bare number); outside it the episode is quarantined.
REWARD_RANGE = (-1.0, 1.0)
DEFAULT_HELD_OUT_SHARE = 0.2
FEEDBACK = "feedback"  # the reward component of an outcome its users' feedback gave
NO_WORLD = "gateway episodes bring no world: the client runs the tools"
NO_TASKS = "gateway episodes bring no tasks: validation replays held-out episodes judged good"
NO_WORLD_TO_ANONYMIZE = "no world: the client runs the tools; validation replays the good ones held out"
GRPO_SKIPPED = ("GRPO skipped: the episodes come from the gateway (environment 'gateway'), whose tools run in the "
                "client, so there is no environment for GRPO to roll out in; the SFT model is the candidate")


def judged_by_users(environment: str | None) -> bool:
    """Whether the episodes of `environment` (a name as episodes carry it) are judged by their users' feedback: the
    class's declared capabilities say (environments/gateway), not its name."""
    return capabilities_of(environment).judged_by_users


def row_judged_by_users(row: Mapping[str, Any]) -> bool:
    """Whether an episode row's outcome comes from its users (its environment's capabilities): what curation's
    passes over users' ratings (labels, tenant agreement) keep."""
    return judged_by_users(row.get("environment"))


def check_feedback(verdict: str) -> str:
    """A feedback verdict the loop can use, else ValueError saying what it accepts: a verdict word ('up', 'down',
    'correct', ...), a JSON verdict, or a finite reward in REWARD_RANGE (bare or as {"reward": x}). Refused at the
    API so a typo or an out-of-range number is not stored to be quarantined (or counted as unrated) without a word."""
    low, high = REWARD_RANGE
    accepted = f"a verdict such as 'up' or 'down', or a reward between {low:g} and {high:g}"
    reward = feedback_reward(verdict)
    if reward is None:
        raise ValueError(f"is not a verdict: use {accepted}")
    if not math.isfinite(reward) or not low <= reward <= high:
        raise ValueError(f"is out of range: use {accepted}")
    return verdict


def judge_by_feedback(row: Mapping[str, Any]) -> dict[str, Any]:
    """A gateway episode with its users' feedback as outcome and reward (other episodes are returned as they are).

    The category defaults to 'uncategorized' so balancing and the diversity gate see every episode."""
    out = dict(row)
    if not judged_by_users(out.get("environment")):
        return out
    out["task_category"] = out.get("task_category") or UNCATEGORIZED
    if str(out.get("outcome") or Outcome.UNJUDGED.value) != Outcome.UNJUDGED.value:
        return out  # a verdict was already given (by a judge the caller declared)
    reward = feedback_reward(out.get("feedback"))
    if reward is None:
        return out
    out["reward"] = reward
    out["outcome"] = (Outcome.CORRECT if math.isfinite(reward) and reward > 0 else Outcome.WRONG).value
    out["reward_components"] = {FEEDBACK: reward}
    return out


def live_validation_config(rows: Iterable[Mapping[str, Any]], **overrides: Any):
    """The validation suite's settings for gateway episodes: the categories they carry, the tools their clients
    declared, feedback rewards in REWARD_RANGE, and no reward required (unrated episodes are clean, not positives)."""
    from agent_rl.curation.validate import ValidationConfig

    categories: dict[str, None] = {UNCATEGORIZED: None}
    tools: dict[str, None] = {}
    environments: dict[str, None] = {}  # those of its rows' environments judged by users; any other is refused
    for row in rows:
        if row_judged_by_users(row):
            environments[str(row["environment"]).strip()] = None
        if row.get("task_category"):
            categories[str(row["task_category"])] = None
        for schema in row.get("tools") or []:
            name = call_name(schema)  # a tool schema nests its name as a call does
            if name:
                tools[name] = None
    # The client ends an episode where it likes (its final tool, an end call): a last call may stay unanswered.
    settings = {"categories": tuple(categories), "tools": tuple(tools), "final_tools": tuple(tools),
                "environments": tuple(environments),
                "require_reward": False, "require_answer_when_correct": False,
                "reward_min": REWARD_RANGE[0], "reward_max": REWARD_RANGE[1]}
    return ValidationConfig(**{**settings, **overrides})


def held_out(episode_id: str, share: float = DEFAULT_HELD_OUT_SHARE) -> bool:
    """Whether a live episode is kept for validation (never trained on): a stable hash of its id, so re-runs and
    later weeks agree."""
    if not 0 <= share < 1:
        raise ValueError(f"held-out share must be in [0, 1), got {share}")
    digest = hashlib.sha256(f"live-held-out:{episode_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def is_rated_good(row: Mapping[str, Any]) -> bool:
    """Correct by its users' feedback (a label the labeler gave is no rating)."""
    return str(row.get("outcome")) == Outcome.CORRECT.value and LABELER not in (row.get("reward_components") or {})


def is_labeled_good(row: Mapping[str, Any]) -> bool:
    """Labeled good by the week's labeler (only a labeler that passed its check labels): nobody rated it."""
    return str(row.get("outcome")) == Outcome.CORRECT.value and LABELER in (row.get("reward_components") or {})


LABELER = "labeler"  # the reward component of an outcome the labeler gave (its probability that users were happy)


def labeler_fit_rows(live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The episodes a week's labeler learns from: every one but the rated episodes whose id validation's hash
    holds out, rated good or not, so the ratings it fits on are a sample of all, not one short of good ratings."""
    return [r for r in live if not (r.get("feedback") is not None and held_out(str(r.get("episode_id"))))]


def label_unrated(rows: list[dict[str, Any]], config: Any) -> tuple[list[dict[str, Any]], Any]:
    """The rows with the labeler's confident labels on the gateway episodes nobody rated, and its report.

    The labeler (agent_rl/feedback/labeler.py) learns from the rated episodes, leaving out those whose id the
    validation hash holds out, rated good or not (the rated-good ones among them are validation's and stay unseen;
    leaving out only those would fit the labeler on a sample with a fifth of its good ratings missing, and its
    probabilities would come out ~0.03 too low, ECE +0.02 against the hidden truth: docs/experiments.md
    2026-11-29), and checks itself on them out of fold: when the check fails no row is
    labeled and the report says why; the week trains on ratings alone. A labeled episode gets the outcome, a reward
    of +1 or -1 as a rating would, and its probability as the `labeler` reward component, so every later step
    (and a reader of the episode) can tell a label from a rating.

    `config` is a `LabelerConfig`, or a labeler of its own with `label(episodes) -> LabelingResult`, such as a
    model judge (agent_rl/feedback/judge_agreement.py `JudgeLabeler`: same thresholds, same check on the ratings),
    or the judge as one signal of the signals labeler (`JudgeAndSignalsLabeler`)."""
    live = [r for r in rows if row_judged_by_users(r)]
    fit_on = labeler_fit_rows(live)
    by_tenant: dict[str, list[dict[str, Any]]] = {}
    for row in fit_on:
        by_tenant.setdefault(str(row.get("tenant") or "default"), []).append(row)
    # Each tenant's unrated traffic is labeled from that tenant's own ratings, checked on them: one tenant's ratings
    # (honest or not) never decide another tenant's labels (curation/tenants.py).
    results = {tenant: _label_with(config, tenant_rows) for tenant, tenant_rows in sorted(by_tenant.items())}
    report = _combined_report(results) if len(results) > 1 else next(iter(results.values())).report if results \
        else _label_with(config, []).report
    labels = {label.episode_id: label for result in results.values() for label in result.labels}
    out = []
    for row in rows:
        label = labels.get(str(row.get("episode_id")))
        if label is not None and str(row.get("outcome") or Outcome.UNJUDGED.value) == Outcome.UNJUDGED.value:
            reward = 1.0 if label.good else -1.0
            row = {**row, "outcome": (Outcome.CORRECT if label.good else Outcome.WRONG).value, "reward": reward,
                   "reward_components": {LABELER: round(label.probability, 4)}}
        out.append(row)
    return out, report


def _label_with(config: Any, rows: list[dict[str, Any]]):
    from agent_rl.feedback.labeler import label_episodes

    return config.label(rows) if callable(getattr(config, "label", None)) else label_episodes(rows, config)


def _combined_report(results: dict[str, Any]):
    """One report for a week of several tenants: counts summed, passed when any tenant's labeler passed its own
    check (the others train on their ratings alone), AUC and ECE of the tenant with the most ratings, and each
    tenant's own report in `per_tenant`."""
    from dataclasses import replace

    reports = {tenant: result.report for tenant, result in results.items()}
    largest = max(reports.values(), key=lambda r: r.n_rated)
    failed = [f"{tenant}: {r.reason}" for tenant, r in reports.items() if not r.passed]
    return replace(
        largest, n_rated=sum(r.n_rated for r in reports.values()),
        n_rated_good=sum(r.n_rated_good for r in reports.values()),
        n_unrated=sum(r.n_unrated for r in reports.values()), n_labeled=sum(r.n_labeled for r in reports.values()),
        n_labeled_good=sum(r.n_labeled_good for r in reports.values()),
        passed=any(r.passed for r in reports.values()), reason="; ".join(failed),
        per_tenant={tenant: {"n_rated": r.n_rated, "n_labeled": r.n_labeled, "passed": r.passed,
                             "auc": r.auc, "ece": r.ece, "reason": r.reason} for tenant, r in reports.items()})


def split_live(rows: Iterable[Mapping[str, Any]], share: float = DEFAULT_HELD_OUT_SHARE
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(trainable, held-out) gateway episodes; held out are the good ones (rated, or labeled by a labeler that
    passed its check) whose id the hash keeps for validation, never trained on.

    Why labeled episodes are held out too: replay validation asks whether a model takes the kind of action the
    approved agent took (evaluate/replay.py), which a wrong label barely changes (a mislabeled episode was played
    by the same agent), while a week's ~5% of rating users leave it some 30 rated-good episodes to hold out: a bound
    of about +-3 points, wider than most of a 5-point non-inferiority margin. The replay reads rated episodes
    first and fills its sample with labeled ones; the answer check reads rated ones only."""
    train, test = [], []
    for row in rows:
        good = is_rated_good(row) or is_labeled_good(row)
        (test if good and held_out(str(row.get("episode_id")), share) else train).append(dict(row))
    return train, test

"""Does a tenant rate as the week's other evidence says its users felt? A check per tenant, and what a "no" costs.

The share cap (tenants.py) bounds how much one tenant sets; it does not tell an honest tenant from one that rates its
own wrong answers "up". What the literature on learning from many annotators does without gold labels is to measure
each annotator against evidence that annotator does not control: Dawid & Skene (1979) estimate each one's error
rates from agreement with the others; Raykar et al. (2010, "Learning from Crowds") and CROWDLAB (Goh et al. 2022)
do it when annotators rarely label the same item, by learning from item features what the others' labels say and
scoring each annotator against that; Raykar & Yu (2012, "Eliminating Spammers and Ranking Annotators") remove the
annotators whose labels do not follow the evidence, and Paudice et al. (2018, "Label Sanitization against Label
Flipping Poisoning Attacks") distrust labels their neighbours in feature space contradict. The RLHF poisoning work
(Baumgärtner et al. 2024, "Best-of-Venom"; PoisonBench 2025; tenants.py's citations) finds 1-5% of poisoned
preferences enough to move a model, so a source found disagreeing is dropped, not down-weighted. All of these
assume most of the evidence is honest: a poisoner whose ratings are most of the other tenants' can make an honest
tenant look like the odd one out, which is why a flag here costs a tenant only its ratings, never the week.

Here each tenant's episodes are rated by its own users, so no two tenants rate the same episode. The evidence a
tenant does not control is its episodes' implicit signals (feedback/signals.py), read by:
- the labeler (feedback/labeler.py) fitted on the OTHER tenants' ratings (leave one tenant out), when they hold at
  least `labeler_min_per_class` ratings of each kind: its probability that a user was satisfied; the others' own
  rated episodes are scored out of fold, so neither side is scored by a model that saw it;
- else the fixed reading of the signals, the same for every environment: thanks and follow-ups count for the
  user's satisfaction, corrections, complaints, re-asks, tool errors, the agent giving up and abandonment against.
  (Needed: in the issue's attack the honest tenant's 30 ratings are all "up", too few and of one kind to fit on.)

The statistic: T's episodes rated "up" against the other tenants' episodes rated "up", by that score. If T rates as
the others do, a random one of its "up" episodes shows less satisfaction than a random one of theirs half the time;
`effect` is that share (ties count half), and the one-sided Mann-Whitney U test (the rank test of exactly this
share) gives its p-value. A rank test needs no calibrated probability (the fixed reading has none) and compares like
with like: an honest tenant whose agent is worse has fewer "up" ratings, not "up" ratings that look like the
others' "down". A tenant is flagged when p < `alpha` and the effect is at least 0.5 + `min_effect`: significance
alone would flag a large honest tenant whose users merely thank a little less, or whose many unhappy users' rare
mis-clicks make a few of its "up" look bad (simulated users: an honest tenant whose agent satisfies 10% of its users,
next to one at 85%, reached an effect of 0.67-0.68 at p < 0.005 in 2 of 8 weeks; the issue's flood 0.84 on the fixed
reading, 0.84-0.89 against a labeler; hence `min_effect` 0.2). Only "up" is tested because only "up" reaches training: an "up" episode
becomes an SFT row and may be held out for validation, while a "down" one leaves the tenant's own episode out and
fits only its own labeler (curation/live.py). A direction of "down" ratings was tried and dropped: an honest tenant
with a good agent has more of its "down" ratings from mis-clicks, which read as disagreement (1 in 8 seeds flagged).
Tenants with fewer than `min_rated` ratings, or with too few "up" on either side, are "not checked", with the reason.

What a flagged tenant gets (`distrust`): its gateway episodes lose their ratings for this week (outcome unjudged,
no reward, no feedback), so they leave the SFT rows and the held-out replay set and fit no labeler (labels are per
tenant: its unrated traffic stays unlabeled); the episodes stay in the week as clean unjudged data, and the pool
keeps what the tenant sent. Nothing else of the week changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from agent_rl.curation.live import FEEDBACK, row_judged_by_users
from agent_rl.feedback.signals import Signals, episode_signals
from agent_rl.records import Outcome

AGREES, DISAGREES, NOT_CHECKED = "agrees", "disagrees", "not checked"
FIXED_READING = "implicit signals, fixed reading"
_FOR = ("thanks", "follow_ups")
_AGAINST = ("corrections", "complaints", "reasks", "tool_errors", "agent_gave_up", "abandoned")


@dataclass(frozen=True)
class AgreementConfig:
    """`min_rated`: a tenant's ratings before it is checked; `min_up`: "up" ratings on each side before they are
    compared; `labeler_min_per_class`: the other tenants' ratings of each kind before a labeler is fitted on them
    (the week's labeler wants as many); `alpha`: the false-flag rate per honest tenant; `min_effect`: how far past
    0.5 the effect must be as well."""

    min_rated: int = 20
    min_up: int = 10
    labeler_min_per_class: int = 20
    alpha: float = 0.01
    min_effect: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if not 0 <= self.min_effect < 0.5:
            raise ValueError(f"min_effect must be in [0, 0.5), got {self.min_effect}")
        if self.min_rated < 1 or self.min_up < 1 or self.labeler_min_per_class < 5:
            raise ValueError("min_rated and min_up must be >= 1, labeler_min_per_class >= 5 (the labeler's folds)")


@dataclass(frozen=True)
class TenantAgreement:
    """One tenant's check: `effect` the share of (its, another tenant's) pairs of "up" episodes where its own shows
    less satisfaction (0.5: it rates as the others do), `p` the one-sided p-value (None when not checked)."""

    tenant: str
    n_rated: int
    n_up: int
    n_up_others: int
    status: str  # AGREES, DISAGREES or NOT_CHECKED
    evidence: str  # what scored the episodes ("" when not checked)
    effect: float | None
    p: float | None
    reason: str  # why not checked, or how far it disagrees

    @property
    def flagged(self) -> bool:
        return self.status == DISAGREES


@dataclass(frozen=True)
class AgreementReport:
    tenants: tuple[TenantAgreement, ...]
    config: AgreementConfig

    @property
    def flagged(self) -> list[str]:
        return [t.tenant for t in self.tenants if t.flagged]

    def table(self) -> list[dict[str, Any]]:
        """One row per tenant for a metadata table."""
        return [{"tenant": t.tenant, "rated": t.n_rated, "up": t.n_up, "up_elsewhere": t.n_up_others,
                 "status": t.status, "effect": "-" if t.effect is None else f"{t.effect:.3f}",
                 "p": "-" if t.p is None else f"{t.p:.3g}", "evidence": t.evidence or "-", "reason": t.reason or "-"}
                for t in self.tenants]

    def to_metadata(self) -> dict[str, Any]:
        return {"flagged": self.flagged, "tenants": [asdict(t) for t in self.tenants], "config": asdict(self.config)}


def fixed_reading(s: Signals) -> float:
    """The signals' own say on a user's satisfaction, the same for every environment (module docstring)."""
    return float(sum(getattr(s, n) for n in _FOR) - sum(float(getattr(s, n)) for n in _AGAINST))


def _tenant(row: Mapping[str, Any]) -> str:
    return str(row.get("tenant") or "default")


def _up(signals: Sequence[Signals]) -> np.ndarray:
    return np.array([(s.rating or 0) > 0 for s in signals], dtype=bool)


def _scores(mine: list[Signals], others: list[Signals], names: str, config: AgreementConfig
            ) -> tuple[str, np.ndarray, np.ndarray]:  # fmt: skip
    """(evidence, this tenant's scores, the other tenants' scores): the out-of-tenant labeler when the others'
    ratings can fit it (theirs out of fold), else the fixed reading."""
    n_good = int(_up(others).sum())
    if min(n_good, len(others) - n_good) >= config.labeler_min_per_class:
        from agent_rl.feedback.labeler import LabelerConfig, fitted_scores

        theirs, own = fitted_scores(others, mine, LabelerConfig(seed=config.seed))
        return f"labeler fitted on {len(others)} ratings of {names}", own, theirs
    return FIXED_READING, np.array([fixed_reading(s) for s in mine]), np.array([fixed_reading(s) for s in others])


def _check(tenant: str, rated: dict[str, list[Signals]], config: AgreementConfig) -> TenantAgreement:
    from scipy.stats import mannwhitneyu

    mine = rated[tenant]
    others = [s for t, signals in rated.items() if t != tenant for s in signals]
    n_up, n_up_others = int(_up(mine).sum()), int(_up(others).sum()) if others else 0
    counts = (tenant, len(mine), n_up, n_up_others)
    if len(mine) < config.min_rated:
        return TenantAgreement(*counts, NOT_CHECKED, "", None, None,
                               f"too few ratings: {len(mine)} < {config.min_rated}")
    if not others:
        return TenantAgreement(*counts, NOT_CHECKED, "", None, None,
                               "no other tenant rated episodes this week: nothing to compare with")
    if min(n_up, n_up_others) < config.min_up:
        return TenantAgreement(*counts, NOT_CHECKED, "", None, None,
                               f"too few 'up' ratings to compare: {n_up} here, {n_up_others} from the other "
                               f"tenants (< {config.min_up})")
    evidence, own, theirs = _scores(mine, others, ", ".join(sorted(t for t in rated if t != tenant)), config)
    # U counts the pairs where this tenant's "up" episode shows more satisfaction (ties half): effect = 1 - U / pairs.
    u, p = mannwhitneyu(own[_up(mine)], theirs[_up(others)], alternative="less", method="asymptotic")
    effect = 1 - float(u) / (n_up * n_up_others)
    p = float(p) if np.isfinite(p) else 1.0  # every score tied: no evidence either way
    if p < config.alpha and effect >= 0.5 + config.min_effect:
        return TenantAgreement(*counts, DISAGREES, evidence, round(effect, 4), p,
                               f"its 'up' episodes show less satisfaction than the other tenants' in {effect:.0%} of "
                               f"pairs (p={p:.2g} < {config.alpha:g})")
    return TenantAgreement(*counts, AGREES, evidence, round(effect, 4), p, "")


def check_tenant_agreement(rows: Iterable[Mapping[str, Any]], config: AgreementConfig = AgreementConfig()
                           ) -> AgreementReport:  # fmt: skip
    """Each tenant's "up" ratings of its gateway episodes against the evidence it does not control (module
    docstring)."""
    rated: dict[str, list[Signals]] = {}
    for row in rows:
        if row_judged_by_users(row):
            signals = episode_signals(row)
            if signals.rated:
                rated.setdefault(_tenant(row), []).append(signals)
    return AgreementReport(tuple(_check(tenant, rated, config) for tenant in sorted(rated)), config)


def distrust(rows: Sequence[Mapping[str, Any]], tenants: Iterable[str]) -> tuple[list[dict[str, Any]], int]:
    """The rows with the named tenants' gateway episodes stripped of their ratings (module docstring), and how many
    ratings that dropped. An episode a judge the caller declared scored keeps that verdict (it is no rating)."""
    distrusted = set(tenants)
    out, dropped = [], 0
    for row in rows:
        row = dict(row)
        if (_tenant(row) in distrusted and row_judged_by_users(row) and row.get("feedback") is not None
                and (FEEDBACK in (row.get("reward_components") or {})
                     or str(row.get("outcome") or Outcome.UNJUDGED.value) == Outcome.UNJUDGED.value)):
            row.update(outcome=Outcome.UNJUDGED.value, reward=None, feedback=None)
            row.pop("reward_components", None)
            dropped += 1
        out.append(row)
    return out, dropped


def check_week(rows: Sequence[Mapping[str, Any]], config: AgreementConfig = AgreementConfig(), *,
               distrust_flagged: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """A gateway week's rows after the check (the flagged tenants' ratings dropped when `distrust_flagged`), and the
    check's report for curation's files: each tenant's result, the flagged ones, what was done to them."""
    report = check_tenant_agreement(rows, config)
    out, dropped = distrust(rows, report.flagged) if distrust_flagged else ([dict(r) for r in rows], 0)
    return out, {**report.to_metadata(), "table": report.table(), "distrusted": distrust_flagged and bool(
        report.flagged), "ratings_dropped": dropped}


def summary(report: Mapping[str, Any]) -> str:
    """One line for a person: the flagged tenants with their statistic and what they got, or that none was."""
    tenants = report.get("tenants") or []
    flagged = [t for t in tenants if t["status"] == DISAGREES]
    unchecked = [f"{t['tenant']} ({t['reason']})" for t in tenants if t["status"] == NOT_CHECKED]
    tail = f"; not checked: {', '.join(unchecked)}" if unchecked else ""
    if not flagged:
        checked = len(tenants) - len(unchecked)
        return f"{checked} tenant(s) checked, none disagrees{tail}" if tenants else "no tenant rated an episode"
    done = (f"their {report.get('ratings_dropped', 0)} ratings dropped for the week: out of the SFT rows and the "
            "held-out set, no labeler fitted on them" if report.get("distrusted") else
            "ratings kept (distrust_disagreeing_tenants is off)")
    named = "; ".join(f"{t['tenant']}: effect {t['effect']:.2f}, p={t['p']:.2g} ({t['evidence']})" for t in flagged)
    return f"ratings disagree with the week's other evidence: {named}; {done}{tail}"

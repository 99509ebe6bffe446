"""The week's labeler kept for the A/B test that follows: the models `label_unrated` fitted, refitted identically.

`label_unrated` (curation/live.py) fits each tenant's labeler on that tenant's rated gateway episodes (the rated-good
ones held out for validation left out), checks it out of fold and labels the rest, but keeps no model. The A/B test
of the challenger this week trains wants that labeler, frozen (agent_rl/feedback/frozen.py). This module refits it
on exactly the rows `label_unrated` learned from (same selection, same estimator, same configuration: a
deterministic fit, so the same model), takes the check's verdict from `label_unrated`'s report rather than running
it again, and changes nothing in curation's rows or report. Only the signals labeler is frozen; a model judge's
labeler (`JudgeLabeler`, `JudgeAndSignalsLabeler`) is not (None), and the A/B test then reads ratings alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import numpy as np

from agent_rl.curation.live import labeler_fit_rows, row_judged_by_users
from agent_rl.feedback.frozen import FrozenLabeler, features
from agent_rl.feedback.labeler import LabelerConfig, LabelerReport
from agent_rl.feedback.signals import episode_signals
from agent_rl.utc import parse_utc


def _created_at(row: Mapping[str, Any]) -> datetime | None:
    value = row.get("created_at")
    return parse_utc(value, "episode created_at") if isinstance(value, str | datetime) else None


def _checks(report: LabelerReport, tenants: list[str]) -> dict[str, dict[str, Any]]:
    """Each tenant's check as `label_unrated` reported it (a single tenant's report is the week's)."""
    if report.per_tenant:
        return {tenant: dict(check) for tenant, check in report.per_tenant.items()}
    only = {"n_rated": report.n_rated, "passed": report.passed, "auc": report.auc, "ece": report.ece,
            "ece_excess": report.ece_excess, "reason": report.reason}
    return {tenant: dict(only) for tenant in tenants}


def freeze_week_labeler(rows: list[Mapping[str, Any]], config: Any, report: LabelerReport,
                        week: str | None = None) -> FrozenLabeler | None:
    """The labeler `label_unrated(rows, config)` fitted, with `report` its report. `rows` are the rows given to
    `label_unrated` (after `judge_by_feedback`, before labeling). None when `config` is not the signals labeler's
    `LabelerConfig` (a model judge)."""
    if not isinstance(config, LabelerConfig):
        return None
    from agent_rl.feedback.labeler import _estimator  # the labeler's own estimator: the same model as curation's

    live = [r for r in rows if row_judged_by_users(r)]
    fit_on = labeler_fit_rows(live)
    by_tenant: dict[str, list[Mapping[str, Any]]] = {}
    for row in fit_on:
        by_tenant.setdefault(str(row.get("tenant") or "default"), []).append(row)
    checks = _checks(report, sorted(by_tenant))
    models: dict[str, Any] = {}
    base_rates: dict[str, float] = {}
    through: datetime | None = None
    all_y: list[int] = []
    for tenant, tenant_rows in sorted(by_tenant.items()):
        signals = [episode_signals(r) for r in tenant_rows]
        rated = [(s, r) for s, r in zip(signals, tenant_rows) if s.rated]
        if not rated:
            continue
        y = np.array([1 if (s.rating or 0) > 0 else 0 for s, _ in rated], dtype=int)
        all_y.extend(y.tolist())
        base_rates[tenant] = float(y.mean())
        dates = [d for _, r in rated if (d := _created_at(r)) is not None]
        if dates:
            through = max([through, *dates]) if through else max(dates)
        if checks.get(tenant, {}).get("passed") and 0 < y.sum() < len(y):
            models[tenant] = _estimator(config).fit(features([s for s, _ in rated]), y)
    if all_y:
        base_rates[""] = float(np.mean(all_y))
    passed = bool(report.passed and models)
    reason = "" if passed else (report.reason or "no tenant's labeler could be fitted")
    return FrozenLabeler(models=models, base_rates=base_rates, passed=passed, reason=reason, checks=checks,
                         fitted_through=through, week=week)

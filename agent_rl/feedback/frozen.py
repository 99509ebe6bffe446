"""The labeler frozen for an A/B test: the week's fitted labeler, saved by curation, copied when a test starts.

Curation's labeler (labeler.py, run per tenant by curation/live.py `label_unrated`) fits a classifier on the
week's ratings, checks it out of fold and labels the unrated episodes. The A/B test that follows wants the same
judge for every episode of both arms, fixed before the challenger saw any traffic (evidence.py in agent_rl/ab: what
the test assumes). So the week's fitted models are kept (`FrozenLabeler.save`, called by curation's
`validated_episodes` through `curation/week_labeler.py`), under `artifacts/ab_labeler/<week>/`, and when a test
starts the controller copies the newest one fitted on ratings older than the test into the test's own folder
(`freeze_for_test`): a later week's curation, which may learn from the test's own traffic, never changes the
judge of a running test.

A `FrozenLabeler` holds, per tenant, the model whose check passed, and the share of good ratings it learned from
(a tenant without a passing model, or one the week did not see, is scored with that base rate: a constant
judge, which prediction-powered inference corrects like any other). `passed` is the week's verdict as curation's
report gives it (any tenant passed: curation/live.py `_combined_report`), with the check's figures per tenant.
Only the signals labeler is frozen: a model judge's labeler would need the judge's calls at every look.
"""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from agent_rl.environments.gateway import GatewayEnvironment
from agent_rl.feedback.signals import FEATURE_NAMES, Signals, episode_signals
from agent_rl.records import Episode
from agent_rl.utc import as_utc

WEEK_STAGE = "ab_labeler"  # artifacts/ab_labeler/<week>/: curation's copy of the week's labeler
TEST_STAGE = "ab_test_labelers"  # artifacts/ab_test_labelers/<model>/<challenger>/<start>/: the copy a test reads
META = "labeler.json"
MODELS = "models.pkl"
DEFAULT_TENANT = "default"


def features(signals: Sequence[Signals]) -> np.ndarray:
    """One row per episode, its signals in FEATURE_NAMES order: the columns the labeler learned from."""
    return np.array([[s.features()[name] for name in FEATURE_NAMES] for s in signals], dtype=float).reshape(
        len(signals), len(FEATURE_NAMES))


@dataclass(frozen=True)
class FrozenLabeler:
    """A week's fitted labeler, per tenant, with its check. `models`: tenant -> classifier (predict_proba) for the
    tenants whose check passed; `base_rates`: tenant -> share of good ratings it learned from (and "" for all
    tenants together); `checks`: tenant -> AUC, ECE, rated count, passed, reason; `fitted_through`: the newest
    rating it learned from (None: it learned from none)."""

    models: dict[str, Any]
    base_rates: dict[str, float]
    passed: bool
    reason: str
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    fitted_through: datetime | None = None
    week: str | None = None
    environment: str = GatewayEnvironment.name

    def probabilities(self, episodes: Iterable[Episode | Mapping[str, Any]]) -> np.ndarray:
        """Each episode's probability of a good outcome: its tenant's model where that passed, else its tenant's
        base rate (the overall one for a tenant the week did not see)."""
        items = list(episodes)
        out = np.empty(len(items), dtype=float)
        by_tenant: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            tenant = item.tenant if isinstance(item, Episode) else item.get("tenant")
            by_tenant.setdefault(str(tenant or DEFAULT_TENANT), []).append(i)
        overall = self.base_rates.get("", 0.5)
        for tenant, indices in by_tenant.items():
            model = self.models.get(tenant)
            if model is None:
                out[indices] = self.base_rates.get(tenant, overall)
                continue
            x = features([episode_signals(items[i]) for i in indices])
            out[indices] = model.predict_proba(x)[:, 1]
        return out

    def summary(self) -> dict[str, Any]:
        """The labeler's record for a decision and its logs (no models): week, passed, reason, fitted_through,
        tenants with a model, and the check's AUC and ECE (of the tenant with the most ratings)."""
        largest = max(self.checks.values(), key=lambda c: c.get("n_rated") or 0) if self.checks else {}
        return {"week": self.week, "passed": self.passed, "reason": self.reason,
                "fitted_through": self.fitted_through.isoformat() if self.fitted_through else None,
                "tenants": sorted(self.models), "auc": largest.get("auc"), "ece": largest.get("ece"),
                "ece_excess": largest.get("ece_excess"), "n_rated": sum(c.get("n_rated") or 0
                                                                        for c in self.checks.values())}

    def save(self, folder: Path) -> Path:
        """Write the models and the record into `folder` (created); returns it."""
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / MODELS, "wb") as handle:
            pickle.dump(self.models, handle)
        meta = {"base_rates": self.base_rates, "passed": self.passed, "reason": self.reason, "checks": self.checks,
                "fitted_through": self.fitted_through.isoformat() if self.fitted_through else None,
                "week": self.week, "environment": self.environment}
        # The record last: a folder with a record has its models (load reads the record first).
        (folder / META).write_text(json.dumps(meta, indent=1, default=str))
        return folder

    @classmethod
    def load(cls, folder: Path) -> FrozenLabeler:
        """The labeler saved in `folder`; FileNotFoundError when there is none. The models are pickles this
        deployment wrote itself (curation's own artifacts), never files from elsewhere."""
        meta = json.loads((folder / META).read_text())
        with open(folder / MODELS, "rb") as handle:
            models = pickle.load(handle)  # noqa: S301 - our own artifact (docstring)
        through = meta.get("fitted_through")
        return cls(models=models, base_rates={str(k): float(v) for k, v in meta["base_rates"].items()},
                   passed=bool(meta["passed"]), reason=str(meta.get("reason") or ""), checks=meta.get("checks") or {},
                   fitted_through=as_utc(datetime.fromisoformat(through)) if through else None,
                   week=meta.get("week"), environment=meta.get("environment") or GatewayEnvironment.name)


def _saved(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for meta in sorted(root.glob(f"*/{META}")):
        try:
            found.append((meta.parent, json.loads(meta.read_text())))
        except (OSError, json.JSONDecodeError):
            continue  # half-written or damaged: not a labeler
    return found


def freeze_for_test(home: Path, model_name: str, challenger: str, started_at: datetime) -> tuple[str | None, str]:
    """Copy the newest week's labeler fitted on ratings older than `started_at` into the test's own folder.

    Returns (its path relative to `home`, a note on what was frozen), or (None, why none was). The newest by the
    ratings it learned from, not by folder name; a week whose newest rating is not older than the test is refused
    (it may have learned from the test's traffic)."""
    started_at = as_utc(started_at)
    weeks = _saved(home / "artifacts" / WEEK_STAGE)
    if not weeks:
        return None, "no labeler saved by curation (no gateway week curated with a labeler before the test)"
    dated = [(as_utc(datetime.fromisoformat(m["fitted_through"])), folder, m) for folder, m in weeks
             if m.get("fitted_through")]
    eligible = [item for item in dated if item[0] < started_at]
    if not eligible:
        return None, (f"no saved labeler learned only from ratings before the test began ({started_at.isoformat()})"
                      if dated else "the saved labelers learned from no rating")
    through, source, meta = max(eligible, key=lambda item: item[0])
    stamp = started_at.strftime("%Y%m%dT%H%M%S")
    target = home / "artifacts" / TEST_STAGE / _safe(model_name) / _safe(challenger) / stamp
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target)
    verdict = "passed its check" if meta.get("passed") else f"failed its check ({meta.get('reason')})"
    return (str(target.relative_to(home)),
            f"labeler of week {meta.get('week')} (ratings through {through.isoformat()}) {verdict}")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"

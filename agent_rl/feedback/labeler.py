"""Labels for the episodes nobody rated, learned from the ones somebody did, and a check of whether to trust them.

The few rated episodes teach a classifier how the implicit signals (signals.py) predict a rating (good: the
rating is > 0, as curation reads it). Before any label is used the labeler is measured on rated episodes it did not
learn from: every rated episode gets an out-of-fold probability (stratified k-fold, the model refitted per fold),
and the check wants a ROC AUC and a calibration error within configurable bars (default AUC >= 0.76, and an
expected calibration error at most 0.05 beyond sampling noise). Out-of-fold rather than one held-out slice because
ratings are scarce: with 200 of them, a fifth held out would measure calibration on 40 episodes, too few to tell
0.05 from noise.

Why the calibration bar is on the error beyond noise: even a perfectly calibrated labeler shows an ECE on a finite
set of ratings (about 0.077 on 150 of them, 10 bins: `ece_floor`), so a bar of 0.05 on the raw ECE fails every
labeler of a week with a few hundred ratings, however good. The check subtracts that floor (the ECE the labeler's
own probabilities would show if they were exactly right) and holds the rest to `max_ece`.

Why the AUC bar is 0.76: the check measures the labeler against ratings, and ratings carry their users' noise, so no
labeler can show more than the signals allow against them. In bench/labels.py's world, a model fitted on the hidden
truth of 36,000 episodes (the signals' best, not a labeler's) reaches AUC 0.873 against that truth but only 0.846
against the ratings; the labeler itself (AUC ~0.865 against the truth, week after week) shows 0.824 out of fold on a
week's ~270 ratings, with a standard deviation of 0.042 from which users happened to rate. The earlier bar, 0.85,
sat above that ceiling: the same labeler passed in 6 of 20 weeks by the luck of the draw. 0.76 is the ceiling less
two standard deviations of one week's estimate: the same labeler passes ~9 weeks in 10 (18 of those 20), one that
separates little (AUC ~0.7 against the truth) almost never (docs/experiments.md, 2026-11-30 (night)).

When the check passes, the final model (fitted on every rated episode) scores the unrated ones and only the
confident probabilities become labels: at or above `positive_threshold` good, at or below `negative_threshold`
bad, the middle left unlabeled. When it fails (too few ratings, a single class, bars missed), the result says
`train_on = rated_only` with the reason, and carries no labels: the caller trains on rated episodes alone.
The logistic model's own probabilities are the labels' probabilities: a logistic regression is fitted by log loss,
so it is already calibrated within its model class, and all the ratings fit it. A second Platt step on top
(scikit-learn's `CalibratedClassifierCV`, the default until 2026-11-28) spent a third of ~200 ratings on each of
three calibrators and averaged them, which left the labels under-confident against the hidden truth (calibration
slope ~1.45; ECE 0.065 against 0.044 without it, docs/experiments.md). The price: where the signals barely separate
(AUC ~0.6) the plain model overfits 200 ratings and is too sure of itself; the check's AUC bar refuses such weeks.
`calibration` "sigmoid" or "isotonic" still wraps the model in `CalibratedClassifierCV`, and gradient boosting
needs it (its scores are not probabilities).

A model judge's score (judge_agreement.py) may join the signals as one more column (`judge_scores`): the classifier
then learns from the ratings how far to trust the judge next to the signals, and the calibration and the
out-of-fold check cover the combination, where a raw judge score is not calibrated at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from numbers import Real
from typing import Any, Literal

import numpy as np
from sklearn.base import ClassifierMixin, clone
from sklearn.calibration import CalibratedClassifierCV
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

from agent_rl.feedback.signals import FEATURE_NAMES, Signals, episode_signals
from agent_rl.records import Episode


class TrainOn(StrEnum):
    """What the week trains on: rated episodes and the confident labels, or, when the check failed, rated alone."""

    RATED_AND_LABELED = "rated_and_labeled"
    RATED_ONLY = "rated_only"


@dataclass(frozen=True)
class LabelerConfig:
    """Thresholds for a label, bars for the check, and how the classifier is built.

    `min_rated` and `min_per_class`: below them the check fails without fitting (AUC and ECE on fewer rated episodes
    say more about the sample than about the labeler); `folds` out-of-fold folds for the check; `calibration` "none"
    takes the logistic model's own probabilities, "sigmoid"/"isotonic" recalibrate with `CalibratedClassifierCV`
    on `calibration_folds` folds inside each fit (module docstring: why "none" is the default)."""

    positive_threshold: float = 0.8
    negative_threshold: float = 0.2
    min_auc: float = 0.76
    max_ece: float = 0.05
    min_rated: int = 100
    min_per_class: int = 20
    folds: int = 5
    calibration_folds: int = 3
    calibration: Literal["none", "sigmoid", "isotonic"] = "none"
    model: Literal["logistic", "boosting"] = "logistic"
    ece_bins: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.negative_threshold < self.positive_threshold <= 1:
            raise ValueError("need 0 <= negative_threshold < positive_threshold <= 1, got "
                             f"{self.negative_threshold} and {self.positive_threshold}")
        if self.folds < 2 or self.calibration_folds < 2 or self.ece_bins < 2:
            raise ValueError("folds, calibration_folds and ece_bins must be >= 2")
        if self.model == "boosting" and self.calibration == "none":
            raise ValueError("model \"boosting\" needs calibration \"sigmoid\" or \"isotonic\": its scores are not "
                             "probabilities")
        # Every fold needs both classes, and with a calibration so does every calibration split inside a fold.
        splits = self.folds if self.calibration == "none" else self.folds * self.calibration_folds
        if self.min_per_class < splits:
            raise ValueError(f"min_per_class must be >= {splits} (folds {self.folds}, calibration "
                             f"{self.calibration!r}): every split needs both classes")


@dataclass(frozen=True)
class EpisodeLabel:
    """An unrated episode's calibrated probability that its user would rate it good, and the label it gets:
    True/False when the probability clears a threshold, None when it sits between them."""

    episode_id: str | None
    probability: float
    good: bool | None


@dataclass(frozen=True)
class LabelerReport:
    """The check on rated episodes and what labeling yielded. `auc`/`ece` are None when no model was fitted;
    `reason` says why the check failed ("" when it passed)."""

    auc: float | None
    ece: float | None
    ece_floor: float | None  # the ECE a perfectly calibrated labeler would show on these rated episodes (noise)
    ece_excess: float | None  # max(0, ece - ece_floor): what the bar `max_ece` is held against
    n_rated: int
    n_rated_good: int
    n_unrated: int
    n_labeled: int
    n_labeled_good: int
    passed: bool
    reason: str
    min_auc: float
    max_ece: float
    judge_calls: int | None = None  # calls to a model judge this labeling made; None: no judge took part
    per_tenant: dict[str, dict[str, Any]] | None = None  # a week of several tenants: each one's own check

    def to_metadata(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LabelingResult:
    """The check, what to train on, and the labels. `scored` holds every unrated episode's probability whenever a
    model was fitted (also when the check failed, to inspect it); `labels` the confident ones, only when it passed."""

    report: LabelerReport
    train_on: TrainOn
    scored: tuple[EpisodeLabel, ...]
    labels: tuple[EpisodeLabel, ...]


def expected_calibration_error(y_true: Sequence[float] | np.ndarray, probability: Sequence[float] | np.ndarray,
                               n_bins: int = 10) -> float:  # fmt: skip
    """Expected calibration error with `n_bins` equal-width probability bins over [0, 1]:
    sum over bins of (episodes in the bin / all episodes) x |share of good episodes in it - mean probability in it|.
    A probability of exactly 1 falls in the last bin; empty bins add nothing. 0 is perfect calibration; a
    well-calibrated model still shows sampling noise, about 0.02-0.05 on a few hundred episodes."""
    y = np.asarray(y_true, dtype=float)
    p = np.asarray(probability, dtype=float)
    if y.shape != p.shape or y.ndim != 1 or not len(y):
        raise ValueError("y_true and probability must be non-empty 1-d sequences of one length")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    bins = np.minimum((p * n_bins).astype(int), n_bins - 1)
    total = 0.0
    for b in np.unique(bins):
        inside = bins == b
        total += inside.sum() / len(p) * abs(y[inside].mean() - p[inside].mean())
    return float(total)


def ece_floor(probability: Sequence[float] | np.ndarray, n_bins: int = 10, draws: int = 200, seed: int = 0) -> float:
    """The ECE a perfectly calibrated model would still show on these probabilities: the mean ECE over `draws`
    outcomes drawn from the probabilities themselves. It is the sampling noise of the measurement; an ECE bar
    below it cannot be met reliably, however good the labeler (about 0.06 on 200 rated episodes, 10 bins)."""
    p = np.asarray(probability, dtype=float)
    rng = np.random.default_rng(seed)
    return float(np.mean([expected_calibration_error(rng.random(len(p)) < p, p, n_bins) for _ in range(draws)]))


# A judge's score is read as log-odds clipped to [logit(0.01), logit(0.99)] (about +-4.6): a judge's 0 or 1 would
# otherwise be infinite, and one over-confident reply would outweigh every signal.
JUDGE_CLIP = 0.01


def _log_counts_judge_logit(x: np.ndarray) -> np.ndarray:
    """The signals on a log scale as without a judge; the judge's score (the last column) as clipped log-odds.
    Log-odds, not log1p: log1p barely bends [0, 1], while a logistic regression is linear in log-odds, so the weight
    it learns on this column rescales the judge as Platt scaling would (large when the ratings bear the judge out,
    near 0 when its scores are noise)."""
    p = np.clip(x[:, -1:], JUDGE_CLIP, 1 - JUDGE_CLIP)
    return np.hstack([np.log1p(x[:, :-1]), np.log(p / (1 - p))])


def _estimator(config: LabelerConfig, judge: bool = False) -> ClassifierMixin:
    """The classifier: counts on a log scale (and a judge's score, when `judge`, as log-odds), standardized, then a
    logistic regression (or shallow gradient boosting), wrapped in `CalibratedClassifierCV` only when
    `config.calibration` asks for it."""
    if config.model == "boosting":
        base: Any = HistGradientBoostingClassifier(max_depth=3, max_iter=100, learning_rate=0.1,
                                                   random_state=config.seed)
    else:
        base = LogisticRegression(C=1.0, max_iter=1000)
    pipeline = make_pipeline(FunctionTransformer(_log_counts_judge_logit if judge else np.log1p), StandardScaler(),
                             base)
    if config.calibration == "none":
        return pipeline
    return CalibratedClassifierCV(pipeline, method=config.calibration, cv=config.calibration_folds)


def _matrix(signals: Sequence[Signals], judge: np.ndarray | None = None) -> np.ndarray:
    """One row per episode: its signals in FEATURE_NAMES order, then the judge's score when there is one."""
    x = np.array([[s.features()[name] for name in FEATURE_NAMES] for s in signals], dtype=float).reshape(
        len(signals), len(FEATURE_NAMES))
    return x if judge is None else np.column_stack([x, judge])


def _judge_column(judge_scores: Sequence[float], n: int) -> np.ndarray:
    """The judge's scores as a column, or a ValueError saying what is wrong: one score per episode, in their order,
    each a finite number in [0, 1] (a probability the episode was rated good)."""
    scores = list(judge_scores)
    if len(scores) != n:
        raise ValueError(f"judge_scores has {len(scores)} scores for {n} episodes: one per episode, in their order")
    for i, score in enumerate(scores):
        if isinstance(score, bool) or not isinstance(score, Real) or not (math.isfinite(score) and 0 <= score <= 1):
            raise ValueError(f"judge_scores[{i}] is {score!r}: each score must be a finite number in [0, 1]")
    return np.array(scores, dtype=float)


def too_little(n_rated: int, n_good: int, config: LabelerConfig) -> str:
    """Why the rated episodes cannot support a check ("" when they can)."""
    if n_rated < config.min_rated:
        return f"too few rated episodes: {n_rated} < {config.min_rated}"
    if n_good in (0, n_rated):
        return f"all {n_rated} rated episodes are {'good' if n_good else 'bad'}: one class only, nothing to learn"
    fewest, kind = min((n_good, "good"), (n_rated - n_good, "bad"))
    if fewest < config.min_per_class:
        return f"only {fewest} {kind} rated episodes: fewer than {config.min_per_class}"
    return ""


def out_of_fold(x: np.ndarray, y: np.ndarray, config: LabelerConfig, judge: bool = False) -> np.ndarray:
    """Each rated episode's probability from a model fitted on the other folds (stratified, shuffled by seed);
    `judge`: the last column of `x` is a judge's score."""
    folds = StratifiedKFold(n_splits=config.folds, shuffle=True, random_state=config.seed)
    out = np.empty(len(y), dtype=float)
    for train, test in folds.split(x, y):
        model = clone(_estimator(config, judge)).fit(x[train], y[train])
        out[test] = model.predict_proba(x[test])[:, 1]
    return out


def fitted_scores(rated: Sequence[Signals], score: Sequence[Signals], config: LabelerConfig = LabelerConfig()
                  ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The labeler's probabilities without labeling or checking: each of `rated`'s out of fold, and each of
    `score`'s from the model fitted on all of `rated` (a rating > 0 is good). For checks that compare ratings with a
    labeler fitted on other ratings (curation/tenant_agreement.py); `rated` needs `config.folds` of each kind."""
    y = np.array([1 if (s.rating or 0) > 0 else 0 for s in rated], dtype=int)
    x = _matrix(rated)
    oof = out_of_fold(x, y, config)
    scores = _estimator(config).fit(x, y).predict_proba(_matrix(score))[:, 1] if len(score) else np.empty(0)
    return oof, scores


def ece_excess(ece: float, floor: float) -> float:
    """The calibration error beyond sampling noise: what the ECE bar is held against (module docstring)."""
    return max(0.0, ece - floor)


def _check(auc: float, ece: float, floor: float, n_rated: int, min_auc: float, max_ece: float, how: str) -> str:
    misses = []
    if auc < min_auc:
        misses.append(f"AUC {auc:.3f} < {min_auc}")
    excess = ece_excess(ece, floor)
    if excess > max_ece:
        misses.append(f"ECE {ece:.3f} is {excess:.3f} beyond the {floor:.3f} that sampling noise alone gives, "
                      f"> {max_ece}")
    return f"{' and '.join(misses)} on {n_rated} rated episodes{how}" if misses else ""


def agreement(y_true: Sequence[int] | np.ndarray, probability: Sequence[float] | np.ndarray, *, min_auc: float,
              max_ece: float, n_bins: int = 10, min_rated: int = 1, seed: int = 0, how: str = "") -> dict[str, Any]:
    """How far probabilities agree with ratings (1 good, 0 bad), by the labeler's own check: ROC AUC >= `min_auc`
    and ECE at most `max_ece` beyond sampling noise. Public so that any other source of labels (a model judge) is
    held to the same bars, measured the same way. Returns auc, ece, ece_floor, ece_excess (None when unmeasurable),
    n, n_good, passed, reason."""
    y = np.asarray(y_true, dtype=int)
    p = np.asarray(probability, dtype=float)
    n, n_good = len(y), int(y.sum())
    report: dict[str, Any] = {"auc": None, "ece": None, "ece_floor": None, "ece_excess": None, "n": n, "n_good": n_good,
                              "passed": False, "reason": "", "min_auc": min_auc, "max_ece": max_ece}
    if n < max(min_rated, 1):
        report["reason"] = f"too few rated episodes: {n} < {max(min_rated, 1)}"
    elif n_good in (0, n):
        report["reason"] = f"all {n} rated episodes are {'good' if n_good else 'bad'}: AUC needs both classes"
    else:
        auc, ece = float(roc_auc_score(y, p)), expected_calibration_error(y, p, n_bins)
        floor = ece_floor(p, n_bins, seed=seed)
        reason = _check(auc, ece, floor, n, min_auc, max_ece, how)
        report.update(auc=auc, ece=ece, ece_floor=floor, ece_excess=ece_excess(ece, floor), passed=not reason,
                      reason=reason)
    return report


def against_truth(scored: Iterable[EpisodeLabel], truth: Mapping[str, bool], n_bins: int = 10) -> dict[str, Any]:
    """How a labeler's probabilities agree with a simulation's hidden truth (`truth`: episode id -> satisfied), on
    the scored episodes the truth covers: AUC, ECE (`expected_calibration_error`), mean probability against the
    truth's share, and the confident labels and how many contradict the truth. One function, so that the bench
    (`bench/labels.py`) and the gateway demo measure the labels the same way. AUC/ECE None without episodes."""
    kept = [s for s in scored if s.episode_id in truth]
    out: dict[str, Any] = {"scored": len(kept), "auc": None, "ece": None, "mean_probability": None,
                           "truth_share": None, "confident": 0, "confident_wrong": 0}
    if kept:
        y = np.array([bool(truth[s.episode_id]) for s in kept], dtype=int)
        p = np.array([s.probability for s in kept], dtype=float)
        out.update(auc=float(roc_auc_score(y, p)) if 0 < y.sum() < len(y) else None,
                   ece=expected_calibration_error(y, p, n_bins), mean_probability=float(p.mean()),
                   truth_share=float(y.mean()))
        confident = [s for s in kept if s.good is not None]
        out["confident"] = len(confident)
        out["confident_wrong"] = sum(s.good != bool(truth[s.episode_id]) for s in confident)
    return out


def _label(episode_id: str | None, probability: float, config: LabelerConfig) -> EpisodeLabel:
    good = None
    if probability >= config.positive_threshold:
        good = True
    elif probability <= config.negative_threshold:
        good = False
    return EpisodeLabel(episode_id, probability, good)


def label_episodes(episodes: Iterable[Signals | Episode | Mapping[str, Any]],
                   config: LabelerConfig = LabelerConfig(), *,
                   judge_scores: Sequence[float] | None = None) -> LabelingResult:  # fmt: skip
    """Learn from the rated episodes, check on them out of fold, label the unrated ones it is confident about.

    `episodes` are a week's episodes as the pool stores them (or their `Signals`, already read); `judge_scores`,
    when given, a model judge's score of each of them (same order, rated and unrated alike), one more column."""
    signals = [e if isinstance(e, Signals) else episode_signals(e) for e in episodes]
    judge = None if judge_scores is None else _judge_column(judge_scores, len(signals))
    is_rated = np.array([s.rated for s in signals], dtype=bool)
    rated = [s for s in signals if s.rated]
    unrated = [s for s in signals if not s.rated]
    y = np.array([1 if (s.rating or 0) > 0 else 0 for s in rated], dtype=int)
    n_good = int(y.sum())
    reason = too_little(len(rated), n_good, config)
    auc = ece = floor = excess = None
    scored: tuple[EpisodeLabel, ...] = ()
    if not reason:
        x_all = _matrix(signals, judge)
        x = x_all[is_rated]
        oof = out_of_fold(x, y, config, judge is not None)
        check = agreement(y, oof, min_auc=config.min_auc, max_ece=config.max_ece, n_bins=config.ece_bins,
                          seed=config.seed, how=" (out of fold)")
        auc, ece, floor, excess, reason = (check["auc"], check["ece"], check["ece_floor"], check["ece_excess"],
                                           check["reason"])
        if unrated:
            model = _estimator(config, judge is not None).fit(x, y)
            probabilities = model.predict_proba(x_all[~is_rated])[:, 1]
            scored = tuple(_label(s.episode_id, float(p), config) for s, p in zip(unrated, probabilities))
    passed = not reason
    labels = tuple(label for label in scored if label.good is not None) if passed else ()
    report = LabelerReport(
        auc=auc, ece=ece, ece_floor=floor, ece_excess=excess, n_rated=len(rated), n_rated_good=n_good, n_unrated=len(unrated),
        n_labeled=len(labels),
        n_labeled_good=sum(bool(label.good) for label in labels), passed=passed, reason=reason,
        min_auc=config.min_auc, max_ece=config.max_ece)
    return LabelingResult(report=report, train_on=TrainOn.RATED_AND_LABELED if passed else TrainOn.RATED_ONLY,
                          scored=scored, labels=labels)

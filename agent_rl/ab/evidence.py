"""Outcomes from ratings and labels: each arm's success rate when users rate a few episodes and a frozen labeler
scores them all (prediction-powered inference), and the check that the labels do not contradict the ratings.

Where users judge an agent (the gateway), about one episode in twenty is rated. The week's labeler
(agent_rl/feedback/labeler.py) gives every episode a calibrated probability f that its user was happy, from the
implicit signals of its conversation. Two ways to use it in an A/B test were weighed:

- **Labels as the outcome** (a surrogate metric, the "surrogate index" of Athey et al. 2019): mean f per arm.
  Fast (every episode counts at its label's variance), but it is only right when the labeler judges both arms
  alike, and the online-experimentation literature warns that a test on a surrogate has an inflated false-positive
  rate unless its prediction error is accounted for (Duan, Ba & Zhang, "Online experimentation with surrogate
  metrics", LinkedIn 2021) and that a proxy can move against the outcome it stands for. Here the risk is built in:
  the challenger is fine-tuned on the episodes this labeler labeled good, so it learns what the labeler rewards,
  and the labeler's error is likely to favour it (Goodhart).
- **Prediction-powered inference** (PPI; Angelopoulos, Bates, Fannjiang, Jordan & Zrnic, Science 2023), chosen:
  per arm, the mean label over all its episodes plus the mean of (rating - label) over its rated ones, the
  "rectifier". The rectifier measures the labeler's error on this arm's own traffic and removes it, so the
  estimate is unbiased for the arm's true good-rating rate whatever the labeler's error, miscalibration or
  favouritism included; a better labeler only makes it less noisy.

The estimator, for an arm with N episodes users could rate, n of them rated (ratings y, labels f):

    theta = mean_N(f) + mean_n(y - f)
    Var(theta) = (s_f^2 + 2 c_{f,r}) / N + s_r^2 / n           r = y - f

(the labels' mean and the rectifier share the rated episodes, hence the covariance term; s_f^2 + 2 c_{f,r}
estimates Var(y) - Var(r) and is floored at 0). With every episode rated it is the ratings' mean, with
Var(y) / n. With few ratings the variance is mostly s_r^2 / n: PPI needs ratings still, but Var(y - f) instead of
Var(y) of them, i.e. Var(y) / Var(y - f) times fewer: 1.6x for the labeler of bench/labels.py's default
population (out-of-fold AUC 0.83; 0.23 / 0.14), 5x for one that sorts episodes into 5% and 95% sure. Labels alone
would need no ratings at all, but only by taking the labeler's error on trust. Episodes whose outcome is known
without a rating (an environment judged them, or the reply was broken) form their own stratum with their known
outcome, weighted by their count.
s_r^2 is the residuals' sample variance plus a quarter (one maximally uncertain rating) over n, as the rate test
adds half a success: a few rated episodes that happen to agree with their labels never claim zero noise.

The difference of the two arms' estimates and its variance go into the same always-valid test as the ratings
(the mSPRT of stats.py, with the plug-in variance in place of the pooled one), so P(false promotion) <= alpha still
holds however often the sensor looks, in the normal approximation that the minimum samples protect; confidence
sequences for PPI by the same mixture argument: "prediction-powered confidence sequences" (Ville's inequality and
the method of mixtures).

What the test assumes (docs/architecture.md, "The A/B test's evidence"):
1. The labeler is frozen before the test: fitted on traffic before the challenger was routed (the week that
   trained the challenger), and not refitted while the test runs, so no test episode trains the judge of its own
   arm, and f is a fixed function of the episode. PPI's guarantee is for a fixed f; a labeler refitted on test
   traffic, its rated episodes included, would be anti-conservative.
2. Ratings are missing at random within an arm: whether a user rates does not depend on how it went once the
   episode's signals are known (strictly, the rated episodes are a random sample of the arm's episodes). Users who
   rate mostly when unhappy break this, for the ratings-only test just as much.
3. The labeler passed its check this week (out-of-fold AUC and calibration on the ratings). PPI would stay unbiased
   without it; the check is what makes the labels worth their variance, and a failed labeler leaves the test on
   ratings alone, saying so.

Ratings stay the ground truth: `disagreement` compares, on the rated episodes of both arms, the ratings' lift with
the labels' lift. When they have opposite signs and differ by more than their noise (a two-sided z-test at the
configured level on the difference of the arms' mean (rating - label), which is exactly how far the ratings' lift
departs from the labels' on the same episodes), the labeler judges the arms differently, and the rollout holds and
says why rather than act on labels the ratings contradict. The check is per look, not always-valid, on purpose: a
spurious hold only waits for the next look, and the brake should be quick.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from agent_rl.ab.stats import SequentialTestConfig, TestResult, always_valid_test_of_estimate

# One maximally uncertain rating's variance, added to the residuals' sum of squares (module docstring).
PSEUDO_RATING_VARIANCE = 0.25


@dataclass(frozen=True)
class LabeledArm:
    """One arm's episodes as the label-aware test sees them.

    `labels`: the frozen labeler's probability of a good outcome of every episode users could rate (nobody else
    judged it), rated or not; `ratings`, aligned with `labels`: 1 where its user rated it good, 0 bad, None where
    nobody rated it; `judged`: outcomes known without a rating (an environment's judgment, a broken reply), 1 a
    success and 0 a failure."""

    labels: tuple[float, ...] = ()
    ratings: tuple[int | None, ...] = ()
    judged: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("labels", "ratings", "judged"):
            if not isinstance(getattr(self, name), tuple):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if len(self.labels) != len(self.ratings):
            raise ValueError(f"LabeledArm: {len(self.labels)} labels but {len(self.ratings)} ratings: one rating "
                             "(or None) per labeled episode")
        if any(not (math.isfinite(f) and 0.0 <= f <= 1.0) for f in self.labels):
            raise ValueError("LabeledArm.labels must be probabilities in [0, 1]")
        if any(y not in (0, 1, None) for y in self.ratings) or any(y not in (0, 1) for y in self.judged):
            raise ValueError("LabeledArm: ratings are 1, 0 or None; judged outcomes 1 or 0")

    @property
    def rated(self) -> int:
        return sum(y is not None for y in self.ratings)

    @property
    def labeled_only(self) -> int:
        """Episodes only the labeler judged (nobody rated them)."""
        return len(self.labels) - self.rated

    @property
    def episodes(self) -> int:
        return len(self.labels) + len(self.judged)


@dataclass(frozen=True)
class ArmEstimate:
    """One arm's success rate three ways, and the counts behind them.

    `ratings_rate`: rated (and otherwise judged) episodes alone, what the ratings-only test reads; `labels_rate`:
    the labels taken at their word (judged episodes at their outcome); `estimate`, `variance`: prediction-powered
    (labels corrected by the ratings); `rectifier`: mean (rating - label) over the rated episodes, the labeler's
    error on this arm. None where it cannot be computed (no rated episode)."""

    episodes: int
    rated: int
    labeled: int  # episodes only the labeler judged
    judged: int
    ratings_rate: float | None
    labels_rate: float | None
    rectifier: float | None
    estimate: float | None
    variance: float  # math.inf where the estimate is undefined or its noise unknown (fewer than 2 rated)

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def _residual_variance(residuals: np.ndarray) -> float:
    n = residuals.size
    return float((np.sum((residuals - residuals.mean()) ** 2) + PSEUDO_RATING_VARIANCE) / n)


def ppi_estimate(arm: LabeledArm) -> ArmEstimate:
    """The arm's prediction-powered success rate and its variance (module docstring)."""
    f = np.asarray(arm.labels, dtype=float)
    is_rated = np.array([y is not None for y in arm.ratings], dtype=bool)
    y = np.array([y for y in arm.ratings if y is not None], dtype=float)
    judged = np.asarray(arm.judged, dtype=float)
    n_ratable, n_rated, n_judged = f.size, int(is_rated.sum()), judged.size
    total = n_ratable + n_judged
    known = n_rated + n_judged
    ratings_rate = float((y.sum() + judged.sum()) / known) if known else None
    labels_rate = float((f.sum() + judged.sum()) / total) if total else None
    rectifier = float((y - f[is_rated]).mean()) if n_rated else None
    if n_ratable and n_rated < 2:  # the labels' error on this arm is unmeasured: no estimate yet
        return ArmEstimate(total, n_rated, n_ratable - n_rated, n_judged, ratings_rate, labels_rate, rectifier,
                           None, math.inf)
    parts, variance = [], 0.0
    if n_ratable:
        r = y - f[is_rated]
        s_r2 = _residual_variance(r)
        s_f2 = float(f.var(ddof=1)) if n_ratable > 1 else 0.0
        c_fr = float(np.cov(f[is_rated], r, ddof=1)[0, 1]) if n_rated > 1 else 0.0
        theta_r = float(f.mean() + r.mean())
        var_r = max(0.0, s_f2 + 2.0 * c_fr) / n_ratable + s_r2 / n_rated
        parts.append((n_ratable, theta_r))
        variance += (n_ratable / total) ** 2 * var_r
    if n_judged:
        p = (judged.sum() + 0.5) / (n_judged + 1)  # shrunk by half a success, as the rate test's unpooled variance
        parts.append((n_judged, float(judged.mean())))
        variance += (n_judged / total) ** 2 * p * (1 - p) / n_judged
    estimate = sum(n * value for n, value in parts) / total if total else None
    return ArmEstimate(total, n_rated, n_ratable - n_rated, n_judged, ratings_rate, labels_rate, rectifier, estimate,
                       variance if total else math.inf)


def ppi_test(champion: ArmEstimate, challenger: ArmEstimate, config: SequentialTestConfig) -> TestResult:
    """The always-valid test (stats.py's mSPRT) on the difference of the arms' prediction-powered estimates, with
    their plug-in variance. Verdicts wait for `config.min_samples_per_arm` episodes per arm (rated or labeled);
    an arm without an estimate (fewer than 2 rated episodes) gives p = 1 and the whole [-1, 1] as interval."""
    both = champion.estimate is not None and challenger.estimate is not None
    lift = challenger.estimate - champion.estimate if both else None
    return always_valid_test_of_estimate(lift, champion.variance + challenger.variance, champion.episodes,
                                         challenger.episodes, champion.estimate or 0.0, config, "msprt_ppi")


@dataclass(frozen=True)
class Disagreement:
    """Do the ratings contradict the labels? On the episodes users could rate: `ratings_lift` (rated ones) and
    `labels_lift` (all of them); `difference`: mean (rating - label) of the challenger's rated episodes minus the
    champion's, how far the ratings' lift departs from the labels' on the same episodes, with its standard error
    `se` and `z`; `disagree` when the two lifts have opposite signs and |z| exceeds `threshold` (z at 1 - alpha/2)."""

    ratings_lift: float
    labels_lift: float
    difference: float
    se: float
    z: float
    threshold: float
    disagree: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sentence(self) -> str:
        return (f"the ratings' lift {self.ratings_lift:+.3f} and the labels' lift {self.labels_lift:+.3f} disagree "
                f"in sign beyond their noise (ratings minus labels {self.difference:+.3f}, z={self.z:+.2f}, "
                f"|z| > {self.threshold:.2f}): the labeler judges the arms differently")


def disagreement(champion: LabeledArm, challenger: LabeledArm, alpha: float = 0.05) -> Disagreement | None:
    """The stated test of ratings against labels (module docstring); None when an arm has fewer than 2 rated
    episodes among those users could rate (nothing to compare yet)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be strictly between 0 and 1, got {alpha}")
    sides = []
    for arm in (champion, challenger):
        f = np.asarray(arm.labels, dtype=float)
        is_rated = np.array([y is not None for y in arm.ratings], dtype=bool)
        if is_rated.sum() < 2:
            return None
        y = np.array([y for y in arm.ratings if y is not None], dtype=float)
        r = y - f[is_rated]
        sides.append((float(y.mean()), float(f.mean()), float(r.mean()), _residual_variance(r) / r.size))
    (y_a, f_a, r_a, v_a), (y_b, f_b, r_b, v_b) = sides
    ratings_lift, labels_lift, difference = y_b - y_a, f_b - f_a, r_b - r_a
    se = math.sqrt(v_a + v_b)
    z = difference / se if se > 0 else 0.0
    threshold = NormalDist().inv_cdf(1.0 - alpha / 2.0)
    disagree = ratings_lift * labels_lift < 0 and abs(z) > threshold
    return Disagreement(ratings_lift, labels_lift, difference, se, z, threshold, disagree)


def evidence_line(evidence: dict[str, Any]) -> str:
    """One line for logs and the demo's summary: what the test read, per arm rated and labeled episodes, the
    ratings' and labels' lifts and the test's statistic (decision.stats["evidence"])."""
    if not evidence:
        return ""
    with_labels = evidence.get("source") == "ratings+labels"

    def counts(arm: dict[str, Any]) -> str:
        if with_labels:
            return (f"{arm['version']}: {arm['rated']} rated + {arm['labeled']} labeled"
                    + (f" + {arm['judged']} judged" if arm.get("judged") else ""))
        unrated = arm.get("unrated") or 0
        return f"{arm['version']}: {arm['rated']} rated" + (f" of {arm['episodes']}" if unrated else "")

    arms = "; ".join(counts(arm) for arm in (evidence["champion"], evidence["challenger"]))

    def lift(value: Any) -> str:
        return "n/a" if value is None else f"{value:+.3f}"

    test = evidence.get("test") or {}
    statistic = (f"{test.get('method', '?')} lift {lift(test.get('lift'))}, p={test['p_value']:.4f}"
                 if test.get("p_value") is not None else "no statistic yet")
    source = "ratings and labels" if with_labels else "ratings alone"
    line = (f"evidence: {source} ({arms}); lifts: ratings {lift(evidence.get('ratings_lift'))}, labels "
            f"{lift(evidence.get('labels_lift'))}; {statistic}")
    return line + (f"; {evidence['note']}" if evidence.get("note") else "")

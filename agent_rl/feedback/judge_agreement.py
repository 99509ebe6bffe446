"""How far a model judge agrees with the ratings, and the judge as the labeler of a week's unrated episodes.

A judge's score is trusted as a label only as far as the signals labeler's probabilities are: the same check on
the rated episodes (labeler.agreement: ROC AUC and expected calibration error within the profile's bars). The
judge never learns from the ratings, so the check needs no folds: every rated episode is held out.

`JudgeAndSignalsLabeler` uses the judge as a signal instead: its score of every episode becomes one more column of
the signals labeler, which learns from the ratings how far to trust it next to the implicit signals; calibration
and the out-of-fold check then cover the combination (a raw judge score is not calibrated; the combination is).
Both return what `label_episodes` returns, so curation (curation/live.py `label_unrated`) takes any of the three.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent_rl.feedback.judge import JudgeConfig, JudgePrompt, JudgeScore, ModelJudge, ModelJudgeError
from agent_rl.feedback.labeler import (
    EpisodeLabel,
    LabelerConfig,
    LabelerReport,
    LabelingResult,
    TrainOn,
    agreement,
    label_episodes,
    too_little,
)
from agent_rl.feedback.signals import rating_of
from agent_rl.records import Episode

EpisodeLike = Episode | Mapping[str, Any]


def _get(episode: EpisodeLike, name: str) -> Any:
    return getattr(episode, name, None) if isinstance(episode, Episode) else episode.get(name)


def split_rated(episodes: Iterable[EpisodeLike]) -> tuple[list[EpisodeLike], list[int], list[EpisodeLike]]:
    """(rated episodes, their labels: 1 when the rating is > 0 as curation reads it, unrated episodes)."""
    rated, labels, unrated = [], [], []
    for episode in episodes:
        rating = rating_of(_get(episode, "feedback"))
        if rating is None:
            unrated.append(episode)
        else:
            rated.append(episode)
            labels.append(1 if rating > 0 else 0)
    return rated, labels, unrated


def judge_agreement(judge: ModelJudge, episodes: Iterable[EpisodeLike], *, min_auc: float = 0.85,
                    max_ece: float = 0.05, min_rated: int = 30, n_bins: int = 10) -> dict[str, Any]:  # fmt: skip
    """The judge's scores on the rated episodes against their ratings: auc, ece, ece_floor, n, n_good, passed,
    reason (labeler.agreement), plus the judge's mode and the calls it made. Unrated episodes are ignored."""
    rated, labels, _ = split_rated(episodes)
    calls = judge.calls
    # Too few ratings, or one class only: agreement() says why without scores, so no call is spent on them.
    measurable = len(rated) >= max(min_rated, 1) and len(set(labels)) == 2
    scores = [s.score for s in judge.score_episodes(rated)] if measurable else [0.5] * len(rated)
    report = agreement(labels, scores, min_auc=min_auc, max_ece=max_ece, n_bins=n_bins, min_rated=min_rated,
                       how=" (model judge)")
    report.update(mode=judge.config.mode, model=judge.config.endpoint.model, calls=judge.calls - calls)
    return report


class JudgeLabeler(BaseModel):
    """A model judge in the signals labeler's place: same thresholds (a label at or above `positive_threshold`
    good, at or below `negative_threshold` bad), same bars on the rated episodes. `label` runs the check first and
    scores the unrated episodes only when it passed (each score is a call to the endpoint)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    judge: JudgeConfig
    positive_threshold: float = Field(default=0.8, gt=0.5, le=1)
    negative_threshold: float = Field(default=0.2, ge=0, lt=0.5)
    min_auc: float = Field(default=0.85, ge=0.5, le=1)
    max_ece: float = Field(default=0.05, gt=0, le=1)
    min_rated: int = Field(default=30, ge=1)
    ece_bins: int = Field(default=10, ge=2)

    @model_validator(mode="after")
    def _ordered(self) -> JudgeLabeler:
        if not self.negative_threshold < self.positive_threshold:
            raise ValueError("need negative_threshold < positive_threshold")
        return self

    def _label(self, episode_id: str | None, p: float) -> EpisodeLabel:
        good = True if p >= self.positive_threshold else False if p <= self.negative_threshold else None
        return EpisodeLabel(episode_id, p, good)

    def label(self, episodes: Sequence[EpisodeLike], *, prompt: JudgePrompt | None = None) -> LabelingResult:
        """Check the judge on the rated episodes, then label the unrated ones it is confident about."""
        _, labels, unrated = split_rated(episodes)
        with ModelJudge(self.judge, prompt=prompt) as judge:
            check = judge_agreement(judge, episodes, min_auc=self.min_auc, max_ece=self.max_ece,
                                    min_rated=self.min_rated, n_bins=self.ece_bins)
            scored = tuple(self._label(s.episode_id, s.score) for s in judge.score_episodes(unrated)) \
                if check["passed"] and unrated else ()
            calls = judge.calls
        confident = tuple(label for label in scored if label.good is not None)
        report = LabelerReport(
            auc=check["auc"], ece=check["ece"], ece_floor=check["ece_floor"], ece_excess=check["ece_excess"],
            n_rated=len(labels),
            n_rated_good=sum(labels), n_unrated=len(unrated), n_labeled=len(confident),
            n_labeled_good=sum(bool(label.good) for label in confident), passed=check["passed"],
            reason=check["reason"], min_auc=self.min_auc, max_ece=self.max_ece, judge_calls=calls)
        return LabelingResult(report=report, train_on=TrainOn.RATED_AND_LABELED if check["passed"] else
                              TrainOn.RATED_ONLY, scored=scored, labels=confident)


def _aligned(episodes: Sequence[EpisodeLike], scores: Sequence[JudgeScore]) -> list[float]:
    """The judge's scores in the episodes' order, each checked against its episode's id. `score_episodes` answers
    in input order; matching by position, not by looking ids up, keeps apart episodes without an id (None) or with
    one id twice, which a lookup would give one score."""
    if len(scores) != len(episodes) or any(s.episode_id != _get(e, "episode_id") for s, e in zip(scores, episodes)):
        raise ModelJudgeError(f"the judge scored {len(scores)} episodes that do not line up with the "
                              f"{len(episodes)} given: no score is matched to the wrong episode")
    return [s.score for s in scores]


class JudgeAndSignalsLabeler(BaseModel):
    """The judge as one signal of the signals labeler (module docstring): pick it when the judge reads something
    the implicit signals miss (a wrong answer nobody complained about) but its raw scores are not calibrated, or
    not trusted alone. Thresholds, bars and fitting are the signals labeler's own (`signals`). Every episode, rated
    and unrated, is scored once, and only when the rated ones can support the check."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    judge: JudgeConfig
    signals: LabelerConfig = LabelerConfig()

    def label(self, episodes: Sequence[EpisodeLike], *, prompt: JudgePrompt | None = None) -> LabelingResult:
        """Score every episode with the judge, then fit, check and label with the score as one more column. The
        report's `judge_calls` says how many calls that took (0 when too few ratings left nothing to check)."""
        episodes = list(episodes)
        _, labels, _ = split_rated(episodes)
        if too_little(len(labels), sum(labels), self.signals):
            result = label_episodes(episodes, self.signals)  # fails before any fit, saying why: no call is spent
            return replace(result, report=replace(result.report, judge_calls=0))
        with ModelJudge(self.judge, prompt=prompt) as judge:
            scores = _aligned(episodes, judge.score_episodes(episodes))
            calls = judge.calls
        result = label_episodes(episodes, self.signals, judge_scores=scores)
        return replace(result, report=replace(result.report, judge_calls=calls))

"""What grading one sample returns: the score, why when it is not a plain judgement, and the sub-scores."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GradeResult(BaseModel):
    """`reason` is set when something kept the grader from judging normally (a timeout, a crash, a missing sample
    field, an unusable model reply); such a grade scores 0.0, so the reason is what tells it from a real zero."""

    model_config = ConfigDict(frozen=True)

    score: float
    reason: str | None = None
    sub_scores: dict[str, float] = Field(default_factory=dict, description="a multi grader's sub-grader scores by key")

"""OpenAI's grader JSON as typed pydantic models, so a job brought from OpenAI is checked before it grades anything.

The field names are OpenAI's (`string_check`, `text_similarity`, `score_model`, `python`, `multi`), so the JSON of
an OpenAI fine-tuning job loads as it is. Unknown fields are refused: a typo such as `evaluation_metrics` would
otherwise grade with a default nobody asked for. `parse_grader` names an unknown `type` and the ones we take.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class GraderConfigError(ValueError):
    """A grader that cannot grade as configured (unknown type, missing item field, metric unavailable...).

    Raised at validation time, or by `grade` when the configuration only turns out wrong then; never a silent 0.
    """


class _Grader(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="the grader's name, shown in reasons and sub-scores")


class StringCheckGrader(_Grader):
    """1.0 when `operation` holds between the rendered input and reference, else 0.0."""

    type: Literal["string_check"] = "string_check"
    input: str = Field(description="template, usually {{ sample.output_text }}")
    reference: str = Field(description="template, usually {{ item.<field> }}")
    operation: Literal["eq", "ne", "like", "ilike"]


Metric = Literal[
    "fuzzy_match", "bleu", "gleu", "meteor", "cosine",
    "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l",
]  # fmt: skip


class TextSimilarityGrader(_Grader):
    """A similarity in [0, 1] between the rendered input and reference, by `evaluation_metric`."""

    type: Literal["text_similarity"] = "text_similarity"
    input: str
    reference: str
    evaluation_metric: Metric
    pass_threshold: float | None = Field(
        default=None, description="OpenAI's evals field; kept for round trips, the score is not thresholded"
    )


class InputText(BaseModel):
    """A text part of a score_model message (OpenAI's input_text / output_text); `text` is a template."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["input_text", "output_text"]
    text: str


class InputImage(BaseModel):
    """An image part of a score_model message, sent as an image_url part."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["input_image"]
    image_url: str
    detail: str | None = None


class ScoreModelMessage(BaseModel):
    """One message to the scoring model; string content and text parts are templates."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[Annotated[InputText | InputImage, Field(discriminator="type")]]
    type: Literal["message"] | None = None


class SamplingParams(BaseModel):
    """OpenAI's sampling parameters for the scoring model."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    max_completions_tokens: int | None = None
    reasoning_effort: str | None = None


class ScoreModelGrader(_Grader):
    """A model reads the templated messages and answers a number in `range`; we map it linearly onto [0, 1]."""

    type: Literal["score_model"] = "score_model"
    model: str
    input: list[ScoreModelMessage] = Field(min_length=1)
    range: tuple[float, float] = (0.0, 1.0)
    sampling_params: SamplingParams | None = None
    pass_threshold: float | None = None

    @field_validator("range")
    @classmethod
    def _ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not value[0] < value[1]:
            raise ValueError(f"range must be [low, high] with low < high, got {list(value)}")
        return value


class PythonGrader(_Grader):
    """Untrusted `def grade(sample, item) -> float`, run in a separate limited process when the operator allows it."""

    type: Literal["python"] = "python"
    source: str
    image_tag: str | None = Field(default=None, description="OpenAI's runtime image; ignored, we run our Python")
    pass_threshold: float | None = None


class MultiGrader(_Grader):
    """Named sub-graders combined by an arithmetic formula over their scores."""

    type: Literal["multi"] = "multi"
    graders: dict[str, Grader] = Field(min_length=1)
    calculate_output: str


Grader = Annotated[
    StringCheckGrader | TextSimilarityGrader | ScoreModelGrader | PythonGrader | MultiGrader,
    Field(discriminator="type"),
]
MultiGrader.model_rebuild()
AnyGrader = StringCheckGrader | TextSimilarityGrader | ScoreModelGrader | PythonGrader | MultiGrader

GRADER_TYPES: dict[str, type[BaseModel]] = {
    "string_check": StringCheckGrader,
    "text_similarity": TextSimilarityGrader,
    "score_model": ScoreModelGrader,
    "python": PythonGrader,
    "multi": MultiGrader,
}
# OpenAI's label_model grader is not taken (yet): its labels need a structured-output model we may not have.


def _check_types(spec: Any, where: str) -> None:
    """Name an unknown or missing `type` with its place in the tree, before pydantic's generic union message."""
    if not isinstance(spec, dict):
        raise GraderConfigError(f"{where}: a grader is a JSON object, got {type(spec).__name__}")
    kind = spec.get("type")
    if not isinstance(kind, str) or kind not in GRADER_TYPES:
        shown = "no 'type'" if kind is None else f"unknown grader type {kind!r}"
        raise GraderConfigError(f"{where}: {shown}; allowed types: {', '.join(sorted(GRADER_TYPES))}")
    if kind == "multi" and isinstance(spec.get("graders"), dict):
        for key, sub in spec["graders"].items():
            _check_types(sub, f"{where}.graders.{key}")


class _GraderDocument(BaseModel):
    grader: Grader


def parse_grader(spec: dict[str, Any]) -> AnyGrader:
    """The typed grader for OpenAI's grader JSON; a ValueError names what is wrong and where."""
    _check_types(spec, "grader")
    return _GraderDocument.model_validate({"grader": spec}).grader


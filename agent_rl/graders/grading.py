"""`validate` a grader once when a job is set up, then `grade` every sample with it.

`validate` finds what would otherwise surface mid-training or, worse, as silent zeros: a template naming an
item field the dataset does not have, a sample field OpenAI does not define, a formula that is not plain
arithmetic over the sub-graders, a metric or grader type the operator has not provided for (cosine without an
embedding function, meteor without WordNet, score_model without an endpoint, python while python is off).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from agent_rl.graders import similarity
from agent_rl.graders.config import (AnyGrader, GraderConfigError, InputText, MultiGrader, PythonGrader,
                                     ScoreModelGrader, StringCheckGrader, TextSimilarityGrader, parse_grader)
from agent_rl.graders.context import GraderContext
from agent_rl.graders.formula import FormulaError, evaluate_formula, parse_formula
from agent_rl.graders.result import GradeResult
from agent_rl.graders.sandbox import check_python_grader, run_python_grader
from agent_rl.graders.score_model import grade_score_model
from agent_rl.graders.string_check import string_check
from agent_rl.graders.templates import check_template, render


def _as_grader(grader: AnyGrader | Mapping[str, Any]) -> AnyGrader:
    return parse_grader(dict(grader)) if isinstance(grader, Mapping) else grader


def _missing(gaps: list[str]) -> str | None:
    return "; ".join(gaps) if gaps else None


def grade(grader: AnyGrader | Mapping[str, Any], sample: Mapping[str, Any], item: Mapping[str, Any],
          context: GraderContext | None = None) -> GradeResult:  # fmt: skip
    """Score one sample against its dataset item.

    Raises GraderConfigError (a ValueError) for configuration problems — the same ones `validate` reports —
    and never scores them 0; what goes wrong with the sample itself scores 0.0 with a reason.
    """
    grader = _as_grader(grader)
    context = context or GraderContext()
    if isinstance(grader, StringCheckGrader):
        text, gaps = render(grader.input, sample, item)
        reference, more = render(grader.reference, sample, item)
        return GradeResult(score=string_check(grader.operation, text, reference), reason=_missing(gaps + more))
    if isinstance(grader, TextSimilarityGrader):
        text, gaps = render(grader.input, sample, item)
        reference, more = render(grader.reference, sample, item)
        return GradeResult(score=_similarity(grader, text, reference, context), reason=_missing(gaps + more))
    if isinstance(grader, ScoreModelGrader):
        return grade_score_model(grader, sample, item, context)
    if isinstance(grader, PythonGrader):
        return run_python_grader(grader, sample, item, context.python)
    return _grade_multi(grader, sample, item, context)


def _similarity(grader: TextSimilarityGrader, text: str, reference: str, context: GraderContext) -> float:
    metric = grader.evaluation_metric
    if metric == "cosine":
        if context.embed is None:
            raise GraderConfigError(_NO_EMBED.format(name=grader.name))
        score = similarity.cosine(context.embed([text, reference]))
    else:
        score = similarity.METRICS[metric](text, reference)
    return min(1.0, max(0.0, float(score)))


def _grade_multi(grader: MultiGrader, sample: Mapping[str, Any], item: Mapping[str, Any],
                 context: GraderContext) -> GradeResult:  # fmt: skip
    formula = parse_formula(grader.calculate_output, grader.graders.keys())
    results = {key: grade(sub, sample, item, context) for key, sub in grader.graders.items()}
    sub_scores: dict[str, float] = {}
    for key, result in results.items():
        sub_scores[key] = result.score
        sub_scores.update({f"{key}.{inner}": score for inner, score in result.sub_scores.items()})
    reasons = [f"{key}: {result.reason}" for key, result in results.items() if result.reason]
    try:
        score = evaluate_formula(formula, {key: result.score for key, result in results.items()})
    except FormulaError as exc:
        reasons.append(f"calculate_output {grader.calculate_output!r} failed: {exc}")
        score = 0.0
    return GradeResult(score=score, reason="; ".join(reasons) or None, sub_scores=sub_scores)


_NO_EMBED = (
    "text_similarity grader {name!r} uses the cosine metric, which needs an embedding function: "
    "set GraderContext.embed (texts -> vectors)"
)
_NO_ENDPOINT = "score_model grader {name!r} needs a chat endpoint: set GraderContext.chat_endpoint"


def problems(grader: AnyGrader | Mapping[str, Any], example_item: Mapping[str, Any],
             context: GraderContext | None = None) -> list[str]:  # fmt: skip
    """Everything `validate` would refuse, one line each (empty when the grader can run)."""
    try:
        grader = _as_grader(grader)
    except ValueError as exc:
        return [str(exc)]
    return list(_problems(grader, example_item, context or GraderContext(), f"grader {grader.name!r}"))


def validate(grader: AnyGrader | Mapping[str, Any], example_item: Mapping[str, Any],
             context: GraderContext | None = None) -> None:  # fmt: skip
    """Raise a GraderConfigError (a ValueError) listing every problem, checked against a representative item."""
    found = problems(grader, example_item, context)
    if found:
        raise GraderConfigError("; ".join(found) if len(found) == 1 else "\n".join(["grader problems:", *found]))


def _problems(grader: AnyGrader, item: Mapping[str, Any], context: GraderContext, where: str) -> Iterator[str]:
    def templates(*pairs: tuple[str, str]) -> Iterator[str]:
        for field, template in pairs:
            try:
                check_template(template, item, f"{where} {field}")
            except GraderConfigError as exc:
                yield str(exc)

    if isinstance(grader, StringCheckGrader | TextSimilarityGrader):
        yield from templates(("input", grader.input), ("reference", grader.reference))
    if isinstance(grader, TextSimilarityGrader):
        if grader.evaluation_metric == "cosine" and context.embed is None:
            yield _NO_EMBED.format(name=grader.name)
        if grader.evaluation_metric == "meteor" and (problem := similarity.wordnet_problem()):
            yield f"{where}: {problem}"
    elif isinstance(grader, ScoreModelGrader):
        for index, message in enumerate(grader.input):
            field = f"input[{index}].content"
            if isinstance(message.content, str):
                yield from templates((field, message.content))
            else:
                for part_index, part in enumerate(message.content):
                    text = part.text if isinstance(part, InputText) else part.image_url
                    yield from templates((f"{field}[{part_index}]", text))
        if context.chat_endpoint is None:
            yield _NO_ENDPOINT.format(name=grader.name)
    elif isinstance(grader, PythonGrader):
        try:
            check_python_grader(grader, context.python)
        except GraderConfigError as exc:
            yield str(exc)
    elif isinstance(grader, MultiGrader):
        try:
            parse_formula(grader.calculate_output, grader.graders.keys())
        except GraderConfigError as exc:
            yield f"{where}: {exc}"
        for key, sub in grader.graders.items():
            yield from _problems(sub, item, context, f"{where} > graders.{key}")

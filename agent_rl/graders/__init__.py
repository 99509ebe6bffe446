"""OpenAI's grader JSON (string_check, text_similarity, score_model, python, multi) evaluated by our code.

A fine-tuning job brought from OpenAI keeps its reward definition: `parse_grader` reads the JSON into typed
models, `validate` checks it once against a representative dataset item and the operator's context, and
`grade` scores each sample. docs/graders.md says what each grader does and where we differ from OpenAI.
"""

from agent_rl.graders.config import (
    GRADER_TYPES,
    AnyGrader,
    GraderConfigError,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
    parse_grader,
)
from agent_rl.graders.context import GraderContext, PythonSandboxConfig
from agent_rl.graders.grading import grade, problems, validate
from agent_rl.graders.result import GradeResult
from agent_rl.graders.sample import SAMPLE_FIELDS, make_sample
from agent_rl.graders.templates import TemplateError

__all__ = [
    "GRADER_TYPES",
    "SAMPLE_FIELDS",
    "AnyGrader",
    "GradeResult",
    "GraderConfigError",
    "GraderContext",
    "MultiGrader",
    "PythonGrader",
    "PythonSandboxConfig",
    "ScoreModelGrader",
    "StringCheckGrader",
    "TemplateError",
    "TextSimilarityGrader",
    "grade",
    "make_sample",
    "parse_grader",
    "problems",
    "validate",
]

"""What a fine-tuning job request must be before anything is written: OpenAI's create parameters checked one by one.

`parse_job_request` reads the body of `POST /v1/fine_tuning/jobs` (the model, the method with its hyperparameters
and grader, seed, suffix, metadata); `check_job_file` reads a stored training or validation file the way the job's
environment will (every row, for the job's method), and `grader_problems` checks the grader against the first
training row. Each refusal is a JobRequestError naming the parameter (`param`) in OpenAI's terms, so the route
answers a 400 in OpenAI's error shape. Messages name parameters, line numbers and fields, never a value from a
file: training data holds personal data.

No FastAPI here: the arbiter's routes (agent_rl/arbiter/job_routes.py) and the job store both use these checks.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from agent_rl.environments.openai_jobs.rows import JobFileError, JobRow, Method, iter_rows
from agent_rl.graders import GraderConfigError, GraderContext, parse_grader, problems

METHODS = tuple(m.value for m in Method)
# OpenAI's create parameters; any other is refused like OpenAI refuses it ("Unrecognized request argument").
PARAMETERS = ("model", "training_file", "validation_file", "method", "hyperparameters", "seed", "suffix", "metadata",
              "integrations")
# Each method's hyperparameters: name -> (what it takes, lowest, highest). "auto" is always taken; the runner maps
# "auto" and the numbers onto our training settings (the store records them as given).
_INT, _NUMBER = "a whole number", "a number"
SUPERVISED_HYPERPARAMETERS: dict[str, tuple[str, float, float]] = {
    "n_epochs": (_INT, 1, 50),
    "batch_size": (_INT, 1, 256),
    "learning_rate_multiplier": (_NUMBER, 0, 10),
}
REINFORCEMENT_HYPERPARAMETERS: dict[str, tuple[str, float, float]] = {
    **SUPERVISED_HYPERPARAMETERS,
    "compute_multiplier": (_NUMBER, 0, 10),
    "eval_interval": (_INT, 1, 1_000_000),
    "eval_samples": (_INT, 1, 1_000),
}
REASONING_EFFORTS = ("default", "low", "medium", "high")
BASE_HYPERPARAMETERS = ("batch_size", "learning_rate_multiplier", "n_epochs")  # the job object's top-level ones
MAX_SUFFIX = 64
MAX_METADATA = 16
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
MAX_SEED = 2**31 - 1


class JobRequestError(ValueError):
    """A job request refused before anything is written: `param` names the parameter (OpenAI's `param`), `code`
    is the error code, `status` the HTTP status (400 unless said otherwise)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


@dataclass(frozen=True)
class JobRequest:
    """A create request as the store takes it: the method normalized (`normalize_method`), files still by id."""

    model: str
    training_file: str
    validation_file: str | None
    method: dict[str, Any]
    seed: int
    suffix: str | None
    metadata: dict[str, str] | None

    @property
    def method_type(self) -> Method:
        return Method(self.method["type"])

    @property
    def grader(self) -> dict[str, Any] | None:
        return method_grader(self.method)


def method_grader(method: Mapping[str, Any]) -> dict[str, Any] | None:
    """The grader of a normalized method (reinforcement), else None."""
    config = method.get(method["type"]) or {}
    return config.get("grader")


def method_hyperparameters(method: Mapping[str, Any]) -> dict[str, Any]:
    """The hyperparameters of a normalized method."""
    return dict((method.get(method["type"]) or {}).get("hyperparameters") or {})


def parse_job_request(body: Any, served_models: Sequence[str], *, allow_python_graders: bool = False) -> JobRequest:
    """The create body checked field by field (everything but the files' content and the grader against a row);
    the first problem is a JobRequestError naming its parameter."""
    if not isinstance(body, dict):
        raise JobRequestError("the request body must be a JSON object", code="invalid_request")
    for name in body:
        if name not in PARAMETERS:
            shown = name[:100] if _storable(name) else "?"
            raise JobRequestError(f"Unrecognized request argument supplied: {shown}", param=shown,
                                  code="unknown_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise JobRequestError("model is required: the name of a base model to fine-tune", param="model",
                              code="invalid_value")
    if model not in served_models:
        shown = f"{model!r} is" if len(model) <= 100 and _storable(model) else "that model is"
        raise JobRequestError(f"{shown} not available for fine-tuning here; the models served for fine-tuning are: "
                              f"{', '.join(served_models)}", param="model", code="model_not_available")
    training_file = _file_id(body.get("training_file"), "training_file", required=True)
    validation_file = _file_id(body.get("validation_file"), "validation_file", required=False)
    integrations = body.get("integrations")
    if integrations not in (None, []):
        raise JobRequestError("integrations (Weights and Biases) are not supported here; leave them out",
                              param="integrations", code="unsupported_parameter")
    method = normalize_method(body.get("method"), body.get("hyperparameters"))
    grader = method_grader(method)
    if grader is not None and not allow_python_graders and _has_python_grader(grader):
        raise JobRequestError("python graders are off on this arbiter (they run the job's own code); the operator "
                              "enables them with ArbiterConfig.jobs.allow_python_graders",
                              param="method.reinforcement.grader", code="python_grader_disabled")
    return JobRequest(model=model, training_file=training_file, validation_file=validation_file, method=method,
                      seed=check_seed(body.get("seed")), suffix=check_suffix(body.get("suffix")),
                      metadata=check_metadata(body.get("metadata")))


def _file_id(value: Any, param: str, required: bool) -> Any:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise JobRequestError(f"{param} must be the id of a file uploaded with purpose fine-tune", param=param,
                              code=f"invalid_{param}")
    return value


def normalize_method(method: Any, legacy_hyperparameters: Any = None) -> dict[str, Any]:
    """OpenAI's `method` (or, without one, the deprecated top-level `hyperparameters`: a supervised job) as
    `{"type": t, t: {"hyperparameters": {...}, "grader": {...}}}`: every hyperparameter of the method present
    ("auto" where not given), the grader for reinforcement only. Normalizing a normalized method changes nothing."""
    if method is None:
        method = {"type": Method.SUPERVISED.value}
    if not isinstance(method, dict):
        raise JobRequestError("method must be an object such as {\"type\": \"supervised\"}", param="method",
                              code="invalid_method")
    kind = method.get("type")
    if kind == "dpo":
        raise JobRequestError("dpo (preference) fine-tuning is not supported here; use supervised or reinforcement",
                              param="method.type", code="unsupported_method")
    if kind not in METHODS:
        raise JobRequestError(f"method.type must be one of {', '.join(METHODS)}", param="method.type",
                              code="invalid_method")
    for name in method:
        if name not in ("type", kind):
            shown = name[:100] if _storable(name) else "?"
            raise JobRequestError(f"method.{shown} does not go with method.type {kind}", param=f"method.{shown}",
                                  code="invalid_method")
    config = method.get(kind)
    if config is None:
        config = {}
    where = f"method.{kind}"
    if not isinstance(config, dict):
        raise JobRequestError(f"{where} must be an object", param=where, code="invalid_method")
    allowed = ("hyperparameters",) if kind == Method.SUPERVISED.value else ("hyperparameters", "grader")
    for name in config:
        if name not in allowed:
            shown = name[:100] if _storable(name) else "?"
            raise JobRequestError(f"{where}.{shown} is not a setting of {kind} fine-tuning (it takes "
                                  f"{' and '.join(allowed)})", param=f"{where}.{shown}", code="invalid_method")
    hyperparameters, param = config.get("hyperparameters"), f"{where}.hyperparameters"
    if legacy_hyperparameters is not None:
        if kind != Method.SUPERVISED.value or hyperparameters is not None:
            raise JobRequestError(f"send the hyperparameters as {where}.hyperparameters only (the top-level "
                                  "hyperparameters are OpenAI's deprecated form of a supervised job's)",
                                  param="hyperparameters", code="invalid_hyperparameters")
        hyperparameters, param = legacy_hyperparameters, "hyperparameters"
    normalized: dict[str, Any] = {"hyperparameters": check_hyperparameters(hyperparameters, Method(kind), param)}
    if kind == Method.REINFORCEMENT.value:
        grader = config.get("grader")
        if grader is None:
            raise JobRequestError("a reinforcement job needs a grader (method.reinforcement.grader) to score the "
                                  "model's replies", param=f"{where}.grader", code="invalid_grader")
        normalized["grader"] = check_grader(grader)
    return {"type": kind, kind: normalized}


def check_hyperparameters(value: Any, method: Method, param: str) -> dict[str, Any]:
    """The method's hyperparameters, each "auto" or a number in its range (ours: the runner maps them)."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise JobRequestError(f"{param} must be an object", param=param, code="invalid_hyperparameters")
    known = SUPERVISED_HYPERPARAMETERS if method is Method.SUPERVISED else REINFORCEMENT_HYPERPARAMETERS
    taken = [*known, *(["reasoning_effort"] if method is Method.REINFORCEMENT else [])]
    result: dict[str, Any] = {}
    for name, given in value.items():
        at = f"{param}.{name[:100] if _storable(name) else '?'}"
        if name not in taken:
            raise JobRequestError(f"{at} is not a hyperparameter of {method.value} fine-tuning (it takes "
                                  f"{', '.join(taken)})", param=at, code="invalid_hyperparameters")
        if name == "reasoning_effort":
            if given not in REASONING_EFFORTS:
                raise JobRequestError(f"{at} must be one of {', '.join(REASONING_EFFORTS)}", param=at,
                                      code="invalid_hyperparameters")
            result[name] = given
            continue
        kind, low, high = known[name]
        if given == "auto":
            result[name] = given
            continue
        number_ok = isinstance(given, int | float) and not isinstance(given, bool) and math.isfinite(given)
        whole_ok = isinstance(given, int) and not isinstance(given, bool)
        ok = (whole_ok if kind == _INT else number_ok) and low <= given <= high and (kind == _INT or given > 0)
        if not ok:
            what = (f"a whole number from {low:g} to {high:g}" if kind == _INT
                    else f"a number greater than {low:g} and at most {high:g}")
            raise JobRequestError(f"{at} must be \"auto\" or {what}", param=at, code="invalid_hyperparameters")
        result[name] = given
    for name in known:
        result.setdefault(name, "auto")
    return result


def check_grader(grader: Any) -> dict[str, Any]:
    """The grader JSON, parsed by agent_rl.graders (a known type, known fields, a formula that parses); returned
    as given. Its templates are checked against a real row later (`grader_problems`)."""
    param = "method.reinforcement.grader"
    if not isinstance(grader, dict):
        raise JobRequestError(f"{param} must be a grader object (string_check, text_similarity, score_model, python "
                              "or multi)", param=param, code="invalid_grader")
    try:
        parse_grader(grader)
    except ValidationError as exc:
        details = "; ".join(f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors())
        raise JobRequestError(f"{param} is not a valid grader: {details}", param=param, code="invalid_grader") from None
    except (GraderConfigError, ValueError) as exc:
        raise JobRequestError(f"{param} is not a valid grader: {exc}", param=param, code="invalid_grader") from None
    return grader


def _has_python_grader(grader: Mapping[str, Any]) -> bool:
    if grader.get("type") == "python":
        return True
    subs = grader.get("graders") if grader.get("type") == "multi" else None
    return isinstance(subs, dict) and any(isinstance(s, dict) and _has_python_grader(s) for s in subs.values())


def check_seed(seed: Any) -> int:
    """The job's seed: a whole number from 0 to 2**31 - 1; a random one when none is given (as OpenAI does)."""
    if seed is None:
        return secrets.randbelow(MAX_SEED + 1)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise JobRequestError(f"seed must be a whole number from 0 to {MAX_SEED}", param="seed", code="invalid_value")
    return seed


def check_suffix(suffix: Any) -> str | None:
    """Up to 64 printable characters added to the fine-tuned model's name (unsafe characters there become '-')."""
    if suffix is None or suffix == "":
        return None
    if not isinstance(suffix, str) or len(suffix) > MAX_SUFFIX or not suffix.isprintable() or not _storable(suffix):
        raise JobRequestError(f"suffix must be a string of up to {MAX_SUFFIX} printable characters", param="suffix",
                              code="invalid_value")
    return suffix


def check_metadata(metadata: Any) -> dict[str, str] | None:
    """OpenAI's metadata: up to 16 pairs, keys up to 64 characters, values strings up to 512."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA:
        raise JobRequestError(f"metadata must be an object of at most {MAX_METADATA} string pairs", param="metadata",
                              code="invalid_value")
    for key, value in metadata.items():
        if not (0 < len(key) <= MAX_METADATA_KEY and _storable(key)):
            raise JobRequestError(f"metadata keys must be 1 to {MAX_METADATA_KEY} characters", param="metadata",
                                  code="invalid_value")
        if not isinstance(value, str) or len(value) > MAX_METADATA_VALUE or not _storable(value):
            raise JobRequestError(f"metadata values must be strings of at most {MAX_METADATA_VALUE} characters",
                                  param="metadata", code="invalid_value")
    return dict(metadata)


def _storable(text: str) -> bool:
    """Text SQLite and every JSON reader take: no NUL, no lone surrogate."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- the files ------------------------------------------------------------------------------------


def check_job_file(lines: Iterable[bytes], method: Method, param: str) -> JobRow:
    """Read a training or validation file the way the job's environment will (every row, as a row of `method`)
    and return its first row; a JobRequestError names the file's parameter and its first bad line."""
    first: JobRow | None = None
    try:
        for row in iter_rows(lines, method):
            if first is None:
                first = row
    except JobFileError as exc:
        raise JobRequestError(f"{param} cannot be used for {method.value} fine-tuning: {exc}", param=param,
                              code="invalid_file_format") from None
    if first is None:
        raise JobRequestError(f"{param} holds no rows", param=param, code="invalid_file_format")
    return first


def grader_problems(grader: Mapping[str, Any], first_row: JobRow, context: GraderContext | None = None) -> None:
    """Refuse a grader that cannot grade the job's rows (agent_rl.graders.problems against the first training row:
    a template naming a field the rows lack, a metric or grader type the operator has not provided for, a python
    grader while `context` keeps them off)."""
    found = problems(dict(grader), first_row.item, context or GraderContext())
    if found:
        raise JobRequestError("method.reinforcement.grader cannot grade the training file's rows: " + "; ".join(found),
                              param="method.reinforcement.grader", code="invalid_grader")


def file_kind_matches(kind: str | None, method: Method, param: str) -> None:
    """Refuse a file whose rows (as the Files API classified them at upload) are of the other method's kind."""
    if kind is None or kind == method.value:
        return
    hint = ("its messages end with a user or developer message" if kind == Method.REINFORCEMENT.value
            else "its messages end with the assistant reply to learn")
    raise JobRequestError(f"{param} holds {kind} rows ({hint}) but method.type is {method.value}", param=param,
                          code="invalid_file_format")

"""The validation suite for exported pool episodes: every row ends up clean or quarantined with all its reasons.

Each raw row is profiled in Python into a flat, safe DataFrame row (types, lengths, parse
states, conversation errors); one Great Expectations 1.x suite then runs over the whole frame
and its per-expectation unexpected row ids become the per-row reasons. GX runs here rather than
through dagster-ge, which supports only GX < 1.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_rl.agent.tool_calls import call_function
from agent_rl.curation.conversation_rules import conversation_errors
from agent_rl.json_walk import MAX_JSON_DEPTH, strings, too_deep
from agent_rl.records import Episode, Outcome, current_episode_keys

# What one episode may hold before curation quarantines it instead of reading it: generous (the gateway refuses
# requests nested deeper than json_walk.MAX_JSON_DEPTH, and an episode holds a few levels of its own around them;
# older pool rows were never checked), and far below what breaks the walkers after validation (pydantic's
# serializer stops at 255 levels) or makes the privacy pass run for hours.
DEFAULT_EPISODE_CHARS = 1_000_000
DEFAULT_EPISODE_DEPTH = 2 * MAX_JSON_DEPTH
# Postgres text cannot hold NUL, and tokenizers/UTF-8 writers choke on lone surrogates.
_BAD_CHARS = re.compile("[\ud800-\udfff\x00]")


def config_for(environments: list[Any], **overrides: Any) -> ValidationConfig:
    """The checks for a run training on `environments` (agent_rl/environments): their categories and tools."""
    categories = tuple(dict.fromkeys(c for env in environments for c in env.categories))
    tools = tuple(dict.fromkeys(t for env in environments for t in env.tool_names()))
    ranges = [env.grading().reward_range for env in environments]
    bounds = {"reward_min": min(low for low, _ in ranges), "reward_max": max(high for _, high in ranges)}
    return ValidationConfig(categories=categories, tools=tools, environments=tuple(e.name for e in environments),
                            **{**bounds, **overrides})


class ValidationConfig(BaseModel):
    """Ranges and sets the suite checks: what is known (categories, tools, environments) comes from the run's
    environments (`config_for`) or the gateway's episodes (curation/live.py); the limits' defaults fit any agent."""

    model_config = ConfigDict(frozen=True)

    categories: tuple[str, ...] = Field(description="known task categories (config_for: the environments')")
    outcomes: tuple[str, ...] = Field(tuple(o.value for o in Outcome), description="known outcomes")
    tools: tuple[str, ...] = Field(description="tools an assistant may call")
    environments: tuple[str, ...] = Field(description="environments whose episodes are expected")
    final_tools: tuple[str, ...] = Field(("return_final_answer",),
                                         description="tools whose call may end a conversation unanswered")
    require_category: bool = Field(True, description="rows without task_category are quarantined (balancing needs it)")
    require_reward: bool = Field(True, description="rows without a reward are quarantined (training needs it)")
    require_answer_when_correct: bool = Field(True, description="a correct row without a final answer is corrupt "
                                              "(off for live traffic: users may approve an action, not a reply)")
    reward_min: float = Field(-2.0, description="lowest reward the rubric can give")
    reward_max: float = Field(1.5, description="highest reward the rubric can give")
    min_turns: int = Field(0, ge=0)
    max_turns: int = Field(50, ge=1, description="more turns than any runner budget allows")
    max_prompt_tokens: int = Field(1_000_000, ge=1, description="prompt tokens summed over an episode's turns")
    max_completion_tokens: int = Field(200_000, ge=1)
    min_messages: int = Field(2, ge=1, description="at least the system/user opening")
    max_messages: int = Field(200, ge=2)
    max_message_chars: int = Field(50_000, ge=1, description="longest single message content or tool-call argument")
    max_messages_chars: int = Field(400_000, ge=1, description="all message text of one episode")
    max_episode_chars: int = Field(DEFAULT_EPISODE_CHARS, ge=1, description=(
        "characters of all the text of one episode (every field, message, tool schema, key): above it the episode "
        "is quarantined, 'episode too large', before the privacy pass reads it"))
    max_json_depth: int = Field(DEFAULT_EPISODE_DEPTH, ge=1, description=(
        "objects and arrays nested in one episode, and in each string of it that holds JSON: deeper, it is "
        "quarantined before anything walks it"))
    max_question_chars: int = Field(4_000, ge=1)
    max_answer_chars: int = Field(4_000, ge=1)


class GateConfig(BaseModel):
    """What a validated export must reach before it may feed training."""

    model_config = ConfigDict(frozen=True)

    min_points: int = Field(5000, ge=0, description="clean episodes required")
    min_clean_ratio: float = Field(0.95, ge=0, le=1, description="clean / exported")
    min_categories: int = Field(5, ge=0, description="distinct task categories among clean episodes")


@dataclass
class GateResult:
    name: str
    passed: bool
    observed: float
    required: float
    message: str


@dataclass
class ValidationResult:
    """`clean` holds normalized episode dicts (JSON-safe, messages parsed); `quarantined` the raw rows with reasons."""

    clean: list[dict[str, Any]]
    quarantined: list[tuple[Any, list[str]]]
    report: dict[str, Any] = field(default_factory=dict)


# -- per-row profiling -------------------------------------------------------------------------

# (field, expected kind, required?) -- kinds: str, int, number, list, dict, datetime, json-list, json-dict
def _field_specs(config: ValidationConfig) -> list[tuple[str, str, bool]]:
    return [
        ("episode_id", "str", True),
        ("created_at", "datetime", True),
        ("tenant", "str", False),
        ("environment", "str", True),
        ("context", "str", True),
        ("task_category", "str", config.require_category),
        ("task_id", "str", False),
        ("question", "str", True),
        ("policy_version", "str", True),
        ("messages", "json-list", True),
        ("final_answer", "str", False),
        ("citations", "list", False),
        ("outcome", "str", True),
        ("reward", "number", config.require_reward),
        ("reward_components", "json-dict", False),
        ("turns", "int", False),
        ("prompt_tokens", "int", False),
        ("completion_tokens", "int", False),
        ("latency_ms", "number", False),
        ("cost_usd", "number", False),
        ("feedback", "str", False),
    ]


_KIND_TEXT = {
    "str": "a string",
    "int": "an integer",
    "number": "a finite number",
    "list": "a list",
    "datetime": "an ISO timestamp",
    "json-list": "a list (or JSON text of one)",
    "json-dict": "an object (or JSON text of one)",
}


def _type_state(value: Any, kind: str, required: bool) -> str:
    """'ok', 'missing', or the name of the wrong type found."""
    if value is None:
        return "missing" if required else "ok"
    if kind == "str":
        ok = isinstance(value, str)
    elif kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "number":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return "ok" if math.isfinite(value) else "non-finite number"
        ok = False
    elif kind == "list":
        ok = isinstance(value, (list, tuple))
    elif kind == "datetime":
        if isinstance(value, datetime):
            return "ok"
        if isinstance(value, str):
            try:
                datetime.fromisoformat(value.replace("Z", "+00:00"))
                return "ok"
            except ValueError:
                return "unparsable timestamp"
        ok = False
    elif kind == "json-list":
        ok = isinstance(value, (list, tuple, str))
    else:  # json-dict
        ok = isinstance(value, (dict, str))
    return "ok" if ok else type(value).__name__


def _parse_json(value: Any, want: type) -> tuple[Any, str]:
    """(parsed value, 'ok' or what is wrong)."""
    if not isinstance(value, str):
        return value, "ok"
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError) as exc:
        return None, f"malformed JSON ({str(exc)[:80]})"
    if not isinstance(parsed, want):
        return None, f"JSON holds {type(parsed).__name__}, expected {want.__name__}"
    return parsed, "ok"


def _bad_unicode_fields(row: Mapping[str, Any]) -> str | None:
    """Names of the fields holding lone surrogates or NUL characters (anywhere inside, keys too), or None."""
    bad = [str(key) for key, value in row.items()
           if any(_BAD_CHARS.search(text) for text in strings({key: value}))]
    return ", ".join(sorted(bad)) or None


def _message_sizes(messages: Any) -> tuple[int, int]:
    """(total characters, longest single content/argument) over a parsed message list."""
    total = longest = 0
    if not isinstance(messages, list):
        return 0, 0
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        pieces = [message.get("content")]
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                fn = call_function(call)
                if fn is not None:
                    pieces.append(_argument_text(fn.get("arguments")))
        for piece in pieces:
            if isinstance(piece, str):
                total += len(piece)
                longest = max(longest, len(piece))
    return total, longest


def _argument_text(args: Any) -> str:
    """Tool-call arguments as the text they are sent as; arguments too deep to write out count as their strings
    (the depth check quarantines the row and names them)."""
    if isinstance(args, str):
        return args
    try:
        return json.dumps(args, default=str)
    except (ValueError, RecursionError):
        return "".join(strings(args))


def _hazards(row: Mapping[str, Any], messages: Any, config: ValidationConfig) -> tuple[int, str | None]:
    """(characters of all the episode's text, the path of what nests deeper than the limit or None), read without
    recursion over the row with its messages parsed (JSON text inside them is measured too)."""
    whole = {**row, "messages": messages} if messages is not None else row
    return sum(len(text) for text in strings(whole)), too_deep(whole, config.max_json_depth)


@dataclass
class _Profile:
    columns: dict[str, Any]
    normalized: dict[str, Any] | None
    python_reasons: list[str]


def _profile(row_id: int, raw: Any, config: ValidationConfig) -> _Profile:
    specs = _field_specs(config)
    columns: dict[str, Any] = {"row_id": row_id}
    if isinstance(raw, str):
        raw, state = _parse_json(raw, dict)
        if state != "ok":
            raw = None
    if not isinstance(raw, Mapping):
        # Only the "row" check speaks for a non-object row; its fields are not missing one by one.
        for name, _, _ in specs:
            columns[f"type__{name}"] = "ok"
        columns["row_kind"] = type(raw).__name__ if raw is not None else "unparsable"
        return _Profile(columns, None, [])
    columns["row_kind"] = "dict"
    row = current_episode_keys(dict(raw))
    for name, kind, required in specs:
        columns[f"type__{name}"] = _type_state(row.get(name), kind, required)
    typed = {name: row.get(name) if columns[f"type__{name}"] == "ok" else None for name, _, _ in specs}

    messages, columns["json__messages"] = _parse_json(typed["messages"], list)
    components, columns["json__reward_components"] = _parse_json(typed["reward_components"], dict)
    episode_id = typed["episode_id"]
    columns["episode_id"] = episode_id
    for name in ("task_category", "outcome", "environment"):
        # Truncated: a megabyte-long category must not travel through the GX result.
        columns[name] = typed[name][:100] if typed[name] is not None else None
    for name in ("reward", "turns", "prompt_tokens", "completion_tokens", "latency_ms", "cost_usd"):
        columns[name] = float(typed[name]) if typed[name] is not None else None
    columns["question_chars"] = len(typed["question"]) if typed["question"] is not None else None
    columns["answer_chars"] = len(typed["final_answer"] or "")
    columns["message_count"] = len(messages) if isinstance(messages, list) else None
    total, longest = _message_sizes(messages)
    columns["messages_chars"] = total
    columns["longest_message_chars"] = longest
    columns["bad_unicode"] = _bad_unicode_fields(row)
    citations = typed["citations"]
    columns["citations_ok"] = citations is None or all(isinstance(s, str) for s in citations)

    columns["episode_chars"], columns["too_deep"] = _hazards(row, messages, config)
    hazardous = columns["episode_chars"] > config.max_episode_chars or columns["too_deep"] is not None

    python_reasons = []
    if (messages is not None and not hazardous and longest <= config.max_message_chars
            and total <= config.max_messages_chars):
        python_reasons = [f"conversation: {e}" for e in conversation_errors(messages, config)]
    columns["conversation_errors"] = len(python_reasons)

    normalized = dict(row)
    if messages is not None:
        normalized["messages"] = messages
    if components is not None:
        normalized["reward_components"] = components
    return _Profile(columns, normalized, python_reasons)


# -- the GX suite --------------------------------------------------------------------------------


def _expectations(config: ValidationConfig) -> list[tuple[Any, str]]:
    """(expectation, reason prefix) pairs; the prefix names the check in every reason it produces."""
    import great_expectations as gx

    E = gx.expectations
    out: list[tuple[Any, str]] = [(E.ExpectColumnValuesToBeInSet(column="row_kind", value_set=["dict"]), "row")]
    for name, _, _ in _field_specs(config):
        out.append((E.ExpectColumnValuesToBeInSet(column=f"type__{name}", value_set=["ok"]), f"type:{name}"))
    out += [
        (E.ExpectColumnValuesToBeInSet(column="json__messages", value_set=["ok"]), "json:messages"),
        (E.ExpectColumnValuesToBeInSet(column="json__reward_components", value_set=["ok"]), "json:reward_components"),
        (E.ExpectColumnValuesToBeNull(column="duplicate_of"), "duplicate"),
        (E.ExpectColumnValuesToBeInSet(column="task_category", value_set=list(config.categories)), "category"),
        (E.ExpectColumnValuesToBeInSet(column="environment", value_set=list(config.environments)), "environment"),
        (E.ExpectColumnValuesToBeInSet(column="outcome", value_set=list(config.outcomes)), "outcome"),
        (E.ExpectColumnValuesToBeBetween(column="reward", min_value=config.reward_min, max_value=config.reward_max),
         "reward_range"),
        (E.ExpectColumnValuesToBeBetween(column="turns", min_value=config.min_turns, max_value=config.max_turns),
         "turns_range"),
        (E.ExpectColumnValuesToBeBetween(column="prompt_tokens", min_value=0, max_value=config.max_prompt_tokens),
         "prompt_tokens_range"),
        (E.ExpectColumnValuesToBeBetween(column="completion_tokens", min_value=0,
                                         max_value=config.max_completion_tokens), "completion_tokens_range"),
        (E.ExpectColumnValuesToBeBetween(column="latency_ms", min_value=0), "latency_range"),
        (E.ExpectColumnValuesToBeBetween(column="cost_usd", min_value=0), "cost_range"),
        (E.ExpectColumnValuesToBeBetween(column="question_chars", min_value=1, max_value=config.max_question_chars),
         "question_length"),
        (E.ExpectColumnValuesToBeBetween(column="answer_chars", max_value=config.max_answer_chars), "answer_length"),
        (E.ExpectColumnValuesToBeBetween(column="message_count", min_value=config.min_messages,
                                         max_value=config.max_messages), "message_count"),
        (E.ExpectColumnValuesToBeBetween(column="longest_message_chars", max_value=config.max_message_chars),
         "message_size"),
        (E.ExpectColumnValuesToBeBetween(column="messages_chars", max_value=config.max_messages_chars),
         "conversation_size"),
        (E.ExpectColumnValuesToBeBetween(column="episode_chars", max_value=config.max_episode_chars),
         "episode too large"),
        (E.ExpectColumnValuesToBeNull(column="too_deep"), "depth"),
        (E.ExpectColumnValuesToBeNull(column="bad_unicode"), "unicode"),
        (E.ExpectColumnValuesToBeInSet(column="citations_ok", value_set=[True]), "citations"),
        # Reasons for this one come from the Python conversation check (one per problem).
        (E.ExpectColumnValuesToBeBetween(column="conversation_errors", max_value=0), "conversation"),
    ]
    if config.require_answer_when_correct:
        out.append((E.ExpectColumnValuesToBeBetween(column="answer_chars", min_value=1,
                                                    row_condition='outcome=="correct"', condition_parser="pandas"),
                    "empty_correct_answer"))
    return out


_REASON_TEXT = {
    "row": lambda v: f"row is {v}, not an episode object",
    "duplicate": lambda v: f"duplicate episode_id (first seen at row {int(v)})",
    "category": lambda v: f"unknown task_category {str(v)[:40]!r}",
    "environment": lambda v: f"episode of environment {str(v)[:40]!r}, not one this run trains on",
    "outcome": lambda v: f"unknown outcome {str(v)[:40]!r}",
    "empty_correct_answer": lambda v: "outcome is correct but final_answer is empty",
    "unicode": lambda v: f"invalid unicode (lone surrogate or NUL) in {v}",
    "citations": lambda v: "citations holds non-string items",
}


def _reason(prefix: str, column: str, value: Any, config: ValidationConfig) -> str:
    if prefix.startswith("type:"):
        name = prefix.split(":", 1)[1]
        kind = dict((n, k) for n, k, _ in _field_specs(config))[name]
        if value == "missing":
            return f"{prefix}: required field {name!r} is missing"
        return f"{prefix}: {name} is {value}, expected {_KIND_TEXT[kind]}"
    if prefix.startswith("json:"):
        return f"{prefix}: {prefix.split(':', 1)[1]} {value}"
    if prefix in _REASON_TEXT:
        return f"{prefix}: {_REASON_TEXT[prefix](value)}"
    if prefix == "episode too large":
        return f"{prefix}: {int(value)} characters > {config.max_episode_chars}"
    if prefix == "depth":
        return f"{prefix}: {value} is nested more than {config.max_json_depth} levels deep"
    shown = int(value) if isinstance(value, float) and value.is_integer() else value
    return f"{prefix}: {column} = {shown} is out of range"


class _Suite:
    """The GX context, batch definition and suite, built once per config (building costs ~50 ms)."""

    def __init__(self, config: ValidationConfig) -> None:
        import great_expectations as gx

        self.context = gx.get_context(mode="ephemeral")
        try:
            from great_expectations.data_context.types.base import ProgressBarsConfig

            self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        except Exception:  # progress bars are cosmetic; an API change must not break validation
            pass
        asset = self.context.data_sources.add_pandas("pool_export").add_dataframe_asset("episodes")
        self.batch_definition = asset.add_batch_definition_whole_dataframe("export")
        self.suite = gx.ExpectationSuite(name="pool_episodes")
        self.prefixes: dict[str, str] = {}
        for expectation, prefix in _expectations(config):
            expectation.meta = {"check": prefix}
            self.suite.add_expectation(expectation)
        self.suite = self.context.suites.add(self.suite)

    def run(self, frame: Any) -> Any:
        batch = self.batch_definition.get_batch(batch_parameters={"dataframe": frame})
        return batch.validate(
            self.suite, result_format={"result_format": "COMPLETE", "unexpected_index_column_names": ["row_id"]}
        )


_SUITES: dict[str, _Suite] = {}


def _suite_for(config: ValidationConfig) -> _Suite:
    key = config.model_dump_json()
    if key not in _SUITES:
        _SUITES[key] = _Suite(config)
    return _SUITES[key]


def validate_episodes(rows: list[Any], config: ValidationConfig) -> ValidationResult:
    """Split exported rows into clean episodes and quarantined rows (each with every reason).

    Never raises on bad rows: whatever a row holds, it ends in exactly one of the two lists,
    so `len(rows) == len(clean) + len(quarantined)`.
    """
    import pandas as pd

    started = time.perf_counter()
    profiles = [_profile(i, raw, config) for i, raw in enumerate(rows)]
    first_seen: dict[str, int] = {}
    for profile in profiles:
        episode_id = profile.columns.get("episode_id")
        duplicate_of = None
        if episode_id is not None:
            duplicate_of = first_seen.setdefault(episode_id, profile.columns["row_id"])
            duplicate_of = None if duplicate_of == profile.columns["row_id"] else duplicate_of
        profile.columns["duplicate_of"] = duplicate_of
    profiled = time.perf_counter()

    reasons: dict[int, list[str]] = {i: [] for i in range(len(rows))}
    checks: list[dict[str, Any]] = []
    gx_success = True
    if rows:
        frame = pd.DataFrame([p.columns for p in profiles])
        outcome = _suite_for(config).run(frame)
        gx_success = bool(outcome.success)
        for result in outcome.results:
            expectation = result.expectation_config
            prefix = (expectation.meta or {}).get("check", expectation.type)
            column = expectation.kwargs.get("column", "")
            if result.exception_info and result.exception_info.get("raised_exception"):
                # A suite error must not pass rows silently: every row fails this check.
                message = str(result.exception_info.get("exception_message"))[:200]
                for i in reasons:
                    reasons[i].append(f"{prefix}: check could not run ({message})")
                checks.append({"check": prefix, "success": False, "unexpected": len(rows), "error": message})
                continue
            unexpected = result.result.get("unexpected_index_list") or []
            checks.append({"check": prefix, "success": bool(result.success), "unexpected": len(unexpected)})
            if prefix == "conversation":
                continue
            for item in unexpected:
                reasons[int(item["row_id"])].append(_reason(prefix, column, item.get(column), config))
    validated = time.perf_counter()

    clean: list[dict[str, Any]] = []
    quarantined: list[tuple[Any, list[str]]] = []
    for i, (raw, profile) in enumerate(zip(rows, profiles)):
        row_reasons = reasons[i] + profile.python_reasons
        if not row_reasons and profile.normalized is not None:
            try:
                clean.append(Episode.model_validate(profile.normalized).model_dump(mode="json"))
                continue
            except ValidationError as exc:
                row_reasons = [f"record: {_pydantic_summary(exc)}"]
        if not row_reasons:
            row_reasons = ["row: not an episode object"]
        quarantined.append((raw, row_reasons))

    reason_counts = Counter(r.split(":", 1)[0] if not r.startswith(("type:", "json:")) else ":".join(r.split(":", 2)[:2])
                            for _, rs in quarantined for r in rs)
    categories = Counter(row.get("task_category") for row in clean)
    per_environment: dict[str, Counter] = {}
    for row in clean:
        per_environment.setdefault(str(row.get("environment")), Counter())[str(row.get("task_category"))] += 1
    report = {
        "count_in": len(rows),
        "clean": len(clean),
        "quarantined": len(quarantined),
        "clean_ratio": len(clean) / len(rows) if rows else 0.0,
        "categories": {str(k): v for k, v in sorted(categories.items(), key=lambda kv: str(kv[0]))},
        "environments": {env: dict(sorted(c.items())) for env, c in sorted(per_environment.items())},
        "reasons": dict(reason_counts.most_common()),
        "gx_success": gx_success,
        "checks": checks,
        "seconds": {"profile": profiled - started, "gx": validated - profiled,
                    "total": time.perf_counter() - started},
    }
    return ValidationResult(clean=clean, quarantined=quarantined, report=report)


def _pydantic_summary(exc: ValidationError) -> str:
    parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3]]
    return "; ".join(parts)


def evaluate_gates(result: ValidationResult, config: GateConfig | None = None) -> list[GateResult]:
    """The blocking prerequisites for training: volume, clean ratio, category diversity."""
    count_in = result.report.get("count_in", len(result.clean) + len(result.quarantined))
    categories = {row.get("task_category") for row in result.clean if row.get("task_category")}
    return gate_results(count_in, len(result.clean), categories, config)


def gate_results(count_in: int, clean: int, categories: set[str], config: GateConfig | None = None,
                 declared_categories: int | None = None) -> list[GateResult]:
    """The gates from the counts alone (what a blocking check re-reads from the validation report).

    With `declared_categories` (how many the environment has), diversity asks for at most that many: a plug-in
    declaring 4 categories can never show 5."""
    config = config or GateConfig()
    if declared_categories is not None and declared_categories < config.min_categories:
        config = config.model_copy(update={"min_categories": declared_categories})
    ratio = clean / count_in if count_in else 0.0
    return [
        GateResult("volume", clean >= config.min_points, clean, config.min_points,
                   f"{clean} clean episodes; at least {config.min_points} required"),
        GateResult("clean_ratio", ratio >= config.min_clean_ratio, round(ratio, 4), config.min_clean_ratio,
                   f"{ratio:.1%} of {count_in} exported episodes are clean; at least "
                   f"{config.min_clean_ratio:.0%} required"),
        GateResult("diversity", len(categories) >= config.min_categories, len(categories), config.min_categories,
                   f"{len(categories)} task categories ({', '.join(sorted(categories)) or 'none'}); at least "
                   f"{config.min_categories} required"),
    ]

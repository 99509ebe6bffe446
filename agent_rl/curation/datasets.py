"""TRL-ready datasets: SFT conversations from good episodes, JSONL with hashes (GRPO rows are the environment's:
`World.grpo_rows`, else `train.plugin_rollouts.task_rows`).

Quality (for SFT selection) is 0 unless the episode's outcome is correct; a correct episode's quality is what
its environment's `demonstration_quality(reward)` says (the registry finds it by the episode's `environment`): 1 by
default, the share of the rubric's extra credit for the email assistant (right sources, few turns). An
environment the registry does not know by name (gateway traffic, a plug-in loaded by import path) has quality 1:
its judge (or a user's verdict) said correct.

Rows are saved as JSONL from plain Python objects: a `datasets.Dataset` built from message lists
whose tool calls have different argument keys merges the schemas and fills the missing keys with
null, which then render into prompts (docs/architecture.md, known pitfalls).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any

from agent_rl.environments.messages import call_arguments, is_malformed, malformed_calls, template_messages
from agent_rl.agent.tool_calls import call_function, call_name
from agent_rl.jsonl import canonical_line, read_jsonl, save_jsonl  # noqa: F401 - curation's names for them
from agent_rl.records import DEFAULT_ENVIRONMENT

log = logging.getLogger(__name__)


def quality(episode: Mapping[str, Any]) -> float:
    """How good a demonstration the episode is (see module docstring)."""
    reward = episode.get("reward")
    if str(episode.get("outcome")) != "correct" or not isinstance(reward, (int, float)):
        return 0.0
    return _demonstration_quality(str(episode.get("environment") or DEFAULT_ENVIRONMENT))(float(reward))


@lru_cache(maxsize=None)
def _demonstration_quality(environment: str) -> Callable[[float], float]:
    """The scale of the environment the registry knows by that name; 1.0 for one it does not know."""
    from agent_rl.environments.registry import available, load_environment

    if environment not in available():
        return lambda reward: 1.0
    return load_environment(environment).grading().demonstration_quality


def _schemas(tools: list[dict[str, Any]] | None, environment: str, known: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The tools a row trains with: those given, else those of the episode's environment as the registry finds it
    by name (a built-in or an installed plug-in; one loaded by import path passes its own)."""
    if tools is not None:
        return tools
    if environment not in known:
        from agent_rl.environments.registry import load_environment

        known[environment] = load_environment(environment).tool_schemas()
    return known[environment]


def _parameters(schemas: list[dict[str, Any]]) -> dict[str, list[str]]:
    out = {}
    for schema in schemas:
        function = schema.get("function", schema)
        out[function["name"]] = list(function.get("parameters", {}).get("properties", {}))
    return out


def _in_schema_order(arguments: dict[str, Any], allowed: list[str] | None) -> dict[str, Any]:
    """Arguments in schema order (sorted for a tool the schemas do not know), without null values (they would
    render as `null`)."""
    order = allowed if allowed is not None else sorted(arguments)
    return {key: arguments[key] for key in order if key in arguments and arguments[key] is not None}


def conversation(messages: list[dict[str, Any]], schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages in one consistent TRL layout: the chat template's shape (environments/messages.py) without call
    ids, each call's arguments in its schema's order. Malformed arguments keep their raw text, as serving showed them (a
    replayed step); `sft_rows` leaves such a conversation out."""
    allowed = _parameters(schemas)
    out = template_messages(messages, ids=False)
    for message in out:
        for call in message.get("tool_calls") or []:
            function = call["function"]
            if not is_malformed(function["arguments"]):
                function["arguments"] = _in_schema_order(function["arguments"], allowed.get(function["name"]))
    return out


def final_answer(messages: list[dict[str, Any]]) -> str | None:
    """The answer argument of the conversation's return_final_answer call, if any ("" when its arguments are
    malformed)."""
    for message in reversed(messages):
        for call in message.get("tool_calls") or []:
            if call_name(call) == "return_final_answer":
                arguments = call_arguments(call_function(call).get("arguments"))
                answer = None if is_malformed(arguments) else arguments.get("answer")
                return "" if answer is None else str(answer)
    return None


# Share of SFT rows that may answer "I don't know" (see sft_rows); about the unanswerable share of demo questions.
DEFAULT_MAX_IDK_SHARE = 0.2


def sft_rows(
    episodes: Iterable[Mapping[str, Any]],
    min_quality: float = 0.8,
    tools: list[dict[str, Any]] | None = None,
    max_idk_share: float | None = DEFAULT_MAX_IDK_SHARE,
) -> list[dict[str, Any]]:
    """Conversational TRL rows {"messages", "tools"} of correct episodes with quality >= min_quality. An episode
    with a tool call whose arguments are malformed is left out: training data holds neither the raw text nor a
    repaired call (environments/messages.py).

    At most `max_idk_share` of the rows answer "I don't know" (None: no cap); the first IDK rows in input order
    are kept. Every other answer is a different string, so too many identical answers teach a small model to
    give that one even after reading the right email; too few and it never says it. Measured with SmolLM2-135M
    on the demo (bench/quality.py, 48 held-out questions, 8 unanswerable): a cap of 0.1 left 0 of 8
    unanswerable questions answered "I don't know" (6 ended in an invented email id) and 40% hallucinated;
    0.2 got 6 of 8, hallucination 23%, accuracy 44% -> 58%.
    """
    from agent_rl.reward.judge import is_idk

    if max_idk_share is not None and not 0 <= max_idk_share < 1:
        raise ValueError(f"max_idk_share must be in [0, 1), got {max_idk_share}")
    known: dict[str, list[dict[str, Any]]] = {}
    rows: list[tuple[bool, dict[str, Any]]] = []
    malformed = 0
    for episode in episodes:
        if quality(episode) < min_quality:
            continue
        schemas = _schemas(tools, str(episode.get("environment") or DEFAULT_ENVIRONMENT), known)
        messages = episode.get("messages")
        if isinstance(messages, str):
            messages = json.loads(messages)
        # A gateway episode trains with the tools its client declared, not the environment's.
        own = episode.get("tools")
        row_schemas = own if isinstance(own, list) and own else schemas
        row = {"messages": conversation(messages or [], row_schemas), "tools": row_schemas}
        if malformed_calls(row["messages"]):  # not a demonstration: training never sees a malformed call
            malformed += 1
            continue
        answer = final_answer(row["messages"])
        rows.append((answer is not None and is_idk(answer), row))
    if malformed:
        log.warning("sft_rows left out %d episode(s) with a tool call whose arguments are malformed", malformed)
    if max_idk_share is None:
        return [row for _, row in rows]
    answered = sum(1 for idk, _ in rows if not idk)
    # idk / (answered + idk) <= share  <=>  idk <= share * answered / (1 - share)
    budget = int(max_idk_share * answered / (1 - max_idk_share) + 1e-9)
    out = []
    for idk, row in rows:
        if idk:
            if budget <= 0:
                continue
            budget -= 1
        out.append(row)
    return out


load_jsonl = read_jsonl  # curation's name for the one JSONL reader (agent_rl/jsonl.py)

"""Running a plug-in's tools and judge safely: whatever an environment does, the loop gets a string to show
the model or a clear error naming the environment, never a half-played episode written to the pool."""

from __future__ import annotations

import inspect
import json
import logging
import math
from functools import lru_cache
from typing import Any

from agent_rl.environments.core import Environment, EnvironmentError, Judgement, Task, Trajectory
from agent_rl.records import Outcome

log = logging.getLogger(__name__)

MAX_NAME_SHOWN = 40


def _error(message: str) -> str:
    return json.dumps({"error": message}, separators=(",", ":"))


@lru_cache(maxsize=256)
def tool_parameters(session_type: type, name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(all parameter names, required ones) of a tool method (inspect.signature is slow: cached per class)."""
    parameters = inspect.signature(getattr(session_type, name)).parameters
    names = tuple(p for p, v in parameters.items() if p != "self" and v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD))
    required = tuple(p for p in names if parameters[p].default is inspect.Parameter.empty)
    return names, required


def call_session_tool(environment: Environment, session: Any, name: str, arguments: Any) -> str:
    """One tool call on an episode's session. Unknown tools and bad arguments come back to the model as a short
    JSON error it can act on; a tool that raises does too (and is logged, naming the environment and tool)."""
    own = getattr(environment, "call", None)
    if callable(own):  # an environment that validates its own calls (the email assistant records errors)
        return own(session, name, arguments)
    shown = str(name)[:MAX_NAME_SHOWN]
    tools = environment.tool_names()
    if name not in tools:
        return _error(f"unknown tool {shown!r}; use one of {', '.join(tools)}")
    if not isinstance(arguments, dict):
        return _error("arguments must be a JSON object")
    names, required = tool_parameters(type(session), name)
    unknown = sorted(str(key) for key in arguments if key not in names)
    if unknown:
        return _error(f"unknown argument(s) {', '.join(unknown)[:80]}; expected {', '.join(names)}")
    missing = [p for p in required if p not in arguments]
    if missing:
        return _error(f"missing argument(s) {', '.join(missing)}")
    try:
        result = getattr(session, name)(**arguments)
    except Exception as exc:
        log.warning("environment %r: tool %r raised %s", environment.name, shown, type(exc).__name__)
        return _error(f"{shown} failed: {type(exc).__name__}")
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        log.warning("environment %r: tool %r returned a %s, not text or JSON", environment.name, shown,
                    type(result).__name__)
        return _error(f"{shown} returned no usable result")


def judge_episode(environment: Environment, task: Task, session: Any, trajectory: Trajectory) -> Judgement:
    """The environment's judgement of a finished episode, checked: a judge that raises or returns something
    that is not a Judgement with a known outcome and finite numbers is an EnvironmentError (the batch's
    episodes are then not written at all)."""
    try:
        judgement = environment.judge(task, session, trajectory)
    except EnvironmentError:
        raise
    except Exception as exc:
        raise EnvironmentError(environment.name, f"judge raised {type(exc).__name__}: {exc}"[:300]) from exc
    if not isinstance(judgement, Judgement):
        raise EnvironmentError(environment.name, f"judge returned a {type(judgement).__name__}, not a Judgement")
    try:
        outcome = Outcome(judgement.outcome)
    except ValueError:
        raise EnvironmentError(environment.name, f"judge returned the unknown outcome {str(judgement.outcome)[:40]!r} "
                               f"(expected one of {', '.join(o.value for o in Outcome)})") from None
    numbers = ([judgement.reward] if judgement.reward is not None else []) + list(
        (judgement.components or {}).values())
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in numbers):
        raise EnvironmentError(environment.name, "judge returned a reward or rubric component that is not a finite "
                               "number")
    return Judgement(outcome, None if judgement.reward is None else float(judgement.reward),
                     {str(k): float(v) for k, v in (judgement.components or {}).items()})

"""Tool calls as conversations hold them, read the same way by the runner, curation, the hacking detectors and
training. A call nests its name and arguments under "function" (OpenAI layout) or carries them itself (TRL's parsed
calls); arguments are an object or, from OpenAI-style servers, its JSON text. On the ground floor: the shared
rollout pieces and the reward-hacking helpers read calls with it (agent/tool_calls.py re-exports it)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class MalformedArguments(ValueError):
    """Arguments given as text that is not JSON."""


def call_function(call: Any) -> Mapping[str, Any] | None:
    """The part of a call holding its name and arguments; None when the call, or that part, is not an object."""
    if not isinstance(call, Mapping):
        return None
    function = call.get("function", call)
    return function if isinstance(function, Mapping) else None


def call_name(call: Any) -> str:
    """The called tool's name; empty when the call names none."""
    function = call_function(call)
    return str(function.get("name", "")) if function is not None else ""


def decode_arguments(raw: Any) -> dict[str, Any]:
    """Call arguments as a dict, JSON text decoded; None and blank text are a call without arguments, {} (as
    OpenAI-style servers send one). MalformedArguments for text that is not JSON, ValueError for anything else
    that is not an object (each says what it got). The rules for whole messages: environments/messages.py."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise MalformedArguments("arguments are malformed JSON") from None
        except RecursionError:  # nested past the parser's limit: no tool takes that
            raise MalformedArguments("arguments are nested too deep to decode") from None
    if not isinstance(raw, Mapping):
        raise ValueError(f"arguments are {type(raw).__name__}, not an object")
    return dict(raw)

"""A user's explicit feedback read as a reward: the number sent, else +1 / -1 for a positive / negative verdict.

One reading for the whole loop: curation judges gateway episodes by it (agent_rl/curation/live.py) and the implicit
signals take the rating from it (signals.py), so a label and a rating mean the same thing. A module of its own so
that the signals, which curation's labeler reads, do not import curation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent_rl.ab.outcomes import feedback_verdict


def feedback_reward(feedback: Any) -> float | None:
    """The reward a user's feedback gives: the number sent (`0.5`, `{"reward": 0.5}`), else 1.0 for a positive
    verdict and -1.0 for a negative one; None for no feedback or a free comment."""
    if feedback is None:
        return None
    value: Any = feedback
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text[:1] in "{-0123456789." else text
        except (ValueError, RecursionError):  # a comment, or JSON nested past the parser's limit: no number in it
            value = text
    if isinstance(value, Mapping) and "reward" in value:
        value = value["reward"]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)  # a non-finite or out-of-range number is quarantined by validation, named
    verdict = feedback_verdict(value if not isinstance(value, str) else feedback)
    if verdict is None:
        return None
    return 1.0 if verdict else -1.0

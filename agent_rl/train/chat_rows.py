"""A training row's tool schemas as the chat template wants them: exactly as offered when the episode was served.

Shared by SFT's tokenizer (agent_rl/train/sft.py) and the static prefix (agent_rl/train/static_prefix.py), which
must render a row's opening exactly as SFT does; a module of its own so the static prefix does not import sft.py,
which imports it. The row's messages are read by environments/messages.py's `training_messages`.
"""

from __future__ import annotations

import json
from typing import Any


def row_tools(tools: Any) -> list[dict[str, Any]] | None:
    """The row's tool schemas exactly as they were offered when the episode was served (None: no tools).

    Their key order is part of the prompt; datasets keep it (curation/datasets.py), so nothing is reordered here."""
    if isinstance(tools, str):
        tools = json.loads(tools)
    return list(tools) if tools else None

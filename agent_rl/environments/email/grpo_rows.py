"""The email assistant's GRPO rows: a scenario as the prompt its rollouts start from, with the columns they read to
score it (inbox, golden answer, gold sources, query date). The loop's own task rows (train/plugin_rollouts.py) carry
a whole task instead; the email rollouts (rollouts.py) predate them."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from agent_rl.environments.core import Environment, Task
from agent_rl.records import Split


def grpo_rows(scenarios: Iterable[Any], split: str | None = Split.TRAIN.value,
              environment: Environment | None = None) -> list[dict[str, Any]]:
    """Scenarios of `split` (None = all) as GRPO rows; the prompt is the opening `environment` (default: the email
    assistant the registry loads) gives the scenario's question."""
    if environment is None:
        from agent_rl.environments.registry import load_environment

        environment = load_environment("email")
    rows = []
    for scenario in scenarios:
        data = scenario.model_dump(mode="json") if hasattr(scenario, "model_dump") else dict(scenario)
        if split is not None and str(data.get("split")) != split:
            continue
        query_date = data.get("query_date")
        when = datetime.fromisoformat(query_date) if isinstance(query_date, str) else query_date
        opening = Task(id=str(data["id"]), environment=environment.name, context=data["inbox_id"],
                       prompt=data["question"], metadata={"query_date": when} if when else {})
        rows.append({
            "prompt": environment.opening_messages(opening),
            "task_id": data["id"],
            "inbox": data["inbox_id"],
            "answer": data["answer"],
            "source_ids": list(data.get("source_ids") or []),
            "category": str(data["category"]),
            "query_date": when.isoformat() if isinstance(when, datetime) else query_date,
        })
    return rows

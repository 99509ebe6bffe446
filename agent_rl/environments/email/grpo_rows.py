"""The email assistant's GRPO rows: a scenario as the prompt its rollouts start from, the task itself (the column
every environment's rows carry: the prompt filter plays it, train/plugin_rollouts.py's rows have it too), and the
columns the email rollouts (rollouts.py) read to score it (inbox, golden answer, gold sources, query date)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agent_rl.environments.core import Environment
from agent_rl.environments.email.records import Scenario
from agent_rl.environments.email.tasks import scenario_task
from agent_rl.records import Split


def grpo_rows(scenarios: Iterable[Any], split: str | None = Split.TRAIN.value,
              environment: Environment | None = None) -> list[dict[str, Any]]:
    """Scenarios of `split` (None = all) as GRPO rows; the prompt is the opening `environment` (default: the email
    assistant the registry loads) gives the scenario's question."""
    if environment is None:
        from agent_rl.environments.registry import load_environment

        environment = load_environment("email")
    rows = []
    for item in scenarios:
        scenario = item if isinstance(item, Scenario) else Scenario.model_validate(item)
        if split is not None and str(scenario.split) != split:
            continue
        task = scenario_task(scenario).model_copy(update={"environment": environment.name})
        rows.append({
            "prompt": environment.opening_messages(task),
            "task_id": scenario.id,
            "task": task.model_dump_json(),
            "inbox": scenario.inbox_id,
            "answer": scenario.answer,
            "source_ids": list(scenario.source_ids),
            "category": str(scenario.category),
            "query_date": task.metadata["query_date"],
        })
    return rows

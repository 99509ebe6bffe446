"""Email questions as the episode runner plays them: an `EpisodeTask` names an inbox and a question (with its
scenario when the answer is known) and becomes a `Play` of the email environment's task; `run_episodes` plays
them on an inbox store through the loop's one runner (environments/runner.py), which knows no email."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent_rl.environments.runner import Play, RunnerConfig, play_episodes
from agent_rl.environments.answers import Judge
from agent_rl.environments.email.environment import EmailEnvironment
from agent_rl.environments.email.inbox.store_interface import InboxStore
from agent_rl.environments.email.tasks import live_task, scenario_task
from agent_rl.environments.policy import Policy
from agent_rl.records import Episode
from agent_rl.environments.email.records import Scenario


@dataclass
class EpisodeTask:
    """One email question to play: on which inbox, with the scenario when the golden answer is known."""

    inbox: str
    question: str
    scenario: Scenario | None = None
    policy_version: str | None = None  # defaults to policy.version
    tenant: str = "default"
    query_date: datetime | None = None  # defaults to the scenario's query date

    @classmethod
    def from_scenario(cls, scenario: Scenario, **kwargs: Any) -> EpisodeTask:
        return cls(inbox=scenario.inbox_id, question=scenario.question, scenario=scenario, **kwargs)

    def play(self) -> Play:
        if self.scenario is not None:
            task = scenario_task(self.scenario)
            if self.query_date is not None or self.inbox != task.context or self.question != task.prompt:
                metadata = dict(task.metadata)
                if self.query_date is not None:
                    metadata["query_date"] = self.query_date.isoformat()
                task = task.model_copy(update={"context": self.inbox, "prompt": self.question, "metadata": metadata})
        else:
            task = live_task(self.inbox, self.question, self.query_date)
        return Play(task, self.policy_version, self.tenant)


def run_episodes(
    policy: Policy,
    tasks: list[EpisodeTask],
    store: InboxStore,
    config: RunnerConfig | None = None,
    judge: Judge | None = None,
) -> list[Episode]:
    """Play email questions on `store` (the email environment's entry point)."""
    config = config or RunnerConfig()
    return play_episodes(policy, EmailEnvironment(store, judge=judge), [t.play() for t in tasks], config)


def run_episode(
    policy: Policy,
    task: EpisodeTask,
    store: InboxStore,
    config: RunnerConfig | None = None,
    judge: Judge | None = None,
) -> Episode:
    """Play one task."""
    return run_episodes(policy, [task], store, config, judge)[0]

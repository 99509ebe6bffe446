"""An environment whose sessions take minutes to open: a command evaluating it is still at work when a test signals
it, however fast the machine (tests/reliability/test_cli_stops.py)."""

from __future__ import annotations

import sys
import time
from typing import Any, ClassVar

from agent_rl.environments.core import Environment, FinalAnswer, Judgement, Task, Trajectory
from agent_rl.records import Outcome, Split

OPENING = "opening a session that takes minutes"


class SlowSession:
    def wait(self) -> str:
        """Wait for nothing.

        Returns:
            An empty result.
        """
        return "{}"


class SlowEnvironment(Environment):
    name: ClassVar[str] = "slow"
    categories: ClassVar[tuple[str, ...]] = ("waiting",)

    def tasks(self, split: Split) -> list[Task]:
        return [Task(id=f"slow-{i}", environment=self.name, context="slow", prompt="Wait.", reference="done",
                     category="waiting", split=split) for i in range(3)]

    def open(self, task: Task) -> SlowSession:
        print(OPENING, file=sys.stderr, flush=True)
        time.sleep(600)
        return SlowSession()

    def session_type(self) -> type:
        return SlowSession

    def final_answer(self, session: Any) -> FinalAnswer | None:
        return None

    def judge(self, task: Task, session: Any, trajectory: Trajectory) -> Judgement:
        return Judgement(Outcome.WRONG, 0.0)

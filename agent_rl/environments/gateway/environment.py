"""The gateway as an environment of the contract, so that the loop asks what a run's episodes allow
(`Environment.capabilities`) instead of whether their environment is called "gateway".

Its agent is the client's: the client declares the tools in every request and runs them itself, so there is no
world to build, anonymize, reopen or roll out in, and no task to play. Its episodes are judged by the users' feedback
(curation/live.py) and, where nobody rated, by the labeler; validation replays the held-out episodes users rated
good. What the contract asks of a world (tasks, sessions, a judge) answers here that there is none.
"""

from __future__ import annotations

from typing import Any, ClassVar

from agent_rl.environments.core import (UNCATEGORIZED, Capabilities, Environment, EnvironmentError, FinalAnswer,
                                        Grading, Judgement, Split, Task, Trajectory, World)


class _ClientTools:
    """The session a live episode has on our side: none; its tools are the client's (declared per request)."""


class ClientWorld(World):
    """None of ours: the client's agent acts in its own. Its episodes come without a world to share with other
    plug-ins' in one run, so a run that trains the gateway trains nothing else."""

    trains_alone = True


class GatewayEnvironment(Environment):
    """Live traffic of an agent that is no plug-in: no world, judged by its users; SFT only, validated by replay."""

    name: ClassVar[str] = "gateway"
    categories: ClassVar[tuple[str, ...]] = (UNCATEGORIZED,)
    # Its client's agent may answer in words; the tools are the client's.
    capabilities: ClassVar[Capabilities] = Capabilities(world=False, judged_by_users=True, answers_in_words=True)

    def tasks(self, split: Split) -> list[Task]:
        """None: validation replays the held-out episodes users rated good instead."""
        return []

    def open(self, task: Task) -> Any:
        raise EnvironmentError(self.name, "has no world to open: the client runs the tools")

    def final_answer(self, session: Any) -> FinalAnswer | None:
        return None

    def judge(self, task: Task, session: Any, trajectory: Trajectory) -> Judgement:
        raise EnvironmentError(self.name, "is judged by its users' feedback (curation), not by a judge of ours")

    def session_type(self) -> type:
        return _ClientTools

    def world(self) -> World:
        return ClientWorld()

    def grading(self) -> Grading:
        """Rewards are users' feedback as curation/live.py reads it (-1..1); a rated-good live episode is a whole
        demonstration (Grading's default quality): the user approved the conversation as it went."""
        return Grading(reward_range=(-1.0, 1.0))

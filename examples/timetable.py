"""A minimal agent-rl environment: a railway timetable assistant (docs/environments.md walks through it).

The agent looks up trains between two stations, reads one train's details, and replies with the answer and the
trains it used. Tasks are generated from a small fixed timetable, so the reference answers are known; asking for
a connection that does not exist should get "I don't know". Use it as `--env examples.timetable:TimetableEnvironment`.
"""

from __future__ import annotations

import json
import random
import re

from agent_rl.environments import Environment, FinalAnswer, Judgement, Task, Trajectory, World
from agent_rl.environments.policy import Policy, PolicyTurn, ToolCall
from agent_rl.records import Outcome, Split

STATIONS = ("Aston", "Bramley", "Carlow", "Dunmore", "Elgin")
ROUTES = [(a, b) for a in STATIONS for b in STATIONS if a != b]
# train id -> (origin, destination, departure, platform, minutes); one train per route, every third route has none
TRAINS = {f"T{i:02d}": (a, b, f"{6 + i % 14:02d}:{(i * 7) % 60:02d}", str(1 + i % 4), 20 + (i * 13) % 70)
          for i, (a, b) in enumerate(ROUTES) if i % 3 != 2}


class TimetableSession:
    """One episode's tools. Every public method is a tool the model can call."""

    def __init__(self) -> None:
        self.answer: FinalAnswer | None = None

    def find_trains(self, origin: str, destination: str) -> str:
        """List the trains from one station to another.

        Args:
            origin: The station the trip starts at.
            destination: The station the trip ends at.
        """
        found = [{"id": t, "departs": d} for t, (o, to, d, _, _) in TRAINS.items()
                 if o.lower() == origin.strip().lower() and to.lower() == destination.strip().lower()]
        return json.dumps(found, separators=(",", ":"))

    def train_details(self, train_id: str) -> str:
        """Show one train's departure time, platform and journey time.

        Args:
            train_id: The id of the train, from find_trains.
        """
        if train_id not in TRAINS:
            return json.dumps({"error": f"no train {train_id[:20]!r}"})
        origin, destination, departs, platform, minutes = TRAINS[train_id]
        return json.dumps({"id": train_id, "from": origin, "to": destination, "departs": departs,
                           "platform": platform, "minutes": minutes}, separators=(",", ":"))

    def reply(self, answer: str, trains: list[str]) -> str:
        """Give the final answer to the traveller; this ends the task.

        Args:
            answer: The answer, or "I don't know" if the timetable does not say.
            trains: Ids of the trains the answer is about.
        """
        self.answer = FinalAnswer(answer.strip(), [t for t in trains if isinstance(t, str)])
        return "Reply sent."


class TimetableTeacher(Policy):
    """Reads the stations from the question, finds the train, reads it, replies: the agent a team runs before any
    training (it stands for production in `make demo ENV=examples.timetable:TimetableEnvironment` and seeds pools)."""

    version = "teacher"

    def act(self, conversations, tools, max_new_tokens=256):
        return [self._turn(messages) for messages in conversations]

    def _turn(self, messages):
        question = messages[-1]["content"] if messages[-1]["role"] == "user" else next(
            m["content"] for m in messages if m["role"] == "user")
        origin, destination = re.search(r"from (\w+) to (\w+)", question).groups()
        found = [t for t, (o, d, *_) in TRAINS.items() if (o, d) == (origin, destination)]
        step = sum(1 for m in messages if m["role"] == "assistant")
        if step == 0:
            return PolicyTurn(tool_calls=[ToolCall("find_trains", {"origin": origin, "destination": destination})])
        if not found:
            return PolicyTurn(tool_calls=[ToolCall("reply", {"answer": "I don't know", "trains": []})])
        if step == 1:
            return PolicyTurn(tool_calls=[ToolCall("train_details", {"train_id": found[0]})])
        _, _, departs, platform, minutes = TRAINS[found[0]]
        answer = (f"Platform {platform}" if "platform" in question else f"{minutes} minutes" if "minutes" in question
                  else departs)
        return PolicyTurn(tool_calls=[ToolCall("reply", {"answer": answer, "trains": [found[0]]})])


class TimetableWorld(World):
    """The timetable comes with the environment; the world adds the teacher that plays production first."""

    def teacher(self, **options: object) -> Policy:
        return TimetableTeacher()


class TimetableEnvironment(Environment):
    name = "timetable"
    categories = ("departure", "platform", "duration", "no_connection")
    system_prompt = ("You help travellers with the railway timetable. Find the train, read its details, then call "
                     "reply with a short answer and the train ids. If the timetable does not say, answer \"I don't know\".")

    def tasks(self, split: Split) -> list[Task]:
        rng, tasks = random.Random(0), []
        for train, (origin, destination, departs, platform, minutes) in sorted(TRAINS.items()):
            kind = rng.choice(self.categories[:3])
            prompt, answer = {
                "departure": (f"When does the train from {origin} to {destination} leave?", departs),
                "platform": (f"Which platform does the {departs} train from {origin} to {destination} use?", platform),
                "duration": (f"How many minutes is the {departs} trip from {origin} to {destination}?", str(minutes)),
            }[kind]
            tasks.append(Task(id=f"tt-{train}", environment=self.name, context="timetable", prompt=prompt,
                              reference=answer, category=kind, split=Split.TEST if train.endswith(("3", "7")) else
                              Split.TRAIN, metadata={"trains": [train]}))
        for i, (a, b) in enumerate(r for n, r in enumerate(ROUTES) if n % 3 == 2):
            tasks.append(Task(id=f"tt-none-{i}", environment=self.name, context="timetable",
                              prompt=f"When does the train from {a} to {b} leave?", reference="I don't know",
                              category="no_connection", split=Split.TEST if i % 4 == 0 else Split.TRAIN))
        return [t for t in tasks if t.split == split]

    def world(self) -> TimetableWorld:
        return TimetableWorld(self)

    def open(self, task: Task) -> TimetableSession:
        return TimetableSession()

    def session_type(self) -> type:
        return TimetableSession

    def final_answer(self, session: TimetableSession) -> FinalAnswer | None:
        return session.answer

    def judge(self, task: Task, session: TimetableSession, trajectory: Trajectory) -> Judgement:
        if trajectory.format_error:
            return Judgement(Outcome.FORMAT_ERROR, -1.0, {"format": -1.0})
        answer = trajectory.answer
        if answer is None:
            return Judgement(Outcome.RAN_OUT, 0.0, {})
        says_idk = "don't know" in answer.text.lower()
        if task.category == "no_connection":
            outcome = Outcome.CORRECT if says_idk else Outcome.WRONG
        elif says_idk:
            outcome = Outcome.IDK
        else:
            outcome = Outcome.CORRECT if (task.reference or "").lower() in answer.text.lower() else Outcome.WRONG
        cited = float(set(answer.citations) == set(task.metadata.get("trains", [])))
        reward = {Outcome.CORRECT: 1.0, Outcome.IDK: 0.0, Outcome.WRONG: -1.0}[outcome] + 0.2 * cited
        return Judgement(outcome, reward, {"answer": reward - 0.2 * cited, "citations": 0.2 * cited})

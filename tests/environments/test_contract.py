"""The environment contract: discovery by name, import path and entry point, tools derived as TRL derives them,
and a broken plug-in (missing method, tool raising, judge returning garbage) failing with an error that names the
environment and what is wrong, with nothing of its batch written."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from agent_rl.agent.policy import Policy, PolicyTurn, ToolCall
from agent_rl.environments.runner import Play, play_episodes
from agent_rl.environments import EnvironmentError, Judgement, Task
from agent_rl.environments.core import check_environment
from agent_rl.environments.email.environment import EmailEnvironment
from agent_rl.environments.registry import ENTRY_POINT_GROUP, available, load_environment
from agent_rl.records import Outcome, Split
from examples.timetable import TimetableEnvironment, TimetableSession

EXAMPLE = "examples.timetable:TimetableEnvironment"


class Scripted(Policy):
    """Calls the given tool calls in order, one per turn."""

    version = "scripted"

    def __init__(self, calls: list[tuple[str, dict]]) -> None:
        self.calls = calls

    def act(self, conversations, tools, max_new_tokens=256):
        turns = []
        for messages in conversations:
            done = sum(1 for m in messages if m["role"] == "assistant")
            name, arguments = self.calls[min(done, len(self.calls) - 1)]
            turns.append(PolicyTurn(tool_calls=[ToolCall(name, arguments)]))
        return turns


def test_builtins_import_paths_and_entry_points_resolve(monkeypatch):
    assert isinstance(load_environment("email"), EmailEnvironment)
    example = load_environment(EXAMPLE)
    assert example.name == "timetable" and example.tool_names() == ("find_trains", "train_details", "reply")

    entry = importlib.metadata.EntryPoint(name="timetable", value=EXAMPLE, group=ENTRY_POINT_GROUP)
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: [entry] if kw.get("group") == ENTRY_POINT_GROUP else real(**kw))
    assert available()["timetable"] == EXAMPLE
    assert isinstance(load_environment("timetable"), TimetableEnvironment)

    with pytest.raises(EnvironmentError, match=r"'nope': unknown; known: email, gateway, openai_job, support, timetable"):
        load_environment("nope")
    with pytest.raises(EnvironmentError, match=r"module 'no_such_pkg.env' cannot be imported"):
        load_environment("no_such_pkg.env:Env")
    with pytest.raises(EnvironmentError, match=r"has no 'Missing'"):
        load_environment("examples.timetable:Missing")


def test_tool_schemas_are_what_trl_derives():
    from transformers.utils import get_json_schema

    env = TimetableEnvironment()
    assert env.tool_schemas() == [get_json_schema(getattr(TimetableSession, n)) for n in env.tool_names()]
    # The email environment's schemas are the ones SFT and serving have always used.
    from agent_rl.environments.email.tools import tool_schemas

    assert EmailEnvironment().tool_schemas() == tool_schemas()


class NoJudge(TimetableEnvironment):
    name = "no-judge"
    judge = None


class Undocumented(TimetableEnvironment):
    name = "undocumented"

    class Session(TimetableSession):
        def shout(self, text):  # no type hints, no docstring: cannot be offered to a model
            return text

    def session_type(self):
        return self.Session


class NoCategories(TimetableEnvironment):
    name = "no-categories"
    categories = ()


@pytest.mark.parametrize("broken, message", [
    (NoJudge, r"environment 'no-judge': lacks method\(s\) judge"),
    (Undocumented, r"environment 'undocumented': tool 'shout' cannot be described"),
    (NoCategories, r"environment 'no-categories': declares no task categories"),
])
def test_a_broken_environment_is_refused_naming_it(broken, message):
    with pytest.raises(EnvironmentError, match=message):
        check_environment(broken())


class RaisingTools(TimetableEnvironment):
    name = "raising"

    class Session(TimetableSession):
        def find_trains(self, origin: str, destination: str) -> str:
            """List the trains from one station to another.

            Args:
                origin: The station the trip starts at.
                destination: The station the trip ends at.
            """
            raise KeyError("database down")

    def open(self, task):
        return self.Session()

    def session_type(self):
        return self.Session


def test_a_tool_that_raises_is_an_error_the_model_sees_and_the_log_names(caplog):
    env = RaisingTools()
    task = env.tasks(Split.TRAIN)[0]
    policy = Scripted([("find_trains", {"origin": "Aston", "destination": "Bramley"}),
                       ("find_trains", {"origin": "Aston", "where": "x"}),
                       ("reply", {"answer": "I don't know", "trains": []})])
    episode = play_episodes(policy, env, [Play(task)])[0]
    tool_results = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert json.loads(tool_results[0]) == {"error": "find_trains failed: KeyError"}
    assert "unknown argument(s) where" in tool_results[1]
    assert episode.environment == "raising" and episode.final_answer == "I don't know"
    assert "environment 'raising': tool 'find_trains' raised KeyError" in caplog.text
    assert "database down" not in caplog.text  # what a tool's error says may be private


class GarbageJudge(TimetableEnvironment):
    name = "garbage"

    def judge(self, task, session, trajectory):
        return {"outcome": "great"}


class UnknownOutcome(TimetableEnvironment):
    name = "unknown-outcome"

    def judge(self, task, session, trajectory):
        return Judgement("great", 1.0)


class NanReward(TimetableEnvironment):
    name = "nan"

    def judge(self, task, session, trajectory):
        return Judgement(Outcome.CORRECT, float("nan"))


@pytest.mark.parametrize("env, message", [
    (GarbageJudge(), r"environment 'garbage': judge returned a dict, not a Judgement"),
    (UnknownOutcome(), r"environment 'unknown-outcome': judge returned the unknown outcome 'great'"),
    (NanReward(), r"environment 'nan': judge returned a reward .* not a finite number"),
])
def test_a_judge_returning_garbage_fails_the_batch_naming_the_environment(env, message):
    tasks = env.tasks(Split.TRAIN)[:3]
    policy = Scripted([("reply", {"answer": "08:00", "trains": []})])
    with pytest.raises(EnvironmentError, match=message):
        play_episodes(policy, env, [Play(t) for t in tasks])


def test_tasks_are_generic_records():
    task = TimetableEnvironment().tasks(Split.TEST)[0]
    assert isinstance(task, Task) and task.environment == "timetable" and task.category in TimetableEnvironment.categories
    assert {t.split for t in TimetableEnvironment().tasks(Split.TEST)} == {Split.TEST}


def test_eval_cli_evaluates_any_environment_by_import_path():
    from typer.testing import CliRunner

    from agent_rl.cli import app

    result = CliRunner().invoke(app, ["eval", "--policy", "tiny", "--env", EXAMPLE, "--n", "3", "--json"])
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    report = json.loads(last[last.index("{"):])  # the test runner mixes the weight-loading bar (stderr) in
    assert (report["environment"], report["n"]) == ("timetable", 3)
    assert {"accuracy", "failure_rate", "valid_tool_call_rate"} <= set(report["metrics"])

    unknown = CliRunner().invoke(app, ["eval", "--policy", "tiny", "--env", "nope", "--json"])
    assert unknown.exit_code == 2 and "environment 'nope': unknown" in unknown.output


def test_the_email_worlds_public_terms_come_with_its_privacy_spec(tmp_path):
    """Curation reads which names are no one's from the environment's privacy spec, as for any plug-in: the demo
    world's sites and cities when every inbox is a demo mailbox, none for another corpus."""
    from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus, public_terms
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.environments.email.records import Email

    url = f"sqlite:///{tmp_path / 'inbox.db'}"
    store = open_inbox_store(url)
    build_demo_corpus(store, seed=0)
    store.close()
    env = load_environment("email", store_url=url)
    try:
        assert env.world().privacy().public_terms == public_terms() and "Reno" in public_terms()
    finally:
        env.close()
    other = open_inbox_store(f"sqlite:///{tmp_path / 'real.db'}")
    other.add_emails([Email(message_id="<1@x>", inbox="jeff@enron.com", sender="ken@enron.com", to=["jeff@enron.com"],
                            subject="Reno", body="Meet in Reno.", date="2001-05-01T10:00:00Z")])
    assert EmailEnvironment(store=other).world().privacy().public_terms == ()
    other.close()

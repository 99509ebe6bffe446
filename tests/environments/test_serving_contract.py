"""What the loop asks an environment when serving and curating (issue 44): its replayable tasks, its contexts and
a correct episode's demonstration quality, with the email assistant answering like any plug-in; and the registry
handing a world's options only to an environment that takes them."""

from __future__ import annotations

import threading

import pytest

from agent_rl.curation.datasets import quality
from agent_rl.environments.email.environment import EmailEnvironment, scenario_task
from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.environments.email.memo_judge import MemoJudge
from agent_rl.environments.email.scenarios import generate_scenarios, save_scenarios
from agent_rl.environments.registry import accepted_options, load_environment, world_options
from agent_rl.records import Split
from agent_rl.reward.judge import Verdict


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("email-world")
    url = f"sqlite:///{root / 'inbox.db'}"
    store = open_inbox_store(url)
    scenarios = generate_scenarios(build_demo_corpus(store, seed=0, n_inboxes=2, n_emails=120), test_fraction=0.5)
    inboxes = frozenset(store.inboxes())
    store.close()
    return url, save_scenarios(scenarios, root / "scenarios.jsonl"), scenarios, inboxes


def test_email_replays_its_scenarios_in_file_order_and_serves_every_inbox_of_its_store(world):
    url, path, scenarios, inboxes = world
    env = load_environment("email", store_url=url, scenarios_path=str(path))
    try:
        assert env.world().replayable_tasks() == [scenario_task(s) for s in scenarios]
        assert {t.split for t in env.world().replayable_tasks()} == set(Split)  # both splits, interleaved as in file
        assert env.world().contexts() == inboxes
    finally:
        env.close()


def test_email_without_scenarios_serves_live_traffic_only(world, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_RL_HOME", str(tmp_path))  # no scenarios asset written here
    env = load_environment("email", store_url=world[0])
    try:
        assert env.world().replayable_tasks() == [] and env.world().contexts() == world[3]
        with pytest.raises(FileNotFoundError):  # evaluation still says where scenarios are missing
            env.tasks(Split.TEST)
    finally:
        env.close()
    named = load_environment("email", store_url=world[0], scenarios_path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        named.world().replayable_tasks()


def test_a_plugin_replays_all_its_tasks_in_their_contexts():
    env = load_environment("support")
    tasks = env.world().replayable_tasks()
    assert tasks == env.tasks(Split.TRAIN) + env.tasks(Split.TEST)
    assert env.world().contexts() == frozenset(t.context for t in tasks)
    assert env.grading().demonstration_quality(0.2) == 1.0


def test_each_thread_reads_its_own_store_connection_and_close_releases_all(world):
    env = EmailEnvironment(store_url=world[0])
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(env._inbox_store())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    main = env._inbox_store()
    assert len({id(s) for s in [*seen, main]}) == 3 and env._inbox_store() is main
    env.close()
    assert env._inbox_store() is not main  # reopened after close: nothing closed is handed out again
    env.close()
    given = open_inbox_store(world[0])
    try:
        shared = EmailEnvironment(store=given)
        shared.close()
        assert shared._inbox_store() is given and given.inboxes()  # a given store stays the caller's, open
    finally:
        given.close()


def test_demonstration_quality_is_the_environments_scale_and_one_for_an_unknown_name():
    email = load_environment("email")
    grading = email.grading()
    assert grading.demonstration_quality(grading.reward_range[1]) == 1.0
    assert grading.demonstration_quality(email.rubric.correct) == 0.0
    assert quality({"outcome": "correct", "reward": 1.2, "environment": "email"}) == grading.demonstration_quality(1.2)
    assert quality({"outcome": "correct", "reward": 1.2, "environment": "gateway"}) == 1.0
    assert quality({"outcome": "wrong", "reward": 1.2, "environment": "gateway"}) == 0.0


def test_memo_judge_asks_once_per_question_golden_and_answer():
    calls = []

    class Counting:
        def judge(self, question, golden, answer):
            calls.append((question, golden, answer))
            return Verdict(answer == golden, "same text")

    memo = MemoJudge(Counting(), size=2)
    assert [memo.judge("q", "a", x).correct for x in ("a", "a", "b", "a")] == [True, True, False, True]
    assert calls == [("q", "a", "a"), ("q", "a", "b")]
    memo.judge("q", "a", "c")  # the least recently used, (q, a, b), falls out
    memo.judge("q", "a", "a")
    memo.judge("q", "a", "b")
    assert calls[2:] == [("q", "a", "c"), ("q", "a", "b")]


def test_options_naming_a_world_reach_only_an_environment_that_takes_them(world):
    options = {"store_url": world[0], "scenarios_path": str(world[1])}
    assert accepted_options("email", options) == options
    assert accepted_options("support", options) == {}
    assert accepted_options("support", {"seed": 3, "store_url": "x"}) == {"seed": 3}


class TasksFromAFile:
    """A plug-in factory written after the email assistant's first options: its tasks file is `scenarios_path`."""

    def __init__(self, scenarios_path: str | None = None) -> None:
        self.scenarios_path = scenarios_path


def test_a_world_named_on_the_command_line_reaches_the_environment_under_the_loops_names(world, recwarn):
    url, path = world[0], str(world[1])
    assert world_options("email", url, path) == {"store_url": url, "tasks_path": path}
    environment = load_environment("email", **world_options("email", url, path))
    try:
        assert environment.world().replayable_tasks() == [scenario_task(s) for s in world[2]]
    finally:
        environment.close()
    assert world_options("support", url, path) == {}  # it brings its own world
    assert not recwarn.list
    # A plug-in that took the tasks file under its first name still gets it, warned.
    spec = f"{__name__}:TasksFromAFile"
    with pytest.warns(DeprecationWarning, match="tasks_path"):
        assert world_options(spec, url, path) == {"scenarios_path": path}

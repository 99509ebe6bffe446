"""The world is the environment's concern, gathered in one object (`Environment.world()`): building it (`build`,
`build_tasks`), its own privacy pass (`anonymize`), reopening what that wrote (`reopen`) and its GRPO rows and
rollouts; the defaults leave a plug-in's world as it came, the email assistant's EmailWorld does each with what the
Dagster assets used to do by name, and a plug-in that still defines the old environment-level hooks keeps working
for one release, warned."""

from __future__ import annotations

import sqlite3

import pytest

from agent_rl.environments import Environment
from agent_rl.environments.email.environment import EmailEnvironment, scenario_task
from agent_rl.environments.email.inbox.demo_corpus import generate_demo_corpus
from agent_rl.environments.email.scenarios.generate import generate_scenarios
from agent_rl.records import Split
from examples.timetable import TimetableEnvironment

SMALL = {"seed": 1, "n_inboxes": 2, "n_emails": 200}


class Timetable(TimetableEnvironment):
    """The example without its World: where a plug-in of the previous contract started from."""

    world = Environment.world


def test_a_plugin_whose_world_comes_with_it_builds_nothing_and_rolls_out_in_the_loops_rollouts(tmp_path):
    from agent_rl.privacy.anonymize import AnonymizerConfig
    from agent_rl.train.plugin_rollouts import PluginRollout, rollout_factory

    env = TimetableEnvironment()
    world = env.world()
    assert world.build(**SMALL, ingest_path="") == {} and world.build_tasks(**SMALL) == {}
    assert world.anonymize([], tmp_path, [], AnonymizerConfig()) is None and world.reopen(tmp_path) is None
    assert world.rollout_factory(4) is None and world.grpo_rows(env.tasks(Split.TRAIN)) is None
    assert not world.trains_alone
    made = rollout_factory(env, 4)
    assert issubclass(made, PluginRollout) and made._max_turns == 4


@pytest.fixture
def email(tmp_path):
    env = EmailEnvironment(store_url=f"sqlite:///{tmp_path / 'inbox.db'}", scenarios_path=str(tmp_path / "s.jsonl"))
    yield env
    env.close()


def test_the_email_world_is_the_seeded_demo_corpus_and_its_scenarios(email, tmp_path):
    built = email.world().build(**SMALL)
    corpus = generate_demo_corpus(**SMALL)
    assert built["generated_emails"] == built["emails"] == len(corpus.emails) and built["inboxes"] == 2
    assert "| inbox | emails |" in built["per_inbox"]
    assert email.world().build(**SMALL)["emails"] == len(corpus.emails)  # idempotent

    written = email.world().build_tasks(**SMALL)
    expected = generate_scenarios(corpus, seed=SMALL["seed"])
    assert written["path"] == str(tmp_path / "s.jsonl") and len(written["content_hash"]) == 64
    assert email.tasks(Split.TRAIN) + email.tasks(Split.TEST) == [
        scenario_task(s) for split in (Split.TRAIN, Split.TEST) for s in expected if s.split == split]
    reread = EmailEnvironment(store_url=email.store_url, scenarios_path=written["path"])
    assert reread.tasks(Split.TEST) == email.tasks(Split.TEST)  # what the file holds, not just memory


def test_an_ingested_corpus_without_an_endpoint_is_refused(email, tmp_path):
    from tests.conftest import ENRON_CSV

    assert email.world().build(ingest_path=str(ENRON_CSV))["inserted"] == 103
    with pytest.raises(ValueError, match="needs an LLM endpoint"):
        email.world().build_tasks(ingest_path=str(ENRON_CSV))


def test_the_email_privacy_pass_is_curations_email_pass(tmp_path):
    """Same episodes, inbox and scenarios as `environments.email.privacy.anonymize_partition` called as the curation
    asset called it: the directory from every inbox's headers, the demo world's public terms after the configured
    ones."""
    from agent_rl.privacy.anonymize import AnonymizerConfig
    from agent_rl.curation.datasets import load_jsonl
    from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
    from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
    from agent_rl.environments.email.privacy import anonymize_partition
    from agent_rl.environments.email.inbox.demo_world import public_terms_of

    env = EmailEnvironment(store_url=f"sqlite:///{tmp_path / 'inbox.db'}", scenarios_path=str(tmp_path / "s.jsonl"))
    try:
        env.world().build(**SMALL)
        env.world().build_tasks(**SMALL)
        store, scenarios = env._inbox_store(), env._all_scenarios()
        train = [s for s in scenarios if s.split == Split.TRAIN][:12]
        policy = HeuristicPolicy(HeuristicConfig(scenarios=train, wrong_rate=0.2, seed=1), store=store)
        episodes = [e.model_dump(mode="json")
                    for e in run_episodes(policy, [EpisodeTask.from_scenario(s) for s in train], store)]
        config = AnonymizerConfig(public_terms=("Acme Widget",))
        own = env.world().anonymize(episodes, tmp_path / "anon", ["4111 1111 1111 1111"], config)

        inboxes = sorted({e["context"] for e in episodes} | {s.inbox_id for s in scenarios})
        direct = anonymize_partition(
            episodes, [m for a in inboxes for m in store.iter_emails(a)], scenarios, canaries=["4111 1111 1111 1111"],
            directory_emails=[m for a in store.inboxes() for m in store.iter_emails(a)],
            config=AnonymizerConfig(public_terms=("Acme Widget", *public_terms_of(store.inboxes()))))
    finally:
        env.close()
    timeless = [{k: v for k, v in r.items() if k != "seconds"} for r in (own.report, direct.report)]
    assert own.episodes == direct.episodes and timeless[0] == timeless[1] and own.leaks == direct.leaks == []
    assert load_jsonl(tmp_path / "anon" / "scenarios.jsonl") == [s.model_dump(mode="json") for s in direct.scenarios]
    with sqlite3.connect(tmp_path / "anon" / "inbox.db") as db:
        assert db.execute("select count(*) from emails").fetchone()[0] == len(direct.emails) == own.world["emails"]
    assert own.world["scenarios"] == len(scenarios) and own.world["inboxes"] == len(inboxes)


def test_a_plugin_with_the_old_environment_level_world_hooks_still_builds_and_trains_alone_warned(tmp_path):
    """A plug-in written against the previous contract (hooks on the environment itself) keeps its behaviour for
    one release: the loop reaches its hooks through `world()`, which says, once per call, what to move where."""
    from agent_rl.environments.core import PrivacySpec, World

    built = []

    class OldStyle(Timetable):
        name = "old-style"
        trains_alone = True

        def build_world(self, **options):
            built.append(options)
            return {"stops": 3}

        def grpo_rows(self, tasks):
            return [{"task_id": t.id} for t in tasks]

        def privacy(self):
            return PrivacySpec(known_people=lambda context: [("Ada Byron", "ada@example.org")])

    env = OldStyle()
    with pytest.warns(DeprecationWarning, match=r"build_world, grpo_rows, privacy, trains_alone.*World from world\(\)"):
        world = env.world()
    assert isinstance(world, World) and world.trains_alone and world.holds_personal_data()
    assert list(world.privacy().known_people("any")) == [("Ada Byron", "ada@example.org")]
    assert world.build(seed=4) == {"stops": 3} and built == [{"seed": 4}]
    train = env.tasks(Split.TRAIN)[:2]
    assert world.grpo_rows(train) == [{"task_id": t.id} for t in train]
    assert world.build_tasks(seed=4) == {} and world.reopen(tmp_path) is None  # hooks it lacks: the defaults


def test_the_email_world_trains_alone_and_reopens_what_it_wrote(email, tmp_path):
    world = email.world()
    assert world.trains_alone and type(world).__name__ == "EmailWorld"
    stored = world.reopen(tmp_path / "anon")
    assert stored.store_url == f"sqlite:///{tmp_path / 'anon' / 'inbox.db'}"
    assert stored.environment.scenarios_path == str(tmp_path / "anon" / "scenarios.jsonl")


def test_a_plugin_with_the_old_grading_members_keeps_them_warned():
    """Before `Grading`, an environment declared its reward range, demonstration quality, hacking detectors and
    probe on itself, and answers_in_words on the class: each still reaches the loop for one release, warned."""
    from agent_rl.environments.core import Grading, ProbeItem

    def detector(rollouts, config):
        return None

    with pytest.warns(DeprecationWarning, match="answers_in_words on the class"):
        class OldStyle(Timetable):
            name = "old-grading"
            reward_range = (0.0, 2.0)
            answers_in_words = True

            def __init__(self):
                super().__init__()
                self.rewarded_above = 0.5

            def demonstration_quality(self, reward):
                return reward / 2

            def hacking_detectors(self):
                return {"mine": detector}

            def probe(self):
                return [ProbeItem("What is 2 + 2?", ("4",))]

    env = OldStyle()
    assert env.capabilities.answers_in_words and not TimetableEnvironment.capabilities.answers_in_words
    with pytest.warns(DeprecationWarning, match=r"reward_range, rewarded_above, demonstration_quality, "
                                                r"hacking_detectors, probe.*Grading from grading\(\)"):
        grading = env.grading()
    assert grading.reward_range == (0.0, 2.0) and grading.rewarded_above == 0.5
    assert grading.demonstration_quality(1.0) == 0.5 and grading.hacking_detectors == {"mine": detector}
    assert grading.probe == (ProbeItem("What is 2 + 2?", ("4",)),)
    assert TimetableEnvironment().grading() == Grading()  # a plug-in of today: the defaults, no warning


def test_a_grading_with_an_empty_reward_range_is_refused():
    from agent_rl.environments.core import Grading

    with pytest.raises(ValueError, match=r"Grading.reward_range must be \(lowest, highest\)"):
        Grading(reward_range=(1.0, 1.0))


def test_overriding_the_derived_tools_is_warned():
    """The tools are the session type's public methods: an environment that lists others would train on one set
    and be served another."""
    with pytest.warns(DeprecationWarning, match="overrides tool_names: the tools are derived from session_type"):
        class Listed(Timetable):
            name = "listed"

            def tool_names(self):
                return ("departures",)

    assert Listed().tool_schemas() == TimetableEnvironment().tool_schemas()


def test_a_plugin_that_serves_its_own_contexts_on_the_environment_is_reached_through_its_world():
    with pytest.warns(DeprecationWarning, match="defines contexts on the environment"):
        class Served(Timetable):
            name = "served"

            def contexts(self):
                return frozenset({"night-line"})

        world = Served().world()
    assert world.contexts() == frozenset({"night-line"})
    assert world.replayable_tasks() == [t for split in Split for t in Served().tasks(split)]  # the default


def test_a_plugin_with_its_own_teacher_and_close_on_the_environment_keeps_them_warned():
    """Before the world held them, an environment returned its teacher and released its sessions' resources itself;
    such a plug-in still plays and closes for one release, warned, and its subclasses inherit them."""
    from examples.timetable import TimetableTeacher

    closed: list[str] = []
    with pytest.warns(DeprecationWarning, match="defines teacher, close on the environment: define it on a World"):
        class OldStyle(Timetable):
            name = "old-teacher"

            def teacher(self, seed=0):
                return TimetableTeacher() if seed == 0 else None

            def close(self):
                closed.append(self.name)

    class Child(OldStyle):
        name = "child"

    assert isinstance(OldStyle().teacher(), TimetableTeacher) and OldStyle().teacher(seed=1) is None
    assert isinstance(Child().world().teacher(), TimetableTeacher)
    OldStyle().close()
    Child().close()
    assert closed == ["old-teacher", "child"]
    assert isinstance(TimetableEnvironment().teacher(), TimetableTeacher)  # today's plug-in: on its World


def test_a_plugin_implements_at_most_twelve_members_and_the_guide_lists_each():
    """What a plug-in may implement is the contract newcomers read: the members of `Environment` that are not
    derived or final; docs/environments.md's table names every one of them and nothing else."""
    import re
    from pathlib import Path

    from agent_rl.environments import Environment

    members = {name for name, value in vars(Environment).items()
               if not name.startswith("_") and not getattr(value, "__final__", False)}
    assert len(members) <= 12, sorted(members)
    guide = (Path(__file__).parents[2] / "docs" / "environments.md").read_text()
    table = guide[guide.index("| member |"):guide.index("**The grading**")]
    listed = {re.sub(r"\(.*", "", cell) for cell in re.findall(r"^\| `([^`]+)`", table, flags=re.M)}
    assert listed == members

"""How a user picks and configures an environment for the loop: the resource and profile (AGENT_RL_ENV), the
registered model's name, the teacher specs production can be played by, and what the privacy pass does with
what a plug-in declares."""

from __future__ import annotations

from collections import Counter

import pytest

from agent_rl.environments.runner import Play, play_episodes
from agent_rl.arbiter.policies import PolicyLoadError, load_policy
from agent_rl.privacy.anonymize import Anonymizer, AnonymizerConfig
from agent_rl.curation.plugin_privacy import anonymize_plugin_partition, has_personal_world
from agent_rl.environments import World
from agent_rl.environments.support import SupportEnvironment
from agent_rl.records import Split
from agent_rl.registry import model_name_for
from examples.timetable import TimetableEnvironment
from resources.environment import EnvironmentResource


def test_the_resource_names_a_loadable_environment_or_fails_when_built():
    assert EnvironmentResource().load().name == "email" and EnvironmentResource().load().world().trains_alone
    resource = EnvironmentResource(name="support")
    assert not resource.load().world().trains_alone and resource.load().name == "support"
    with pytest.raises(Exception, match="environment 'suport': unknown; known: email, gateway, openai_job, support"):
        EnvironmentResource(name="suport")


def test_the_profile_takes_the_environment_and_a_model_name_of_its_own_from_agent_rl_env(monkeypatch):
    from pipelines.profiles import resources_for

    monkeypatch.setenv("AGENT_RL_ENV", "support")
    resources = resources_for("fast")
    assert resources["environment"].name == "support"
    assert resources["mlflow"].model_name == "agent-rl-support" == model_name_for("support")
    # A plug-in by import path is named after the name it declares, as docs/environments.md says.
    assert model_name_for("examples.timetable:TimetableEnvironment") == "agent-rl-timetable"
    assert model_name_for("support,examples.timetable:TimetableEnvironment") == "agent-rl-support-timetable"
    assert model_name_for("no_such_module:Nothing") == "agent-rl-no_such_module-Nothing"


def test_a_teacher_spec_plays_the_environments_teacher_with_its_options():
    env = SupportEnvironment()
    tasks = env.tasks(Split.TEST)
    perfect = load_policy("teacher:support")
    flawed = load_policy('teacher:{"environment": "support", "success_rate": 0.5, "seed": 3}')
    assert perfect.version == flawed.version == "teacher:support"
    outcomes = {name: Counter(e.outcome.value for e in play_episodes(policy, env, [Play(t) for t in tasks]))
                for name, policy in (("perfect", perfect), ("flawed", flawed))}
    assert outcomes["perfect"]["correct"] == len(tasks)
    assert 0.3 * len(tasks) < outcomes["flawed"]["correct"] < 0.8 * len(tasks)  # the share it fails is simulated
    again = play_episodes(load_policy('teacher:{"environment": "support", "success_rate": 0.5, "seed": 3}'), env,
                          [Play(t) for t in tasks])
    assert Counter(e.outcome.value for e in again) == outcomes["flawed"]  # a replay fails the same way


class NoTeacher(TimetableEnvironment):
    """A plug-in that offers no policy to play its tasks (the contract's default world)."""

    def world(self):
        return World(self)


@pytest.mark.parametrize("spec, complaint", [
    ("teacher:nowhere", "environment 'nowhere': unknown"),
    ("teacher:tests.environments.test_plugin_wiring:NoTeacher", "offers no teacher"),
    ('teacher:{"success_rate": 0.5}', 'needs "environment"'),
    ('teacher:{"environment": "support", "accuracy": 0.5}', "does not take \\['accuracy'\\]"),
    ('teacher:{"environment": "support", "success_rate": 2}', "success_rate must be in"),
])
def test_a_bad_teacher_spec_is_refused_naming_what_is_wrong(spec, complaint):
    with pytest.raises(PolicyLoadError, match=complaint):
        load_policy(spec)


def test_product_and_place_names_a_plugin_declares_public_are_left_alone():
    text = "Hello, I'd like to return the French Press and the Running Shoes. Thanks, Imogen Jablonski"
    plain = Anonymizer(AnonymizerConfig(key="k")).anonymize_text(text)
    kept = Anonymizer(AnonymizerConfig(key="k", public_terms=("French Press", "Running Shoes"))).anonymize_text(text)
    assert "I'd like" in plain  # a contraction is nobody's name
    assert "French Press" in kept and "Running Shoes" in kept and "Imogen" not in kept and "Jablonski" not in kept


def test_a_plugin_without_personal_data_in_its_world_keeps_its_tasks_and_world():
    timetable = TimetableEnvironment()
    assert not has_personal_world(timetable) and has_personal_world(SupportEnvironment())
    tasks = timetable.tasks(Split.TEST)
    result = anonymize_plugin_partition(timetable, [], tasks, plant=False)
    assert result.environment is timetable and result.tasks == tasks
    assert result.report["world"].startswith("declared free")

"""Profiles are TOML data: each shipped profile builds exactly the resources the former Python profiles built, a
user's own file is selected by path, and a misspelt resource or field fails naming the file and the key."""

import os

import pytest

from pipelines.profiles import PROFILE_DIR, PROFILES, RESOURCES, profile_path, resources_for

CORES = max(1, os.cpu_count() or 1)
# The fields each profile sets (as the if/elif code did before the TOML files, the demo's SFT now at its default
# length); every other field of every resource is its default.
EXPECTED = {
    "default": {},
    "demo": {
        "rollout": {"min_samples_per_arm": 20, "min_samples_per_step": 20, "tau_squared": 0.09, "ramp_on": "safety"},
        "evaluation": {"max_tasks": 94, "torch_threads": CORES, "batch_size": 32},
        "compute": {"omp_num_threads": CORES},
        "training": {"sft_overrides": {},
                     "grpo_overrides": {"max_steps": 2, "prompt_filter": {"mode": "none"}}},
    },
    "fast": {
        "curation": {"min_points": 300},
        "training": {"base_model": "tiny", "sft_overrides": {"max_steps": 4, "save_steps": 2, "max_length": 4096},
                     "grpo_overrides": {"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 4,
                                        "gradient_accumulation_steps": 1, "max_completion_length": 256,
                                        "prompt_filter": {"mode": "none"}}},
        "evaluation": {"max_tasks": 20, "gate": "open", "max_forgetting_drop": 1.0},
        "rollout": {"min_samples_per_arm": 10, "min_samples_per_step": 10, "base_spec": "tiny",
                    "max_step_hours": 0.05},
    },
    "learn": {
        "environment": {"name": "examples.helpdesk:HelpdeskEnvironment"},
        "curation": {"min_points": 300},
        "training": {"base_model": "tiny:examples.helpdesk:HelpdeskEnvironment",
                     "sft_overrides": {"max_steps": 400, "save_steps": 200, "learning_rate": 3e-3,
                                       "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
                                       "retain_fraction": 0.0},
                     "grpo_overrides": {"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 4,
                                        "gradient_accumulation_steps": 1, "max_completion_length": 128,
                                        "prompt_filter": {"mode": "none"}}},
        "evaluation": {"max_tasks": 70, "max_forgetting_drop": 1.0},
        "rollout": {"min_samples_per_arm": 10, "min_samples_per_step": 10,
                    "base_spec": "tiny:examples.helpdesk:HelpdeskEnvironment", "max_step_hours": 0.05},
    },
}


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profile_builds_the_resources_it_always_built(profile):
    built = resources_for(profile)
    assert list(built) == list(RESOURCES)
    for name, resource in RESOURCES.items():
        expected = resource(**EXPECTED[profile].get(name, {}))
        assert type(built[name]) is resource
        assert built[name].model_dump() == expected.model_dump(), name


def test_the_profiles_are_files_shipped_with_the_package():
    assert sorted(p.stem for p in PROFILE_DIR.glob("*.toml")) == sorted(PROFILES)


def test_agent_rl_profile_selects_by_name_or_path(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENT_RL_PROFILE", "fast")
    assert resources_for()["training"].base_model == "tiny"
    monkeypatch.delenv("AGENT_RL_PROFILE")
    assert resources_for()["training"].base_model == "base"
    gpu = tmp_path / "gpu.toml"
    gpu.write_text('[training]\nprofile = "gpu"\ngrpo_overrides = { max_steps = 50 }\n'
                   '[compute]\nomp_num_threads = "all-cores"\n')
    monkeypatch.setenv("AGENT_RL_PROFILE", str(gpu))
    built = resources_for()
    assert built["training"].grpo().use_vllm and built["training"].grpo().max_steps == 50
    assert built["compute"].omp_num_threads == CORES


@pytest.mark.parametrize("text, expected", [
    ("[evalution]\nmax_tasks = 5\n", r"bad.toml: unknown resource \[evalution\]"),
    ("[evaluation]\nmax_scenario = 5\n", r"bad.toml: \[evaluation\] unknown field 'max_scenario'"),
    ("evaluation = 5\n", r"bad.toml: evaluation must be a table"),
    ("[evaluation]\nmax_tasks = 0\n", r"bad.toml: \[evaluation\] max_tasks: Input should be greater"),
    ("[training]\ngrpo_overrides = { max_step = 2 }\n", r"bad.toml: \[training\] grpo_overrides.max_step: Extra"),
    ("[evaluation\n", r"bad.toml: not valid TOML"),
])
def test_a_bad_profile_fails_naming_the_file_and_the_key(tmp_path, text, expected):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=expected):
        resources_for(str(path))


def test_a_profile_with_a_field_under_its_old_name_still_loads_warned(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("[evaluation]\nmax_scenarios = 7\n")
    with pytest.warns(DeprecationWarning, match=r"mine.toml: \[evaluation\] max_scenarios is now max_tasks"):
        built = resources_for(str(path))
    assert built["evaluation"].max_tasks == 7 and built["evaluation"].eval_config().max_tasks == 7


def test_an_unknown_profile_names_the_choices(tmp_path):
    with pytest.raises(ValueError, match="expected one of default, demo, fast, learn or the path"):
        profile_path("gpu")
    with pytest.raises(ValueError, match="no such profile file"):
        profile_path(str(tmp_path / "missing.toml"))


def test_the_demo_table_sizes_the_demo_and_the_command_line_overrides_it(tmp_path):
    from demos.demo import parse_plan
    from pipelines.profiles import demo_settings

    sized = demo_settings("demo")  # the email world sized to 2 cores: v0 48 steps, the week 48 more on its adapter
    assert (sized.v0_steps, sized.week_sft_steps, sized.week_requests) == (48, 48, 100)
    plan = parse_plan(["--incumbent", "ours"])
    assert (plan.args.v0_steps, plan.args.week_sft_steps, plan.args.week_requests) == (48, 48, 100)
    plan = parse_plan(["--incumbent", "ours", "--v0-steps", "96", "--week-sft-steps", "96", "--week-requests", "400"])
    assert (plan.args.v0_steps, plan.args.week_sft_steps, plan.args.week_requests) == (96, 96, 400)
    # A profile without the table keeps the driver's own defaults (v0: half the profile's SFT steps).
    plan = parse_plan(["--fast", "--profile", "learn", "--incumbent", "ours"])
    assert (plan.args.v0_steps, plan.args.week_sft_steps, plan.args.week_requests) == (None, None, 400)
    bad = tmp_path / "bad.toml"
    bad.write_text("[demo]\nv0_step = 4\n")
    with pytest.raises(ValueError, match=r"bad.toml: \[demo\] unknown field 'v0_step'"):
        demo_settings(str(bad))
    bad.write_text("[demo]\nweek_requests = 0\n")
    with pytest.raises(ValueError, match=r"bad.toml: \[demo\] week_requests: Input should be greater"):
        demo_settings(str(bad))
    bad.write_text("[demo]\nweek_requests = 10\n")  # the table is no resource: the resources build without it
    assert list(resources_for(str(bad))) == list(RESOURCES)


def test_the_world_stores_first_names_are_read_warned(monkeypatch, tmp_path):
    import resources.stores

    own = tmp_path / "own.toml"
    own.write_text(f'[inbox_store]\nurl = "sqlite:///{tmp_path}/mine.db"\n')
    with pytest.warns(DeprecationWarning, match=r"\[inbox_store\] is now \[world_store\]"):
        built = resources_for(str(own))
    assert built["world_store"].resolved_url() == f"sqlite:///{tmp_path}/mine.db"
    with pytest.warns(DeprecationWarning, match="now WorldStoreResource"):
        assert resources.stores.InboxStoreResource is resources.stores.WorldStoreResource

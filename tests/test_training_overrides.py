"""TrainingResource's SFT / GRPO overrides are typed: checked against the settings models when the resource is
built, so a misspelt or invalid field fails at load, named, instead of in the middle of a run."""

import dagster as dg
import pytest

from resources.training import TrainingResource


def test_overrides_are_dicts_applied_to_the_settings():
    training = TrainingResource(sft_overrides={"max_steps": 48},
                                grpo_overrides={"max_steps": 2, "prompt_filter": {"mode": "none"}})
    assert training.sft().max_steps == 48
    assert training.grpo().max_steps == 2 and training.grpo().prompt_filter.mode == "none"
    assert TrainingResource(profile="gpu", grpo_overrides={"max_steps": 3}).grpo().use_vllm


def test_a_json_object_string_is_still_read():
    assert TrainingResource(sft_overrides='{"max_steps": 4}').sft_overrides == {"max_steps": 4}
    with pytest.raises(ValueError, match="sft_overrides is not valid JSON"):
        TrainingResource(sft_overrides="{max_steps: 4}")
    with pytest.raises(ValueError, match="grpo_overrides must be a JSON object, got list"):
        TrainingResource(grpo_overrides="[1]")


@pytest.mark.parametrize("field, overrides, expected", [
    ("sft_overrides", {"max_step": 4}, "sft_overrides.max_step: Extra inputs are not permitted"),
    ("sft_overrides", {"lora": {"rank": 4}}, "sft_overrides.lora.rank: Extra inputs are not permitted"),
    ("grpo_overrides", {"max_steps": 0}, "grpo_overrides.max_steps: Input should be greater than 0"),
    ("grpo_overrides", {"prompt_filter": {"mode": "some"}}, "grpo_overrides.prompt_filter.mode"),
    ("grpo_overrides", {"rubric": {"corect": 2.0}}, "grpo_overrides.rubric.corect"),
    ("grpo_overrides", {"num_generations": 3}, "grpo_overrides: .*multiple of num_generations"),
    ("grpo_overrides", {"fresh_adapter": True}, "grpo_overrides: fresh_adapter: moved to experimental"),
])
def test_a_bad_override_fails_at_load_naming_the_field(field, overrides, expected):
    with pytest.raises(ValueError, match=expected):
        TrainingResource(**{field: overrides})


def test_dagster_run_config_takes_the_overrides_as_objects_and_checks_them():
    @dg.asset
    def steps(training: TrainingResource) -> int:
        return training.grpo().max_steps

    launch = {"training": TrainingResource.configure_at_launch()}
    config = {"resources": {"training": {"config": {"grpo_overrides": {"max_steps": 3}}}}}
    result = dg.materialize([steps], resources=launch, run_config=config)
    assert result.output_for_node("steps") == 3
    config = {"resources": {"training": {"config": {"grpo_overrides": {"max_stepz": 3}}}}}
    with pytest.raises(dg.DagsterResourceFunctionError) as failed:
        dg.materialize([steps], resources=launch, run_config=config)
    assert "grpo_overrides.max_stepz: Extra inputs are not permitted" in str(failed.value.__cause__)

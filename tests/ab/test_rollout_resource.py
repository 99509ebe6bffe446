"""The A/B resource wraps RolloutConfig (issue 65): its defaults are the library's, every field of the config (the
guardrails included) is a profile key, what a profile sets reaches the config the sensors' controller decides with,
and a misspelt or out-of-range value fails when the profile loads, naming the key."""

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from agent_rl.ab.rollout import Guardrails, LabelSettings, Margin, RolloutConfig, RolloutState, decide
from agent_rl.ab.stats import ArmStats
from pipelines.profiles import resources_for
from resources.rollout import _KEYS, RolloutResource

T0 = datetime(2026, 11, 30, tzinfo=timezone.utc)


def _at(config: RolloutConfig, path: tuple[str, ...]):
    value = config
    for name in path:
        value = getattr(value, name)
    return value


def test_the_resource_defaults_are_the_librarys():
    resource = RolloutResource()
    assert resource.config() == RolloutConfig()
    library = RolloutConfig()
    for key, path in _KEYS.items():
        value = getattr(resource, key)
        expected = _at(library, path)
        if key == "steps":
            value = tuple(value)
        elif key == "max_step_hours":
            value = timedelta(hours=value)
        elif key == "outage_hold_minutes":
            value = timedelta(minutes=value)
        elif key == "guardrails":
            expected = expected.model_dump()
        assert value == expected, key
    assert resource.max_step_hours == 72.0  # two steps fit in the week between two challengers


def test_every_field_of_the_config_has_a_profile_key():
    covered = {".".join(path) for path in _KEYS.values()}
    fields = {name for name in RolloutConfig.model_fields if name != "labels"}
    fields |= {f"labels.{name}" for name in LabelSettings.model_fields}
    assert fields == covered


def _profile(tmp_path, text: str):
    path = tmp_path / "mine.toml"
    path.write_text(text)
    return resources_for(str(path))


def test_guardrails_set_in_a_profile_reach_the_controllers_config(tmp_path, sqlite_url):
    import dagster as dg

    from pipelines.sensors import _controller
    from resources.registry import MlflowResource
    from resources.stores import PoolResource

    built = _profile(tmp_path, '[rollout]\nmax_step_hours = 48\nuse_labels = false\n'
                     'guardrails = { latency_p95 = { value = 0.6 }, failure_rate = { kind = "relative", value = 0.5 },'
                     ' alpha = 0.01 }\n')
    controller = _controller(dg.build_sensor_context(), PoolResource(url=sqlite_url),
                             MlflowResource(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"), built["rollout"])
    try:
        config = controller.config
    finally:
        controller.pool.close()
    assert config.guardrails == Guardrails(latency_p95=Margin(kind="relative", value=0.6),
                                           failure_rate=Margin(kind="relative", value=0.5), alpha=0.01)
    assert config.max_step_duration == timedelta(hours=48) and not config.labels.use
    assert config.steps == RolloutConfig().steps and config.alpha == RolloutConfig().alpha

    # The same traffic, a challenger as good but 40% slower: the default 20% margin rolls it back, the profile's 60%
    # keeps the test running.
    rng = np.random.default_rng(0)
    champion = ArmStats(600, 1000, latencies_ms=tuple(rng.normal(1000, 50, 1000)))
    challenger = ArmStats(600, 1000, latencies_ms=tuple(rng.normal(1400, 50, 1000)))
    state = RolloutState.start("v1", "v2", config, now=T0)
    assert decide(state, champion, challenger, RolloutConfig(), now=T0 + timedelta(hours=1)).cause == "guardrail_breach"
    assert decide(state, champion, challenger, config, now=T0 + timedelta(hours=1)).action == "hold"


@pytest.mark.parametrize("text, expected", [
    ("guardrails = { failure_rat = { value = 0.03 } }", r"\[rollout\] guardrails.failure_rat: Extra inputs"),
    ("guardrails = { latency_p95 = { kind = \"rel\" } }", r"\[rollout\] guardrails.latency_p95.kind: Input should "
     "be 'absolute' or 'relative'"),
    ("guardrails = { failure_rate = { value = -0.1 } }", r"\[rollout\] guardrails.failure_rate.value: Input should "
     "be greater than or equal to 0"),
    ("guardrails = { alpha = 2 }", r"\[rollout\] guardrails.alpha: guardrails.alpha must be strictly between"),
    ("max_step_hours = -1", r"\[rollout\] max_step_hours: max_step_duration must be positive"),
    ("max_step_hours = inf", r"\[rollout\] max_step_hours: inf is not a number of hours"),
    ("alpha = 1.5", r"\[rollout\] alpha: alpha must be strictly between 0 and 1"),
    ("steps = [0.5, 0.1, 1.0]", r"\[rollout\] steps: steps must be strictly increasing"),
    ("labels_min_rated_per_arm = 1", r"\[rollout\] labels_min_rated_per_arm: Input should be greater than or equal"),
    ("min_samples_per_arm = 0", r"\[rollout\] min_samples_per_arm: Input should be greater than or equal to 1"),
    ("max_step_duration = 3", r"\[rollout\] unknown field 'max_step_duration'"),
])
def test_a_bad_rollout_value_fails_when_the_profile_loads_naming_it(tmp_path, text, expected):
    with pytest.raises(ValueError, match=expected):
        _profile(tmp_path, f"[rollout]\n{text}\n")

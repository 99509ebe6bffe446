"""Where a week's SFT starts: the champion's adapter when production runs a model of ours on this base."""

from __future__ import annotations

import json

from agent_rl import registry
from agent_rl.train.starting_point import starting_point


def _adapter(folder):
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    return folder


def test_training_continues_production_only_when_it_is_one_adapter_of_ours_on_this_base(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_RL_HOME", str(tmp_path / "home"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    where = {"name": "agent-rl-email", "tracking_uri": uri}
    one = registry.register_candidate([_adapter(tmp_path / "sft")], "base", **where)
    other_base = registry.register_candidate([_adapter(tmp_path / "tiny-sft")], "tiny", **where)
    stack = registry.register_candidate([_adapter(tmp_path / "a"), _adapter(tmp_path / "b")], "base", **where)
    configured = registry.register_policy_spec("heuristic", **where)

    start = starting_point("champion", f"v{one.version}", "base", model_name="agent-rl-email", tracking_uri=uri)
    assert start.version == f"v{one.version}" and (start.adapter / "adapter_model.safetensors").read_bytes() == b"weights"
    assert start.lineage() == f"v{one.version}"

    for incumbent, why in ((f"v{other_base.version}", "an adapter of 'tiny'"),
                           (f"v{stack.version}", "a stack of 2 adapters"),
                           (f"v{configured.version}", "a configured policy"),
                           ("o3-sim", "production runs o3-sim, not a registered model of ours"),
                           ("v99", "v99 is not a version of agent-rl-email")):
        start = starting_point("champion", incumbent, "base", model_name="agent-rl-email", tracking_uri=uri)
        assert start.adapter is None and start.lineage() == "base" and why in start.description, incumbent
    chosen = starting_point("base", f"v{one.version}", "base", model_name="agent-rl-email", tracking_uri=uri)
    assert chosen.adapter is None and "training.start_from = base" in chosen.description

"""The training entry point as a Dagster Pipes subprocess (how the training assets run it).

No `from __future__ import annotations` here: Dagster resolves the asset's parameter annotations at runtime.
"""

import json
import os
import sys
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def test_entry_point_under_dagster_pipes_reports_the_materialization(train_data, tmp_path):
    """The lead's assets run the stage as a Pipes subprocess; logs, metrics and metadata must reach Dagster."""
    config = {"model_path": str(train_data["tiny"]), "rows_jsonl": str(train_data["sft"]),
              "out_dir": str(tmp_path / "sft"), "settings": {"max_steps": 1, "per_device_train_batch_size": 1, "max_length": 8192}}
    path = tmp_path / "sft.json"
    path.write_text(json.dumps(config))
    custom_messages = []

    @dg.asset
    def sft_adapter(context: dg.AssetExecutionContext, pipes: dg.PipesSubprocessClient):
        invocation = pipes.run(command=[sys.executable, "-m", "agent_rl.train", "sft", "--config", str(path)],
                               context=context, env={**_env(), "AGENT_RL_HOME": str(tmp_path / "home")})
        custom_messages.extend(invocation.get_custom_messages())
        return invocation.get_materialize_result()

    result = dg.materialize([sft_adapter], resources={"pipes": dg.PipesSubprocessClient()},
                            instance=dg.DagsterInstance.ephemeral())
    assert result.success
    metadata = result.asset_materializations_for_node("sft_adapter")[0].metadata
    assert metadata["steps"].value == 1 and metadata["cut_rows"].value == 0
    assert Path(metadata["adapter_path"].value, "adapter_model.safetensors").is_file()
    assert metadata["tokens_per_second"].value > 0
    assert any(m.get("kind") == "metrics" and "loss" in m["metrics"] for m in custom_messages)

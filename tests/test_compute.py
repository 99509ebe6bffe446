"""TrainingCompute in kubernetes mode: the pod it asks for and the files that cross to it and back.

dagster-k8s is not installed on these machines and no local cluster can run here, so the pod spec is a pure
function (`pod_spec`) tested as data, and `PipesK8sClient` is a stand-in (tests/k8s_stub.py) that records the
call; here it plays the pod in this process with a stage that writes files like one (no model). A real training
stage in a separate process: tests/train/test_pod_stage.py.
"""

import json
from pathlib import Path

import dagster as dg
import pytest

from agent_rl.train.__main__ import _materialization_metadata
from agent_rl.train.stage_store import CONFIG_ENV, read_stage_config, run_in_scratch
from resources.compute import ComputeMode, TrainingCompute, pod_spec, stage_command
from tests import k8s_stub


def test_pod_spec_names_the_image_its_python_gpus_and_the_store_credentials():
    env = {CONFIG_ENV: '{"stage_store": "s3://bucket/agent-rl"}', "OMP_NUM_THREADS": "4"}
    spec = pod_spec("ghcr.io/acme/agent-rl:1.2", stage_command("python", "grpo"), env, gpus=4,
                    env_secret="agent-rl-store")
    (container,) = spec["containers"]
    assert container["image"] == "ghcr.io/acme/agent-rl:1.2"
    assert container["command"] == ["python", "-m", "agent_rl.train", "grpo"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 4}}
    assert k8s_stub.container_env(spec)[CONFIG_ENV] == env[CONFIG_ENV]
    assert k8s_stub.container_env(spec)["AGENT_RL_SCRATCH"] == container["volume_mounts"][0]["mount_path"]
    assert container["env_from"] == [{"secret_ref": {"name": "agent-rl-store"}}]
    assert spec["restart_policy"] == "Never" and spec["volumes"][0]["empty_dir"] == {}
    assert pod_spec("img", ["python"], {}, gpus=0)["containers"][0]["resources"] == {}


def test_kubernetes_mode_needs_a_store_and_a_good_one():
    with pytest.raises(ValueError, match="needs stage_store_url"):
        TrainingCompute(mode="kubernetes", k8s_image="img")
    with pytest.raises(ValueError, match="stage_store_url .*unknown protocol") as info:
        TrainingCompute(mode="kubernetes", k8s_image="img", stage_store_url="nonsense://bucket")
    with pytest.raises(ValueError, match="credentials in the URL") as info:
        TrainingCompute(stage_store_url="s3://key:hunter2@bucket/x")
    assert "hunter2" not in str(info.value)
    assert TrainingCompute().mode == ComputeMode.SUBPROCESS and TrainingCompute().stage_store_url == ""


def _fake_stage(local: dict, _uploaders: list = ()) -> dict:
    out = Path(local["out_dir"]) / "adapter"
    out.mkdir(parents=True)
    (out / "adapter_model.safetensors").write_bytes(Path(local["rows_jsonl"]).read_bytes())
    (out / "agent_rl_adapter.json").write_text(json.dumps({"base_model": local["model_path"], "adapters": [str(out)]}))
    return {"adapter_dir": str(out), "steps": 1, "losses": [1.5], "seconds": 0.1, "tokens_per_second": 10.0,
            "rows_used": 1, "cut_rows": 0}


def _play_in_process(context, spec):
    """The pod's side, in this process: the config from the container's environment, files through the store."""
    config = read_stage_config(k8s_stub.container_env(spec)[CONFIG_ENV])
    metadata = _materialization_metadata("sft", run_in_scratch(config, _fake_stage))
    metadata = {k: dg.MetadataValue.json(v["raw_value"]) if isinstance(v, dict) else v for k, v in metadata.items()}

    class Invocation:
        def get_results(self):
            return [dg.MaterializeResult(metadata=metadata)]

    return Invocation()


def test_the_pod_gets_store_urls_and_its_output_comes_home(tmp_path, monkeypatch):
    calls = k8s_stub.install(monkeypatch, _play_in_process)
    monkeypatch.setenv("AGENT_RL_SCRATCH", str(tmp_path / "pod-scratch"))
    (tmp_path / "pod-scratch").mkdir()
    host = tmp_path / "host-home"
    rows = host / "artifacts" / "sft_dataset" / "2026-01-05" / "train.jsonl"
    rows.parent.mkdir(parents=True)
    rows.write_text('{"messages": []}\n')
    out_dir = host / "artifacts" / "sft_adapter" / "2026-01-05"
    compute = TrainingCompute(mode="kubernetes", k8s_image="ghcr.io/acme/agent-rl:1.2", k8s_gpu_count=2,
                              k8s_namespace="training", k8s_model_path="/opt/models/smollm2",
                              stage_store_url=f"file://{tmp_path / 'store'}", k8s_env_secret="agent-rl-store")

    result = compute.run(None, "sft", {"model_path": str(host / "models" / "smollm2"), "rows_jsonl": str(rows),
                                       "out_dir": str(out_dir), "settings": {"max_steps": 1}})

    (call,) = calls
    spec = call["base_pod_spec"]
    assert call["namespace"] == "training"
    assert spec["containers"][0]["command"] == ["python", "-m", "agent_rl.train", "sft"]
    assert spec["containers"][0]["image"] == "ghcr.io/acme/agent-rl:1.2"
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    sent = k8s_stub.container_env(spec)[CONFIG_ENV]
    assert str(tmp_path / "host-home") not in sent, "no path of the host reaches the pod"
    config = json.loads(sent)
    assert config["stage_store"] == f"file://{tmp_path / 'store'}"
    assert config["rows_jsonl"].startswith(config["stage_store"] + "/objects/")
    assert config["model_path"] == "/opt/models/smollm2"
    assert result["adapter_path"] == str(out_dir / "adapter") and result["steps"] == 1
    assert (out_dir / "adapter" / "adapter_model.safetensors").read_bytes() == rows.read_bytes()
    manifest = json.loads((out_dir / "adapter" / "agent_rl_adapter.json").read_text())
    assert manifest == {"base_model": str(host / "models" / "smollm2"), "adapters": [str(out_dir / "adapter")]}
    assert "stage_out" not in result and "pod_paths" not in result


def test_kubernetes_mode_without_dagster_k8s_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "dagster_k8s", None)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("{}\n")
    compute = TrainingCompute(mode="kubernetes", k8s_image="img", stage_store_url=f"file://{tmp_path / 'store'}")
    with pytest.raises(RuntimeError, match="pip install dagster-k8s"):
        compute.run(None, "sft", {"model_path": "m", "rows_jsonl": str(rows), "out_dir": str(tmp_path / "out")})


def test_a_pod_cannot_track_into_this_machines_mlflow_files(tmp_path, monkeypatch):
    calls = k8s_stub.install(monkeypatch, _play_in_process)
    compute = TrainingCompute(mode="kubernetes", k8s_image="img", stage_store_url=f"file://{tmp_path / 'store'}")
    config = {"model_path": "m", "rows_jsonl": "r", "out_dir": str(tmp_path / "out"),
              "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "dagster_run_id": "run-1"}}
    with pytest.raises(ValueError, match="MLFLOW_TRACKING_URI") as info:
        compute.run(None, "sft", config)
    assert str(tmp_path) not in str(info.value) and not calls and not (tmp_path / "store").exists()


def test_several_processes_run_under_accelerate_launch_one_per_gpu():
    assert stage_command("python", "sft") == ["python", "-m", "agent_rl.train", "sft"]
    command = stage_command("/opt/venv/bin/python", "grpo", processes=4, port=29411)
    assert command[:3] == ["/opt/venv/bin/python", "-m", "accelerate.commands.launch"]
    assert command[command.index("--num_processes") + 1] == "4"
    assert command[command.index("--main_process_port") + 1] == "29411"
    assert command[-3:] == ["-m", "agent_rl.train", "grpo"]
    with pytest.raises(ValueError, match="exceeds k8s_gpu_count"):
        TrainingCompute(mode="kubernetes", k8s_image="img", stage_store_url="file:///tmp/s", k8s_gpu_count=2,
                        processes=4)
    with pytest.raises(ValueError, match="needs mode 'subprocess' or 'kubernetes'"):
        TrainingCompute(mode="in_process", processes=2)


def test_the_user_guide_kubernetes_profile_loads(tmp_path):
    """The snippet a user copies names real fields and, with a store this machine can open, builds the resources."""
    from pipelines.profiles import read_profile, resources_for

    guide = (Path(__file__).resolve().parents[1] / "docs" / "user-guide.md").read_text()
    section = guide[guide.index("**Training on Kubernetes**"):]
    snippet = section[section.index("```toml") + len("```toml"):section.index("```", section.index("```toml") + 7)]
    profile = tmp_path / "k8s.toml"
    profile.write_text(snippet.replace("s3://acme-ml/agent-rl/stages", f"file://{tmp_path / 'store'}"))
    assert read_profile(profile)["compute"]["mode"] == "kubernetes"
    compute = resources_for(str(profile))["compute"]
    assert compute.mode == ComputeMode.KUBERNETES and compute.k8s_gpu_count == 1


def test_the_entry_point_says_where_it_looks_for_its_config(monkeypatch):
    from agent_rl.train.__main__ import main

    monkeypatch.delenv(CONFIG_ENV, raising=False)
    with pytest.raises(SystemExit, match=f"--config FILE or set {CONFIG_ENV}"):
        main(["sft"])
    monkeypatch.setenv(CONFIG_ENV, "[1, 2]")
    with pytest.raises(SystemExit, match="expected a JSON object"):
        main(["sft"])

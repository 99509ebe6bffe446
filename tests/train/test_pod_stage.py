"""Training in a pod that shares nothing with the Dagster host, played on this machine.

No cluster runs here (and dagster-k8s is not installed), so `PipesK8sClient` is the stand-in of tests/k8s_stub.py:
it takes the pod spec TrainingCompute sends and runs its container's command as given (`python -m agent_rl.train
STAGE`, `python` from PATH as in the image) in another working directory, with only the container's environment
(the stage config and the store URL), a fresh AGENT_RL_HOME and the Pipes bootstrap variables. While it runs, the
host's inputs and its AGENT_RL_HOME are moved away: whatever the pod reads comes through the store (file:// to a
temp dir), and what it writes reaches the host only by the download afterwards.

No `from __future__ import annotations`: Dagster resolves the asset's parameter annotations at runtime.
"""

import json
from pathlib import Path

import dagster as dg
import pytest

from agent_rl import settings
from agent_rl.train.stage_store import CONFIG_ENV
from resources.compute import TrainingCompute
from tests import k8s_stub
from tests.train.test_sft_grpo import _forced_pairs

pytestmark = pytest.mark.slow
PARTITION = "2026-01-05"


def _hidden_while(paths: list[Path], run):
    """Run `run()` with `paths` renamed away (restored after); a path the pod recreated fails the test."""
    away = [p.rename(p.with_name(p.name + ".away")) for p in paths]
    try:
        result = run()
        recreated = [str(p) for p in paths if p.exists()]
        assert not recreated, f"the pod wrote on the host: {recreated}"
        return result
    finally:
        for original, moved in zip(paths, away):
            moved.rename(original)


def _materialize(compute: TrainingCompute, stage: str, config: dict) -> dict:
    """The stage through the resource inside a real asset run, as assets/training.py calls it; its result dict."""
    results = []

    @dg.asset(name=f"{stage}_adapter")
    def stage_asset(context: dg.AssetExecutionContext):
        results.append(compute.run(context, stage, config))
        return dg.MaterializeResult(metadata={"steps": results[-1]["steps"]})

    assert dg.materialize([stage_asset], instance=dg.DagsterInstance.ephemeral()).success
    return results[0]


def _assert_pod_spec(call: dict, stage: str, host_paths: list[Path]) -> None:
    (container,) = call["base_pod_spec"]["containers"]
    assert container["command"] == ["python", "-m", "agent_rl.train", stage]
    assert container["image"] == "agent-rl:test" and container["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    env = k8s_stub.container_env(call["base_pod_spec"])
    assert json.loads(env[CONFIG_ENV])["stage_store"].startswith("file://")
    leaked = [str(p) for p in host_paths if any(str(p) in value for value in env.values())]
    assert not leaked, f"host paths in the pod's environment: {leaked}"


def test_sft_then_grpo_in_a_pod_that_shares_nothing_with_the_host(train_data, tmp_path, monkeypatch):
    host_home = settings.home()
    hidden = [Path(train_data["root"]), host_home]
    calls = k8s_stub.install(monkeypatch, lambda context, spec: _hidden_while(
        hidden, lambda: k8s_stub.run_container(context, spec, tmp_path / f"pod-{len(calls)}")))
    compute = TrainingCompute(mode="kubernetes", k8s_image="agent-rl:test", k8s_gpu_count=1,
                              stage_store_url=f"file://{tmp_path / 'store'}")

    sft_out = settings.artifact_dir("sft_adapter", PARTITION)
    sft = _materialize(compute, "sft", {
        "model_path": str(train_data["tiny"]), "rows_jsonl": str(train_data["sft"]), "out_dir": str(sft_out),
        "settings": {"max_steps": 1, "per_device_train_batch_size": 1, "max_length": 8192}})

    _assert_pod_spec(calls[0], "sft", hidden)
    assert sft["steps"] == 1 and sft["adapter_path"] == str(sft_out / "adapter")
    assert (sft_out / "adapter" / "adapter_model.safetensors").is_file()
    manifest = json.loads((sft_out / "adapter" / "agent_rl_adapter.json").read_text())
    assert manifest == {"base_model": str(train_data["tiny"]), "adapters": [str(sft_out / "adapter")]}

    # GRPO reads the SFT adapter as it came home, the inbox database and the prompts: all through the store.
    grpo_out = settings.artifact_dir("grpo_adapter", PARTITION)
    grpo = _materialize(compute, "grpo", {
        "model_path": str(train_data["tiny"]), "sft_adapter": str(sft_out / "adapter"),
        "grpo_rows_jsonl": str(train_data["grpo"]), "store_url": train_data["store_url"],
        "out_dir": str(grpo_out), "settings": _forced_pairs(train_data["tiny"]).model_dump(mode="json")})

    _assert_pod_spec(calls[1], "grpo", hidden)
    assert grpo["steps"] == 1 and grpo["adapter_path"] == str(grpo_out / "adapter")
    assert grpo["rollouts_path"] == str(grpo_out / "rollouts.jsonl") and (grpo_out / "rollouts.jsonl").is_file()
    stack = json.loads((grpo_out / "adapter" / "agent_rl_adapter.json").read_text())
    assert stack["base_model"] == str(train_data["tiny"])
    assert all(Path(a).is_relative_to(host_home) and Path(a, "adapter_config.json").is_file()
               for a in stack["adapters"])


@pytest.mark.parametrize("mode", ["kubernetes", "subprocess"])
def test_sft_in_two_processes_writes_one_adapter(mode, train_data, tmp_path, monkeypatch, capfd):
    """`processes = 2`: accelerate launch, DDP over gloo on CPU. Rank 0 reports and (in a pod) uploads; rank 1
    trains alongside and writes nothing the host sees."""
    calls = k8s_stub.install(monkeypatch, lambda context, spec: k8s_stub.run_container(context, spec, tmp_path / "pod"))
    pod = dict(mode="kubernetes", k8s_image="agent-rl:test", k8s_gpu_count=2,
               stage_store_url=f"file://{tmp_path / 'store'}") if mode == "kubernetes" else {}
    compute = TrainingCompute(processes=2, **pod)
    out = settings.artifact_dir("sft_adapter", PARTITION)

    sft = _materialize(compute, "sft", {
        "model_path": str(train_data["tiny"]), "rows_jsonl": str(train_data["sft"]), "out_dir": str(out),
        "settings": {"max_steps": 2, "per_device_train_batch_size": 1, "max_length": 8192}})

    assert "sft: rank 1 of 2 trains alongside rank 0" in capfd.readouterr().err
    assert sft["steps"] == 2 and sft["adapter_path"] == str(out / "adapter")
    adapters = [p for p in settings.home().rglob("adapter_model.safetensors") if "checkpoint-" not in str(p)]
    assert adapters == [out / "adapter" / "adapter_model.safetensors"]
    if mode == "kubernetes":
        command = calls[0]["base_pod_spec"]["containers"][0]["command"]
        assert command[:3] == ["python", "-m", "accelerate.commands.launch"] and "--num_processes" in command
        assert command[command.index("--num_processes") + 1] == "2"
        assert command[-3:] == ["-m", "agent_rl.train", "sft"]


def test_grpo_in_two_processes_writes_one_adapter_and_reports_the_whole_batch(train_data, capfd):
    """`processes = 2` for GRPO: each process rolls out half of the generation batch, rank 0 reports the groups of
    both, writes the one adapter and every rollout. The forced rollouts score alike, so every micro-batch has zero
    advantage: the processes skip them together (one skipping alone would leave the other waiting in TRL's
    metric gathers), and score the one that syncs the gradients."""
    compute = TrainingCompute(processes=2)
    out = settings.artifact_dir("grpo_adapter", PARTITION)

    grpo = _materialize(compute, "grpo", {
        "model_path": str(train_data["tiny"]), "sft_adapter": None, "grpo_rows_jsonl": str(train_data["grpo"]),
        "inbox_store_url": train_data["store_url"], "out_dir": str(out),  # the old name of store_url
        "settings": _forced_pairs(train_data["tiny"]).model_dump(mode="json")})

    assert "grpo: rank 1 of 2 trains alongside rank 0" in capfd.readouterr().err
    assert grpo["steps"] == 1 and grpo["adapter_path"] == str(out / "adapter")
    adapters = [p for p in settings.home().rglob("adapter_model.safetensors") if "checkpoint-" not in str(p)]
    assert adapters == [out / "adapter" / "adapter_model.safetensors"]
    rollouts = [json.loads(line) for line in Path(grpo["rollouts_path"]).read_text().splitlines()]
    # 1 row per device x 4 accumulation steps x 2 processes = 8 rollouts, in groups of 2
    assert len(rollouts) == 8 and grpo["groups"] == grpo["zero_variance_groups"] == 4
    assert sorted(r["group"] for r in rollouts) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert grpo["tool_calls"] >= 8 and grpo["outcomes"] == {"ran_out": 8}


class _Preempted(RuntimeError):
    pass


def _preempt_after(step: int):
    """A Trainer callback that stops the run after `step` as a preempted node would: no clean save, no output."""
    from transformers import TrainerCallback

    class Preempt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                raise _Preempted(f"node preempted after step {step}")
            return control

    return Preempt()


def test_a_preempted_pod_resumes_in_a_fresh_pod_from_the_checkpoint_in_the_store(train_data, tmp_path, monkeypatch):
    from agent_rl.train.__main__ import run_configured
    from agent_rl.train.stage_store import StagedConfig, StageStore, stage_key

    out_dir = tmp_path / "host" / "sft_adapter"
    config = {"model_path": str(train_data["tiny"]), "rows_jsonl": str(train_data["sft"]), "out_dir": str(out_dir),
              "settings": {"max_steps": 4, "save_steps": 2, "per_device_train_batch_size": 2, "max_length": 8192}}
    staged = StagedConfig.prepare("sft", config, f"file://{tmp_path / 'store'}")
    store, key = StageStore(staged.config["stage_store"]), stage_key(staged.config)

    # The first pod trains steps 1-3 on its node and is preempted: its scratch is gone, checkpoint-2 went up.
    monkeypatch.setenv("AGENT_RL_SCRATCH", str((tmp_path / "node-a").resolve()))
    (tmp_path / "node-a").mkdir()
    with pytest.raises(_Preempted):
        run_configured("sft", staged.config, "test", callbacks=[_preempt_after(3)])
    assert not list((tmp_path / "node-a").iterdir()), "the first pod's scratch is removed"
    assert store.latest_checkpoint(key)["name"] == "checkpoint-2"

    # Its replacement runs on another node with an empty scratch: it resumes from the store's checkpoint-2.
    monkeypatch.setenv("AGENT_RL_SCRATCH", str((tmp_path / "node-b").resolve()))
    (tmp_path / "node-b").mkdir()
    reported = run_configured("sft", staged.config, "test")
    assert reported["resumed_from"] == "checkpoint-2"
    assert reported["steps"] == 4 and len(reported["losses"]) == 2  # only steps 3 and 4 ran again
    assert store.latest_checkpoint(key) is None, "a finished stage leaves no checkpoint to resume"

    result = staged.bring_back(reported)
    assert Path(result["adapter_dir"]) == out_dir / "adapter"
    assert (out_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert not list(out_dir.glob("checkpoint-*")), "checkpoints stay in the store, not in the host's output"


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts each rank in a session of its own: killing the launcher's process
    group leaves them running)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_a_preempted_two_process_pod_resumes_on_another_node_from_the_checkpoint_in_the_store(train_data, tmp_path):
    """Both ranks of a two-process stage (accelerate launch, gloo on CPU) resume from the checkpoint rank 0 uploaded
    before the node went away: rank 1 from its own scratch, on a node where nothing of the first pod is left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from agent_rl.train.stage_store import StagedConfig, StageStore, stage_key
    from resources.compute import _free_port, stage_command

    config = {"model_path": str(train_data["tiny"]), "rows_jsonl": str(train_data["sft"]),
              "out_dir": str(tmp_path / "host" / "sft_adapter"),
              "settings": {"max_steps": 40, "save_steps": 2, "per_device_train_batch_size": 1, "max_length": 8192}}
    staged = StagedConfig.prepare("sft", config, f"file://{tmp_path / 'store'}")
    store, key = StageStore(staged.config["stage_store"]), stage_key(staged.config)

    def pod(node: str) -> tuple[list[str], dict[str, str]]:
        (tmp_path / node).mkdir()
        env = {**os.environ, CONFIG_ENV: staged.env_value, "AGENT_RL_SCRATCH": str(tmp_path / node),
               "OMP_NUM_THREADS": "1"}
        env.pop("DAGSTER_PIPES_CONTEXT", None)
        return stage_command(sys.executable, "sft", 2, port=_free_port()), env

    command, env = pod("node-a")
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while store.latest_checkpoint(key) is None:
            assert first.poll() is None, f"the first pod ended before a checkpoint was uploaded:\n{first.stderr.read()}"
            assert time.monotonic() < deadline, "no checkpoint uploaded in 10 minutes"
            time.sleep(0.2)
    finally:  # the node goes away: every process of the pod dies at once
        for pid in [first.pid, *_descendants(first.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        first.wait()
    saved = int(store.latest_checkpoint(key)["name"].split("-")[1])
    assert saved < 40, "the first pod was stopped before it finished"

    command, env = pod("node-b")
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    first_failure = next((line for line in second.stderr.splitlines() if "Error: " in line), "")
    assert second.returncode == 0, f"{first_failure}\n{second.stderr[-3000:]}"
    reported = json.loads(second.stdout.strip().splitlines()[-1])
    assert reported["resumed_from"] == f"checkpoint-{saved}"
    assert reported["steps"] == 40 and len(reported["losses"]) == 40 - saved
    assert "rank 1 of 2 trains alongside rank 0" in second.stderr
    assert store.latest_checkpoint(key) is None, "a finished stage leaves no checkpoint to resume"

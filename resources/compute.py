"""Where training runs: in the Dagster process (tests), a Pipes subprocess (default), or a Kubernetes pod.

All three run the same entry point, `python -m agent_rl.train STAGE`; GPU, bf16, vLLM and multi-GPU settings are
part of the training config, not of this resource. A pod shares nothing with this machine: its config travels in
its environment and its files through `stage_store_url` (agent_rl/train/stage_store.py); a subprocess uses the
store too when the URL is set.
"""


import json
import os
import re
import signal
import sys
import tempfile
from enum import StrEnum
from typing import Any

import dagster as dg
from pydantic import ConfigDict, Field, field_validator, model_validator

from agent_rl.train.stage_store import CONFIG_ENV, SCRATCH_ENV, StagedConfig, check_pod_can_track, check_store_url

SCRATCH_MOUNT = "/scratch"  # the pod's emptyDir for downloaded inputs and the output before upload


class ComputeMode(StrEnum):
    IN_PROCESS = "in_process"
    SUBPROCESS = "subprocess"
    KUBERNETES = "kubernetes"


class TrainingCompute(dg.ConfigurableResource):
    # A refused stage_store_url may carry credentials: errors name the field and the problem, never the value.
    model_config = ConfigDict(hide_input_in_errors=True)

    mode: ComputeMode = Field(default=ComputeMode.SUBPROCESS)
    omp_num_threads: int = Field(default=1, ge=1, description="CPU threads for torch; 1 on a busy 2-core machine")
    stage_store_url: str = Field(default="", description="fsspec URL both this machine and the training process "
                                 "reach (s3://bucket/agent-rl, gs://..., file:///shared/volume); stage inputs and "
                                 "outputs travel through it. Required in kubernetes mode; credentials come from the "
                                 "environment, never the URL")
    processes: int = Field(default=1, ge=1, description="training processes per stage, one per GPU (data parallel); "
                           "> 1 runs the stage under `accelerate launch --num_processes N`")
    k8s_image: str = Field(default="", description="image with this project installed (kubernetes mode)")
    k8s_python: str = Field(default="python", description="the image's Python, on its PATH or as a path in the image")
    k8s_namespace: str = Field(default="default")
    k8s_gpu_count: int = Field(default=1, ge=0, description="nvidia.com/gpu per training pod")
    k8s_model_path: str = Field(default="", description="the base model's path (or hub name) inside the image; "
                                "empty: this machine's copy travels through the store")
    k8s_env_secret: str = Field(default="", description="a Kubernetes Secret whose keys become the pod's environment "
                                "(the store's credentials, e.g. AWS_ACCESS_KEY_ID)")

    @field_validator("stage_store_url")
    @classmethod
    def _store_url(cls, value: str) -> str:
        return check_store_url(value) if value.strip() else ""

    @model_validator(mode="after")
    def _consistent(self) -> "TrainingCompute":
        if self.mode == ComputeMode.KUBERNETES and not self.stage_store_url:
            raise ValueError("compute mode 'kubernetes' needs stage_store_url: a pod cannot read this machine's "
                             "files, so its inputs and outputs travel through a store both reach (s3://, gs://, "
                             "file:///shared/volume)")
        if self.processes > 1 and self.mode == ComputeMode.IN_PROCESS:
            raise ValueError(f"processes = {self.processes} needs mode 'subprocess' or 'kubernetes' (accelerate "
                             "launch starts them); in_process runs one")
        if self.mode == ComputeMode.KUBERNETES and 0 < self.k8s_gpu_count < self.processes:
            raise ValueError(f"processes = {self.processes} exceeds k8s_gpu_count = {self.k8s_gpu_count}: one "
                             "training process per GPU")
        return self

    def run(self, context: dg.AssetExecutionContext, stage: str, config: dict[str, Any]) -> dict[str, Any]:
        """Run one training stage and return its result dict (paths on this machine, steps, metrics)."""
        if self.mode == ComputeMode.IN_PROCESS:
            from agent_rl.train.__main__ import run_stage

            return run_stage(stage, config)
        if self.mode == ComputeMode.KUBERNETES and not self.k8s_image:
            raise ValueError("compute mode 'kubernetes' needs k8s_image (an image with agent-rl installed)")
        if not self.stage_store_url:  # a subprocess on this machine reads the config from a file
            return self._subprocess_with_file(context, stage, config)
        in_pod = self.mode == ComputeMode.KUBERNETES
        if in_pod:
            check_pod_can_track(config)
        pod_values = {"model_path": self.k8s_model_path} if in_pod and self.k8s_model_path else None
        staged = StagedConfig.prepare(stage, config, self.stage_store_url, pod_values=pod_values)
        command = stage_command(self.k8s_python, stage, self.processes) if in_pod else self._local_command(stage)
        env = {CONFIG_ENV: staged.env_value, "OMP_NUM_THREADS": str(self.omp_num_threads)}
        if in_pod:
            invocation = self._pod(context, command, env)
        else:
            invocation = _subprocess(context, stage, command, {**os.environ, **env})
        return staged.bring_back(_result(invocation, stage))

    def _subprocess_with_file(self, context: dg.AssetExecutionContext, stage: str,
                              config: dict[str, Any]) -> dict[str, Any]:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
            json.dump(config, handle)
            config_path = handle.name
        try:
            command = [*self._local_command(stage), "--config", config_path]
            env = {**os.environ, "OMP_NUM_THREADS": str(self.omp_num_threads)}
            return _result(_subprocess(context, stage, command, env), stage)
        finally:
            os.unlink(config_path)

    def _local_command(self, stage: str) -> list[str]:
        """This machine's interpreter; several processes rendezvous on a free port (another stage may run)."""
        return stage_command(sys.executable, stage, self.processes, port=_free_port() if self.processes > 1 else None)

    def _pod(self, context: dg.AssetExecutionContext, command: list[str], env: dict[str, str]):
        try:
            from dagster_k8s import PipesK8sClient
        except ImportError as exc:
            raise RuntimeError("compute mode 'kubernetes' needs `pip install dagster-k8s`") from exc
        spec = pod_spec(self.k8s_image, command, env, gpus=self.k8s_gpu_count, env_secret=self.k8s_env_secret)
        return PipesK8sClient().run(context=context, namespace=self.k8s_namespace, base_pod_spec=spec)


def stage_command(python: str, stage: str, processes: int = 1, port: int | None = None) -> list[str]:
    """The entry point as the training process runs it (its config arrives in CONFIG_ENV or after --config);
    several processes: under `accelerate launch` (torchrun: NCCL on GPUs, gloo on CPUs), rank 0 reports."""
    if processes <= 1:
        return [python, "-m", "agent_rl.train", stage]
    launch = [python, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    # Training settings choose bf16 / fp16 themselves; `no` only keeps accelerate from guessing.
    return [*launch, *(["--main_process_port", str(port)] if port else []), "-m", "agent_rl.train", stage]


def _free_port() -> int:
    """A free local port for the processes' rendezvous: two stages on one machine must not share torchrun's default."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pod_spec(image: str, command: list[str], env: dict[str, str], gpus: int = 0, env_secret: str = "") -> dict:
    """The training pod: one container of `image` running `command`, its config and store in `env`, `gpus`
    nvidia.com/gpu, a scratch volume for the downloaded inputs, the store's credentials from `env_secret`."""
    container: dict[str, Any] = {
        "name": "train", "image": image, "command": command,
        "env": [{"name": k, "value": v} for k, v in {**env, SCRATCH_ENV: SCRATCH_MOUNT}.items()],
        "volume_mounts": [{"name": "scratch", "mount_path": SCRATCH_MOUNT}],
        "resources": {"limits": {"nvidia.com/gpu": gpus}} if gpus else {},
    }
    if env_secret:
        container["env_from"] = [{"secret_ref": {"name": env_secret}}]
    return {"containers": [container], "volumes": [{"name": "scratch", "empty_dir": {}}], "restart_policy": "Never"}


KILLED_RETRIES = 1  # a stage killed by a signal runs once more, from its last checkpoint


class StageKilled(RuntimeError):
    """The training process ended by a signal (the out-of-memory killer, an eviction), not by an error of its own."""


def _subprocess(context: dg.AssetExecutionContext, stage: str, command: list[str], env: dict[str, str]):
    """Run the stage as a Pipes subprocess. One killed by a signal is retried once (the step is up for retry and
    resumes from the stage's last checkpoint, agent_rl/train/sft.py): the kill says nothing about the inputs. A
    stage that failed on its own (a Python error, a bad config) is not: the same inputs would fail the same way."""
    try:
        return dg.PipesSubprocessClient().run(command=command, context=context, env=env)
    except Exception as error:
        code = _exit_code(error)
        if code is None or code >= 0:
            raise
        reason = killed_reason(stage, -code)
        context.log.warning(f"{reason}; retried once from its last checkpoint")
        raise dg.RetryRequested(max_retries=KILLED_RETRIES, seconds_to_wait=1) from StageKilled(reason)


def _exit_code(error: Exception) -> int | None:
    """The exit status in Dagster's Pipes error ("External execution process failed with code -9"), else None."""
    if type(error).__name__ != "DagsterPipesExecutionError":
        return None
    match = re.search(r"failed with code (-?\d+)", str(error))
    return int(match.group(1)) if match else None


def killed_reason(stage: str, signum: int) -> str:
    """What a user reads when the training process was killed: which signal, and its usual cause."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    why = {"SIGKILL": ": on Linux most often the kernel's out-of-memory killer (see `dmesg`), or a process "
                      "manager's hard stop",
           "SIGTERM": ": something outside the run stopped it"}.get(name, "")
    return f"training stage {stage!r} was killed by {name}{why}"


def _result(invocation, stage: str) -> dict[str, Any]:
    """The stage's result: its materialization's metadata as plain values."""
    results = invocation.get_results()
    materialization = next((r for r in results if isinstance(r, dg.MaterializeResult)), None)
    if materialization is None or not materialization.metadata:
        raise RuntimeError(f"training stage {stage!r} reported no result")
    return {key: getattr(value, "value", value) for key, value in materialization.metadata.items()}

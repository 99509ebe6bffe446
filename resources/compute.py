"""Where training runs: in the Dagster process (tests), a Pipes subprocess (default), or a Kubernetes pod.

All three run the same entry point, `python -m agent_rl.train STAGE --config FILE`; GPU, bf16, vLLM
and multi-GPU settings are part of the training config, not of this resource.
"""


import json
import os
import sys
import tempfile
from enum import StrEnum
from typing import Any

import dagster as dg
from pydantic import Field


class ComputeMode(StrEnum):
    IN_PROCESS = "in_process"
    SUBPROCESS = "subprocess"
    KUBERNETES = "kubernetes"


class TrainingCompute(dg.ConfigurableResource):
    mode: ComputeMode = Field(default=ComputeMode.SUBPROCESS)
    omp_num_threads: int = Field(default=1, ge=1, description="CPU threads for torch; 1 on a busy 2-core machine")
    k8s_image: str = Field(default="", description="image with this project installed (kubernetes mode)")
    k8s_namespace: str = Field(default="default")
    k8s_gpu_count: int = Field(default=1, ge=0, description="nvidia.com/gpu per training pod")

    def run(self, context: dg.AssetExecutionContext, stage: str, config: dict[str, Any]) -> dict[str, Any]:
        """Run one training stage and return its result dict (paths, steps, metrics)."""
        if self.mode == ComputeMode.IN_PROCESS:
            from agent_rl.train.__main__ import run_stage

            return run_stage(stage, config)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
            json.dump(config, handle)
            config_path = handle.name
        command = [sys.executable, "-m", "agent_rl.train", stage, "--config", config_path]
        if self.mode == ComputeMode.SUBPROCESS:
            env = {**os.environ, "OMP_NUM_THREADS": str(self.omp_num_threads)}
            invocation = dg.PipesSubprocessClient().run(command=command, context=context, env=env)
        else:
            try:
                from dagster_k8s import PipesK8sClient
            except ImportError as exc:
                raise RuntimeError("compute mode 'kubernetes' needs `pip install dagster-k8s`") from exc
            if not self.k8s_image:
                raise ValueError("compute mode 'kubernetes' needs k8s_image (an image with agent-rl installed)")
            pod_spec = {"containers": [{
                "name": "train", "image": self.k8s_image, "command": command,
                "resources": {"limits": {"nvidia.com/gpu": self.k8s_gpu_count}} if self.k8s_gpu_count else {},
            }]}
            invocation = PipesK8sClient().run(context=context, namespace=self.k8s_namespace, base_pod_spec=pod_spec)
        results = invocation.get_results()
        materialization = next((r for r in results if isinstance(r, dg.MaterializeResult)), None)
        if materialization is None or not materialization.metadata:
            raise RuntimeError(f"training stage {stage!r} reported no result")
        return {key: getattr(value, "value", value) for key, value in materialization.metadata.items()}

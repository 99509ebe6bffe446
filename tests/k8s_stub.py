"""A stand-in for `dagster_k8s.PipesK8sClient`: dagster-k8s is not installed here and no cluster can run on these
machines, so tests put this in `sys.modules["dagster_k8s"]`, record the pod the resource asks for, and play it.

    calls = install(monkeypatch, play)   # play(context, base_pod_spec) -> an invocation with get_results()
    ...                                   # calls[i]: the keyword arguments of each PipesK8sClient().run(...)

`run_container` plays a pod for real: the first container's command, as given (`python` found on PATH, as in the
image), in another working directory, with only the container's environment, a fresh AGENT_RL_HOME, the Pipes
bootstrap variables (context in the environment, as PipesK8sClient injects it) and the pod's volume mounts
replaced by local folders. Nothing of the host's environment goes in but PATH to the interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path
from typing import Any


def install(monkeypatch, play) -> list[dict[str, Any]]:
    """Put a fake dagster_k8s module in place; returns the list its client records each run(...) call in."""
    calls: list[dict[str, Any]] = []

    class PipesK8sClient:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def run(self, *, context, extras=None, image=None, command=None, namespace=None, env=None,
                base_pod_meta=None, base_pod_spec=None, ignore_containers=None):
            calls.append({"context": context, "extras": extras, "image": image, "command": command,
                          "namespace": namespace, "env": env, "base_pod_spec": base_pod_spec})
            return play(context, base_pod_spec)

    module = types.ModuleType("dagster_k8s")
    module.PipesK8sClient = PipesK8sClient
    monkeypatch.setitem(sys.modules, "dagster_k8s", module)
    return calls


def container_env(spec: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in spec["containers"][0].get("env", [])}


def run_container(context, spec: dict[str, Any], root: Path, timeout: float = 600):
    """Run the pod's first container locally under a Pipes session; its invocation (get_results())."""
    import dagster as dg

    container = spec["containers"][0]
    volumes = {m["name"]: m["mount_path"] for m in container.get("volume_mounts", [])}
    for name in ("workdir", "home", *volumes):
        (root / name).mkdir(parents=True, exist_ok=True)
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(root / "home"),
           "AGENT_RL_HOME": str(root / "home" / "agent-rl")}
    for key, value in container_env(spec).items():
        mounted = next((name for name, path in volumes.items() if value == path), None)
        env[key] = str(root / mounted) if mounted else value  # a mounted volume: its local stand-in
    with dg.open_pipes_session(context=context, context_injector=dg.PipesEnvContextInjector(),
                               message_reader=dg.PipesTempFileMessageReader()) as session:
        process = subprocess.run(container["command"], cwd=root / "workdir", timeout=timeout,
                                 env={**env, **session.get_bootstrap_env_vars()}, capture_output=True, text=True)
        sys.stdout.write(process.stdout)  # the pod's logs, forwarded as PipesK8sClient does
        sys.stderr.write(process.stderr)
        if process.returncode:
            raise AssertionError(f"the pod failed ({process.returncode}):\n{process.stderr[-4000:]}")
    return dg.PipesClientCompletedInvocation(session)

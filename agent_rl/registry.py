"""The model registry on MLflow: a candidate is registered as its LoRA adapters plus a reference to its base.

Why not `mlflow.transformers`: logging a PeftModel through it corrupts the base weights on reload
(docs/architecture.md), and a 135M base copied per version wastes space; adapters are a few MB. A version's
artifacts are `model/adapters/00, 01, ...` (applied in order: SFT, then GRPO) and
`model/agent_rl_model.json` (base model spec and the adapter order). Aliases, not stages:
`champion`, `challenger`, `previous_champion`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

from agent_rl import settings



def model_name_for(environment: str) -> str:
    """The registered model of an environment's agent: one per environment, so an email model can never be
    promoted for support traffic (`agent-rl-email`, `agent-rl-support`, ...). A plug-in given by import path is
    named after the `name` it declares (`examples.timetable:TimetableEnvironment` -> `agent-rl-timetable`); a run
    on several environments after all of them, in order (`agent-rl-support-timetable`)."""
    from agent_rl.environments.registry import setting_names

    names = [_declared_name(part) for part in setting_names(environment)] or ["email"]
    return "agent-rl-" + re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(names))


def _declared_name(setting: str) -> str:
    if ":" not in setting:
        return setting  # a built-in, an installed plug-in's entry point or 'gateway': already a name
    from agent_rl.environments.registry import load_environment, resolve

    try:
        declared = getattr(resolve(setting), "name", None)  # a class says its name without being built
        return declared if isinstance(declared, str) and declared else load_environment(setting).name
    except Exception:  # noqa: BLE001 - not loadable here: the run that uses it fails on it, named, elsewhere
        return setting


# The environment this process serves (AGENT_RL_ENV, as the demo, `make ui` and the arbiter set it).
MODEL_NAME = model_name_for(os.environ.get("AGENT_RL_ENV") or "email")
MODEL_MANIFEST = "agent_rl_model.json"
ALIASES = ("champion", "challenger", "previous_champion")


@dataclass
class RegisteredVersion:
    name: str
    version: str
    run_id: str
    aliases: list[str]
    tags: dict[str, str]


def _client(tracking_uri: str | None = None):
    import mlflow
    from mlflow import MlflowClient

    uri = tracking_uri or settings.mlflow_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


class RegistrationOptions(TypedDict, total=False):
    """The keywords every `register_*` takes, whatever the version holds (adapters or a policy spec): both are
    registered the same way by `_register`, which holds their defaults (in brackets)."""

    metrics: dict[str, float] | None  # logged on the run and tagged `metric.<key>` on the version [none]
    tags: dict[str, str] | None  # the run's and the version's tags [none]
    alias: str | None  # set to the new version; None sets none ["challenger"]
    name: str  # the registered model [MODEL_NAME]
    experiment: str  # the MLflow experiment of the registering run ["agent-rl"]
    tracking_uri: str | None  # [settings.mlflow_uri()]


def register_candidate(
    adapters: list[str | Path], base_model: str, **options: Unpack[RegistrationOptions]
) -> RegisteredVersion:
    """Log the adapter stack as a run's artifacts, create a registry version from it, tag it and set `alias`."""
    dirs = [Path(a) for a in adapters]
    if not dirs:
        raise ValueError("register_candidate needs at least one adapter directory")
    for directory in dirs:
        if not (directory / "adapter_config.json").is_file():
            raise FileNotFoundError(f"adapter {str(directory)!r} is not a PEFT adapter directory (no adapter_config.json)")

    def stage(staged: Path) -> dict[str, Any]:
        names = []
        for index, directory in enumerate(dirs):
            names.append(f"adapters/{index:02d}")
            shutil.copytree(directory, staged / names[-1],
                            ignore=shutil.ignore_patterns("checkpoint-*", "optimizer.pt"))
        return {"base_model": base_model, "adapters": names}

    return _register(stage, **options)


def register_policy_spec(spec: str, **options: Unpack[RegistrationOptions]) -> RegisteredVersion:
    """Register a policy that is configuration, not weights (a prompted API model, a rule-based policy)."""
    if not spec or not isinstance(spec, str):
        raise ValueError("policy spec must be a non-empty string, e.g. 'heuristic' or 'http:{...}'")
    return _register(lambda staged: {"policy_spec": spec}, **options)


def experiment_id(client, name: str, tracking_uri: str | None = None) -> str:
    """The experiment's id, created with its artifacts under AGENT_RL_HOME when the store is local."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=settings.mlflow_artifact_location(tracking_uri))
    except Exception:  # created by another process in between
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _register(
    stage: Callable[[Path], dict[str, Any]],
    *,
    metrics: dict[str, float] | None = None,
    tags: dict[str, str] | None = None,
    alias: str | None = "challenger",
    name: str = MODEL_NAME,
    experiment: str = "agent-rl",
    tracking_uri: str | None = None,
) -> RegisteredVersion:
    client = _client(tracking_uri)
    tags = {k: str(v) for k, v in (tags or {}).items()}
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "model"
        staged.mkdir()
        manifest = stage(staged)
        (staged / MODEL_MANIFEST).write_text(json.dumps(manifest))
        run = client.create_run(experiment_id(client, experiment, tracking_uri), run_name=f"register-{name}", tags=tags)
        run_id = run.info.run_id
        for key, value in (metrics or {}).items():
            client.log_metric(run_id, key, float(value))
        client.log_artifacts(run_id, str(staged), artifact_path="model")
        client.set_terminated(run_id)
    try:
        client.get_registered_model(name)
    except Exception:
        client.create_registered_model(name, description="agent-rl email agent (LoRA adapters + base reference)")
    version = client.create_model_version(name, source=f"runs:/{run_id}/model", run_id=run_id, tags=tags)
    for key, value in (metrics or {}).items():
        client.set_model_version_tag(name, version.version, f"metric.{key}", f"{float(value):.6g}")
    if alias:
        client.set_registered_model_alias(name, alias, version.version)
    return get_version(name=name, version=version.version, tracking_uri=tracking_uri)


def get_version(
    alias: str | None = None, *, version: str | None = None, name: str = MODEL_NAME, tracking_uri: str | None = None
) -> RegisteredVersion:
    """A version by alias or number; raises LookupError naming the alias when it is not set."""
    client = _client(tracking_uri)
    try:
        mv = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, version)
    except Exception as exc:
        raise LookupError(f"model {name!r} has no {'alias ' + repr(alias) if alias else 'version ' + str(version)}") from exc
    return RegisteredVersion(name, str(mv.version), mv.run_id, list(mv.aliases or []), dict(mv.tags or {}))


def set_alias(alias: str, version: str, name: str = MODEL_NAME, tracking_uri: str | None = None) -> None:
    _client(tracking_uri).set_registered_model_alias(name, alias, version)


def delete_alias(alias: str, name: str = MODEL_NAME, tracking_uri: str | None = None) -> None:
    client = _client(tracking_uri)
    try:
        client.delete_registered_model_alias(name, alias)
    except Exception:  # deleting an alias that is not set is not an error for our callers
        pass


def tag_version(version: str, tags: dict[str, Any], name: str = MODEL_NAME, tracking_uri: str | None = None) -> None:
    client = _client(tracking_uri)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, str(value))


def download_version(
    alias: str | None = None, *, version: str | None = None, name: str = MODEL_NAME, tracking_uri: str | None = None
) -> tuple[Path, dict[str, Any]]:
    """Local directory of a registered version (cached by version) and its manifest."""
    import mlflow

    found = get_version(alias, version=version, name=name, tracking_uri=tracking_uri)
    target = settings.models_dir() / "registry" / name / found.version
    manifest = target / "model" / MODEL_MANIFEST
    if not manifest.exists():
        tmp = Path(tempfile.mkdtemp(dir=settings.models_dir()))
        mlflow.artifacts.download_artifacts(run_id=found.run_id, artifact_path="model", dst_path=str(tmp))
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(target)  # whole or nothing: a half download never looks like a version
    return target / "model", json.loads(manifest.read_text())

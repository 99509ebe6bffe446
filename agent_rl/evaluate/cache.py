"""Held-out results of a model already evaluated on the same tasks, reused instead of played again.

Why: once production runs a model of ours, each week's incumbent is a model the loop evaluated before (v0 when it
was made, last week's candidate), and playing its held-out episodes again costs as much as evaluating a candidate
(minutes per model on a CPU). A result is reused only when everything that decides it is the same: the weights
(base model and adapter files, in order), every file of the held-out world and the evaluation settings; greedy
decoding then plays the same episodes. Any difference is another key, so a stale result is never read.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from agent_rl.evaluate.metrics import EvalMetrics
from agent_rl.records import Episode

WEIGHT_FILES = ("adapter_config.json", "adapter_model.safetensors")


def weights_fingerprint(base_model: str, adapters: list[str | Path]) -> str | None:
    """One hash over what a stacked model computes with; None when an adapter lacks its weight files."""
    digest = hashlib.sha256(f"base:{base_model}".encode())
    for adapter in adapters:
        for name in WEIGHT_FILES:
            path = Path(adapter) / name
            if not path.is_file():
                return None
            digest.update(name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def registered_fingerprint(spec: str, model_name: str, tracking_uri: str | None = None) -> str | None:
    """The weights fingerprint of a registered version routed as `mlflow:vN`; None for anything else (an API
    model, a rule-based agent, a configured policy): those are played every time."""
    from agent_rl import registry
    from agent_rl.ab.controller import is_registered_version

    ref = spec.removeprefix("mlflow:")
    if not spec.startswith("mlflow:") or not is_registered_version(ref):
        return None
    try:
        path, manifest = registry.download_version(version=ref[1:], name=model_name, tracking_uri=tracking_uri)
    except LookupError:
        return None
    if "adapters" not in manifest:
        return None
    return weights_fingerprint(manifest["base_model"], [path / a for a in manifest["adapters"]])


def inputs_fingerprint(folder: Path, settings: str) -> str:
    """One hash over every file of the held-out world (names and bytes) and the evaluation settings."""
    digest = hashlib.sha256(settings.encode())
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


class EvaluationCache:
    """Results by (weights, inputs) key under `folder`, one JSON file each, written whole or not at all."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def _path(self, weights: str, inputs: str) -> Path:
        return self.folder / f"{weights[:24]}-{inputs[:24]}.json"

    def _read(self, weights: str, inputs: str) -> dict | None:
        """The entry written for exactly these keys (None: none, unreadable, or another key's under the same name)."""
        try:
            data = json.loads(self._path(weights, inputs).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("weights") != weights or data.get("inputs") != inputs:
            return None
        return data

    def get(self, weights: str, inputs: str) -> tuple[EvalMetrics, list[Episode], float | None] | None:
        data = self._read(weights, inputs)
        if data is None:
            return None
        try:
            return (EvalMetrics.model_validate(data["metrics"]),
                    [Episode.model_validate(e) for e in data["episodes"]], data.get("probe"))
        except (ValueError, KeyError, TypeError):
            return None  # unreadable: evaluate again (and overwrite it)

    def put(self, weights: str, inputs: str, metrics: EvalMetrics, episodes: list[Episode],
            probe: float | None) -> None:
        self._write(weights, inputs, {"metrics": metrics.model_dump(mode="json"),
                                      "episodes": [e.model_dump(mode="json") for e in episodes], "probe": probe})

    def get_probe(self, weights: str, inputs: str) -> float | None:
        """The forgetting probe of a model measured on the same probe items before (the base model: every week
        compares with it, and loading it on the engine costs a start-up of its own); None when not recorded."""
        data = self._read(weights, "probe-" + inputs)
        probe = data.get("probe") if data is not None else None
        return float(probe) if isinstance(probe, (int, float)) and not isinstance(probe, bool) else None

    def put_probe(self, weights: str, inputs: str, probe: float) -> None:
        self._write(weights, "probe-" + inputs, {"probe": probe})

    def _write(self, weights: str, inputs: str, fields: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump({"weights": weights, "inputs": inputs, **fields}, out)
        os.replace(tmp, self._path(weights, inputs))

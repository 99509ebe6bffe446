"""What each stage of the loop hands the next: one typed handle per asset, naming the files it writes.

Every partitioned stage writes under `$AGENT_RL_HOME/artifacts/<asset>/<partition>/` (`settings.artifact_dir`). A
handle is built from the partition alone (`SftDataset(partition).rows`); the asset that writes a file writes it
through its handle and every stage that reads it reads through the same handle, so each file name is spelled here
and nowhere else in the code location (tests/test_stage_handles.py holds the assets to that). Names that the library
owns come from the library that writes or reads them: the trainers' adapter folder, manifest and rollouts
(`agent_rl/train/outputs.py`), the saved anonymized worlds and their tasks (`agent_rl/environments/worlds.py`), the
A/B test's copy of the week's labeler (`agent_rl/feedback/frozen.py`).

Asking a handle for a path creates the stage's folder, as `settings.artifact_dir` always has; files are created
only by whoever writes them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from agent_rl import settings
from agent_rl.environments import worlds
from agent_rl.feedback.frozen import WEEK_STAGE
from agent_rl.train.outputs import ADAPTER_DIR, MANIFEST, ROLLOUTS_FILE


def stage_dir(stage: str, partition: str | None = None) -> Path:
    """A stage's folder for a partition (`artifacts/<stage>/<partition>/`; `all` for an unpartitioned stage)."""
    return settings.artifact_dir(stage, partition)


@dataclass(frozen=True)
class _Stage:
    """A partition's folder of one asset; subclasses name the files in it."""

    partition: str
    STAGE: ClassVar[str]

    @property
    def folder(self) -> Path:
        return stage_dir(self.STAGE, self.partition)


# -- pool and curation ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PoolExport(_Stage):
    """`pool_episodes` hands curation the week's episodes of the run's environments, in cursor order."""

    STAGE: ClassVar[str] = "pool_episodes"

    @property
    def episodes(self) -> Path:
        return self.folder / "episodes.jsonl"


@dataclass(frozen=True)
class ValidatedEpisodes(_Stage):
    """`validated_episodes` hands anonymization the clean episodes, and its gate checks the report (GX results,
    counts, the labeler's and the tenant check's reports). It also keeps the week's labeler for the A/B test of the
    challenger this week trains, where the A/B controller looks for it (`labeler_copy`)."""

    STAGE: ClassVar[str] = "validated_episodes"

    @property
    def episodes(self) -> Path:
        return self.folder / "episodes.jsonl"

    @property
    def report(self) -> Path:
        return self.folder / "report.json"

    @property
    def labeler_copy(self) -> Path:
        """`artifacts/ab_labeler/<week>/`: a folder of its own, which `agent_rl.feedback.frozen` reads."""
        return stage_dir(WEEK_STAGE, self.partition)


@dataclass(frozen=True)
class AnonymizedEpisodes(_Stage):
    """`anonymized_episodes` hands balancing the pseudonymized episodes, and its privacy check the auditor's report
    (entities, leaks, masked leak examples)."""

    STAGE: ClassVar[str] = "anonymized_episodes"

    @property
    def episodes(self) -> Path:
        return self.folder / "episodes.jsonl"

    @property
    def privacy_report(self) -> Path:
        return self.folder / "privacy.json"


@dataclass(frozen=True)
class AnonymizedEnvironment(_Stage):
    """`anonymized_environment` hands GRPO's rows, GRPO and validation the world under the episodes' pseudonyms:
    the folder itself (an environment's own privacy pass writes its store there; `worlds.reopen` reads either kind),
    the plug-ins' saved worlds and tasks, or, for users' traffic with no world, the episodes rated good that
    validation replays."""

    STAGE: ClassVar[str] = "anonymized_environment"

    @property
    def tasks(self) -> Path:
        return self.folder / worlds.TASKS_FILE

    @property
    def held_out(self) -> Path:
        return self.folder / "held_out.jsonl"

    def world(self, name: str) -> Path:
        """Where plug-in `name`'s anonymized world is saved."""
        return worlds.saved_path(self.folder, name)


@dataclass(frozen=True)
class BalancedEpisodes(_Stage):
    """`balanced_episodes` hands the SFT dataset the anonymized episodes, each task category capped and weighted."""

    STAGE: ClassVar[str] = "balanced_episodes"

    @property
    def episodes(self) -> Path:
        return self.folder / "episodes.jsonl"


@dataclass(frozen=True)
class SftDataset(_Stage):
    """`sft_dataset` hands SFT its chat rows (JSONL; empty when a run allows no SFT)."""

    STAGE: ClassVar[str] = "sft_dataset"

    @property
    def rows(self) -> Path:
        return self.folder / "train.jsonl"


@dataclass(frozen=True)
class GrpoDataset(_Stage):
    """`grpo_dataset` hands GRPO its prompts with what the reward needs (JSONL; empty with no world to roll out in)."""

    STAGE: ClassVar[str] = "grpo_dataset"

    @property
    def rows(self) -> Path:
        return self.folder / "train.jsonl"


# -- training -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _TrainedAdapter(_Stage):
    """A training stage's folder is the trainer's `out_dir`: the adapter, its manifest and checkpoints are the
    trainer's names."""

    @property
    def adapter(self) -> Path:
        return self.folder / ADAPTER_DIR

    @property
    def manifest(self) -> Path:
        return self.adapter / MANIFEST

    def adapters(self) -> list:
        """The adapters to apply on the base model, in order, as the trainer recorded them in the manifest."""
        return json.loads(self.manifest.read_text())["adapters"]

    def checkpoints(self) -> list[Path]:
        """The trainer's checkpoint folders left in the stage's folder (`checkpoint-<step>`)."""
        return sorted(self.folder.glob("checkpoint-*"))


@dataclass(frozen=True)
class SftAdapter(_TrainedAdapter):
    """`sft_adapter` hands GRPO and validation the SFT adapter (its manifest: the base model and the stack), and the
    registry what SFT continued (`started_from`: {"version", "description"})."""

    STAGE: ClassVar[str] = "sft_adapter"

    @property
    def started_from(self) -> Path:
        return self.folder / "started_from.json"

    def lineage(self) -> dict:
        """What the partition's SFT continued: {"version": "v3" or None, "description": ...}."""
        path = self.started_from
        return json.loads(path.read_text()) if path.exists() else {"version": None, "description": "unknown"}


@dataclass(frozen=True)
class GrpoAdapter(_TrainedAdapter):
    """`grpo_adapter` hands validation the adapters of SFT + GRPO (GRPO either kept training the SFT adapter, beta = 0:
    one adapter, or trained a fresh one on the merged SFT model, beta > 0: two), the rollouts the reward-hacking
    detectors judge and their findings, or a marker saying why GRPO did not run."""

    STAGE: ClassVar[str] = "grpo_adapter"

    @property
    def rollouts(self) -> Path:
        return self.folder / ROLLOUTS_FILE

    @property
    def skipped(self) -> Path:
        return self.folder / "skipped.json"

    @property
    def hacking(self) -> Path:
        return self.folder / "hacking.json"

    def skip_reason(self) -> str | None:
        """Why GRPO did not run for this partition (None: it ran)."""
        path = self.skipped
        return json.loads(path.read_text())["reason"] if path.exists() else None


# -- validation and monitoring --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EvaluationReport(_Stage):
    """`evaluation_report` hands its gate checks, the registration and whoever reads a run's outcome the report
    (every model's metrics, the candidate and why, the gates); the folder also holds each evaluated model's episodes
    as played (`agent_rl.evaluate.validation` names them) and the comparison chart."""

    STAGE: ClassVar[str] = "evaluation_report"

    @property
    def report(self) -> Path:
        return self.folder / "report.json"

    @property
    def chart(self) -> Path:
        return self.folder / "comparison.png"

    @property
    def cache(self) -> Path:
        """Results of models evaluated before, shared by every partition (`artifacts/evaluation_cache/all/`)."""
        return stage_dir("evaluation_cache")

    def read(self) -> dict:
        return json.loads(self.report.read_text())


@dataclass(frozen=True)
class LoopHealth:
    """`loop_health` (not partitioned) hands whoever watches the loop its run-level metrics and their plot."""

    STAGE: ClassVar[str] = "loop_health"

    @property
    def folder(self) -> Path:
        return stage_dir(self.STAGE)

    @property
    def report(self) -> Path:
        return self.folder / "loop_health.json"

    @property
    def chart(self) -> Path:
        return self.folder / "loop_health.png"

"""An OpenAI fine-tuning job as an environment: its files are the tasks, its grader is the judge.

A team leaving OpenAI's fine-tuning brings chat JSONL and, for reinforcement, a grader; the loop trains on the
environment this builds like on any plug-in (curation with its privacy gate, SFT, GRPO, validation, A/B). The
model answers in words, as it did at OpenAI: the reply is the sample the grader scores. A supervised job has no
grader of its own; its reply is scored against the row's target by fuzzy match (`SUPERVISED_GRADER`), so
validation and GRPO have a number where OpenAI reported only a loss.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from agent_rl.environments.core import (Capabilities, Environment, EnvironmentError, FinalAnswer, Grading, Judgement,
                                        Task, Trajectory, World)
from agent_rl.environments.openai_jobs.rows import JobFileError, JobRow, Method, read_rows
from agent_rl.graders import (
    AnyGrader,
    GraderContext,
    PythonSandboxConfig,
    grade,
    make_sample,
    parse_grader,
    validate,
)
from agent_rl.json_walk import rewrite_strings
from agent_rl.records import Outcome, Split

NAME = "openai_job"
JOB_DIR_ENV = "AGENT_RL_JOB_DIR"
PYTHON_GRADERS_ENV = "AGENT_RL_PYTHON_GRADERS"
JOB_FILE, TRAIN_FILE, VALIDATION_FILE = "job.json", "train.jsonl", "validation.jsonl"
DEFAULT_CATEGORY = "job"
HELD_OUT_EVERY = 10  # without a validation file, one row in ten (by id, so stable) is held out for validation
SUPERVISED_GRADER: dict[str, Any] = {
    "type": "text_similarity", "name": "matches the reference reply", "evaluation_metric": "fuzzy_match",
    "input": "{{ sample.output_text }}", "reference": "{{ item.reference_reply }}",
}
MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")


def _grader_score_as_quality(reward: float) -> float:
    """A job's demonstration quality is its grader's score, clamped to [0, 1]."""
    return max(0.0, min(1.0, reward))


class JobSession:
    """A job's episode offers no tools: the model replies in words and the reply is graded."""


class OpenAIJobEnvironment(Environment):
    """Tasks from a fine-tuning job's training and validation files, judged by its grader."""

    name: ClassVar[str] = NAME
    categories: tuple[str, ...] = (DEFAULT_CATEGORY,)
    capabilities: ClassVar[Capabilities] = Capabilities(answers_in_words=True)

    def __init__(self, job_dir: str | None = None, *, method: str | None = None,
                 train_rows: Sequence[JobRow] | None = None, validation_rows: Sequence[JobRow] | None = None,
                 grader: Mapping[str, Any] | None = None, pass_threshold: float = 0.5,
                 grader_context: GraderContext | None = None) -> None:
        """From a job folder (`job_dir`, else $AGENT_RL_JOB_DIR: job.json with `method` and `grader`, train.jsonl,
        validation.jsonl optional) or from rows given here. A reply scoring at least `pass_threshold` is correct."""
        # The operator allows python graders to the runner as to the API (AGENT_RL_PYTHON_GRADERS=1); off otherwise.
        self._context = grader_context or GraderContext(
            python=PythonSandboxConfig(enabled=os.environ.get(PYTHON_GRADERS_ENV) == "1"))
        self.pass_threshold = pass_threshold
        if train_rows is None:
            folder = job_dir or os.environ.get(JOB_DIR_ENV)
            if not folder:
                raise EnvironmentError(NAME, f"no job: pass job_dir or set {JOB_DIR_ENV} to a job folder")
            spec, train_rows, validation_rows = load_job(Path(folder))
            method, grader = spec["method"], spec.get("grader")
        self.method = Method(method or Method.SUPERVISED)
        if grader is None and self.method is Method.REINFORCEMENT:
            raise EnvironmentError(NAME, "a reinforcement job needs a grader")
        self.grader_json = dict(grader or SUPERVISED_GRADER)
        self.grader: AnyGrader = parse_grader(self.grader_json)
        self.train_rows, self.validation_rows = list(train_rows), list(validation_rows or [])
        if not self.train_rows:
            raise EnvironmentError(NAME, "the training file holds no rows")
        # Checked once against a real row: a template naming a field the rows lack fails here, not as silent zeros.
        validate(self.grader, self.train_rows[0].item, self._context)
        self.categories = tuple(dict.fromkeys(_category(r) for r in [*self.train_rows, *self.validation_rows]))
        self._tasks = self._split_tasks()

    def _split_tasks(self) -> dict[Split, list[Task]]:
        if self.validation_rows:
            held, kept = self.validation_rows, self.train_rows
        else:
            held = [r for r in self.train_rows if int(r.id[4:], 16) % HELD_OUT_EVERY == 0]
            if not held and len(self.train_rows) > 1:
                held = [min(self.train_rows, key=lambda r: r.id)]
            kept = [r for r in self.train_rows if r not in held]
        return {Split.TRAIN: [self._task(r, Split.TRAIN) for r in kept],
                Split.TEST: [self._task(r, Split.TEST) for r in held]}

    def _task(self, row: JobRow, split: Split) -> Task:
        # A reinforcement row's expected outcome is what its grader says of the reply (the item holds its fields).
        reference = row.reference if row.reference is not None else f"graded by {self.grader.name}"
        # OpenAI's "developer" is the system message of newer models; chat templates of ours know "system" only.
        prompt = [{k: ("system" if k == "role" and m[k] == "developer" else m[k]) for k in MESSAGE_FIELDS if k in m}
                  for m in row.prompt]
        return Task(id=row.id, environment=NAME, context=NAME, prompt=row.request, reference=reference,
                    category=_category(row), split=split, metadata={"messages": prompt, "item": row.item})

    # -- the contract ----------------------------------------------------------------------------

    def tasks(self, split: Split) -> list[Task]:
        return list(self._tasks.get(split, []))

    def open(self, task: Task) -> JobSession:
        return JobSession()

    def session_type(self) -> type:
        return JobSession

    def final_answer(self, session: Any) -> FinalAnswer | None:
        return None  # the reply in words is the answer (answers_in_words)

    def opening_messages(self, task: Task) -> list[dict[str, Any]]:
        """The row's own conversation up to the reply: its system and earlier turns, as OpenAI showed them."""
        return [dict(m) for m in task.metadata.get("messages") or []] or super().opening_messages(task)

    def judge(self, task: Task, session: Any, trajectory: Trajectory) -> Judgement:
        if trajectory.format_error:
            return Judgement(Outcome.FORMAT_ERROR, 0.0, {"grader": 0.0})
        if trajectory.answer is None:
            return Judgement(Outcome.RAN_OUT, 0.0, {"grader": 0.0})
        item = task.metadata.get("item")
        if task.reference is None or not isinstance(item, Mapping):
            return Judgement(Outcome.UNJUDGED)  # served traffic: no row to grade against
        result = grade(self.grader, make_sample(trajectory.answer.text), item, self._context)
        components = {"grader": result.score, **{f"grader.{k}": v for k, v in (result.sub_scores or {}).items()}}
        outcome = Outcome.CORRECT if result.score >= self.pass_threshold else Outcome.WRONG
        return Judgement(outcome, result.score, components)

    def grading(self) -> Grading:
        """The grader scores 0..1; a fuzzy score below the pass mark is no reward for the answer (the hacking
        detectors' threshold); SFT keeps the replies the grader scored at least min_quality."""
        return Grading(reward_range=(0.0, 1.0), rewarded_above=self.pass_threshold,
                       demonstration_quality=_grader_score_as_quality)

    def __getstate__(self) -> dict[str, Any]:
        """Curation saves the anonymized copy with pickle (environments/worlds.py): the grader context's clients and
        lock stay behind, its settings travel."""
        state = dict(self.__dict__)
        context = state.pop("_context")
        state["_context_settings"] = {"python": context.python, "chat_endpoint": context.chat_endpoint}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        settings = state.pop("_context_settings")
        self.__dict__.update(state)
        self._context = GraderContext(**settings)

    def world(self) -> JobWorld:
        """The job's rows: curation rewrites them with the episodes (JobWorld)."""
        return JobWorld(self)


class JobWorld(World):
    """An OpenAI job's world is its rows: prompts, references and grader items may name people, so curation's
    pseudonymizer rewrites them (`anonymized`) as it rewrites the episodes."""

    def __init__(self, environment: OpenAIJobEnvironment) -> None:
        super().__init__(environment)
        self.env = environment

    def anonymized(self, transform: Callable[[str], str]) -> OpenAIJobEnvironment:
        """A copy whose rows went through curation's pseudonymizer: the same one rewrites the episodes, so a graded
        reply still matches its anonymized reference."""
        def rows(values: list[JobRow]) -> list[JobRow]:
            return [dataclasses.replace(r, prompt=rewrite_strings(r.prompt, transform),
                                        reference=transform(r.reference) if r.reference is not None else None,
                                        item=rewrite_strings(r.item, transform)) for r in values]

        env = self.env
        return OpenAIJobEnvironment(method=env.method.value, train_rows=rows(env.train_rows),
                                    validation_rows=rows(env.validation_rows), grader=env.grader_json,
                                    pass_threshold=env.pass_threshold, grader_context=env._context)


def load_job(folder: Path) -> tuple[dict[str, Any], list[JobRow], list[JobRow]]:
    """A job folder's spec and rows; a missing or bad file is an EnvironmentError naming file and line."""
    try:
        spec = json.loads((folder / JOB_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EnvironmentError(NAME, f"{JOB_FILE} in the job folder cannot be read: {type(exc).__name__}") from None
    if not isinstance(spec, dict):
        raise EnvironmentError(NAME, f"{JOB_FILE} must hold a JSON object")
    try:
        method = Method(spec.get("method") or Method.SUPERVISED)
    except ValueError:
        raise EnvironmentError(NAME, f"{JOB_FILE}: method must be supervised or reinforcement") from None
    files = [TRAIN_FILE, VALIDATION_FILE]
    rows: list[list[JobRow]] = []
    for file in files:
        path = folder / file
        if file == VALIDATION_FILE and not path.exists():
            rows.append([])
            continue
        try:
            with path.open("rb") as lines:
                rows.append(read_rows(lines, method))
        except OSError as exc:
            raise EnvironmentError(NAME, f"{file} cannot be read: {type(exc).__name__}") from None
        except JobFileError as exc:
            raise EnvironmentError(NAME, f"{file}: {exc}") from None
    return {**spec, "method": method.value}, rows[0], rows[1]


def _category(row: JobRow) -> str:
    value = row.item.get("category")
    return value if isinstance(value, str) and value.strip() else DEFAULT_CATEGORY

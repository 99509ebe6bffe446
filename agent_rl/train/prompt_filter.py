"""Choose GRPO prompts the model sometimes solves: a group whose rollouts all score the same has zero advantage
and teaches nothing (docs/architecture.md: on CPU most groups had zero variance).

Solve rates come either from outside (e.g. the SFT evaluation, by task id) or from a quick sampled
pre-pass of the SFT model through the real episode runner, in the environment the rows belong to.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_rl.environments.core import Environment, Task
from agent_rl.records import Outcome
from agent_rl.train.config import PromptFilterSettings
from agent_rl.turn_budget import DEFAULT_MAX_TURNS, DEFAULT_TURN_TOKENS

log = logging.getLogger(__name__)


@dataclass
class FilterReport:
    mode: str
    candidates: int
    kept: int  # candidates whose solve rate passed
    solve_rates: dict[str, float] = field(default_factory=dict)
    fallback: bool = False  # nothing passed and keep_when_empty kept the unfiltered prompts
    seconds: float = 0.0
    unexamined: int = 0  # prompts beyond max_candidates, kept without a solve rate

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "candidates": self.candidates, "kept": self.kept, "fallback": self.fallback,
                "unexamined_kept": self.unexamined,
                "seconds": round(self.seconds, 2),
                "solve_rate_histogram": _histogram(self.solve_rates)}


def _histogram(rates: dict[str, float]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for rate in rates.values():
        counts[f"{rate:.2f}"] += 1
    return dict(sorted(counts.items()))


def row_task(row: dict[str, Any]) -> Task:
    """The task a GRPO row was made from (its `task` column, which every environment's rows carry), for the runner."""
    try:
        return Task.model_validate_json(row["task"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"GRPO row {row.get('task_id', '?')!r}: no readable task column ({type(exc).__name__}); "
                         "rows made by this release's curation carry one") from exc


def select_by_rates(rows: list[dict[str, Any]], rates: dict[str, float], settings: PromptFilterSettings) -> list[dict[str, Any]]:
    """Rows whose solve rate lies strictly between min_rate and max_rate; rows without a rate are left out."""
    return [row for row in rows if (rate := rates.get(str(row.get("task_id")))) is not None
            and settings.min_rate < rate < settings.max_rate]


def sampled_solve_rates(model_path: str | Path, adapter: str | Path | None, rows: list[dict[str, Any]],
                        environment: Environment, settings: PromptFilterSettings, max_turns: int,
                        max_new_tokens: int = DEFAULT_TURN_TOKENS, seed: int = 0) -> dict[str, float]:
    """Play every row `samples_per_prompt` times with the sampled SFT model in `environment`; share of correct
    episodes per row. No wall-clock budget: a solve rate measures the model, not how loaded the machine was."""
    from agent_rl.agent.local_policy import LocalPolicy
    from agent_rl.environments.runner import Play, RunnerConfig, play_episodes

    policy = LocalPolicy(model_path, adapter=adapter, temperature=settings.temperature, seed=seed, batch_size=16)
    tasks = [row_task(row) for row in rows for _ in range(settings.samples_per_prompt)]
    config = RunnerConfig(max_turns=max_turns, max_new_tokens=max_new_tokens, batch_size=16, timeout_s=None)
    episodes = play_episodes(policy, environment, [Play(task) for task in tasks], config)
    correct: dict[str, list[bool]] = defaultdict(list)
    for task, episode in zip(tasks, episodes):
        correct[task.id].append(episode.outcome == Outcome.CORRECT)
    return {sid: sum(flags) / len(flags) for sid, flags in correct.items()}


def filter_prompts(rows: list[dict[str, Any]], settings: PromptFilterSettings, *,
                   solve_rates: dict[str, float] | None = None, model_path: str | Path | None = None,
                   adapter: str | Path | None = None, environment: Environment | None = None,
                   max_turns: int = DEFAULT_MAX_TURNS, seed: int = 0) -> tuple[list[dict[str, Any]], FilterReport]:
    """The rows to train on and what the filter did; mode 'sampled' plays them in `environment`."""
    import time

    started = time.perf_counter()
    if settings.mode == "none":
        return rows, FilterReport("none", len(rows), len(rows))
    candidates = rows[: settings.max_candidates]
    if settings.mode == "solve_rates":
        if solve_rates is None:
            raise ValueError("prompt filter mode 'solve_rates' needs solve_rates (task id -> share solved)")
        rates = dict(solve_rates)
    else:
        if model_path is None or environment is None:
            raise ValueError("prompt filter mode 'sampled' needs the model and the environment to play in")
        rates = sampled_solve_rates(model_path, adapter, candidates, environment, settings, max_turns, seed=seed)
    passed = select_by_rates(candidates, rates, settings)
    # The filter drops only what it knows teaches nothing; prompts beyond the (cost-bounded) candidates were never
    # looked at and stay. Keeping only the survivors of 8 candidates once left GRPO 4 steps on a single question.
    unexamined = rows[settings.max_candidates:]
    report = FilterReport(settings.mode, len(candidates), len(passed), rates, unexamined=len(unexamined))
    kept = passed + unexamined
    if not kept and settings.keep_when_empty:
        log.warning("prompt filter: no prompt has a solve rate in (%s, %s); training on all %d candidates",
                    settings.min_rate, settings.max_rate, len(candidates))
        kept, report.fallback, report.kept = candidates, True, len(candidates)
    report.seconds = time.perf_counter() - started
    return kept, report

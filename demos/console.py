"""The demo's console: one line per stage for a person, the full Dagster log in a file.

Dagster's own console logger prints every event of a run (hundreds of DEBUG lines per week of the loop). The demo
runs its jobs with this logger instead: every record goes to the log file, and the console gets a step's start and
end, failed checks, training progress with an ETA, and the assets' own info lines.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from pathlib import Path
from typing import TextIO

import dagster as dg

TRAINING_STEP = re.compile(r"^step (\d+): (.*)$")
SHOWN_METRICS = ("loss", "reward", "reward_mean")


class ConsoleProgress(logging.Handler):
    """Turns Dagster log records into short progress lines; `max_steps` gives training ETAs per asset."""

    def __init__(self, out: TextIO, max_steps: dict[str, int]) -> None:
        super().__init__(logging.DEBUG)  # Dagster logs step events at DEBUG; messages are filtered in emit
        self.out = out
        self.max_steps = max_steps
        self.started: dict[str, float] = {}

    def _print(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            meta = getattr(record, "dagster_meta", None) or {}
            step = meta.get("step_key") or ""
            event = meta.get("dagster_event")
            message = str(meta.get("orig_message") or record.getMessage())
            if event is not None:
                self._event(step, event, message)
            elif record.levelno >= logging.INFO and step:
                self._message(step, message, record.levelno)
        except Exception:  # a progress line is never worth failing a run
            pass

    def _event(self, step: str, event, message: str) -> None:
        kind = event.event_type_value
        if kind == "STEP_START":
            self.started[step] = time.monotonic()
            self._print(f"  > {step}")
        elif kind == "STEP_SUCCESS":
            seconds = time.monotonic() - self.started.get(step, time.monotonic())
            self._print(f"  ok {step} ({seconds:.0f} s)")
        elif kind == "STEP_FAILURE":
            self._print(f"  FAILED {step}: {message[:300]}{_cause(event)}")
        elif kind == "STEP_UP_FOR_RETRY":
            self._print(f"  retrying {step}{_cause(event)}")
        elif kind == "ASSET_CHECK_EVALUATION":
            data = event.event_specific_data
            evaluation = getattr(data, "asset_check_evaluation", data)
            if evaluation is not None and not getattr(evaluation, "passed", True):
                self._print(f"  check failed: {evaluation.check_name}: {getattr(evaluation, 'description', '')}")

    def _message(self, step: str, message: str, level: int) -> None:
        match = TRAINING_STEP.match(message)
        if match:
            done = int(match.group(1))
            values = dict(part.split("=", 1) for part in match.group(2).split(", ") if "=" in part)
            shown = ", ".join(f"{k} {values[k]}" for k in SHOWN_METRICS if k in values)
            total = self.max_steps.get(step)
            eta = ""
            if total and done:
                elapsed = time.monotonic() - self.started.get(step, time.monotonic())
                eta = f", ETA {max(0.0, elapsed / done * (total - done)) / 60:.1f} min"
            self._print(f"    {step} step {done}/{total or '?'}: {shown}{eta}")
        elif message.startswith("Dependencies for step"):
            return  # the failure upstream was already shown; the skipped steps follow from it
        elif level >= logging.WARNING or not message.startswith(("[pipes]", "agent_rl.train")):
            self._print(f"    {step}: {message[:200]}")


def console_logger(log_file: Path, max_steps: dict[str, int], out: TextIO = sys.stdout) -> dg.LoggerDefinition:
    """A Dagster logger: everything to `log_file` (appended), progress lines to `out`."""

    @dg.logger(description="agent-rl demo console: progress lines on screen, the full log in a file")
    def _logger(_init_context) -> logging.Logger:
        logger = logging.Logger("agent_rl.demo", logging.DEBUG)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        to_file = logging.FileHandler(log_file, encoding="utf-8")
        to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(to_file)
        logger.addHandler(ConsoleProgress(out, max_steps))
        return logger

    return _logger


def _cause(event) -> str:
    """The innermost error under a failed or retried step, where Dagster's own message says only that it failed
    ("Execution of step ... failed."): e.g. which signal killed the training process."""
    error = getattr(event.event_specific_data, "error", None)
    while error is not None and error.cause is not None:
        error = error.cause
    text = (error.message or "").strip().splitlines()[0] if error is not None and error.message else ""
    return f" ({text[:300]})" if text else ""

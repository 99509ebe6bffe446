"""Runs an untrusted `python` grader in a separate, limited process; refused unless the operator enabled it.

A grader's source comes with the job, so it is somebody else's code running next to our keys and data. The
child (sandbox_child.py) is `python -I` (no user site, no PYTHON* variables, no script directory on sys.path)
with an empty environment, a fresh empty working directory, a wall-clock timeout enforced here (the whole
process group is killed), and limits it sets on itself before the grader's code runs: address space
(RLIMIT_AS), CPU time, file size, no core files; no sockets, processes or native-code loaders (an audit hook),
and an empty network namespace where the kernel allows one.

This is defence in depth, not a hardened jail: the grader runs as our user and can read files that user can
read outside /proc. Run the trainer as a user without secrets on disk (or in a container) when graders come
from people you do not trust.

Whatever goes wrong inside — a timeout, a crash, an exception, a non-numeric or non-finite result — scores 0.0
with the reason; the trainer carries on.
"""

from __future__ import annotations

import ast
import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent_rl.graders.config import GraderConfigError, PythonGrader
from agent_rl.graders.context import PythonSandboxConfig
from agent_rl.graders.result import GradeResult

CHILD_SOURCE = (Path(__file__).with_name("sandbox_child.py")).read_text(encoding="utf-8")
_TAIL_CHARS = 600


def check_python_grader(grader: PythonGrader, config: PythonSandboxConfig) -> None:
    """Raise a GraderConfigError unless the operator enabled python graders and the source can define grade()."""
    if not config.enabled:
        raise GraderConfigError(
            f"python grader {grader.name!r} refused: python graders run code from the job and are off; "
            "an operator enables them with GraderContext(python=PythonSandboxConfig(enabled=True))"
        )
    size = len(grader.source.encode("utf-8"))
    if size > config.max_source_kb * 1024:
        raise GraderConfigError(
            f"python grader {grader.name!r}: source is {size} bytes, more than {config.max_source_kb} KB"
        )
    try:
        tree = ast.parse(grader.source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise GraderConfigError(f"python grader {grader.name!r}: the source does not parse: {exc}") from None
    if not any(isinstance(node, ast.FunctionDef) and node.name == "grade" for node in tree.body):
        raise GraderConfigError(f"python grader {grader.name!r}: the source defines no top-level grade(sample, item)")


def _tail(path: Path) -> str:
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - 4 * _TAIL_CHARS))
        text = handle.read().decode("utf-8", "replace").strip()
    return text[-_TAIL_CHARS:]


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the child leads its own session: this takes anything it started
    except (ProcessLookupError, PermissionError):
        process.kill()


def _failure(grader: PythonGrader, what: str, stderr: str = "") -> GradeResult:
    last = stderr.splitlines()[-1] if stderr else ""
    return GradeResult(score=0.0, reason=f"python grader {grader.name!r} {what}" + (f"; stderr: {last}" if last else ""))


def run_python_grader(grader: PythonGrader, sample: Mapping[str, Any], item: Mapping[str, Any],
                      config: PythonSandboxConfig) -> GradeResult:  # fmt: skip
    """Grade one sample with the grader's `grade(sample, item)` in a fresh limited process."""
    check_python_grader(grader, config)
    try:
        job = json.dumps({
            "source": grader.source,
            "sample": sample,
            "item": item,
            "limits": {
                "memory_bytes": config.memory_mb * 2**20,
                "cpu_s": math.ceil(config.timeout_s) + 1,
                "file_bytes": config.max_file_mb * 2**20,
                "network_namespace": config.network_namespace,
            },
        })  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise ValueError(f"python grader {grader.name!r}: the sample and item must be JSON: {exc}") from None
    io_dir = Path(tempfile.mkdtemp(prefix="agent-rl-grader-io-"))
    work_dir = tempfile.mkdtemp(prefix="agent-rl-grader-")  # the child's empty working directory
    try:
        (io_dir / "job.json").write_text(job, encoding="utf-8")
        with (io_dir / "job.json").open("rb") as stdin, (io_dir / "verdict").open("wb") as stdout, \
                (io_dir / "stderr").open("wb") as stderr:  # fmt: skip
            process = subprocess.Popen(
                [config.python_executable, "-I", "-c", CHILD_SOURCE],
                stdin=stdin, stdout=stdout, stderr=stderr, cwd=work_dir, env={},
                start_new_session=True, close_fds=True,
            )  # fmt: skip
            try:
                code = process.wait(timeout=config.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(process)
                process.wait()
                return _failure(grader, f"timed out after {config.timeout_s:g} s (wall clock)")
        stderr_text = _tail(io_dir / "stderr")
        verdict_text = (io_dir / "verdict").read_text(encoding="utf-8", errors="replace").strip()
        if verdict_text:
            try:
                verdict = json.loads(verdict_text.splitlines()[-1])
            except ValueError:
                verdict = None
            if not isinstance(verdict, dict):
                return _failure(grader, "left an unreadable verdict", stderr_text)
            if verdict.get("ok") and isinstance(verdict.get("score"), int | float):
                return GradeResult(score=float(verdict["score"]))
            return _failure(grader, f"failed: {verdict.get('error', 'no error given')}", stderr_text)
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            why = {"SIGXCPU": "ran out of CPU time", "SIGKILL": "was killed (SIGKILL)"}.get(name, f"crashed ({name})")
            return _failure(grader, why, stderr_text)
        if "MemoryError" in stderr_text:
            return _failure(grader, "ran out of memory", stderr_text)
        return _failure(grader, f"exited with code {code} without a verdict", stderr_text)
    finally:
        shutil.rmtree(io_dir, ignore_errors=True)
        shutil.rmtree(work_dir, ignore_errors=True)

"""The import contract (pyproject.toml, [tool.importlinter]): the loop reaches environments only through the
contract and the registry, plug-ins never import the loop's internals, and the layers hold (the Dagster code over the
loop over agent, reward and pool over the environments over the ground floor). `lint-imports` is the real tool; the
other tests show it fails on a violation, on a copy of the source tree with one bad import added."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent_rl", "assets", "resources", "pipelines", "demos", "examples")
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")], cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_repository_keeps_its_import_contracts():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def test_a_loop_module_importing_an_environment_breaks_the_contract(tree_copy):
    (tree_copy / "agent_rl" / "evaluate" / "sneaky.py").write_text(
        "from agent_rl.environments.support.store import SupportDatabase  # noqa: F401\n")
    try:
        result = lint(tree_copy)
    finally:
        (tree_copy / "agent_rl" / "evaluate" / "sneaky.py").unlink()
    assert result.returncode != 0
    assert "The loop imports no environment BROKEN" in result.stdout
    assert "agent_rl.evaluate.sneaky -> agent_rl.environments.support.store" in result.stdout


def test_a_plugin_importing_the_loops_internals_breaks_the_contract(tree_copy):
    target = tree_copy / "examples" / "timetable.py"
    original = target.read_text()
    target.write_text(original + "\nfrom agent_rl.pool.repository import PoolRepository  # noqa: E402,F401\n")
    try:
        result = lint(tree_copy)
    finally:
        target.write_text(original)
    assert result.returncode != 0
    assert "Plug-ins use the contract, not the loop's internals BROKEN" in result.stdout
    assert "examples.timetable -> agent_rl.pool.repository" in result.stdout


def _with_import(path: Path, line: str) -> str:
    """The file's text with `line` appended; the caller restores the returned original."""
    original = path.read_text()
    path.write_text(original + f"\n{line}  # noqa: E402,F401\n")
    return original


LAYERS = "Layers: Dagster code, the loop, agent, environments, the ground floor"


def test_the_ground_floor_importing_the_loop_breaks_the_layers(tree_copy):
    target = tree_copy / "agent_rl" / "environments" / "core.py"
    original = _with_import(target, "from agent_rl.train.config import SFTSettings")
    try:
        result = lint(tree_copy)
    finally:
        target.write_text(original)
    out = " ".join(result.stdout.split())  # the report wraps long lines
    assert result.returncode != 0
    assert f"{LAYERS} BROKEN" in out
    assert "agent_rl.environments.core is not allowed to import agent_rl.train" in out
    assert "agent_rl.environments.core -> agent_rl.train.config" in out


def test_an_environment_importing_above_the_ground_floor_breaks_the_layers(tree_copy):
    target = tree_copy / "agent_rl" / "environments" / "support" / "tasks.py"
    original = _with_import(target, "from agent_rl.reward.judge import LLMJudge")
    try:
        result = lint(tree_copy)
    finally:
        target.write_text(original)
    out = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert f"{LAYERS} BROKEN" in out
    assert "agent_rl.environments.support.tasks -> agent_rl.reward.judge" in out

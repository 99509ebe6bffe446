"""One path through the contract (issue 44): outside `agent_rl/environments/`, the loop asks the environment (its
contract) or the run's capabilities (the `environment` resource) what it can do, never which environment it is. A
scan of the loop's code fails on a name test coming back; the descriptor answers from the declarations."""

from __future__ import annotations

import ast
from pathlib import Path

from agent_rl.environments.core import Capabilities
from agent_rl.environments.gateway import GatewayEnvironment
from resources.environment import EnvironmentResource

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("agent_rl", "assets", "resources")
ENVIRONMENT_NAMES = {"email", "gateway"}
NAME_CONSTANTS = {"RUBRIC_ENVIRONMENT", "LIVE_ENVIRONMENT", "DEFAULT_ENVIRONMENT", "DEFAULT", "EMAIL"}
NAME_PROPERTIES = {"is_email", "is_live"}
# The gateway is an environment (environments/gateway) that declares its capabilities (no world, judged by its
# users): no module of the loop tells its live traffic by name any more (`is_live`, LIVE_ENVIRONMENT are gone).
# Specs that name an environment by what a user types, as the CLI parses arguments: the `heuristic` policy spec is
# the email assistant's teacher (`teacher:email`).
SPEC_ALIASES = {"agent_rl/arbiter/policies.py"}
# Comparisons with "email" that are about a record's kind (an email record beside a scenario), not an environment.
RECORD_KINDS = {("agent_rl/privacy/anonymize.py", "kind"), ("agent_rl/privacy/anonymize.py", "t[0]")}


def _constants(node: ast.AST) -> set[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}


def _named(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def name_branches(root: Path = ROOT) -> list[str]:
    """Every place in the loop's code that tells an environment by its name: `file:line: what`."""
    found = []
    for package in SCANNED:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith("agent_rl/environments/"):  # the environments and their registry may name themselves
                continue
            source = path.read_text(encoding="utf-8")
            for node in ast.walk(ast.parse(source)):
                where = f"{rel}:{getattr(node, 'lineno', '?')}"
                if isinstance(node, ast.Compare):
                    operands = [node.left, *node.comparators]
                    others = [ast.get_source_segment(source, o) for o in operands
                              if not _constants(o) & ENVIRONMENT_NAMES]
                    named = any(_constants(o) & ENVIRONMENT_NAMES for o in operands)
                    if named and not all((rel, other) in RECORD_KINDS for other in others):
                        found.append(f"{where}: {ast.get_source_segment(source, node)}")
                    constants = {_named(o) for o in operands} & NAME_CONSTANTS
                    if constants:
                        found.append(f"{where}: {ast.get_source_segment(source, node)}")
                elif isinstance(node, ast.Attribute) and node.attr in NAME_PROPERTIES:
                    found.append(f"{where}: .{node.attr}")
                elif isinstance(node, ast.Name) and node.id == "RUBRIC_ENVIRONMENT":
                    found.append(f"{where}: RUBRIC_ENVIRONMENT")
                elif isinstance(node, ast.Call) and _named(node.func) == "is_live":
                    found.append(f"{where}: {ast.get_source_segment(source, node)}")
                elif (isinstance(node, ast.Call) and _named(node.func) == "load_environment" and node.args
                      and _constants(node.args[0]) & ENVIRONMENT_NAMES and rel not in SPEC_ALIASES):
                    found.append(f"{where}: {ast.get_source_segment(source, node)}")
    return found


def test_the_loop_asks_capabilities_and_the_contract_never_an_environments_name():
    assert name_branches() == []


def test_the_scan_finds_a_name_branch_coming_back(tmp_path):
    for package in SCANNED:
        (tmp_path / package).mkdir()
    (tmp_path / "assets" / "bad.py").write_text(
        "def grpo(environment, row, name):\n"
        "    if environment.is_email:\n"
        "        return 1\n"
        "    if row.get('environment') == 'gateway' or name in ('email', 'support'):\n"
        "        return 2\n")
    (tmp_path / "agent_rl" / "train.py").write_text(
        "from agent_rl.curation.live import is_live\n"
        "RUBRIC_ENVIRONMENT = 'email'\n"
        "def f(row):\n"
        "    return is_live(row['environment']) or load_environment('email', store_url=row['store'])\n")
    found = name_branches(tmp_path)
    assert sorted(f.split(": ", 1)[0] for f in found) == ["agent_rl/train.py:2", "agent_rl/train.py:4",
                                                          "agent_rl/train.py:4", "assets/bad.py:2", "assets/bad.py:4",
                                                          "assets/bad.py:4"]


def test_the_descriptor_answers_from_declared_capabilities():
    assert EnvironmentResource().capabilities == Capabilities(world=True, judged_by_users=False)
    assert EnvironmentResource(name="support").capabilities == Capabilities()
    live = EnvironmentResource(name="gateway")
    assert live.capabilities == GatewayEnvironment.capabilities == Capabilities(world=False, judged_by_users=True,
                                                                                answers_in_words=True)
    assert live.episode_environments == ["gateway"]

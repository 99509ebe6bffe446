"""No import cycles among the project's own modules (issue 65).

The graph is built statically with `ast` from the first-party packages, read from pyproject.toml: those setuptools
installs ([tool.setuptools.packages.find] include: agent_rl, assets, resources, pipelines, demos) and the import
contract's root packages ([tool.importlinter] root_packages: the same and examples). bench/ and tests/ are scripts
and tests, not packages: nothing in the packages imports them, so they cannot close a cycle among the packages.

A module has an edge to another first-party module for every import statement anywhere in it: at module level,
inside functions, methods and classes, in try/except and in ordinary `if` blocks alike (an import moved into a
function still runs, so it still counts). Only the body of an `if TYPE_CHECKING:` / `if typing.TYPE_CHECKING:`
block is skipped (never executed); its `else:` still counts.
  * `import a.b.c` is an edge to a.b.c (a package's module is its __init__). The one exclusion: the parent
    packages Python imports on the way (a, a.b for `import a.b.c` or `from a.b.c import x`) are not edges of their
    own; otherwise a package whose __init__ re-exports a submodule would form a cycle with every submodule, which
    is how packages are meant to work. An import that names the package itself is an edge to its __init__:
    a submodule that explicitly imports its own package's __init__ (`from agent_rl.pool import X` inside
    agent_rl.pool) while that __init__ imports it back is reported like any other cycle.
  * `from a.b import n` is an edge to a.b.n when that is a module, else to a.b; relative imports are resolved
    against the importing module's package.
  * Imports by string at run time (importlib.import_module, entry points) are not statements and are not seen.

A strongly connected component of more than one module (or a module importing itself) is a cycle; the test
fails listing every component with its modules and every import among them, with its lines.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]


def first_party_packages(root: Path = ROOT) -> list[str]:
    """The top-level packages pyproject.toml names: setuptools' includes and the import contract's roots."""
    tool = tomllib.loads((root / "pyproject.toml").read_text())["tool"]
    names = {pattern.rstrip("*").rstrip(".") for pattern in tool["setuptools"]["packages"]["find"]["include"]}
    names |= set(tool["importlinter"]["root_packages"])
    return sorted(name for name in names if (root / name).is_dir())


def module_files(root: Path = ROOT, packages: list[str] | None = None) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the first-party packages."""
    modules: dict[str, Path] = {}
    for package in packages if packages is not None else first_party_packages(root):
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        and isinstance(test.value, ast.Name) and test.value.id == "typing")


def _imports(node: ast.AST):
    """Every Import / ImportFrom under node, skipping the bodies of `if TYPE_CHECKING:`."""
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        for child in node.orelse:
            yield from _imports(child)
        return
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    for child in ast.iter_child_nodes(node):
        yield from _imports(child)


def _resolve_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _known(name: str, modules) -> str | None:
    """name itself when it is a first-party module, else its longest first-party prefix."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_graph(root: Path = ROOT, packages: list[str] | None = None) -> nx.DiGraph:
    """Module -> imported module, each edge carrying the lines of its import statements."""
    modules = module_files(root, packages)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                targets = [_known(alias.name, modules) for alias in node.names]
            else:
                base = _resolve_base(module, is_package, node)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else _known(base, modules)
                           for alias in node.names]
            for target in targets:
                if target is None:
                    continue
                if graph.has_edge(module, target):
                    lines = graph.edges[module, target]["lines"]
                    if node.lineno not in lines:
                        lines.append(node.lineno)
                else:
                    graph.add_edge(module, target, lines=[node.lineno])
    return graph


def cycles(graph: nx.DiGraph) -> list[list[str]]:
    """The strongly connected components that are cycles, each sorted, in a stable order."""
    found = [sorted(component) for component in nx.strongly_connected_components(graph)
             if len(component) > 1 or graph.has_edge(*(next(iter(component)),) * 2)]
    return sorted(found)


def describe(graph: nx.DiGraph, component: list[str]) -> str:
    """The component's modules, then every import between them (with its lines): the edges to cut from."""
    edges = "\n".join(f"      {a} -> {b}  (line {', '.join(map(str, graph.edges[a, b]['lines']))})"
                       for a, b in sorted(graph.subgraph(component).edges))
    return f"  {len(component)} modules: {', '.join(component)}\n    imports among them:\n{edges}"


def test_the_project_has_no_import_cycles():
    assert {"agent_rl", "assets", "resources", "pipelines", "demos", "examples"} <= set(first_party_packages())
    graph = import_graph()
    assert graph.number_of_nodes() > 100 and graph.has_edge("agent_rl.policy_specs", "agent_rl.arbiter.policies")
    found = cycles(graph)
    assert not found, f"{len(found)} import cycle(s):\n" + "\n".join(describe(graph, c) for c in found)


def test_the_graph_sees_function_level_relative_and_from_imports(tmp_path):
    """The checker itself: a cycle closed by an import inside a function, through a relative `from . import`,
    is found; one closed only under `if TYPE_CHECKING:` is not."""
    package = tmp_path / "agent_rl" / "demo_pkg"
    package.mkdir(parents=True)
    (tmp_path / "agent_rl" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def f():\n    from agent_rl.demo_pkg.a import thing\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import x\n"
                                  "else:\n    import json\n")
    (package / "d.py").write_text("import agent_rl.demo_pkg.c\n")
    graph = import_graph(tmp_path, ["agent_rl"])
    assert graph.has_edge("agent_rl.demo_pkg.a", "agent_rl.demo_pkg.b")
    assert graph.has_edge("agent_rl.demo_pkg.d", "agent_rl.demo_pkg.c")
    assert not graph.has_edge("agent_rl.demo_pkg.c", "agent_rl.demo_pkg.d")
    assert cycles(graph) == [["agent_rl.demo_pkg.a", "agent_rl.demo_pkg.b"]]

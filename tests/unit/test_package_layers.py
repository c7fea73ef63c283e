"""Barge's packages stand on floors, and every import runs down (issue 42):

    cli/                               entry points: `barge` and its commands
    api/        queueing/              the API server; the Celery tasks and the worker
    jobs/                              JobSpec, states, SQL store, client, schedules
    engine/     storage/   webhooks/   inference; bytes at rest; webhook events and delivery

A package imports its own modules and the floors below it, never a floor above it, and
never a package beside it: api/ and queueing/ talk only through jobs/ (the store, and the
client's messaging port, jobs.messaging), and engine/, storage/ and webhooks/ each stand
alone. And no two modules import each other, directly or round a longer circle.

Every import counts, wherever it is written: at the top of a module, inside a function
(a lazy import is still a dependency), under `if TYPE_CHECKING:`, and the names an
engine package loads on first use (engine.lazy: the `{name: "module"}` table handed to
`lazy_names`). The modules are read with `ast`, never imported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FLOORS: dict[str, int] = {   # package -> floor; a module imports only from a lower floor or its own package
    "cli": 3,
    "api": 2, "queueing": 2,
    "jobs": 1,
    "engine": 0, "storage": 0, "webhooks": 0,
}
ALLOWED_SIDEWAYS: dict[tuple[str, str], str] = {}   # (importer, imported) package -> why it must stay


@dataclass(frozen=True)
class Edge:
    importer: str   # module that imports, e.g. "jobs.client"
    imported: str   # module it imports, e.g. "jobs.messaging"
    line: int       # where, in the importer's file


def module_files() -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package by its __init__)."""
    modules = {}
    for package in FLOORS:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_edges(name: str, source: str, *, is_package: bool, modules: dict[str, Path]) -> list[Edge]:
    """What module `name` (its text: `source`) imports of `modules`, anywhere in its text."""
    tree = ast.parse(source)
    tables = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
              for target in node.targets if isinstance(target, ast.Name)}   # a lazy_names table, by its name
    edges = []
    for node in ast.walk(tree):
        for target in _targets(node, name, is_package, modules, tables):
            if target != name:
                edges.append(Edge(name, target, node.lineno))
    return edges


def _targets(node: ast.AST, name: str, is_package: bool, modules: dict[str, Path],
             tables: dict[str, ast.expr]) -> list[str]:
    if isinstance(node, ast.Import):
        return [found for alias in node.names if (found := _known(alias.name, modules))]
    if isinstance(node, ast.ImportFrom):
        base = _absolute(node, name, is_package)
        found = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
        if len(found) < len(node.names) and (defined_in := _known(base, modules)):   # names defined in `base`
            found.append(defined_in)
        return found
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_names":
        return [found for module in _lazy_table(node, tables) if (found := _known(module, modules))]
    return []


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    package = name.split(".") if is_package else name.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _known(dotted: str, modules: dict[str, Path]) -> str | None:
    """The module `dotted` names, or the deepest of ours it sits in (None: not Barge's)."""
    parts = dotted.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or None


def _lazy_table(call: ast.Call, tables: dict[str, ast.expr]) -> list[str]:
    """engine.lazy.lazy_names(__name__, {name: "module"}): the modules it loads on first use."""
    table = call.args[1] if len(call.args) > 1 else None
    if isinstance(table, ast.Name):
        table = tables.get(table.id)
    assert isinstance(table, ast.Dict), f"lazy_names at line {call.lineno}: hand it a literal {{name: 'module'}} table"
    return [value.value for value in table.values if isinstance(value, ast.Constant)]


def all_edges() -> list[Edge]:
    modules = module_files()
    return [edge for name, path in modules.items()
            for edge in import_edges(name, path.read_text(encoding="utf-8"), is_package=path.name == "__init__.py",
                                     modules=modules)]


def package_of(module: str) -> str:
    return module.split(".")[0]


def is_downward(importer: str, imported: str) -> bool:
    source, target = package_of(importer), package_of(imported)
    return (source == target or FLOORS[target] < FLOORS[source]
            or (source, target) in ALLOWED_SIDEWAYS)


def find_cycle(edges: list[Edge]) -> list[str] | None:
    """One circle of module imports (first module repeated at the end), or None."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == 1:
                return path[path.index(imported):] + [imported]
            if imported not in state and (cycle := visit(imported)) is not None:
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_the_floors_are_the_packages_there_are():
    on_disk = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    assert on_disk == set(FLOORS), "put a new package on a floor in FLOORS (and in docs/architecture.md)"


def test_every_import_between_packages_runs_down_the_floors():
    upward = [f"{edge.importer} (line {edge.line}) imports {edge.imported}: "
              f"floor {FLOORS[package_of(edge.importer)]} -> {FLOORS[package_of(edge.imported)]}"
              for edge in all_edges() if not is_downward(edge.importer, edge.imported)]
    assert upward == []


def test_no_modules_import_each_other_round_a_circle():
    cycle = find_cycle(all_edges())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_checks_see_lazy_local_typing_and_relative_imports():
    source = ("from __future__ import annotations\n"
              "from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from queueing.app import create_app\n"
              "def submit():\n    import api.serve\n    from . import store\n"
              "_WHERE = {'Engine': 'engine.engine'}\n"
              "__getattr__ = lazy_names(__name__, _WHERE)\n")
    modules = {m: Path() for m in ("queueing.app", "api.serve", "jobs.store", "jobs.probe", "engine.engine")}
    edges = import_edges("jobs.probe", source, is_package=False, modules=modules)
    assert {edge.imported: is_downward(edge.importer, edge.imported) for edge in edges} == {
        "queueing.app": False, "api.serve": False, "jobs.store": True, "engine.engine": True}


def test_a_circle_is_found_and_named():
    assert find_cycle([Edge("a", "b", 1), Edge("b", "c", 1), Edge("c", "a", 1)]) == ["a", "b", "c", "a"]
    assert find_cycle([Edge("a", "b", 1), Edge("a", "c", 1), Edge("b", "c", 1)]) is None

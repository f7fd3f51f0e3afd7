"""The package's shape, read from its source (ast): lessons stand apart, and no import circle in fastlab/.

An import counts wherever it is written (module level or inside a function): a function-level import hides a
circle from Python's import machinery, not from a reader who follows the dependencies.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fastlab"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path) -> set[str]:
    """The fastlab modules `name` imports: `import fastlab.x`, `from fastlab.x import y`, `from .x import y`,
    `from . import x` (a submodule x, else the package itself: `from . import __version__`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for a in node.names:
                sub = f"{source}.{a.name}"
                found.add(sub if sub in MODULES else source)
    return {m for m in found if m in MODULES and m != name}


def import_graph() -> dict[str, set[str]]:
    return {name: imported(name, path) for name, path in MODULES.items()}


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that import each other, directly or round a circle (Tarjan's strongly connected
    components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest circle through each tangle's first module (a breadth-first path back to it)."""
    groups = tangles(graph)
    found = []
    for group in groups:
        start = min(group)
        paths = {start: [start]}
        frontier = [start]
        while frontier and start not in {w for v in frontier for w in graph[v]}:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & group):
                    if w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in graph[v])
        found.append(paths[last] + [start])
    return found


def test_the_graph_reader_sees_every_kind_of_import(tmp_path):
    graph = import_graph()
    assert "fastlab.comparisons" in graph["fastlab.lessons.kernels"]  # from ..comparisons import comparison
    assert "fastlab.claims" in graph["fastlab.lessons.kernels"]  # from .. import claims
    assert "fastlab.train" in graph["fastlab.calibration"]  # a function-level import counts
    assert "fastlab.lessons.data_loading" in graph["fastlab.claim_map"]  # from .lessons import data_loading
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_lesson_imports_another_lesson():
    graph = import_graph()
    lessons = {m for m in graph if m.startswith("fastlab.lessons.")}
    assert len(lessons) >= 10
    crossing = {m: sorted(graph[m] & lessons) for m in sorted(lessons) if graph[m] & lessons}
    assert not crossing, (f"lessons import other lessons: {crossing}; move what they share into the core module "
                          "it belongs to (data, measure, outcomes, ...)")


def test_no_import_circle_in_fastlab():
    graph = import_graph()
    found = cycles(graph)
    assert not found, ("import circles in fastlab/:\n" + "\n".join(" -> ".join(c) for c in found)
                       + "\nmodules on circles: " + "; ".join(", ".join(sorted(g)) for g in tangles(graph)))


def test_the_version_a_results_file_records_is_the_packages():
    import re

    from fastlab.version import __version__

    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()  # tomllib is 3.11+; the package supports 3.10
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == __version__


def test_no_class_in_fastlab_is_over_250_lines():
    """Small modules with one job each: a class that grows past this holds a second job (the watch held the
    harness's limits, its clock and the reader's loop record before they were split out)."""
    import ast

    long = {f"{path.relative_to(PACKAGE)}:{node.name}": node.end_lineno - node.lineno + 1
            for path in sorted(PACKAGE.rglob("*.py")) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 250}
    assert not long, f"classes over 250 lines: {long}"

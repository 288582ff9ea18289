"""The import graph of `litetopk` has no cycle, and the kernels never reach up into the service or the
clients (kernels/__init__.py draws the layers: a module imports only modules below it).

The graph is built from the source alone (ast: no import is executed): every module of the three
folders (kernels, service, clients, installed as litetopk.kernels / .service / .clients), every
`import` and `from ... import` in it, relative or absolute, at module level or lazily inside a
function. `from package import name` counts as an edge to the submodule `package.name` where one
exists, else to the package; importing a submodule also runs its packages' __init__ modules, which
are edges too (an __init__ that imports its own submodules is not a cycle: Python runs the package
first and the submodule from it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"kernels": "litetopk.kernels", "service": "litetopk.service", "clients": "litetopk.clients"}


def modules() -> dict[str, Path]:
    """Module name -> source file, for every .py file of the three folders."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The modules of `known` that module `name` (source `path`) imports -> the first line that does."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: dict[str, int] = {}

    def add(module: str, line: int) -> None:
        parts = module.split(".")
        for end in range(len(parts), 0, -1):  # the module and the packages above it that it runs
            prefix = ".".join(parts[:end])
            if prefix in known and prefix != name and not name.startswith(prefix + "."):
                targets.setdefault(prefix, line)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                add(submodule if submodule in known else module, node.lineno)
    return targets


def import_graph() -> dict[str, dict[str, int]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def describe(cycle: list[str], graph: dict[str, dict[str, int]], known: dict[str, Path]) -> str:
    return "\n".join(f"  {a} -> {b}   ({known[a].relative_to(ROOT)}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:]))


def test_the_graph_sees_every_kind_of_import():
    """The checker itself: relative and absolute, module-level and lazy imports are all edges."""
    graph = import_graph()
    assert "litetopk.kernels.problem" in graph["litetopk.kernels.validation"]  # from .problem import ...
    assert "litetopk.kernels.triton.backend" in graph["litetopk.kernels.triton"]  # from .backend import ...
    assert "litetopk.kernels.triton.backend" in graph["litetopk.kernels.compile.sm90"]  # lazy, from ..triton...
    assert "litetopk.kernels" in graph["litetopk.service.app"]  # absolute: from litetopk.kernels import ...
    assert "litetopk.kernels.flydsl" in graph["litetopk.kernels.registry"]  # lazy, in the backend registry
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}, "c": {"a": 1, "b": 1}}) is None


def test_litetopk_has_no_import_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, (
        f"import cycle of {len(cycle) - 1} modules (a module imports one above it; "
        f"kernels/__init__.py draws the layers):\n{describe(cycle, graph, modules())}"
    )


@pytest.mark.parametrize("above", ["litetopk.service", "litetopk.clients"])
def test_kernels_never_import_the_service_or_the_clients(above):
    graph = import_graph()
    known = modules()
    reaching = [
        f"{name} -> {target}   ({known[name].relative_to(ROOT)}:{line})"
        for name, targets in sorted(graph.items())
        if name.startswith("litetopk.kernels")
        for target, line in sorted(targets.items())
        if target == above or target.startswith(above + ".")
    ]
    assert not reaching, f"litetopk.kernels imports {above}:\n" + "\n".join(reaching)

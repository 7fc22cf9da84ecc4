"""The module graph has no cycles, function-local imports included (a cycle hidden in a function is still
a cycle), and the oracle never imports through its own package root (whose ``__init__`` imports nearly
every module)."""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("conformance", "reference_impl", "fuzz", "size_gate", "corpus")


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: pathlib.Path, modules: dict) -> set[str]:
    """Modules ``name`` imports: ``from pkg import sub`` counts as the submodule ``sub`` only."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            candidates = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iteratively)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for child in edges:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_module_graph_has_no_cycles():
    modules = _modules()
    graph = defaultdict(set, {name: _imports(name, path, modules) for name, path in modules.items()})
    assert _cycles(graph) == []


def test_the_detector_sees_a_cycle_hidden_in_a_function():
    graph = defaultdict(set, {"a": {"b"}, "b": {"a"}, "c": {"a"}})
    assert _cycles(graph) == [["a", "b"]]


def test_the_oracle_never_imports_through_its_package_root():
    modules = _modules()
    offenders = []
    for name, path in modules.items():
        if not name.startswith("reference_impl."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "reference_impl" and not node.level:
                offenders += [f"{name}: {a.name}" for a in node.names if f"reference_impl.{a.name}" not in modules]
    assert offenders == []

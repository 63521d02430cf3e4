"""The import graph of ``srl/``: no module reaches itself through its imports (lazy ones and those under
``TYPE_CHECKING`` included), so each file can be read, tested and moved with what it imports and no more."""

from __future__ import annotations

import ast
from pathlib import Path

SRL = Path(__file__).resolve().parents[1] / "srl"


def _module(path: Path) -> str:
    parts = path.relative_to(SRL.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module of ``srl`` -> the modules of ``srl`` it imports anywhere in its file (a package's
    ``__init__`` counts as the package; ``from srl.a import b`` is ``srl.a.b`` when that is a module)."""
    modules = {_module(p): p for p in SRL.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_walk_finds_a_circle_when_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert "srl.runtime.plan" in import_graph()["srl.runtime.build"]


def test_no_module_of_srl_imports_itself_round_a_circle():
    assert circles(import_graph()) == []


LOWER = ("srl.api", "srl.base", "srl.nets", "srl.algorithms", "srl.envs")
UPPER = ("srl.system", "srl.runtime", "srl.cli", "srl.bench")


def test_the_math_and_the_interfaces_import_nothing_of_the_workers_or_the_runtimes():
    """Algorithms, networks, environments and the API sit below the workers and the runtimes that run them."""
    graph = import_graph()
    upward = sorted(
        f"{m} -> {t}" for m, edges in graph.items() if m.startswith(LOWER) for t in edges if t.startswith(UPPER)
    )
    assert upward == []

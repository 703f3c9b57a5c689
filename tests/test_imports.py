"""The package's import graph has no loops, deferred and type-only imports included.

A loop hidden inside a function, or under ``if TYPE_CHECKING:``, still couples two modules
both ways: neither can be understood, moved or tested alone. A deferred import's loop also
lets the import order decide which half is half-initialised; a type-only one is where such a
loop starts (the next runtime use of the name closes it). The graph is read from the source
with ``ast`` (no import runs), so every ``import`` counts wherever it sits, under
``if TYPE_CHECKING:`` too. Two levels are checked: modules (``zsearch_cli.train.policy``) and
packages (``zsearch_cli.train``, or a top-level module such as ``zsearch_cli.cli_base``); the
package level also catches an upward import such as ``train`` reaching into ``stages``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "zsearch_cli"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the zsearch_cli modules it imports (a ``from pkg import name`` counts
    as importing ``pkg.name`` when that is a module, else ``pkg``)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    name = ".".join(base + ([node.module] if node.module else []))
                else:
                    name = node.module or ""
                for alias in node.names:
                    full = f"{name}.{alias.name}"
                    deps.add(full if full in modules else name)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[mod] = {d for d in deps if d in modules and d != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_the_cycle_finder_finds_a_planted_loop():
    # a -> b -> c -> a is one loop; d only points into it
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_deferred_imports():
    # checkpoint saves the policy through train.models, inside a function: the graph must
    # hold that edge, or a loop through it would go unseen
    graph = import_graph()
    assert "zsearch_cli.train.policy" in graph["zsearch_cli.train.checkpoint"]
    assert "zsearch_cli.models.hf" in graph["zsearch_cli.models.factory"]


def test_the_graph_sees_type_only_imports():
    # metrics.py imports train.step_samples under `if TYPE_CHECKING:` only: that edge must
    # count too, or a loop made of type-only imports would go unseen
    assert "zsearch_cli.train.step_samples" in import_graph()["zsearch_cli.train.metrics"]


def test_no_module_imports_itself_through_others():
    assert cycles(import_graph()) == []


def test_no_package_imports_itself_through_others():
    packages: dict[str, set[str]] = {}
    for mod, deps in import_graph().items():
        packages.setdefault(_package(mod), set()).update(
            _package(d) for d in deps if _package(d) != _package(mod))
    packages.pop("zsearch_cli", None)  # the root __init__ only holds the version
    for deps in packages.values():
        deps.discard("zsearch_cli")
    assert cycles(packages) == []

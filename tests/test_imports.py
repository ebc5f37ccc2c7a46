"""The package's modules import each other without a cycle (lazy imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

import rnn_rewrite_rules

_ROOT = Path(rnn_rewrite_rules.__file__).parent
_PACKAGE = "rnn_rewrite_rules"


def _module_name(path: Path) -> str:
    parts = (_PACKAGE, *path.relative_to(_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports anywhere in its body.

    ``from package import name`` counts as importing ``package.name`` when that is a module,
    else ``package``; importing ``a.b.c`` does not count ``a.b`` (a package's ``__init__``
    runs first, but what it imports is its own edge).
    """
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in modules else node.module)
    return found & modules


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in _ROOT.rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, modules) - {name} for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 40 and graph[f"{_PACKAGE}._rnn"] >= {f"{_PACKAGE}.shape"}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or ())


def test_a_cycle_is_found() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None

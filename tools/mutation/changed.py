"""The mutants of the functions changed since a git revision, as mutmut names them.

mutmut mutates functions and methods; a mutant's name is its module, the mangled function
(``x_name``, or ``xǁClassǁmethod``) and ``__mutmut_N``. This finds the lines that
``git diff REV`` changes in the files ``[tool.mutmut]`` mutates, the functions whose
source spans them, and returns one name pattern per function (``...__mutmut_*``), which
``mutmut run`` accepts.

    python -m tools.mutation.changed REV
"""

from __future__ import annotations

import ast
import fnmatch
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["changed_lines", "changed_mutants", "function_spans", "mutated_paths"]

ROOT = pathlib.Path(__file__).resolve().parents[2]
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", re.M)


def mutated_paths(root: pathlib.Path = ROOT) -> tuple[list[str], list[str], list[str]]:
    """``[tool.mutmut]``'s ``source_paths``, ``only_mutate`` and ``do_not_mutate``."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
    return (
        list(config.get("source_paths", ["src"])),
        list(config.get("only_mutate", ["*"])),
        list(config.get("do_not_mutate", [])),
    )


def changed_lines(diff: str) -> dict[str, set[int]]:
    """``{path: new-side line numbers}`` of a ``git diff -U0`` (a deletion marks the line
    after it, where the function that lost the lines now is)."""
    lines: dict[str, set[int]] = {}
    path = None
    for chunk in re.split(r"^diff --git ", diff, flags=re.M)[1:]:
        target = re.search(r"^\+\+\+ (?:b/)?(.+)$", chunk, re.M)
        path = None if target is None or target.group(1) == "/dev/null" else target.group(1)
        if path is None:
            continue
        found = lines.setdefault(path, set())
        for match in _HUNK.finditer(chunk):
            start, count = int(match.group(1)), int(match.group(2) or 1)
            found.update(range(start, start + max(count, 1)))
    return lines


def function_spans(source: str) -> list[tuple[str, int, int]]:
    """``(mangled name, first line, last line)`` of each module-level function and method
    of a module-level class, decorators included."""
    spans = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            spans.append((f"x_{node.name}", _first_line(node), node.end_lineno or node.lineno))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    name = f"xǁ{node.name}ǁ{item.name}"
                    spans.append((name, _first_line(item), item.end_lineno or item.lineno))
    return spans


def _first_line(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def _module(path: str, source_paths: Iterable[str]) -> str:
    for base in source_paths:
        prefix = base.rstrip("/") + "/"
        if path.startswith(prefix):
            path = path[len(prefix) :]
            break
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def changed_mutants(revision: str, root: pathlib.Path = ROOT) -> list[str]:
    """The mutmut name patterns of the mutated functions changed since ``revision``.

    Raises:
        RuntimeError: ``git diff`` failed (an unknown revision, not a repository).
    """
    source_paths, only, never = mutated_paths(root)
    done = subprocess.run(
        ["git", "diff", "-U0", "--no-color", revision, "--", *source_paths],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"git diff {revision} failed: {done.stderr.strip()}")
    patterns = []
    for path, lines in sorted(changed_lines(done.stdout).items()):
        mutated = any(fnmatch.fnmatch(path, p) for p in only)
        if not mutated or any(fnmatch.fnmatch(path, p) for p in never):
            continue
        module = _module(path, source_paths)
        for name, first, last in function_spans((root / path).read_text(encoding="utf-8")):
            if any(first <= line <= last for line in lines):
                patterns.append(f"{module}.{name}__mutmut_*")
    return patterns


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print(f"usage: python -m tools.mutation.changed REV\n{__doc__}", file=sys.stderr)
        return 2
    try:
        print("\n".join(changed_mutants(args[0])))
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Keep mutmut's verdicts in a store outside ``mutants/`` (:func:`store_path`), so that a
fresh ``mutants/`` (a clean checkout, another machine given the store) resumes where the
last run stopped.

mutmut keeps each verdict in ``mutants/**/*.meta`` (git-ignored), with a hash of each
mutated function's source; on its next run it keeps the verdicts of every function whose
hash is unchanged and resets the others. ``save`` writes those files' verdicts and hashes
to the store, ``restore`` writes the store back as ``.meta`` files where ``mutants/`` has
none (a fresh checkout or machine), before ``mutmut run``: mutmut's own hash check then
decides which verdicts still hold. A kept verdict was reached with the tests of its run.

    python -m tools.mutation.verdicts save|restore [--mutants DIR] [--store FILE]

The store holds, per source file and function, the hash and the exit code and seconds of
each mutant in mutmut's numbering (``null``: not run).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
from collections.abc import Sequence

__all__ = ["STORE_VARIABLE", "load_store", "main", "restore", "save", "store_path"]

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: The environment variable that names the store; git-ignored ``build/`` by default.
STORE_VARIABLE = "RNN_REWRITE_MUTATION_STORE"
_SUFFIX = "__mutmut_"


def store_path() -> pathlib.Path:
    """The verdict store: ``$RNN_REWRITE_MUTATION_STORE``, else
    ``build/mutation/verdicts.json`` in the repository."""
    named = os.environ.get(STORE_VARIABLE)
    return pathlib.Path(named) if named else ROOT / "build" / "mutation" / "verdicts.json"


def _split(key: str) -> tuple[str, str, int]:
    """``(module, mangled function, number)`` of a mutant's name."""
    function, _, number = key.rpartition(_SUFFIX)
    module, _, name = function.rpartition(".")
    return module, name, int(number)


def save(mutants_dir: pathlib.Path, store: pathlib.Path) -> int:
    """Write the verdicts of every ``.meta`` under ``mutants_dir`` to ``store``; returns the
    number of mutants with a verdict."""
    files: dict[str, dict] = {}
    judged = 0
    for meta in sorted(mutants_dir.rglob("*.py.meta")):
        data = json.loads(meta.read_text())
        functions: dict[str, dict] = {
            name: {"hash": digest, "codes": [], "seconds": []}
            for name, digest in sorted(data.get("hash_by_function_name", {}).items())
        }
        durations = data.get("durations_by_key", {})
        module = None
        for key, code in data.get("exit_code_by_key", {}).items():
            module, name, number = _split(key)
            entry = functions.setdefault(name, {"hash": None, "codes": [], "seconds": []})
            for column in ("codes", "seconds"):
                entry[column] += [None] * (number - len(entry[column]))
            entry["codes"][number - 1] = code
            seconds = durations.get(key)
            entry["seconds"][number - 1] = None if seconds is None else round(seconds, 2)
            judged += code is not None
        if module is not None:  # a file without mutants has no verdict to keep
            path = meta.relative_to(mutants_dir).as_posix().removesuffix(".meta")
            files[path] = {"module": module, "functions": functions}
    store.parent.mkdir(parents=True, exist_ok=True)
    temporary = store.with_name(store.name + ".tmp")
    temporary.write_text(_dumps(files), encoding="utf-8")
    temporary.replace(store)
    return judged


def _dumps(files: dict[str, dict]) -> str:
    """JSON with one line per function: a run changes the lines of what it reran."""
    lines = ['{"files": {']
    for i, (path, entry) in enumerate(sorted(files.items())):
        head = {"module": entry["module"]}
        lines.append(f"{json.dumps(path)}: {json.dumps(head)[:-1]}, " + '"functions": {')
        functions = sorted(entry["functions"].items())
        for j, (name, verdicts) in enumerate(functions):
            comma = "," if j + 1 < len(functions) else ""
            compact = json.dumps(verdicts, separators=(",", ":"), sort_keys=True)
            lines.append(f" {json.dumps(name, ensure_ascii=False)}: {compact}{comma}")
        lines.append("}}," if i + 1 < len(files) else "}}")
    return "\n".join([*lines, "}}"]) + "\n"


def load_store(store: pathlib.Path) -> dict[str, dict]:
    """``{source path: {"module": name, "functions": {function: {"hash", "codes",
    "seconds"}}}}``."""
    return json.loads(store.read_text(encoding="utf-8"))["files"]


def restore(store: pathlib.Path, mutants_dir: pathlib.Path) -> list[str]:
    """Write the store's verdicts as mutmut ``.meta`` files where ``mutants_dir`` has none;
    returns the source paths written."""
    written = []
    for path, entry in load_store(store).items():
        meta = mutants_dir / f"{path}.meta"
        if meta.exists():
            continue
        module, functions = entry["module"], entry["functions"]
        codes, seconds = {}, {}
        for name, verdicts in functions.items():
            pairs = zip(verdicts["codes"], verdicts["seconds"], strict=True)
            for number, (code, took) in enumerate(pairs, 1):
                key = f"{module}.{name}{_SUFFIX}{number}"
                codes[key] = code
                if took is not None:
                    seconds[key] = took
        data = {
            "exit_code_by_key": codes,
            "hash_by_function_name": {n: v["hash"] for n, v in functions.items() if v["hash"]},
            "durations_by_key": seconds,
            "estimated_durations_by_key": {},
            "type_check_error_by_key": {},
        }
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps(data, indent=4))
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("save", "restore"))
    parser.add_argument("--mutants", type=pathlib.Path, default=ROOT / "mutants")
    parser.add_argument("--store", type=pathlib.Path, default=store_path())
    args = parser.parse_args(argv)
    if args.action == "save":
        if not args.mutants.is_dir():
            parser.error(f"{args.mutants} does not exist: run `tox -e mutation` first")
        print(f"kept {save(args.mutants, args.store)} verdicts in {args.store}")
    elif args.store.exists():
        print(f"restored {len(restore(args.store, args.mutants))} files' verdicts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

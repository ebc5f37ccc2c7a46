"""Render mutmut's results (``mutants/**/*.meta``): a summary (docs/mutation.md) and
every mutant that was not killed (``--details``, outside git by default).

Run from the repository root after ``mutmut run`` (``tox -e mutation`` does both). Each
surviving mutant is matched against ``tools/mutation/equivalent.toml`` by a stable key,
the mutated function's name in its module plus the mutated line text (mutmut's numbering
changes whenever a function gains or loses a mutation site, a module path when a module
moves); a match counts as *equivalent*, any other survivor is listed in the summary as
behaviour the tests do not pin down.

    python -m tools.mutation.report [--mutants DIR] [--equivalents FILE] [--out FILE]
        [--details FILE]

The diffs come from mutmut itself (``mutmut show``), so the report needs mutmut installed
(it is, in the tox env).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterable, Sequence

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = [
    "Mutant",
    "load_equivalents",
    "load_mutants",
    "main",
    "mutmut_executable",
    "render",
    "render_details",
    "stale_equivalents",
]

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent

#: mutmut 3's exit codes (mutmut/stats.py), grouped as the report counts them.
_STATUS = {
    1: "killed",
    3: "killed",
    37: "killed",  # by the type checker
    -11: "killed",  # a segfault is a detected change
    -9: "timeout",  # SIGKILL: past the CPU-time limit (mutmut calls it a segfault)
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    None: "not run",
}
COLUMNS = ("mutants", "killed", "equivalent", "survived", "timeout", "no tests", "not run")


@dataclasses.dataclass
class Mutant:
    name: str  # mutmut's, e.g. rnn_rewrite_rules.shape.semantics.x_reshape__mutmut_3
    path: str  # the source file, relative to the repository root
    status: str
    duration: float | None
    diff: str = ""
    reason: str | None = None  # why it is equivalent, when it is

    @property
    def module(self) -> str:
        return self.name.rpartition("__mutmut_")[0].rpartition(".")[0]

    @property
    def qualname(self) -> str:
        """The mutated function's name in its module: ``reshape``, ``Reshape.apply``."""
        function = self.name.rpartition("__mutmut_")[0].rpartition(".")[2]
        if function.startswith("xǁ"):
            return ".".join(function.split("ǁ")[1:])
        return function.removeprefix("x_")

    @property
    def function(self) -> str:
        """The mutated function, readable: ``semantics.reshape``, ``ops.Reshape.apply``."""
        return f"{self.module.rpartition('.')[2]}.{self.qualname}"

    @property
    def mutated_lines(self) -> list[str]:
        return [line[1:].strip() for line in _changed(self.diff, "+")]

    @property
    def original_lines(self) -> list[str]:
        return [line[1:].strip() for line in _changed(self.diff, "-")]

    @property
    def key(self) -> tuple[str, str]:
        """(:attr:`qualname`, mutated lines); a mutant that only deletes lines is keyed by
        what it deletes, ``deleted: <line>``."""
        text = " / ".join(self.mutated_lines)
        if not text and self.original_lines:
            text = "deleted: " + " / ".join(self.original_lines)
        return self.qualname, text


def _changed(diff: str, sign: str) -> list[str]:
    return [
        line
        for line in diff.splitlines()
        if line.startswith(sign) and not line.startswith(sign * 3)
    ]


def load_mutants(mutants_dir: pathlib.Path) -> list[Mutant]:
    """Every mutant mutmut generated, with its last verdict (``not run`` if never run)."""
    found = []
    for meta_path in sorted(mutants_dir.rglob("*.py.meta")):
        meta = json.loads(meta_path.read_text())
        source = meta_path.relative_to(mutants_dir).with_suffix("").as_posix()
        durations = meta.get("durations_by_key", {})
        for name, code in sorted(meta["exit_code_by_key"].items(), key=_natural):
            status = _STATUS.get(code, "suspicious")
            found.append(Mutant(name, source, status, durations.get(name)))
    return found


def _natural(item: tuple[str, object]) -> tuple[str, int]:
    base, _, number = item[0].rpartition("__mutmut_")
    return base, int(number) if number.isdigit() else 0


def load_equivalents(path: pathlib.Path) -> dict[tuple[str, str], str]:
    """``(function, mutated line text) -> reason`` from the equivalents file."""
    if not path.exists():
        return {}
    entries = tomllib.loads(path.read_text()).get("equivalent", [])
    table = {}
    for entry in entries:
        missing = {"function", "mutated", "reason"} - entry.keys()
        if missing:
            raise SystemExit(f"{path}: an [[equivalent]] entry lacks {sorted(missing)}: {entry}")
        table[entry["function"], entry["mutated"]] = entry["reason"]
    return table


def mutmut_executable() -> str | None:
    """The mutmut beside this interpreter (the tox env's), else the one on PATH."""
    beside = shutil.which("mutmut", path=str(pathlib.Path(sys.executable).parent))
    return beside or shutil.which("mutmut")


def _show(names: Iterable[str]) -> dict[str, str]:
    """mutmut's diff of each mutant (``mutmut show``)."""
    executable = mutmut_executable()
    if executable is None:
        raise SystemExit("mutmut is not installed: run this in `tox -e mutation`")
    diffs = {}
    for name in names:
        shown = subprocess.run(
            [executable, "show", name], capture_output=True, text=True, check=False
        )
        diffs[name] = shown.stdout if shown.returncode == 0 else f"(mutmut show failed: {name})"
    return diffs


def _cell(text: str) -> str:
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`" if text else ""


def _seconds(values: Sequence[float]) -> str:
    if not values:
        return ""
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def _counts(
    mutants: Sequence[Mutant],
) -> tuple[dict[str, collections.Counter], dict[str, list[float]]]:
    """Per source file and ``"total"``: the mutants by status, and their durations."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    durations: dict[str, list[float]] = collections.defaultdict(list)
    for mutant in mutants:
        status = "equivalent" if mutant.reason is not None else mutant.status
        for module in (mutant.path, "total"):
            counts[module]["mutants"] += 1
            counts[module][status] += 1
            # 0.0: not measured (mutmut's forkserver workers record no duration)
            if mutant.duration and status != "not run":
                durations[module].append(mutant.duration)
    return counts, durations


def render(mutants: Sequence[Mutant], stale: Sequence[tuple[str, str]] = ()) -> str:
    """The summary page: how to run, the counts per module, survivors without a reason."""
    counts, durations = _counts(mutants)
    lines = [
        "# Mutation testing",
        "",
        "Generated by `tools/mutation/report.py` from the last `tox -e mutation` run;",
        "do not edit. Each mutant is one small change to a module that proves things (the",
        "shape prover, the rules' checks, the weight-folding evaluator, the verify",
        "comparison), run against the torch-free tests that reach the mutated function",
        "(`[tool.mutmut]` in pyproject.toml). *Killed*: a test failed (a *timeout* is a",
        "kill too). *Equivalent*: it survived, and `tools/mutation/equivalent.toml` says why",
        "no test can tell it apart. *Survived*: a behaviour change no test catches.",
        "",
        "```console",
        "$ nice -n 15 tox -e mutation                          # every mutant: hours on 2 cores",
        "$ nice -n 15 tox -e mutation -- --changed-since main  # the functions changed since main",
        "$ nice -n 15 tox -e mutation -- 'rnn_rewrite_rules.shape.values.*'  # by mutmut's names",
        "```",
        "",
        "mutmut keeps each verdict in `mutants/` (git-ignored); `tox -e mutation` also keeps",
        "them in a verdict store outside git (`build/mutation/verdicts.json`, or the path in",
        "`RNN_REWRITE_MUTATION_STORE`) and restores them into a fresh `mutants/`, where",
        "mutmut resets those of every function whose source changed. The counts below add",
        "up the runs whose verdicts the store holds. Every mutant that was not killed, with",
        "its diff and reason, is in `build/mutation/mutants.md` after a run. A survivor",
        "gets a near-miss test in its subject's test file; one that cannot, an entry in",
        "`tools/mutation/equivalent.toml` (function name, mutated line, and why).",
        "`tools/mutation/order.py` orders each mutant's tests fastest first, fails a test",
        "that runs past 5x its recorded time, and maps the functions mutmut cannot see run",
        "(a rule's `pattern` and `__init__`, run at import; the command's child process).",
        "",
        "| module | " + " | ".join(COLUMNS) + " | seconds per mutant (median / max) |",
        "| --- | " + " | ".join("---:" for _ in COLUMNS) + " | ---: |",
    ]
    for module in [*sorted(m for m in counts if m != "total"), "total"]:
        label = f"**{module}**" if module == "total" else f"`{module}`"
        row = [str(counts[module][c]) for c in COLUMNS]
        lines.append(f"| {label} | " + " | ".join(row) + f" | {_seconds(durations[module])} |")
    needs_tests = [m for m in mutants if m.status == "survived" and m.reason is None]
    lines += ["", "## Survivors without a reason", ""]
    if not needs_tests:
        lines.append("None.")
    else:
        lines += [
            f"* `{m.function}`: {_cell(' / '.join(m.original_lines))} -> "
            f"{_cell(' / '.join(m.mutated_lines))}"
            for m in needs_tests
        ]
    unreached = [m for m in mutants if m.status in ("suspicious", "no tests")]
    if unreached:
        lines += ["", "## Mutants no test reaches", ""]
        lines += [
            f"* `{m.function}` {m.status}: {_cell(' / '.join(m.mutated_lines))}" for m in unreached
        ]
    if stale:
        lines += ["", "## Equivalents that matched no surviving mutant", ""]
        lines += [f"* `{function}`: {_cell(text)}" for function, text in stale]
    return "\n".join(lines) + "\n"


def render_details(mutants: Sequence[Mutant]) -> str:
    """Every mutant that was not killed, one row each, with its reason when equivalent."""
    lines = ["# Mutants not killed", ""]
    survivors = [m for m in mutants if m.status == "survived"]
    lines += [
        "| mutant | function | original | mutated | equivalent because |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in survivors:
        number = m.name.rpartition("__mutmut_")[2]
        reason = m.reason if m.reason is not None else "**not equivalent: needs a test**"
        lines.append(
            f"| {number} | `{m.function}` | {_cell(' / '.join(m.original_lines))} "
            f"| {_cell(' / '.join(m.mutated_lines))} | {reason} |"
        )
    others = [m for m in mutants if m.status in ("timeout", "suspicious", "no tests")]
    if others:
        lines += ["", "## Timeouts and mutants no test reaches", ""]
        lines += [
            f"* `{m.function}` {m.status}: {_cell(' / '.join(m.mutated_lines))}" for m in others
        ]
    return "\n".join(lines) + "\n"


def stale_equivalents(
    mutants: Sequence[Mutant], equivalents: dict[tuple[str, str], str]
) -> list[tuple[str, str]]:
    """Entries that match no surviving mutant of a function whose mutants were run (an
    entry for a function not run yet cannot be checked, and is kept)."""
    run = {m.key[0] for m in mutants if m.status != "not run"}
    survivors = {m.key for m in mutants if m.status == "survived"}
    return sorted(key for key in equivalents if key[0] in run and key not in survivors)


def _write(path: pathlib.Path, text: str) -> None:
    """Replace ``path`` whole (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=pathlib.Path, default=ROOT / "mutants")
    parser.add_argument("--equivalents", type=pathlib.Path, default=HERE / "equivalent.toml")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "mutation.md")
    parser.add_argument(
        "--details", type=pathlib.Path, default=ROOT / "build" / "mutation" / "mutants.md"
    )
    args = parser.parse_args(argv)
    if not args.mutants.is_dir():
        parser.error(f"{args.mutants} does not exist: run `tox -e mutation` first")
    mutants = load_mutants(args.mutants)
    if not mutants:
        parser.error(f"{args.mutants} holds no mutmut results")
    shown = [m for m in mutants if m.status in ("survived", "timeout", "suspicious", "no tests")]
    diffs = _show(m.name for m in shown)
    for m in shown:
        m.diff = diffs[m.name]
    equivalents = load_equivalents(args.equivalents)
    for m in mutants:
        if m.status == "survived" and m.key in equivalents:
            m.reason = equivalents[m.key]
    _write(args.out, render(mutants, stale_equivalents(mutants, equivalents)))
    _write(args.details, render_details(mutants))
    print(f"wrote {args.out} and {args.details}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Render mutmut's results (``mutants/**/*.meta``) as docs/mutation.md.

Run from the repository root after ``mutmut run`` (``tox -e mutation`` does both). Each
surviving mutant is matched against ``tests/mutation_equivalent.toml`` by a stable key,
the mutated function plus the mutated line text (mutmut's numbering changes whenever a
function gains or loses a mutation site); a match counts as *equivalent* and shows the
file's reason, any other survivor is listed as behaviour the tests do not pin down.

    python benchmarks/mutation_report.py [--mutants DIR] [--equivalents FILE] [--out FILE]

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

__all__ = ["Mutant", "load_equivalents", "load_mutants", "main", "render", "stale_equivalents"]

ROOT = pathlib.Path(__file__).resolve().parent.parent

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
    def function(self) -> str:
        """The mutated function, readable: ``semantics.reshape``, ``ops.ǁReshapeǁapply``."""
        mangled = self.name.rpartition("__mutmut_")[0]
        module, _, function = mangled.rpartition(".")
        function = function.removeprefix("x_").replace("xǁ", "").replace("ǁ", ".")
        return f"{module.rpartition('.')[2]}.{function.strip('.')}"

    @property
    def mutated_lines(self) -> list[str]:
        return [line[1:].strip() for line in _changed(self.diff, "+")]

    @property
    def original_lines(self) -> list[str]:
        return [line[1:].strip() for line in _changed(self.diff, "-")]

    @property
    def key(self) -> tuple[str, str]:
        """(mangled function, mutated lines); a mutant that only deletes lines is keyed by
        what it deletes, ``deleted: <line>``."""
        text = " / ".join(self.mutated_lines)
        if not text and self.original_lines:
            text = "deleted: " + " / ".join(self.original_lines)
        return self.name.rpartition("__mutmut_")[0], text


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


def _show(names: Iterable[str]) -> dict[str, str]:
    """mutmut's diff of each mutant (``mutmut show``)."""
    executable = shutil.which("mutmut", path=str(pathlib.Path(sys.executable).parent))
    executable = executable or shutil.which("mutmut")
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


def render(mutants: Sequence[Mutant], stale: Sequence[tuple[str, str]] = ()) -> str:
    """The Markdown report."""
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
    lines = [
        "# Mutation testing",
        "",
        "Generated by `benchmarks/mutation_report.py` from the last `tox -e mutation` run;",
        "do not edit. Each mutant is one small change to a module that proves things (the",
        "shape prover, the rules' checks, the weight-folding evaluator, the verify",
        "comparison), run against the torch-free tests that reach the mutated function",
        "(`[tool.mutmut]` in pyproject.toml). *Killed*: a test failed. *Equivalent*: it",
        "survived, and `tests/mutation_equivalent.toml` says why no test can tell it apart.",
        "*Survived*: a behaviour change no test catches. *Not run*: generated but outside",
        "the runs so far.",
        "",
        "```console",
        "$ nice -n 15 tox -e mutation                # every mutant in scope: hours on 2 cores",
        "$ nice -n 15 tox -e mutation -- 'rnn_rewrite_rules.shape.values.*'  # a module",
        "$ python benchmarks/mutation_report.py      # this page again, from mutants/",
        "```",
        "",
        "mutmut keeps each verdict in `mutants/` (git-ignored): a run without names resumes,",
        "named mutants are rerun, a change of the test selection resets them all. `tox -e",
        "mutation` keeps them in `docs/mutation.json` too and restores them into a fresh",
        "`mutants/` (`benchmarks/mutation_verdicts.py`), where mutmut resets those of every",
        "function whose source changed: the counts below add up runs of several days,",
        "each verdict reached with the tests of its run. A survivor",
        "gets a near-miss test (`tests/test_mutants_*.py` and the family's own tests); one",
        "that cannot, an entry in `tests/mutation_equivalent.toml` (function + mutated line,",
        "and why). mutmut does not mutate decorated functions: every `@property` is outside",
        "its reach (`shape/ops.py` registers its transfer functions from a table for this",
        "reason). The command's tests (marker `command`) run the mutant in their child",
        "process (`tests.support.child_env`); tests that measure a child (`subprocess`) are",
        "left out. `tests/mutation_order.py` runs each mutant's fastest tests first, fails a",
        "test that runs past 5x its recorded time (a hang counts as a kill), maps a rule's",
        "`pattern` and `__init__`, which run at import, to the tests of the rule's other",
        "methods, and the command's tests to every function of `_verify` and `runtime`,",
        "whose calls in the child mutmut cannot see. `pattern` and `__init__` need the package",
        'imported after the mutant is chosen: `process_isolation = "forkserver"` (the',
        "default in pyproject.toml); `fork` is faster for every other function.",
        "",
        "| module | " + " | ".join(COLUMNS) + " | seconds per mutant (median / max) |",
        "| --- | " + " | ".join("---:" for _ in COLUMNS) + " | ---: |",
    ]
    for module in [*sorted(m for m in counts if m != "total"), "total"]:
        label = f"**{module}**" if module == "total" else f"`{module}`"
        row = [str(counts[module][c]) for c in COLUMNS]
        lines.append(f"| {label} | " + " | ".join(row) + f" | {_seconds(durations[module])} |")
    survivors = [m for m in mutants if m.status == "survived"]
    lines += ["", "## Surviving mutants", ""]
    if not survivors:
        lines.append("None.")
    else:
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
    if stale:
        lines += ["", "## Equivalents that matched no surviving mutant", ""]
        lines += [f"* `{function}`: {_cell(text)}" for function, text in stale]
    return "\n".join(lines) + "\n"


def stale_equivalents(
    mutants: Sequence[Mutant], equivalents: dict[tuple[str, str], str]
) -> list[tuple[str, str]]:
    """Entries that match no surviving mutant of a function whose mutants were run (an
    entry for a function not run yet cannot be checked, and is kept)."""
    run = {m.key[0] for m in mutants if m.status != "not run"}
    survivors = {m.key for m in mutants if m.status == "survived"}
    return sorted(key for key in equivalents if key[0] in run and key not in survivors)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=pathlib.Path, default=ROOT / "mutants")
    parser.add_argument(
        "--equivalents", type=pathlib.Path, default=ROOT / "tests" / "mutation_equivalent.toml"
    )
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "mutation.md")
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
    text = render(mutants, stale_equivalents(mutants, equivalents))
    temporary = args.out.with_suffix(".md.tmp")
    temporary.write_text(text)
    temporary.replace(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

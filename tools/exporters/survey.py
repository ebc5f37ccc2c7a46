"""What today's rules do to every committed exporter output.

    python -m tools.exporters.survey [--exporter NAME ...] [--out FILE] [--json FILE]
                                     [--markdown docs/exporters.md [--no-timing]]

For each exporter (every ``tests/data/exporters/*/manifest.json``, whoever wrote it): a
table of file, nodes before -> after, recurrent ops (LSTM/GRU/RNN/Loop/Scan) before ->
after, then why each recurrence was left alone, in the package's own words (the report
of :func:`rnn_rewrite_rules.rewrite_file` with ``hazards=True``, i.e. ``rnn-rewrite
--check``), and a summary: files smaller, recurrences left, reasons grouped.

``--markdown FILE`` also (re)writes FILE's generated table (:mod:`tools.exporters.table`),
with ONNX Runtime's time ratio of each rewritten file unless ``--no-timing``.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.exporter_files import DATA, ExporterFile, exporter_files, load_manifests

import rnn_rewrite_rules
from rnn_rewrite_rules import RewriteOptions
from rnn_rewrite_rules.rules.loop_scan.zero_step import EXACT_BRANCH_REASON
from tools.exporters import table

#: Op types counted as recurrences (subgraphs included; domains kept in the name).
RECURRENT = ("LSTM", "GRU", "RNN", "Loop", "Scan", "com.microsoft.DynamicQuantizeLSTM")
#: What the reason of a Loop kept in an exact zero-step branch says (``loop_scan``).
EXACT_BRANCH_TEXT = EXACT_BRANCH_REASON.partition(":")[0]
#: Hazard kinds worth naming in the survey though no rule targets them.
NAMED_HAZARDS = ("frozen-axis", "exporter-bug", "declared-output-shape")


@dataclasses.dataclass
class Row:
    file: str
    expect: str
    nodes: tuple[int, int] = (0, 0)
    recurrent: tuple[dict[str, int], dict[str, int]] = ({}, {})
    #: Why recurrences were left alone (or the model found none), one line each.
    reasons: list[str] = dataclasses.field(default_factory=list)
    error: str = ""

    @property
    def smaller(self) -> bool:
        return not self.error and self.nodes[1] < self.nodes[0]

    @property
    def exact(self) -> int:
        """Loops left in exact zero-step branches (``loop_scan``: kept as written where they
        run no step, a node beside them for the steps), by their reasons."""
        return sum(EXACT_BRANCH_TEXT in reason for reason in self.reasons)


def _recurrent(op_counts: collections.Counter[str]) -> dict[str, int]:
    return {op: op_counts[op] for op in RECURRENT if op_counts[op]}


def survey_file(file: ExporterFile, out: Path | None = None, hazards: bool = True) -> Row:
    """What the default rewrite does to ``file`` (written to ``out`` when given; nothing
    is written where the model has no recurrence); ``hazards=False`` leaves out the
    reasons ``--check`` gives (the node and op counts are the same)."""
    try:
        report = rnn_rewrite_rules.rewrite_file(file.path, out, RewriteOptions(hazards=hazards))
    except rnn_rewrite_rules.NoRecurrence as nothing:  # nothing written: the report says why
        report = nothing.report
    except Exception as error:  # the survey reports, it does not stop
        return error_row(file, error)
    return report_row(file, report)


def error_row(file: ExporterFile, error: Exception) -> Row:
    """The row of a file ``rewrite_file`` raised ``error`` on (not NoRecurrence)."""
    row = Row(file.path.name, file.expect)
    # the message names the file by the path it was read from: the table names it alone
    message = " ".join(str(error).replace(str(file.path), file.path.name).split())
    row.error = f"{type(error).__name__}: {message[:300]}"
    return row


def report_row(file: ExporterFile, report: rnn_rewrite_rules.Report) -> Row:
    """The row of ``rewrite_file``'s ``report`` on ``file`` (a NoRecurrence's included)."""
    row = Row(file.path.name, file.expect)
    row.nodes = (report.before.nodes, report.after.nodes)
    row.recurrent = (_recurrent(report.before.op_counts), _recurrent(report.after.op_counts))
    for item in report.unimproved:
        row.reasons += [f"{item.node}: {reason}" for reason in item.reasons] or [
            f"{item.node}: {hazard}" for hazard in item.hazards
        ]
    row.reasons += [f"kept unrolled: {d.reason}" for d in report.kept_unrolled]
    row.reasons += [
        f"{h.kind}: {h.node}: {h.message}"
        for h in report.hazards_after or ()
        if h.kind in NAMED_HAZARDS
    ]
    guards = report.after.zero_step_loops
    left = {**row.recurrent[1], "Loop": row.recurrent[1].get("Loop", 0) - guards}
    left = {op: n for op, n in left.items() if n}
    if report.found_no_recurrence:
        row.reasons.append("no recurrence found (no RNN/LSTM/GRU node, no recurrence recognised)")
    elif not row.reasons and (row.nodes[1] == row.nodes[0] or _loops(left)):
        if row.nodes[1] != row.nodes[0]:  # rewritten: the Loops and Scans left
            left = {op: n for op, n in left.items() if op in ("Loop", "Scan")}
        row.reasons.append(
            f"{_ops(left)} left as written: the report gives no reason "
            "(--check finds no hazard a rule targets)"
        )
    if guards:
        row.reasons.append(
            f"Loop {guards} of zero-step guards (in the If branch taken where X is empty):"
            " holds no cell, passes the initial state through"
        )
    return row


def _loops(counts: dict[str, int]) -> int:
    return counts.get("Loop", 0) + counts.get("Scan", 0)


def _ops(counts: dict[str, int]) -> str:
    return ", ".join(f"{op} {n}" for op, n in counts.items()) or "-"


def reason_key(reason: str) -> str:
    """A reason without the names of the nodes and values it is about (for grouping)."""
    # a quoted name opens after a non-word character: X's and guard's are not quotes
    text = re.sub(r"(?<!\w)'[^']*'(?!\w)|\"[^\"]*\"", "'…'", reason)
    text = re.sub(r"[\w./-]+:\d+(\[\d+\])?", "…", text)  # tf value names: a/b:0[1]
    return re.sub(r"\b\d+\b", "N", text)


def format_exporter(name: str, header: dict, rows: Sequence[Row]) -> list[str]:
    versions = ", ".join(f"{k} {v}" for k, v in header.get("versions", {}).items())
    smaller = sum(r.smaller for r in rows)
    left = sum(sum(r.recurrent[1].values()) for r in rows)
    exact = sum(r.exact for r in rows)
    kept = f" ({exact} of them Loops left in exact zero-step branches)" if exact else ""
    lines = [f"== {name}: {len(rows)} files, {smaller} smaller, {left} recurrent ops left{kept} =="]
    lines.append(f"   {versions}")
    width = max([len("file"), *(len(r.file) for r in rows)])
    lines.append(f"{'file':<{width}}  {'nodes':>11}  recurrent ops before -> after")
    for row in rows:
        if row.error:
            lines.append(f"{row.file:<{width}}  ERROR {row.error}")
            continue
        nodes = f"{row.nodes[0]} -> {row.nodes[1]}"
        recurrent = f"{_ops(row.recurrent[0])} -> {_ops(row.recurrent[1])}"
        expect = "" if row.expect == "rewrite" else f"  [expect {row.expect.split(':')[0]}]"
        lines.append(f"{row.file:<{width}}  {nodes:>11}  {recurrent}{expect}")
    lines.append("why left alone:")
    for row in rows:
        for reason in row.reasons:
            lines.append(f"  {row.file}: {reason}")
    groups = collections.Counter(reason_key(r) for row in rows for r in set(row.reasons))
    lines.append("reasons grouped (files):")
    ordered = sorted(groups.items(), key=lambda item: (-item[1], item[0]))  # same order each run
    lines += [f"  {n:>3} x {key}" for key, n in ordered]
    return lines


def _changed(row: Row) -> bool:
    return not row.error and (row.nodes[0] != row.nodes[1] or row.recurrent[0] != row.recurrent[1])


def _survey(
    chosen: Sequence[ExporterFile], written: bool, timed: bool
) -> tuple[dict[str, list[Row]], dict[str, dict[str, table.Timing | str]]]:
    """Each file's row by exporter; with ``written`` and ``timed``, ONNX Runtime's time
    ratio of each file the rewrite changed (the rewritten file kept while it is timed)."""
    by_exporter: dict[str, list[Row]] = collections.defaultdict(list)
    timings: dict[str, dict[str, table.Timing | str]] = collections.defaultdict(dict)
    with tempfile.TemporaryDirectory() as tmp:
        for file in chosen:
            out = Path(tmp, f"{file.exporter}_{file.path.name}") if written else None
            row = survey_file(file, out)
            by_exporter[file.exporter].append(row)
            if timed and out is not None and out.exists() and _changed(row):
                timings[file.exporter][row.file] = table.time_ratio(file, out)
    return by_exporter, timings


def _provenance() -> str:
    """Which commit and runtime the table comes from."""
    import onnx
    import onnxruntime

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    state = f"{commit} + uncommitted changes" if dirty else commit
    return (
        f"Commit {state}; rnn-rewrite-rules {rnn_rewrite_rules.__version__}, onnxruntime"
        f" {onnxruntime.__version__}, onnx {onnx.__version__}, python"
        f" {platform.python_version()}."
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.exporters.survey", description=__doc__)
    parser.add_argument("--exporter", nargs="+", help="only these exporters")
    parser.add_argument("--root", type=Path, default=DATA, help="the exporters' data folder")
    parser.add_argument("--out", type=Path, help="also write the text here")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    parser.add_argument("--markdown", type=Path, help="rewrite this file's generated table")
    parser.add_argument("--no-timing", action="store_true", help="leave out the ORT ratios")
    args = parser.parse_args(argv)
    headers = {m["exporter"]: m for _, m in load_manifests(args.root)}
    chosen = [f for f in exporter_files(args.root) if f.exporter in (args.exporter or [f.exporter])]
    by_exporter, timings = _survey(chosen, written=bool(args.markdown), timed=not args.no_timing)
    if args.markdown:
        files = table.by_name(chosen)
        section = table.format_section(by_exporter, headers, files, timings, _provenance())
        args.markdown.write_text(table.replace_section(args.markdown.read_text(), section))
    lines = []
    for name, rows in by_exporter.items():
        lines += [*format_exporter(name, headers[name], rows), ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        data = {name: [dataclasses.asdict(r) for r in rows] for name, rows in by_exporter.items()}
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A rewrite timed against the graph it replaces, on a grid of sizes (issue 32).

The harness of ``benchmarks.merge_costs`` and ``benchmarks.broadcast_costs``: a
:class:`Case` builds the original and the rewritten model for an op and a hidden size, and
feeds for a sequence length and batch; this times both side by side per runtime (ONNX
Runtime with default optimizations, OpenVINO when installed; one thread): ``repeats``
repeats of ``rounds`` interleaved rounds, best of each. A point's ratio is
best(rewritten) / best(original); its spread is the lowest and highest per-repeat ratio; a
point is *slower* when even the lowest per-repeat ratio is above :data:`NOISE`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import pathlib
from collections.abc import Callable, Sequence

import numpy as np
import onnx

import rnn_rewrite_rules
from benchmarks import measure, report
from benchmarks.cost_grid import recurrent_ops, versions
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.benchmark import best_per_repeat

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: A ratio above this (beyond its spread) is "slower".
NOISE = 1.03


@dataclasses.dataclass(frozen=True)
class Point:
    op: str
    hidden: int
    seq: int
    runtime: str
    ratio: float
    low: float
    high: float
    batch: int = 1


@dataclasses.dataclass(frozen=True)
class Case:
    """What is timed: ``build(op, hidden, seq)`` gives (original, rewritten), ``feeds(original,
    seq, batch)`` the inputs; the rest is what the generated page says."""

    module: str
    title: str
    description: str
    out: pathlib.Path
    build: Callable[[str, int, int], tuple[onnx.ModelProto, onnx.ModelProto]]
    feeds: Callable[[onnx.ModelProto, int, int], dict]
    ops: tuple[str, ...]
    seqs: tuple[int, ...]
    batches: tuple[int, ...] = (1,)
    hiddens: tuple[int, ...] = (64, 256, 512)
    #: A cost table the rule reads (``rnn_rewrite_rules/costs/<form>.json``): the points as
    #: that form's (``costs.FORM_TABLES``); None: the page only.
    form: str | None = None
    #: Independent runs of the grid (``--runs``), each point their median (see
    #: :func:`median_of_runs`).
    runs: int = 1


def rerolled_cells(
    op: str, hidden: int, seq: int, **options
) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """An unrolled cell loop (``testing.unrolled.UnrolledCellConfig(**options)``, input size
    = hidden) and its re-rolled form (:func:`into_one`)."""
    from rnn_rewrite_rules.testing.unrolled import UnrolledCellConfig, build_unrolled_cell

    config = UnrolledCellConfig(
        op_type=op,  # type: ignore[arg-type]
        input_size=hidden,
        hidden_size=hidden,
        seq=seq,
        **options,
    )
    return into_one(build_unrolled_cell(config), op, f"{config}: not re-rolled")


def into_one(
    before: onnx.ModelProto, op: str, failure: str
) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``before`` and its rewrite, the cost table ignored (a grid measures the form the
    table is read for), which must leave one ``op`` node (else ``failure``)."""
    from rnn_rewrite_rules import costs

    after = rnn_rewrite_rules.rewrite(before, context=costs.Context(ignore=True))
    assert recurrent_ops(after.graph).count(op) == 1, failure
    return before, after


def cell_feeds(model: onnx.ModelProto, seq: int, batch: int) -> dict[str, np.ndarray]:
    """Random feeds for a cell loop of ``seq`` steps (static in the model): ``batch`` for
    every symbolic size (``batch``, ``state_batch``)."""
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        dims = [
            d.dim_value if d.HasField("dim_value") else batch
            for d in value.type.tensor_type.shape.dim
        ]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    assert seq in feeds["x"].shape[:2], (seq, feeds["x"].shape)
    return feeds


def cell_loop_case(
    module: str, title: str, description: str, *, form: str | None = None, **options
) -> Case:
    """The grid of a re-rolled cell loop (``UnrolledCellConfig(**options)``) against its
    steps: LSTM and GRU, seq 2/4/16, batch 1/8, its page ``docs/<module>.md``."""
    return Case(
        module=module,
        title=title,
        description=description,
        out=ROOT / "docs" / f"{module}.md",
        build=functools.partial(rerolled_cells, **options),
        feeds=cell_feeds,
        ops=("LSTM", "GRU"),
        seqs=(2, 4, 16),
        batches=(1, 8),
        form=form,
    )


def _callers(name: str, model: onnx.ModelProto, feeds: dict) -> Callable[[], object]:
    data = model.SerializeToString()
    if name == "onnxruntime":
        session = runtime.session(data)
        return lambda: session.run(None, feeds)
    from rnn_rewrite_rules import _openvino

    request = _openvino.compile_model(data, {"INFERENCE_NUM_THREADS": 1}).create_infer_request()
    return lambda: request.infer(feeds)


def measure_grid(
    case: Case,
    ops: list[str],
    hiddens: list[int],
    seqs: list[int],
    batches: list[int],
    repeats: int,
    rounds: int,
) -> list[Point]:
    names = ["onnxruntime"] + (["OpenVINO"] if measure.openvino_available() else [])
    points = []
    for op in ops:
        for hidden in hiddens:
            for seq in seqs:
                before, after = case.build(op, hidden, seq)
                for batch in batches:
                    feeds = case.feeds(before, seq, batch)
                    expected, actual = runtime.run(before, feeds), runtime.run(after, feeds)
                    diff = runtime.max_abs_diff(expected, actual)
                    assert diff <= 1e-4, f"{op} {hidden} {seq} {batch}: outputs differ by {diff}"
                    for name in names:
                        calls = {
                            "a": _callers(name, before, feeds),
                            "b": _callers(name, after, feeds),
                        }
                        times = best_per_repeat(calls, repeats=repeats, rounds=rounds, sample=0.005)
                        ratios = [b / a for a, b in zip(times["a"], times["b"], strict=True)]
                        ratio = min(times["b"]) / min(times["a"])
                        point = Point(op, hidden, seq, name, ratio, min(ratios), max(ratios), batch)
                        points.append(point)
                        print(f"{_label(point)}: {ratio:.2f}", flush=True)
    return points


def earlier_parts(rows: Sequence[dict]) -> str:
    """The ``rows`` measured at another time than their table (``measured``), by date:
    ``LSTM hidden 32/64, RNN hidden 32: 2026-12-06, commit a`` (empty: none)."""
    by_date: dict[str, dict[str, set[int]]] = {}
    for row in rows:
        if row.get("measured"):
            ops = by_date.setdefault(row["measured"], {})
            ops.setdefault(row["op"], set()).add(row["hidden"])
    return "; ".join(
        ", ".join(f"{op} hidden {'/'.join(map(str, sorted(h)))}" for op, h in sorted(ops.items()))
        + f": {date}"
        for date, ops in sorted(by_date.items())
    )


def kept_rows(table: dict | None, measured: set[tuple]) -> list[dict]:
    """``table``'s rows not ``measured`` again (keys :func:`row_key`), each with when it was
    measured (``measured``: the table's date where the row has none)."""
    if not table:
        return []
    date = table.get("measured", "")
    if "commit" in table.get("versions", {}):
        date += f", commit {table['versions']['commit']}"
    return [
        {**r, "measured": r.get("measured") or date}
        for r in table["points"]
        if row_key(r) not in measured
    ]


def row_key(row: dict) -> tuple:
    """A table row's cell and runtime: ``(op, hidden, seq, batch, runtime key)``."""
    return (row["op"], row["hidden"], row["seq"], row["batch"], row["runtime"])


def render(case: Case, points: list[Point], header: dict[str, str]) -> str:
    names = [name for name in _RUNTIME_KEYS if name in {p.runtime for p in points}]
    slower = [p for p in points if p.low > NOISE]
    lines = [
        f"# {case.title}",
        "",
        f"<!-- generated by `python -m benchmarks.{case.module}`: do not edit by hand -->",
        "",
        f"Commit {header['commit']}, {header['date']}; "
        + ", ".join(f"{k} {v}" for k, v in header.items() if k not in ("commit", "date"))
        + ".",
        "",
        case.description,
        "Best of interleaved rounds, the per-repeat spread in brackets;",
        f"*slower* where even the lowest per-repeat ratio is above {NOISE}.",
        "",
        f"Slower cells: {len(slower)} of {len(points)}"
        + ("." if not slower else ": " + ", ".join(_label(p) for p in slower) + "."),
        "",
        "| op | hidden | seq | batch | " + " | ".join(names) + " |",
        "|---|---|---|---|" + "---|" * len(names),
    ]
    keys = sorted({(p.op, p.hidden, p.seq, p.batch) for p in points})
    index = {(p.op, p.hidden, p.seq, p.batch, p.runtime): p for p in points}
    for op, hidden, seq, batch in keys:
        cells = []
        for name in names:
            p = index.get((op, hidden, seq, batch, name))
            cells.append("" if p is None else _cell(p))
        lines.append(f"| {op} | {hidden} | {seq} | {batch} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _label(p: Point) -> str:
    return f"{p.op} H={p.hidden} seq={p.seq} batch={p.batch} {p.runtime}"


def _cell(p: Point) -> str:
    text = f"{p.ratio:.2f} [{p.low:.2f}-{p.high:.2f}]"
    return f"**{text} slower**" if p.low > NOISE else text


def main(case: Case, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{case.module}")
    parser.add_argument("--ops", nargs="+", default=list(case.ops))
    parser.add_argument("--hidden", nargs="+", type=int, default=list(case.hiddens))
    parser.add_argument("--seq", nargs="+", type=int, default=list(case.seqs))
    parser.add_argument("--batch", nargs="+", type=int, default=list(case.batches))
    # 5 repeats: one grid of 3 showed a single-run 1.05x cell that three reruns put at 1.00x
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--runs", type=int, default=case.runs, help="independent runs of the grid (median)"
    )
    parser.add_argument("--quick", action="store_true", help="one op, hidden 8, two lengths")
    parser.add_argument("--out", type=pathlib.Path, default=case.out)
    parser.add_argument(
        "--table", type=pathlib.Path, default=None, help="the cost table to write (a form's)"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the table's points not measured again (each saying when it was measured)",
    )
    args = parser.parse_args(argv)
    if case.form is not None and args.table is None and not args.quick:
        args.table = ROOT / "src" / "rnn_rewrite_rules" / "costs" / f"{case.form}.json"
    if args.quick:
        args.ops, args.hidden, args.repeats, args.rounds = [case.ops[-1]], [8], 1, 2
        args.seq, args.batch, args.runs = list(case.seqs[:2]), [1], 1
    grid = (case, args.ops, args.hidden, args.seq, args.batch, args.repeats, args.rounds)
    runs = [measure_grid(*grid) for _ in range(max(args.runs, 1))]
    points = runs[0] if len(runs) == 1 else median_of_runs(runs)
    today = datetime.date.today().isoformat()
    header = {"commit": report.git_commit(), "date": today, **versions()}
    header["rnn-rewrite-rules"] = rnn_rewrite_rules.__version__
    old = None
    if args.keep and args.table is not None and args.table.exists():
        old = json.loads(args.table.read_text())
    data = table(case, points, header, runs) if case.form is not None else {"points": []}
    kept = kept_rows(old, {row_key(r) for r in data["points"]})
    if kept:
        parts = earlier_parts(kept)
        case = dataclasses.replace(
            case, description=f"{case.description}\nRows kept from an earlier run: {parts}."
        )
        points = [*points, *map(point_of_row, kept)]
    args.out.write_text(render(case, points, header))
    print(f"wrote {args.out}")
    if args.table is not None:
        data["points"] = kept + data["points"]
        args.table.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.table}")
    return 0


#: The harness's runtime names -> the cost table's keys (``costs.RUNTIMES``).
_RUNTIME_KEYS = {"onnxruntime": "ort", "OpenVINO": "openvino", "tract": "tract"}
#: The cost table's keys -> the harness's runtime names.
RUNTIME_NAMES = {key: name for name, key in _RUNTIME_KEYS.items()}


def point_of_row(row: dict) -> Point:
    """A cost table's row as the page's point."""
    name = RUNTIME_NAMES[row["runtime"]]
    return Point(row["op"], row["hidden"], row["seq"], name, row["ratio"], row["low"],
                 row["high"], row["batch"])  # fmt: skip


def median_of_runs(runs: list[list[Point]]) -> list[Point]:
    """Each point of independent runs of the grid as their median ratio, its spread the
    runs' ratios (a shared machine slows a whole run now and then: one run is not a
    measurement)."""
    merged = []
    for same in zip(*runs, strict=True):
        ratios = sorted(p.ratio for p in same)
        middle = ratios[len(ratios) // 2]
        median = middle if len(ratios) % 2 else (ratios[len(ratios) // 2 - 1] + middle) / 2
        first = same[0]
        merged.append(dataclasses.replace(first, ratio=median, low=ratios[0], high=ratios[-1]))
    return merged


def table(
    case: Case,
    points: list[Point],
    header: dict[str, str],
    runs: Sequence[list[Point]] = (),
) -> dict:
    """The points as a cost table of form ``case.form`` (``costs.CostTable.from_json``);
    of several ``runs`` (``points`` their medians), each run's ratio too."""
    data = _table(case, points, header)
    if len(runs) > 1:
        data["methods"] = {
            "builder": f"median of {len(runs)} independent runs of the grid, each: one "
            "thread; repeats x rounds interleaved, best of each; ratio = best(rewritten) / "
            "best(original); ratios = each run's"
        }
        for index, row in enumerate(data["points"]):
            row["ratios"] = [round(run[index].ratio, 4) for run in runs]
    return data


def _table(case: Case, points: list[Point], header: dict[str, str]) -> dict:
    return {
        "generated_by": f"python -m benchmarks.{case.module}",
        "measured": header["date"],
        "versions": {k: v for k, v in header.items() if k != "date"},
        "points": [
            {
                "runtime": _RUNTIME_KEYS[p.runtime],
                "op": p.op,
                "form": case.form,
                "direction": "forward",
                "hidden": p.hidden,
                "seq": p.seq,
                "batch": p.batch,
                "ratio": round(p.ratio, 4),
                "low": round(p.low, 4),
                "high": round(p.high, 4),
            }
            for p in points
        ],
    }

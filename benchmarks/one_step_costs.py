"""Is one streaming step no slower as one LSTM/GRU/RNN node? (issue 42)

    python -m benchmarks.one_step_costs              # the grid -> the two tables + docs page
    python -m benchmarks.one_step_costs --quick --out /tmp/s.md   # a smoke run

``one_step``'s ``OneStepCell`` turns one cell step written as plain ops (torch 2.13
``dynamo=True``'s ``nn.LSTMCell`` / ``nn.GRUCell`` / ``nn.RNNCell`` called once,
``rnn_rewrite_rules.testing.one_step``) into one node at seq 1. This grid times the
rewritten step side by side with the original per call (``benchmarks.rewrite_costs``:
interleaved rounds, best of each, one thread; ONNX Runtime and OpenVINO), input size =
hidden, in the two forms the rule emits, each its own table. A call is timed in CPU time
of this process (``time.process_time``: ONNX Runtime and OpenVINO run at one thread),
which the load of other processes on a shared machine does not inflate as it does wall
time; each point keeps its per-repeat ratios (``repeats``: the cost model drops glitches
and judges the spread).

* ``one_step`` (``costs/one_step.json``): a static batch: the node between ``Unsqueeze``
  and ``Squeeze``;
* ``one_step_guarded`` (``costs/one_step_guarded.json``): one symbolic batch the step's own
  ops prove equal (a VAD decoder's ``Concat(x, h)``): the node behind its batch-0 guard
  (``passes.BatchZeroGuardPass``: ONNX Runtime aborts on an LSTM/GRU node at batch 0),
  built from the static step given the symbolic batch (:func:`guarded_step`); LSTM and GRU;
* ``one_step_broadcast`` (``costs/one_step_broadcast.json``): a symbolic batch per input,
  what torch exports declare: the ``Expand``s that broadcast ``x`` and the states as the
  original's ops do, then the node behind its guard. The rule counts the nodes it emits, so
  only a GRU step of 16 nodes or more is rewritten in this form: the grid times the
  builder's GRU step with ``MatMul`` + ``Add`` projections (16 nodes, as jax2onnx writes
  it) and skips the others, saying so.

tract (``--runtimes``; by default every runtime installed) runs in a child process
(``benchmarks/tract_worker.py``), timed in that process's CPU time the same way; ``--keep``
keeps a table's points not measured again (``--runtimes tract --keep`` adds the tract
column, ``--hidden 8 --keep`` a row size), each with when it was measured, and the page
says when each column (and each part of one measured at another time) was measured.

For this form the issue counts parity within noise on a runtime as no slower: a call is
dominated by the runtime's per-call overhead, and the gain is the node count, the other
runtimes and int8 (``DynamicQuantizeLSTM`` needs an LSTM node). ``costs.CostTable.decide``
already fires on a cell within noise whose neighbours are not slower; a cell slower beyond
noise keeps the step as plain ops.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import os
import pathlib
import tempfile
import time

import numpy as np
import onnx
import onnx_ir as ir

import rnn_rewrite_rules
from benchmarks import measure, report, rewrite_costs
from benchmarks.cost_grid import recurrent_ops, versions
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules._rnn_ops import mark_replaces_batch_0_run
from rnn_rewrite_rules.benchmark import best_per_repeat
from rnn_rewrite_rules.passes.batch_zero_guard import BatchZeroGuardPass, guarded_branch
from rnn_rewrite_rules.testing.one_step import StepConfig, build_step, step_feeds

__all__ = ["BROADCAST_OPS", "CASES", "GUARDED_OPS", "guarded_step", "main"]

ROOT = pathlib.Path(__file__).resolve().parent.parent
COSTS = ROOT / "src" / "rnn_rewrite_rules" / "costs"


def rewritten_step(
    op: str, hidden: int, seq: int, *, batch: int | str, gemm: bool = True
) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """A step model (input size = hidden) and its one-node form (the node, or its batch-0
    guard), the cost table ignored."""
    from rnn_rewrite_rules import costs

    assert seq == 1, "a step is one frame"
    cfg = StepConfig(op_type=op, input_size=hidden, hidden_size=hidden, batch=batch, gemm=gemm)
    before = build_step(cfg)
    after = rnn_rewrite_rules.rewrite(
        before, context=costs.Context(ignore=True), target="onnxruntime"
    )
    assert recurrent_ops(after.graph).count(op) == 1, f"{op} {hidden}: not rewritten"
    return before, after


def guarded_step(op: str, hidden: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``one_step_guarded``: the step of a static batch and its node, both given the symbolic
    batch ``batch`` (as a step whose own ops prove the batches equal declares them) and the
    node put behind its batch-0 guard (``passes.BatchZeroGuardPass``), as the rule emits it."""
    before, after = rewritten_step(op, hidden, 1, batch=1)
    before, after = _symbolic_batch(before), _symbolic_batch(after)
    model = ir.from_proto(after)
    (node,) = [n for n in model.graph if n.op_type == op]
    mark_replaces_batch_0_run(node.outputs[0])
    BatchZeroGuardPass()(model)
    after = ir.to_proto(model)
    assert any(guarded_branch(n) is not None for n in after.graph.node), f"{op}: not guarded"
    return before, after


def _symbolic_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its inputs' and outputs' first axis ``batch``, value_info dropped."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    del model.graph.value_info[:]
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    return model


def _feeds(model: onnx.ModelProto, seq: int, batch: int) -> dict:
    del seq
    return step_feeds(model, batch)


def _case(form: str, description: str) -> rewrite_costs.Case:
    return rewrite_costs.Case(
        module="one_step_costs",
        title="One streaming step as one node",
        description=description,
        out=ROOT / "docs" / "one_step_costs.md",
        build=functools.partial(rewritten_step, batch="batch"),
        feeds=_feeds,
        ops=("LSTM", "GRU", "RNN"),
        seqs=(1,),
        batches=(1, 4),
        # hidden 8: the size of many committed exporter files (tests/data)
        hiddens=(8, 32, 64, 128, 256, 512),
        form=form,
    )


CASES = {
    "one_step": _case("one_step", "Static batch: Unsqueeze, one node, Squeeze."),
    "one_step_guarded": _case(
        "one_step_guarded",
        "One symbolic batch the step proves equal: Unsqueeze, the node in its batch-0 guard "
        "(If(Size(X) == 0)), Squeeze. RNN has no guard (ONNX Runtime's RNN runs at batch 0).",
    ),
    "one_step_broadcast": _case(
        "one_step_broadcast",
        "Symbolic batches: Expands broadcasting x and the states, one node in its batch-0 "
        "guard (a GRU step with MatMul + Add projections, 16 nodes).",
    ),
}


#: The ops whose builder step the rule rewrites in the ``one_step_broadcast`` form: its
#: GRU step with MatMul + Add projections (16 nodes; the node, the Expands and the guard
#: are 16). Its LSTM steps would grow; RNN has no guard; the table's LSTM and RNN rows
#: were measured before the rule counted.
BROADCAST_OPS = ("GRU",)
#: The ops the rule guards (``one_step_guarded``).
GUARDED_OPS = ("LSTM", "GRU")
#: The harness's runtime names, in the tables' column order.
RUNTIMES = ("onnxruntime", "OpenVINO", "tract")


def available() -> list[str]:
    """The runtimes installed here."""
    found = {"onnxruntime": True, "OpenVINO": measure.openvino_available()}
    found["tract"] = measure.tract_available()
    return [name for name in RUNTIMES if found[name]]


def _tract_times(
    before: onnx.ModelProto, after: onnx.ModelProto, feeds: dict, args: argparse.Namespace
) -> dict[str, list[float]]:
    """Per model, its best CPU seconds per call per repeat in one tract process, once tract
    gives ONNX Runtime's outputs on the rewritten step (a child process: a tract panic
    aborts the process it runs in)."""
    with tempfile.TemporaryDirectory(prefix="one_step_tract_") as workdir:
        paths = {}
        for key, model in (("a", before), ("b", after)):
            paths[key] = os.path.join(workdir, f"{key}.onnx")
            onnx.save(model, paths[key])
        names = [i.name for i in before.graph.input]
        feeds_path = os.path.join(workdir, "feeds.npz")
        np.savez(feeds_path, **feeds)
        (probe,) = measure.tract_probe(
            [paths["b"]], names, [feeds_path], [os.path.join(workdir, "b_out")], timeout=300
        )
        (outputs,) = probe.outputs
        assert outputs is not None, f"tract cannot run the rewritten step: {probe.error}"
        diff = runtime.max_abs_diff(runtime.run(after, feeds), outputs)
        assert diff <= 1e-4, f"tract differs from ONNX Runtime by {diff}"
        times = measure.tract_repeats(
            paths,
            names,
            feeds_path,
            repeats=args.repeats,
            rounds=args.rounds,
            sample=args.sample,
            workdir=workdir,
            timeout=1200,
        )
    assert not isinstance(times, str), f"tract timing failed: {times}"
    return times


def _times(
    name: str,
    before: onnx.ModelProto,
    after: onnx.ModelProto,
    feeds: dict,
    args: argparse.Namespace,
) -> dict[str, list[float]]:
    """Best CPU seconds per call per repeat of the original (``a``) and the rewrite (``b``)."""
    if name == "tract":
        return _tract_times(before, after, feeds, args)
    calls = {
        "a": rewrite_costs._callers(name, before, feeds),
        "b": rewrite_costs._callers(name, after, feeds),
    }
    return best_per_repeat(
        calls,
        repeats=args.repeats,
        rounds=args.rounds,
        sample=args.sample,
        clock=time.process_time,
    )


def _measure(
    form: str, args: argparse.Namespace, repeats: dict[tuple, list[float]]
) -> list[rewrite_costs.Point]:
    """``rewrite_costs.measure_grid``'s loop with a longer sample per timing (a call is a few
    microseconds: ``--sample`` seconds of calls per timing steady it on a shared machine)."""
    points: list[rewrite_costs.Point] = []
    for op in args.ops:
        if form == "one_step_broadcast" and op not in BROADCAST_OPS:
            print(f"{form} {op}: skipped (the node and its Expands outgrow the step)")
            continue
        if form == "one_step_guarded" and op not in GUARDED_OPS:
            print(f"{form} {op}: skipped (ONNX Runtime's {op} runs at batch 0: no guard)")
            continue
        for hidden in args.hidden:
            for batch in args.batch:
                before, after = _built(form, op, hidden, batch)
                feeds = step_feeds(before, batch)
                diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
                assert diff <= 1e-4, f"{op} {hidden} {batch}: outputs differ by {diff}"
                for name in args.runtimes:
                    times = _times(name, before, after, feeds, args)
                    ratios = [b / a for a, b in zip(times["a"], times["b"], strict=True)]
                    ratio = min(times["b"]) / min(times["a"])
                    low, high = min(ratios), max(ratios)
                    point = rewrite_costs.Point(op, hidden, 1, name, ratio, low, high, batch)
                    points.append(point)
                    repeats[(op, hidden, batch, name)] = [round(r, 4) for r in ratios]
                    print(
                        f"{form} {op} H={hidden} batch={batch} {name}: {ratio:.2f} "
                        f"[{low:.2f}-{high:.2f}]",
                        flush=True,
                    )
    return points


def _built(form: str, op: str, hidden: int, batch: int) -> tuple[onnx.ModelProto, ...]:
    """The step and its rewrite in ``form``, timed at ``batch``."""
    if form == "one_step":
        return rewritten_step(op, hidden, 1, batch=batch)
    if form == "one_step_guarded":
        return guarded_step(op, hidden)
    return rewritten_step(op, hidden, 1, batch="batch", gemm=False)


_NAMES = rewrite_costs.RUNTIME_NAMES


def _kept(
    path: pathlib.Path, measured: set[tuple]
) -> tuple[list[rewrite_costs.Point], list[dict], dict[str, str]]:
    """The points of ``path``'s table not ``measured`` this run (keys ``(op, hidden, batch,
    runtime)``), as the page's points and as the table's rows, each row with when it was
    measured (``measured``), and when each runtime's column was last measured."""
    if not path.exists():
        return [], [], {}
    data = json.loads(path.read_text())
    when = _when(data)
    rows = [
        {**r, "measured": r.get("measured") or when[r["runtime"]]}
        for r in data["points"]
        if (r["op"], r["hidden"], r["batch"], _NAMES[r["runtime"]]) not in measured
    ]
    return [rewrite_costs.point_of_row(r) for r in rows], rows, when


def _when(data: dict) -> dict[str, str]:
    """When each runtime's column of a table was last measured."""
    return data.get("runtimes") or {
        key: f"{data['measured']}, commit {data['versions'].get('commit', '?')}"
        for key in {r["runtime"] for r in data["points"]}
    }


def median_of(runs: list[dict], into: dict | None) -> dict:
    """One table from independent runs of the grid (tables this module wrote): per row, the
    run whose ratio is the median (the lower middle of an even count), every run's ratio in
    ``ratios`` (a shared machine shifts a whole run now and then); ``into``'s rows the runs
    did not measure are kept, each with when it was measured."""
    found: dict[tuple, list[dict]] = {}
    for run in runs:
        for row in run["points"]:
            found.setdefault(rewrite_costs.row_key(row), []).append(row)
    rows = []
    for same in found.values():
        ordered = sorted(same, key=lambda r: r["ratio"])
        rows.append({**ordered[(len(ordered) - 1) // 2], "ratios": [r["ratio"] for r in same]})
    earlier = _when(into) if into else {}
    when = {**earlier, **runs[-1]["runtimes"]}
    kept = [
        r if r.get("measured") or earlier[r["runtime"]] == when[r["runtime"]]
        else {**r, "measured": earlier[r["runtime"]]}
        for r in (into or {}).get("points", [])
        if rewrite_costs.row_key(r) not in found
    ]  # fmt: skip
    return {**runs[-1], "runtimes": dict(sorted(when.items())), "runs": len(runs),
            "points": kept + rows}  # fmt: skip


def _provenance(when: dict[str, str], rows: list[dict], runs: int = 1) -> str:
    """The page's lines saying when each column was measured (and the ``rows`` of it
    measured at another time, their ``measured``), how tract's was, and of how many
    independent runs a cell is the median."""
    columns = []
    for key, value in sorted(when.items()):
        parts = rewrite_costs.earlier_parts([r for r in rows if r["runtime"] == key])
        columns.append(f"{_NAMES[key]} {value}" + (f" ({parts})" if parts else ""))
    text = "Columns measured: " + "; ".join(columns)
    if "tract" in when:
        text += (
            ". tract runs in a child process (``benchmarks/tract_worker.py``: a tract panic "
            "aborts its process), its outputs on the rewrite checked against ONNX Runtime's, "
            "timed in that process's CPU time with the same repeats, rounds and sample"
        )
    if runs > 1:
        text += (
            f". A cell measured on that date is the median of {runs} independent runs of the "
            "grid (every run's ratio: the table's ``ratios``), shown with that run's spread"
        )
    return text + "."


def _write(
    form: str,
    args: argparse.Namespace,
    header: dict[str, str],
    tables: pathlib.Path | None,
) -> str:
    """Measure ``form`` on ``args.runtimes`` (a form not in ``args.forms``: nothing) and
    write its table; the page's section. With ``--keep``, the table's points not measured
    again (every point, for a form not measured) stay and join the page; a row measured
    before its column's latest date keeps its own (``measured``)."""
    measuring = form in args.forms
    repeats: dict[tuple, list[float]] = {}
    points = _measure(form, args, repeats) if measuring else []
    path = (tables or COSTS) / f"{form}.json"
    done = {(p.op, p.hidden, p.batch, p.runtime) for p in points}
    kept_points, kept_rows, when = _kept(path, done) if args.keep else ([], [], {})
    now = f"{header['date']}, commit {header['commit']}"
    when.update({rewrite_costs._RUNTIME_KEYS[p.runtime]: now for p in points})
    for row in kept_rows:
        if row["measured"] == when[row["runtime"]]:
            del row["measured"]
    runs = json.loads(path.read_text()).get("runs", 1) if not measuring and path.exists() else 1
    case = CASES[form]
    description = f"{case.description} {_provenance(when, kept_rows, runs)}"
    case = dataclasses.replace(case, description=description)
    page = rewrite_costs.render(case, kept_points + points, header)
    if tables is not None and measuring:
        data = rewrite_costs.table(case, points, header)
        for row, p in zip(data["points"], points, strict=True):
            row["repeats"] = repeats[(p.op, p.hidden, p.batch, p.runtime)]
        data["points"] = kept_rows + data["points"]
        data["runtimes"] = dict(sorted(when.items()))
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {path}")
    return page


def main(argv: list[str] | None = None) -> int:
    case = CASES["one_step"]
    parser = argparse.ArgumentParser(prog="python -m benchmarks.one_step_costs")
    parser.add_argument("--ops", nargs="+", default=list(case.ops))
    parser.add_argument("--hidden", nargs="+", type=int, default=list(case.hiddens))
    parser.add_argument("--batch", nargs="+", type=int, default=list(case.batches))
    parser.add_argument("--forms", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--runtimes", nargs="+", default=available(), choices=RUNTIMES)
    parser.add_argument(
        "--keep", action="store_true", help="keep the tables' points not measured again"
    )
    parser.add_argument(
        "--render", action="store_true", help="measure nothing: the page from the tables"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--sample", type=float, default=0.02, help="seconds per timing")
    parser.add_argument("--quick", action="store_true", help="LSTM, hidden 8, batch 1")
    parser.add_argument("--out", type=pathlib.Path, default=case.out)
    parser.add_argument("--tables", type=pathlib.Path, default=None, help="folder of the tables")
    parser.add_argument(
        "--median-of",
        nargs="+",
        type=pathlib.Path,
        metavar="DIR",
        help="measure nothing: the tables (--tables, default the checked-in ones) as the "
        "per-cell median of independent runs' tables (each run's --tables DIR), then the page",
    )
    args = parser.parse_args(argv)
    if args.median_of:
        folder = args.tables or COSTS
        for form in CASES:
            runs = [
                json.loads(p.read_text())
                for d in args.median_of
                if (p := d / f"{form}.json").exists()
            ]
            path = folder / f"{form}.json"
            if runs:
                into = json.loads(path.read_text()) if path.exists() else None
                path.write_text(json.dumps(median_of(runs, into), indent=1) + "\n")
        args.tables, args.render = folder, True
    if args.render:
        args.keep, args.forms = True, []
    if args.quick:
        args.ops, args.hidden, args.batch, args.repeats, args.rounds = ["LSTM"], [8], [1], 1, 2
    tables = args.tables if args.tables is not None else (None if args.quick else COSTS)
    header = {"commit": report.git_commit(), "date": datetime.date.today().isoformat()}
    header.update(versions())
    if "tract" in args.runtimes:
        header["tract"] = importlib.metadata.version("tract")
    header["rnn-rewrite-rules"] = rnn_rewrite_rules.__version__
    forms = CASES if args.keep else args.forms
    pages = [_write(form, args, header, tables) for form in forms]
    args.out.write_text("\n".join(pages))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

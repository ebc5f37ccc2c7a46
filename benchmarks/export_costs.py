"""The cost grid on real exports: torch's own files of ``nn.RNN``, re-rolled and timed (issue 41).

    python -m benchmarks.export_costs                     # the cells -> the checked-in table + docs
    python -m benchmarks.export_costs --hiddens 512 --seqs 1 16 --batches 1   # a few cells, merged
    python -m benchmarks.export_costs --quick --table /tmp/t.json --docs /tmp/c.md   # a smoke run

``benchmarks.cost_grid`` times one-layer builders; the files users re-roll are torch's. This
exports ``nn.RNN(h, h, layers, batch_first=...)`` with ``torch.onnx.export(dynamo=True)``
(torch 2.13 unrolls each layer over the traced sequence: the chains the rule re-rolls) at
each hidden size, length and layer count, re-rolls it for target ``onnxruntime`` with the
cost model ignored, checks the outputs, and times original and re-rolled side by side
(:func:`benchmarks.cost_grid.time_points`: interleaved rounds, best of each, one thread, ONNX
Runtime with default optimizations and with ``ORT_DISABLE_ALL``). The modules: 2 layers
batch-first and 3 layers time-major with a dynamic batch (timed at batch 1 and 5), and 2
layers batch-first exported at a static batch 1 (a streaming call). The points go into
``src/rnn_rewrite_rules/costs/measured.json`` under ``model`` ``torch_dynamo NL[ bf]``
(``rnn_rewrite_rules.costs`` reads every model's points at a size: any slower declines).
TorchScript keeps ``nn.RNN`` as ``RNN`` nodes: nothing to re-roll, nothing to time there.
Three independent runs, then their per-point median into the table::

    for n in 1 2 3; do python -m benchmarks.export_costs --table run$n.json --docs /dev/null; done
    python -m benchmarks.cost_grid --median-of run1.json run2.json run3.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time

import numpy as np
import onnx

import rnn_rewrite_rules
from benchmarks import cost_grid, measure
from rnn_rewrite_rules import costs


@dataclasses.dataclass(frozen=True)
class ExportGrid:
    """The cells the decisions need: the builder grid's sizes, on the forms torch writes."""

    hiddens: tuple[int, ...] = (64, 256, 512)
    seqs: tuple[int, ...] = (1, 16, 128)
    batches: tuple[int, ...] = (1, 5)
    #: (layers, batch_first, batch) per exported module; batch None: exported dynamic (and
    #: timed at every batch of the grid), else exported static at that batch
    shapes: tuple[tuple[int, bool, int | None], ...] = (
        (2, True, None),
        (3, False, None),
        (2, True, 1),
    )
    runtimes: tuple[str, ...] = ("ort", "ort_noopt")
    repeats: int = 7
    rounds: int = 7

    @classmethod
    def quick(cls) -> ExportGrid:
        return cls(hiddens=(8,), seqs=(1, 4), batches=(1,), shapes=((2, True, None),), repeats=3)


def model_name(layers: int, batch_first: bool, batch: int | None = None) -> str:
    static = "" if batch is None else f" static batch {batch}"
    return f"torch_dynamo {layers}L{' bf' if batch_first else ''}{static}"


def export_rnn(
    hidden: int, seq: int, layers: int, batch_first: bool, batch: int | None = None
) -> onnx.ModelProto:
    """``torch.onnx.export(dynamo=True)`` of ``nn.RNN(hidden, hidden, layers)``, batch dynamic
    (exported at 2), or static at ``batch``."""
    import torch
    from torch.export import Dim

    torch.manual_seed(hidden * 1000 + seq * 10 + layers)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = torch.nn.RNN(hidden, hidden, layers, batch_first=batch_first)

        def forward(self, x):
            return self.rnn(x)

    size = 2 if batch is None else batch
    shape = (size, seq, hidden) if batch_first else (seq, size, hidden)
    batch_axis = 0 if batch_first else 1
    with torch.no_grad():
        program = torch.onnx.export(
            Net().eval(),
            (torch.randn(shape),),
            dynamo=True,
            input_names=["x"],
            output_names=["y", "h_n"],
            dynamic_shapes=None if batch is not None else ({batch_axis: Dim.DYNAMIC},),
        )
    return program.model_proto


def feeds(model: onnx.ModelProto, batch: int, seq: int, hidden: int, batch_first: bool) -> dict:
    shape = (batch, seq, hidden) if batch_first else (seq, batch, hidden)
    x = np.random.default_rng(batch).standard_normal(shape).astype(np.float32)
    return {model.graph.input[0].name: x}


def measure_cell(
    grid: ExportGrid, hidden: int, seq: int, shape: tuple[int, bool, int | None], log
) -> list[costs.Point]:
    layers, batch_first, static = shape
    original = export_rnn(hidden, seq, layers, batch_first, static)
    ignored = costs.Context(ignore=True)
    rolled = rnn_rewrite_rules.rewrite(original, target="onnxruntime", context=ignored)
    found = sum(n.op_type == "RNN" for n in rolled.graph.node)
    if found != layers:
        raise RuntimeError(f"re-rolling gave {found} RNN nodes, not {layers}")
    models = {"original": original.SerializeToString(), "none": rolled.SerializeToString()}
    points = []
    for runtime_key in grid.runtimes:
        for batch in grid.batches if static is None else (static,):
            inputs = feeds(original, batch, seq, hidden, batch_first)
            calls = cost_grid._callers(runtime_key, models, inputs)
            diff = measure.compare(calls["none"](), calls["original"]())
            if diff > measure.ATOL:
                raise RuntimeError(f"hidden {hidden} seq {seq}: differs by {diff}")
            (point,) = cost_grid.time_points(
                calls,
                ("none",),
                repeats=grid.repeats,
                rounds=grid.rounds,
                runtime=runtime_key,
                op="RNN",
                direction="forward",
                hidden=hidden,
                seq=seq,
                batch=batch,
                model=model_name(*shape),
            )
            points.append(point)
            log(f"  {runtime_key:9} batch {batch}: {cost_grid.describe(point)}")
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--hiddens", nargs="+", type=int)
    parser.add_argument("--seqs", nargs="+", type=int)
    parser.add_argument("--batches", nargs="+", type=int)
    parser.add_argument("--layers", nargs="+", type=int, help="only these layer counts")
    parser.add_argument("--static", action="store_true", help="only the static-batch exports")
    parser.add_argument("--runtimes", nargs="+", choices=["ort", "ort_noopt"])
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--table", type=pathlib.Path, default=cost_grid.TABLE)
    parser.add_argument("--docs", type=pathlib.Path, default=cost_grid.DOCS)
    args = parser.parse_args(argv)
    grid = ExportGrid.quick() if args.quick else ExportGrid()
    overrides = {
        "hiddens": args.hiddens and tuple(args.hiddens),
        "seqs": args.seqs and tuple(args.seqs),
        "batches": args.batches and tuple(args.batches),
        "runtimes": args.runtimes and tuple(args.runtimes),
        "repeats": args.repeats,
        "rounds": args.rounds,
    }
    grid = dataclasses.replace(grid, **{k: v for k, v in overrides.items() if v})
    if args.layers:
        grid = dataclasses.replace(
            grid, shapes=tuple(s for s in grid.shapes if s[0] in args.layers)
        )
    if args.static:
        grid = dataclasses.replace(grid, shapes=tuple(s for s in grid.shapes if s[2]))
    old = json.loads(args.table.read_text()) if args.table.exists() else None
    start = time.perf_counter()

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    points: list[costs.Point] = []
    data = old
    for shape in grid.shapes:
        for hidden in grid.hiddens:
            for seq in grid.seqs:
                log(f"[{time.perf_counter() - start:.0f} s] {model_name(*shape)} h{hidden} s{seq}")
                points += measure_cell(grid, hidden, seq, shape, log)
                data = cost_grid.merge(old, points, cost_grid.method(grid.repeats, grid.rounds))
                args.table.write_text(json.dumps(data, indent=1) + "\n")
    if data is not None:
        args.docs.write_text(cost_grid.render(data))
    log(f"wrote {args.table} and {args.docs} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

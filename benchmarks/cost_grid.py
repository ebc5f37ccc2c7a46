"""The cost grid: is each kernel-changing rewrite no slower than the original? (issue 32)

    python -m benchmarks.cost_grid                     # the grid -> the checked-in table + docs
    python -m benchmarks.cost_grid --ops RNN --runtimes ort ort_noopt   # part of it, merged
    python -m benchmarks.cost_grid --render            # docs/costs.md from the table only
    python -m benchmarks.cost_grid --quick --table /tmp/t.json --docs /tmp/c.md   # a smoke run
    python -m benchmarks.cost_grid --fresh --table run1.json ...    # independent runs, then
    python -m benchmarks.cost_grid --median-of run1.json run2.json run3.json   # the table
    python -m benchmarks.cost_grid --audit run4.json   # the table's decisions vs another run

For every op (an unrolled ``nn.RNN`` layer, a ``GRUCell`` / ``LSTMCell`` loop, built as
torch 2.13 ``dynamo=True`` exports them by ``rnn_rewrite_rules.testing.unrolled``, with a
symbolic batch and torchlib's runtime zero state), hidden size, sequence length, direction
and batch, it re-rolls the model with the cost model ignored (``costs.Context(ignore=True)``) into
both forms of the initial state the targets emit (``none``: dropped; ``zeros``: one
explicit ``ConstantOfShape`` zero state, what ``portable`` keeps for a symbolic batch),
checks the outputs against the original's, and times original and both forms side by
side per runtime (ONNX Runtime with default optimizations and with ``ORT_DISABLE_ALL``,
OpenVINO when installed; one thread): ``--repeats`` repeats of ``--rounds`` interleaved
rounds, best of each. The ratio is best(rewritten) / best(original) over all rounds; its
spread is the lowest and highest per-repeat ratio.

The table (``src/rnn_rewrite_rules/costs/measured.json``, with the versions it ran) is
what ``rnn_rewrite_rules.costs`` reads; ``docs/costs.md`` is rendered from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import platform
import sys
import time
from collections.abc import Callable, Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper

import rnn_rewrite_rules
from benchmarks import measure
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules.benchmark import best_per_repeat
from rnn_rewrite_rules.testing.unrolled import (
    UnrolledCellConfig,
    UnrolledRnnConfig,
    build_unrolled_cell,
    build_unrolled_rnn,
    cell_inputs,
    rnn_inputs,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
TABLE = ROOT / "src" / "rnn_rewrite_rules" / "costs" / "measured.json"
DOCS = ROOT / "docs" / "costs.md"


@dataclasses.dataclass(frozen=True)
class Grid:
    """What is measured."""

    ops: tuple[str, ...] = ("RNN", "GRU", "LSTM")
    #: hidden 8: the size of many committed exporter files (tests/data)
    hiddens: tuple[int, ...] = (8, 64, 256, 512)
    #: ``nn.RNN`` chains of one step are re-rolled; a single cell call is not.
    rnn_seqs: tuple[int, ...] = (1, 16, 128)
    cell_seqs: tuple[int, ...] = (2, 16, 128)
    batches: tuple[int, ...] = (1, 5)
    #: directions measured per op (cell loops: forward; a reverse loop is the same kernel)
    rnn_directions: tuple[str, ...] = ("forward", "bidirectional")
    runtimes: tuple[str, ...] = ("ort", "ort_noopt", "openvino")
    repeats: int = 5
    rounds: int = 7

    @classmethod
    def quick(cls) -> Grid:
        return cls(
            hiddens=(8, 16),
            rnn_seqs=(1, 4),
            cell_seqs=(2, 4),
            batches=(1, 2),
            rnn_directions=("forward",),
            repeats=2,
            rounds=1,
        )


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    hidden: int
    seq: int
    direction: str

    def build(self) -> tuple[onnx.ModelProto, Callable[[int], dict[str, np.ndarray]]]:
        if self.op == "RNN":
            cfg = UnrolledRnnConfig(
                input_size=self.hidden,
                hidden_size=self.hidden,
                seq=self.seq,
                bidirectional=self.direction == "bidirectional",
                # torch leaves W_hh^T as Transpose(weight_hh) above 8192 elements
                transpose_node=self.hidden * self.hidden > 8192,
            )
            return build_unrolled_rnn(cfg), lambda batch: rnn_inputs(cfg, batch)
        cell = UnrolledCellConfig(
            op_type=self.op, input_size=self.hidden, hidden_size=self.hidden, seq=self.seq
        )
        return build_unrolled_cell(cell), lambda batch: cell_inputs(cell, batch)


def cases(grid: Grid) -> list[Case]:
    """The grid's cases, the issue's ``nn.RNN`` rows first."""
    result = []
    for op in grid.ops:
        seqs = grid.rnn_seqs if op == "RNN" else grid.cell_seqs
        directions = grid.rnn_directions if op == "RNN" else ("forward",)
        for direction in directions:
            for hidden in grid.hiddens:
                for seq in seqs:
                    result.append(Case(op, hidden, seq, direction))
    return result


def with_zero_states(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with an explicit ``ConstantOfShape([D, batch of X, H])`` zero state for every
    RNN/LSTM/GRU node that has none (layout 0), in the graph or ``If`` branch that holds
    it: the form ``portable`` keeps."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    _add_zero_states(result.graph, result.graph, [0])
    return result


def _add_zero_states(graph: onnx.GraphProto, main: onnx.GraphProto, count: list[int]) -> None:
    """:func:`with_zero_states` on ``graph`` and its ``If`` branches (new constants go to
    ``main``'s initializers, which every branch reads)."""
    nodes = []
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _add_zero_states(attribute.g, main, count)
        if node.op_type in ("RNN", "GRU", "LSTM"):
            nodes += _zero_state_nodes(node, main, count)
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


def _zero_state_nodes(
    node: onnx.NodeProto, main: onnx.GraphProto, count: list[int]
) -> list[onnx.NodeProto]:
    """The nodes building ``node``'s zero states, which it now reads."""
    hidden = next(a.i for a in node.attribute if a.name == "hidden_size")
    direction = next((a.s for a in node.attribute if a.name == "direction"), b"forward")
    d = 2 if direction == b"bidirectional" else 1
    name = f"zero_state_{count[0]}"
    count[0] += 1
    main.initializer.extend(
        [
            helper.make_tensor(f"{name}_dh", TensorProto.INT64, [1], [d]),
            helper.make_tensor(f"{name}_h", TensorProto.INT64, [1], [hidden]),
        ]
    )
    nodes = [
        helper.make_node("Shape", [node.input[0]], [f"{name}_b"], start=1, end=2),
        helper.make_node("Concat", [f"{name}_dh", f"{name}_b", f"{name}_h"], [f"{name}_s"], axis=0),
        helper.make_node("ConstantOfShape", [f"{name}_s"], [name]),
    ]
    inputs = list(node.input) + [""] * (7 - len(node.input))
    slots = (5, 6) if node.op_type == "LSTM" else (5,)
    for slot in slots:
        if not inputs[slot]:
            inputs[slot] = name
    del node.input[:]
    node.input.extend(inputs[: max(slots) + 1])
    return nodes


def recurrent_ops(graph: onnx.GraphProto) -> list[str]:
    """The RNN/LSTM/GRU nodes of ``graph`` and its subgraphs (a node may sit in the
    ``If`` that keeps it from batch 0)."""
    found = []
    for node in graph.node:
        if node.op_type in ("RNN", "GRU", "LSTM"):
            found.append(node.op_type)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                found += recurrent_ops(attribute.g)
    return found


def forms(model: onnx.ModelProto, op: str) -> dict[str, onnx.ModelProto]:
    """``original``, ``none`` and ``zeros``: the model and its two re-rolled forms."""
    ignored = costs.Context(ignore=True)
    rolled = rnn_rewrite_rules.rewrite(model, target="onnxruntime", context=ignored)
    kinds = recurrent_ops(rolled.graph)
    if kinds != [op]:
        raise RuntimeError(f"re-rolling gave {kinds or 'no RNN node'}, not one {op}")
    return {"original": model, "none": rolled, "zeros": with_zero_states(rolled)}


def _callers(runtime_key: str, models: dict[str, bytes], feeds: dict[str, np.ndarray]) -> dict:
    if runtime_key == "openvino":
        return {k: measure.ov_caller(m, feeds) for k, m in models.items()}
    sessions = {
        k: runtime.session(m, optimize=runtime_key == "ort", threads=1) for k, m in models.items()
    }
    return {k: (lambda s=s: s.run(None, feeds)) for k, s in sessions.items()}


def measure_case(
    case: Case, grid: Grid, runtimes: Iterable[str], log: Callable[[str], None]
) -> list[costs.Point]:
    """Every point of one case: per runtime and batch, both forms against the original."""
    model, make_feeds = case.build()
    models = {k: m.SerializeToString() for k, m in forms(model, case.op).items()}
    points = []
    for runtime_key in runtimes:
        for batch in grid.batches:
            feeds = make_feeds(batch)
            try:
                calls = _callers(runtime_key, models, feeds)
            except Exception as error:  # reported, not timed
                log(f"  {runtime_key} batch {batch}: {type(error).__name__}: {error}"[:300])
                continue
            expected = calls["original"]()
            for key in ("none", "zeros"):
                diff = measure.compare(calls[key](), expected)
                if diff > measure.ATOL:
                    raise RuntimeError(f"{case} {key} differs by {diff} in {runtime_key}")
            points += time_points(
                calls,
                ("none", "zeros"),
                repeats=grid.repeats,
                rounds=grid.rounds,
                runtime=runtime_key,
                op=case.op,
                direction=case.direction,
                hidden=case.hidden,
                seq=case.seq,
                batch=batch,
            )
            none, zeros = points[-2], points[-1]
            log(f"  {runtime_key:9} batch {batch}: none {describe(none)}, zeros {describe(zeros)}")
    return points


def time_points(
    calls: dict, forms: Iterable[str], *, repeats: int, rounds: int, **fields
) -> list[costs.Point]:
    """Each form of ``calls`` timed side by side with ``calls["original"]``: ``repeats``
    repeats of ``rounds`` interleaved rounds, best of each. A repeat's ratio is its best(form)
    / best(original) (timed in the same rounds, so under the same load); the point's ratio
    is the median of the repeats' ratios, glitches dropped (``costs.glitches``), and
    ``repeats`` keeps every one. (Best over all rounds / best over all rounds pairs times
    from different repeats: on a shared machine it fell outside every repeat's ratio.)"""
    times = best_per_repeat(calls, repeats=repeats, rounds=rounds)
    overall = {k: min(v) for k, v in times.items()}
    points = []
    for form in forms:
        ratios = [a / b for a, b in zip(times[form], times["original"], strict=True)]
        points.append(
            costs.Point(
                form=form,
                ratio=round(costs.median_kept(ratios), 4),
                low=round(min(ratios), 4),
                high=round(max(ratios), 4),
                repeats=tuple(round(r, 4) for r in ratios),
                original_us=round(overall["original"] * 1e6, 1),
                **fields,
            )
        )
    return points


def describe(point: costs.Point) -> str:
    """``1.05 (1.03-1.07, dropped 0.26)`` with the original's time."""
    low, high = point.spread
    dropped = sorted(set(point.repeats) - set(point.kept))
    text = f"{point.ratio:.2f} ({low:.2f}-{high:.2f}"
    if dropped:
        text += ", dropped " + " ".join(f"{r:.2f}" for r in dropped)
    return text + f") of {point.original_us:.1f} us"


def method(repeats: int, rounds: int) -> str:
    return (
        f"one thread; {repeats} repeats x {rounds} interleaved rounds, best of each; a "
        "repeat's ratio = best(rewritten) / best(original), the point's = the median of the "
        "repeats' ratios, glitches dropped"
    )


def versions() -> dict[str, str]:
    """What the table was measured with."""
    import onnxruntime
    import onnxscript

    result = {
        "onnxruntime": onnxruntime.__version__,
        "onnxscript": onnxscript.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": _cpu(),
    }
    if measure.openvino_available():
        import openvino

        result["openvino"] = openvino.__version__
    return result


def _cpu() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


KEY = ("model", "runtime", "op", "form", "direction", "hidden", "seq", "batch")


def point_key(p: dict) -> tuple:
    return tuple(p.get(k, "builder") for k in KEY)


def methods(data: dict | None) -> dict[str, str]:
    """Model -> how its points were measured (a table before issue 41: one method)."""
    if not data:
        return {}
    return dict(data.get("methods") or {"builder": data["method"]})


def merge(old: dict | None, points: list[costs.Point], method_text: str) -> dict:
    """The new table: ``old``'s points, replaced where measured again (the others keep the
    date they were measured, :func:`stamped`); ``method_text`` is how the models of
    ``points`` were measured."""
    today = datetime.date.today().isoformat()
    merged = {point_key(p): p for p in stamped(old)}
    new = [{k: v for k, v in p.items() if v != ""} for p in map(dataclasses.asdict, points)]
    merged.update({point_key(p): p for p in new})
    how = methods(old)
    for model in {p.model for p in points}:
        how[_method_key(old, model, today, method_text)] = method_text
    return {
        "generated_by": "python -m benchmarks.cost_grid",
        "measured": today,
        "versions": versions(),
        "methods": dict(sorted(how.items())),
        "noise": costs.NOISE,
        "points": sorted(merged.values(), key=point_key),
    }


def stamped(table: dict | None) -> list[dict]:
    """``table``'s points, each carrying the date it was measured (``measured``: the
    table's date where the point has none), so a table merged into keeps saying when."""
    if not table:
        return []
    date = table.get("measured", "")
    return [{**p, "measured": p.get("measured") or date} for p in table["points"]]


def _method_key(old: dict | None, model: str, date: str, text: str) -> str:
    """Where ``model``'s method ``text`` (measured ``date``) goes in the table's
    ``methods``: the model itself, or ``model, date`` where the points ``old`` keeps of that
    model were measured another way."""
    earlier = methods(old).get(model)
    kept = any(p.get("model", "builder") == model for p in (old or {}).get("points", []))
    return model if earlier in (None, text) or not kept else f"{model}, {date}"


def when(data: dict) -> str:
    """When each part of the table was measured: ``2026-12-06: builder hidden 64/256/512;
    2026-12-07: builder hidden 8`` (one date: that date)."""
    parts: dict[str, dict[str, set[int]]] = {}
    for p in data["points"]:
        date = p.get("measured") or data["measured"]
        parts.setdefault(date, {}).setdefault(p.get("model", "builder"), set()).add(p["hidden"])
    if len(parts) == 1:
        return next(iter(parts))
    return "; ".join(
        f"{date}: "
        + ", ".join(
            f"{model} hidden {'/'.join(map(str, sorted(hiddens)))}"
            for model, hiddens in sorted(models.items())
        )
        for date, models in sorted(parts.items())
    )


# ---------------------------------------------------------------- docs


def render(data: dict) -> str:
    """``docs/costs.md``: every point, and what each target decides."""
    table = costs.CostTable.from_json(data)
    versions = ", ".join(f"{k} {v}" for k, v in data["versions"].items())
    how = "; ".join(f"`{model}`: {text}" for model, text in methods(data).items())
    lines = [
        "# Cost model: where a re-roll is no slower",
        "",
        "<!-- generated by `python -m benchmarks.cost_grid`; do not edit -->",
        "",
        "A rewrite that changes which kernels run (re-rolling an unrolled recurrence into "
        "`RNN` / `GRU` / `LSTM`) fires only where the measured table "
        "(`src/rnn_rewrite_rules/costs/measured.json`) says its form is no slower on every "
        "runtime of the target; otherwise the rule declines with the reason, which names "
        "the model's own sizes and the measured cells it relied on (for example "
        "\"hidden 512, seq 16, batch symbolic: ONNX Runtime's RNN kernel is slower at hidden "
        '512, seq 16, batch 1 (...)"). See `rnn_rewrite_rules.costs` for the rule.',
        "",
        f"Measured {when(data)}, with {versions}. Method: {how}.",
        "",
        "A cell is the ratio rewritten / original (the spread of its repeats' ratios, "
        "glitches dropped: a repeat whose modified z-score about the repeats' median is "
        f"above {costs.GLITCH}, listed after `drop`) [its range over the independent runs, "
        "where the table is their median]. A ratio below 1 means the re-rolled graph is "
        f"faster. **Bold**: slower (ratio above {1 + data['noise']:.2f}, or above 1 with "
        "the whole spread above 1); *italic*: within noise (the spread crosses 1), which "
        "fires only where no neighbouring measured cell is slower; plain: the whole spread "
        "at or below 1; the spread these read is the repeats kept and the runs' ratios. "
        "Points with no repeats recorded (measured before issue 41) kept only their lowest and "
        "highest repeat, glitches included: their spread is their runs' ratios alone. The "
        "`fires` columns are the decision at that size from every model measured there "
        "(the builders and the real exports below).",
        "",
        "`builder` models: `rnn_rewrite_rules.testing.unrolled` builders shaped as torch "
        "2.13 `dynamo=True` exports (one `nn.RNN` layer, input size = hidden, or a loop over "
        "`GRUCell` / `LSTMCell`), symbolic batch, torchlib's runtime zero state. Forms: "
        "`none`, the initial state dropped (target `onnxruntime`); `zeros`, one explicit "
        "zero state (target `portable` with a symbolic batch); a `GRU`/`LSTM` node in "
        "both sits in its batch-0 guard (`passes.BatchZeroGuardPass`, measured from "
        "2026-12-07 on). `torch_dynamo NL [bf]` "
        "models: `torch.onnx.export(dynamo=True)` of `nn.RNN(h, h, N[, batch_first=True])` "
        "itself, batch dynamic (`static batch B`: exported at that batch), every layer "
        "re-rolled (`python -m benchmarks.export_costs`).",
        "",
    ]
    runtimes = [r for r in costs.RUNTIMES if r in table.runtimes()]
    groups = sorted(
        {(p.op, p.direction) for p in table.points if p.model == "builder"},
        key=lambda g: (("RNN", "GRU", "LSTM").index(g[0]), g[1] != "forward", g[1]),
    )
    for op, direction in groups:
        lines += _builder_section(table, runtimes, op, direction)
    exports = sorted({(p.model, p.op, p.direction) for p in table.points} - {("builder",)})
    for model, op, direction in exports:
        if model != "builder":
            lines += _export_section(table, runtimes, model, op, direction)
    lines += [
        "The `portable` column is the cost model alone: `portable` never emits an `RNN` "
        "node (rten has no `RNN` op and converts the unrolled `nn.RNN`), and drops the zero "
        "state where the batch is static (the `none` columns apply).",
        "",
    ]
    return "\n".join(lines)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _sizes(table: costs.CostTable, model: str, op: str, direction: str) -> list[tuple]:
    return sorted(
        {
            (p.hidden, p.seq, p.batch)
            for p in table.points
            if (p.model, p.op, p.direction) == (model, op, direction)
        }
    )


def _builder_section(
    table: costs.CostTable, runtimes: list[str], op: str, direction: str
) -> list[str]:
    header = ["hidden", "seq", "batch"]
    for r in runtimes:
        header += [f"{costs.RUNTIMES[r]}: none", "zeros"]
    header += ["fires: onnxruntime", "portable (zeros)"]
    lines = [f"## {op} ({direction})", "", _row(header), "|" + " --- |" * len(header)]
    for hidden, seq, batch in _sizes(table, "builder", op, direction):
        cells = [str(hidden), str(seq), str(batch)]
        for r in runtimes:
            for form in ("none", "zeros"):
                p = table._index.get((r, op, form, direction, hidden, seq, batch))
                cells.append("-" if p is None or p.model != "builder" else _cell(p))
        ort = table.decide("onnxruntime", op, hidden, seq, batch, direction, "none")
        port = table.decide("portable", op, hidden, seq, batch, direction, "zeros")
        cells += ["yes" if ort.fires else "no", "yes" if port.fires else "no"]
        lines.append(_row(cells))
    return [*lines, ""]


def _export_section(
    table: costs.CostTable, runtimes: list[str], model: str, op: str, direction: str
) -> list[str]:
    timed = [r for r in runtimes if r in costs.TIMED_RUNTIMES["onnxruntime"]]
    header = ["hidden", "seq", "batch", "original (us)"]
    header += [f"{costs.RUNTIMES[r]}: none" for r in timed] + ["fires: onnxruntime"]
    lines = [f"## {op} ({direction}): `{model}`", "", _row(header), "|" + " --- |" * len(header)]
    for hidden, seq, batch in _sizes(table, model, op, direction):
        found = {
            p.runtime: p
            for p in table._models.get(("ort", op, "none", direction, hidden, seq, batch), [])
            + table._models.get(("ort_noopt", op, "none", direction, hidden, seq, batch), [])
            if p.model == model
        }
        original = found["ort"].original_us if "ort" in found else 0.0
        cells = [str(hidden), str(seq), str(batch), f"{original:.0f}"]
        cells += ["-" if r not in found else _cell(found[r]) for r in timed]
        ort = table.decide("onnxruntime", op, hidden, seq, batch, direction, "none")
        lines.append(_row([*cells, "yes" if ort.fires else "no"]))
    return [*lines, ""]


def _cell(p: costs.Point) -> str:
    low, high = (min(p.kept), max(p.kept)) if p.kept else (p.low, p.high)
    dropped = [r for r in p.repeats if r not in p.kept]
    text = f"{p.ratio:.2f} ({low:.2f}-{high:.2f}"
    if dropped:
        text += "; drop " + " ".join(f"{r:.2f}" for r in dropped)
    text += ")"
    if len(p.ratios) > 1:
        text += f" [{min(p.ratios):.2f}-{max(p.ratios):.2f}]"
    if not p.no_slower:
        return f"**{text}**"
    return text if p.clear else f"*{text}*"


def median_of(runs: list[dict], into: dict | None = None) -> dict:
    """One table from independent runs of the grid: per point, the run whose ratio is the
    median (a slowdown one run measured alone does not decide; one that most runs measured
    does). ``ratios`` keeps every run's ratio; the versions and date are the last run's.
    ``into``: a table whose points the runs did not measure again are kept, with the date
    they were measured (:func:`stamped`); a model's method that differs from ``into``'s is
    recorded as ``model, date``."""
    by_key: dict[tuple, list[dict]] = {}
    for run in runs:
        for point in run["points"]:
            by_key.setdefault(point_key(point), []).append(point)
    points = []
    for found in by_key.values():
        ordered = sorted(found, key=lambda p: p["ratio"])
        median = dict(ordered[(len(ordered) - 1) // 2])  # the lower middle of an even count
        median["ratios"] = [p["ratio"] for p in found]
        median.pop("measured", None)  # the run's date: the table's
        points.append(median)
    last = runs[-1]
    measured = {p.get("model", "builder") for p in points}
    how = {
        _method_key(into, model, last["measured"], text): text
        for model, text in (
            (model, f"median of {len(runs)} independent runs, each: {text}")
            for model, text in methods(last).items()
            if model in measured
        )
    }
    if into is not None:
        how = methods(into) | how
        points += [p for p in stamped(into) if point_key(p) not in by_key]
    result = {**last, "methods": dict(sorted(how.items())), "points": sorted(points, key=point_key)}
    result.pop("method", None)
    return result


# ---------------------------------------------------------------- audit

#: target -> the initial-state form its rules emit at a symbolic batch
_TARGET_FORM = {"onnxruntime": "none", "portable": "zeros"}


def audit(table: dict, fresh: dict) -> list[str]:
    """Where ``table``'s decisions fire but an independent run (``fresh``) measured that
    point slower beyond noise, one line each (empty: no rewrite the table lets fire was
    slower in that run). ``portable`` never re-rolls ``RNN``."""
    decided = costs.CostTable.from_json(table)
    problems = []
    for point in costs.CostTable.from_json(fresh).points:
        if point.no_slower:
            continue
        for target, form in _TARGET_FORM.items():
            if point.form != form or point.runtime not in costs.TIMED_RUNTIMES[target]:
                continue
            if target == "portable" and point.op == "RNN":
                continue
            decision = decided.decide(
                target, point.op, point.hidden, point.seq, point.batch, point.direction, form
            )
            if decision.fires:
                problems.append(
                    f"{target}: {point.op} {point.direction} hidden {point.hidden} seq "
                    f"{point.seq} batch {point.batch} fires, but {costs.RUNTIMES[point.runtime]} "
                    f"measured {point.ratio:.2f}x ({point.low:.2f}-{point.high:.2f})"
                )
    return problems


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--ops", nargs="+", choices=Grid.ops, default=list(Grid.ops))
    parser.add_argument("--runtimes", nargs="+", choices=list(Grid.runtimes))
    parser.add_argument("--hiddens", nargs="+", type=int)
    parser.add_argument("--directions", nargs="+", choices=["forward", "bidirectional"])
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round (a smoke run)")
    parser.add_argument("--render", action="store_true", help="only render the docs from the table")
    parser.add_argument("--table", type=pathlib.Path, default=TABLE)
    parser.add_argument("--docs", type=pathlib.Path, default=DOCS)
    parser.add_argument("--fresh", action="store_true", help="do not merge into the old table")
    parser.add_argument(
        "--audit",
        type=pathlib.Path,
        metavar="FRESH.json",
        help="compare --table's decisions with an independent run's table; exit 1 if a "
        "rewrite it lets fire measured slower there",
    )
    parser.add_argument(
        "--median-of",
        type=pathlib.Path,
        nargs="+",
        metavar="RUN.json",
        help="write --table (and --docs) as the per-point median of these runs' tables",
    )
    args = parser.parse_args(argv)
    if args.median_of:
        into = json.loads(args.table.read_text()) if args.table.exists() else None
        data = median_of([json.loads(path.read_text()) for path in args.median_of], into)
        args.table.write_text(json.dumps(data, indent=1) + "\n")
        args.docs.write_text(render(data))
        return 0
    old = json.loads(args.table.read_text()) if args.table.exists() else None
    if args.audit:
        if old is None:
            parser.error(f"{args.table} does not exist")
        fresh = json.loads(args.audit.read_text())
        problems = audit(old, fresh)
        fired = len(costs.CostTable.from_json(fresh).points)
        print(f"{fired} points measured again; {len(problems)} slower where the table fires")
        print("\n".join(problems))
        return 1 if problems else 0
    if args.render:
        if old is None:
            parser.error(f"{args.table} does not exist")
        args.docs.write_text(render(old))
        return 0
    grid = Grid.quick() if args.quick else Grid()
    overrides = {
        "ops": tuple(args.ops),
        "runtimes": tuple(args.runtimes) if args.runtimes else None,
        "hiddens": tuple(args.hiddens) if args.hiddens else None,
        "rnn_directions": tuple(args.directions) if args.directions else None,
        "repeats": args.repeats,
        "rounds": args.rounds,
    }
    grid = dataclasses.replace(grid, **{k: v for k, v in overrides.items() if v is not None})
    runtimes = [r for r in grid.runtimes if r != "openvino" or measure.openvino_available()]
    if "openvino" in grid.runtimes and "openvino" not in runtimes:
        print("OpenVINO is not installed: its points are not measured", file=sys.stderr)
    todo = cases(grid)
    points: list[costs.Point] = []
    start = time.perf_counter()

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    for number, case in enumerate(todo, 1):
        log(
            f"[{number}/{len(todo)}, {time.perf_counter() - start:.0f} s] {case.op} "
            f"{case.direction} hidden {case.hidden} seq {case.seq}"
        )
        points += measure_case(case, grid, runtimes, log)
        data = merge(None if args.fresh else old, points, method(grid.repeats, grid.rounds))
        args.table.write_text(json.dumps(data, indent=1) + "\n")  # a partial run keeps its points
    args.docs.write_text(render(data))
    log(f"wrote {args.table} and {args.docs} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Is a jax2onnx scan Loop beside initial states of another batch no slower as its exact
zero-step guard and the broadcast? (issue 40)

    python -m benchmarks.guard_broadcast_costs      # writes costs/exact_broadcast.json
    python -m benchmarks.guard_broadcast_costs --quick --tables /tmp/t   # a smoke run

``loop_scan`` rewrites a Loop over ``X``'s length that carries ``X`` around it (jax2onnx's
``lax.scan``) into ``If(Size(X) == 0, the Loop as written, the node)``; where the initial
states are inputs whose batch is not proven ``X``'s (ONNX does not tie equal
``dim_param`` names), the node reads ``X`` and the states expanded to the batch the body's
ops broadcast them to (8 small nodes). This times that form (``exact_broadcast``) side by
side with the committed jax2onnx files with initial states (hidden 8), at lengths 0, 1, 8
and 64, batches 1 and 3 (the states' batch the same), in ONNX Runtime with its default
graph optimisations (``ort``) and with ``ORT_DISABLE_ALL`` (``ort_noopt``), one thread, in
CPU time of this process (``time.process_time``): ``repeats`` repeats of ``rounds``
interleaved rounds, best of each; outputs checked equal first. The rule fires where the
table says no slower at every measured length from 1 and the time added at length 0 is
at most the time saved at length 1 (``loop_scan.exact_cost``).

(The lean guard is not timed: ``loop_scan`` refuses it beside such states for its batch-0
branch, ``BROADCAST_BRANCH_REASON``.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import time
from collections.abc import Callable

import numpy as np
import onnx

import rnn_rewrite_rules
from benchmarks import report
from benchmarks.cost_grid import versions
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules.benchmark import best_per_repeat
from rnn_rewrite_rules.rules.loop_scan.exact_cost import EXACT_BROADCAST_FORM

__all__ = ["FILES", "main"]

ROOT = pathlib.Path(__file__).resolve().parent.parent
COSTS = ROOT / "src" / "rnn_rewrite_rules" / "costs"
JAX = ROOT / "tests" / "data" / "exporters" / "jax2onnx"
#: op -> the jax2onnx file timed for the exact form (hidden 8; its RNN file is two stacked
#: scans: not timed, so the rule refuses that form for want of a measurement).
FILES = {"LSTM": "hand_lstm_initial_states.onnx", "GRU": "nnx_gru_initial_state.onnx"}
JAX_HIDDEN = 8
SEQS = (0, 1, 8, 64)
BATCHES = (1, 3)
RUNTIMES = ("ort", "ort_noopt")

#: A form's models: (original, rewrite, feeds at (seq, batch), the model's name).
Built = tuple[onnx.ModelProto, onnx.ModelProto, Callable[[int, int], dict], str]


def _rewrite(before: onnx.ModelProto) -> onnx.ModelProto:
    """The rewrite with the cost table ignored (this measures what it is read for); it
    must hold the guard and the broadcast."""
    after = rnn_rewrite_rules.rewrite(
        before, target="onnxruntime", context=costs.Context(ignore=True)
    )
    ops = _ops(after.graph)
    assert "If" in ops and "Expand" in ops, f"{before.graph.name}: no guard and broadcast"
    return after


def _ops(graph: onnx.GraphProto) -> list[str]:
    """The op types of ``graph``'s nodes and of its subgraphs'."""
    found = []
    for node in graph.node:
        found.append(node.op_type)
        for attribute in node.attribute:
            if attribute.HasField("g"):
                found += _ops(attribute.g)
    return found


def jax_file(op: str) -> Built:
    """``exact_broadcast``: the committed jax2onnx file for ``op``."""
    name = FILES[op]
    before = onnx.load(JAX / name)
    manifest = json.loads((JAX / "manifest.json").read_text())
    (entry,) = [m for m in manifest["models"] if m["file"] == name]

    def feeds(seq: int, batch: int) -> dict:
        rng = np.random.default_rng(0)
        sizes = {"seq": seq, "batch": batch}
        return {
            key: rng.standard_normal([sizes.get(d, d) for d in dims]).astype(np.float32)
            for key, dims in entry["inputs"].items()
        }

    return before, _rewrite(before), feeds, name.removesuffix(".onnx")


def point(
    form: str, op: str, hidden: int, built: Built, sizes: tuple[int, int], key: str, args
) -> dict:
    """One point at (seq, batch) ``sizes``: both models timed interleaved on runtime
    ``key``, their outputs checked equal first."""
    before, after, feeds, model = built
    seq, batch = sizes
    inputs = feeds(seq, batch)
    sessions = [runtime.session(m, optimize=key == "ort") for m in (before, after)]
    expected, actual = (s.run(None, inputs) for s in sessions)
    for want, got in zip(expected, actual, strict=True):
        assert want.shape == got.shape and np.allclose(want, got, rtol=1e-4, atol=1e-5)
    calls = {k: (lambda s=s: s.run(None, inputs)) for k, s in zip("ab", sessions, strict=True)}
    times = best_per_repeat(
        calls, repeats=args.repeats, rounds=args.rounds, sample=0.01, clock=time.process_time
    )
    repeats = [b / a for a, b in zip(times["a"], times["b"], strict=True)]
    found = {
        "runtime": key,
        "op": op,
        "form": form,
        "direction": "forward",
        "hidden": hidden,
        "seq": seq,
        "batch": batch,
        "ratio": round(min(times["b"]) / min(times["a"]), 4),
        "low": round(min(repeats), 4),
        "high": round(max(repeats), 4),
        "repeats": [round(r, 4) for r in repeats],
        "original_us": round(min(times["a"]) * 1e6, 2),
    }
    return {**found, "model": model}


def _cases(args) -> dict[str, list[tuple[str, int, Callable[[], Built]]]]:
    """form -> (op, hidden, how to build its models) per row of its table."""
    exact = [(op, JAX_HIDDEN, lambda op=op: jax_file(op)) for op in args.ops if op in FILES]
    return {EXACT_BROADCAST_FORM: exact}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.guard_broadcast_costs")
    parser.add_argument("--ops", nargs="+", default=list(FILES), choices=list(FILES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="GRU, batch 1, 2 repeats")
    parser.add_argument("--tables", type=pathlib.Path, default=COSTS, help="where to write")
    args = parser.parse_args(argv)
    batches = BATCHES
    if args.quick:
        args.ops, args.repeats, args.rounds, batches = ["GRU"], 2, 2, (1,)
    header = {"commit": report.git_commit(), **versions()}
    header["rnn-rewrite-rules"] = rnn_rewrite_rules.__version__
    args.tables.mkdir(parents=True, exist_ok=True)
    for form, rows in _cases(args).items():
        points = []
        for op, hidden, build in rows:
            built = build()
            for seq in SEQS:
                for batch in batches:
                    for key in RUNTIMES:
                        found = point(form, op, hidden, built, (seq, batch), key, args)
                        print(
                            f"{form} {op} hidden {hidden} seq {seq} batch {batch}"
                            f" {costs.RUNTIMES[key]}: {found['ratio']:.2f}x"
                            f" [{found['low']:.2f}-{found['high']:.2f}]"
                            f" (original {found['original_us']:.0f} us)",
                            flush=True,
                        )
                        points.append(found)
        data = {
            "generated_by": "python -m benchmarks.guard_broadcast_costs",
            "measured": datetime.date.today().isoformat(),
            "versions": header,
            "methods": {
                form: f"one thread; {args.repeats} repeats x {args.rounds} interleaved "
                "rounds, best of each; ratio = best(rewritten) / best(original)"
            },
            "points": points,
        }
        path = args.tables / f"{form}.json"
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Is a jax2onnx scan Loop no slower as its exact zero-step guard? (issue 40)

    python -m benchmarks.exact_zero_step_costs           # writes costs/exact_zero_step.json
    python -m benchmarks.exact_zero_step_costs --broadcast   # costs/exact_broadcast.json
    python -m benchmarks.exact_zero_step_costs --quick --table /tmp/t.json   # a smoke run

``loop_scan`` rewrites a ``Loop`` over ``X``'s length that carries ``X`` around it
(jax2onnx's ``lax.scan``) into ``If(Size(X) == 0, the Loop as written, the node)``: at
length 0 only the Loop itself gives its stack of no step as ONNX Runtime shapes it. This
times that form side by side with the original file, per committed jax2onnx file (one a
cell: ``hand_lstm_time_major``, ``nnx_gru_batch_major``, ``hand_rnn_time_major``, hidden
8), at lengths 0, 1, 8 and 64 and batches 1 and 3, in ONNX Runtime with its default graph
optimisations (``ort``) and with ``ORT_DISABLE_ALL`` (``ort_noopt``), one thread, in CPU
time of this process (``time.process_time``, which other processes' load on a shared
machine does not inflate): ``repeats`` repeats of ``rounds`` interleaved rounds, best of
each. A point's ratio is
best(rewritten) / best(original) over all rounds, its repeats each repeat's ratio. It
prints each point and writes ``rnn_rewrite_rules/costs/exact_zero_step.json``, the table
the rule reads (``costs.FORM_TABLES``): the form fires only where it says no slower at
every measured length.

``--broadcast`` times the same form beside initial states whose batch is not proven
``X``'s (graph inputs: ONNX does not tie equal ``dim_param`` names), where the node reads
``X`` and the states expanded to the batch the body's ops broadcast them to (8 small
nodes), on the committed files with initial states (:data:`BROADCAST_FILES`; the RNN
file is two stacked scans, not timed, so the rule refuses that form for want of a
measurement), into ``costs/exact_broadcast.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import time

import numpy as np
import onnx

import rnn_rewrite_rules
from benchmarks import report
from benchmarks.cost_grid import versions
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules.benchmark import best_per_repeat
from rnn_rewrite_rules.rules.loop_scan.exact_cost import EXACT_BROADCAST_FORM
from rnn_rewrite_rules.rules.loop_scan.zero_step import EXACT_FORM

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDER = ROOT / "tests" / "data" / "exporters" / "jax2onnx"
#: op -> the file timed for it (``hand_`` and ``nnx`` files: both exporters' spellings).
FILES = {
    "LSTM": "hand_lstm_time_major.onnx",
    "GRU": "nnx_gru_batch_major.onnx",
    "RNN": "hand_rnn_time_major.onnx",
}
#: op -> the file with initial states timed for ``--broadcast`` (the form ``exact_broadcast``).
BROADCAST_FILES = {"LSTM": "hand_lstm_initial_states.onnx", "GRU": "nnx_gru_initial_state.onnx"}
HIDDEN = 8
SEQS = (0, 1, 8, 64)
BATCHES = (1, 3)
RUNTIMES = ("ort", "ort_noopt")


def rewritten(name: str) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The file and its rewrite (the cost table ignored: this measures what it is read
    for), which must hold the guard: an ``If`` with the Loop in one branch."""
    before = onnx.load(FOLDER / name)
    after = rnn_rewrite_rules.rewrite(
        before, target="onnxruntime", context=costs.Context(ignore=True)
    )
    assert [n.op_type for n in after.graph.node].count("If") == 1, f"{name}: no guard"
    return before, after


def feeds(name: str, seq: int, batch: int) -> dict[str, np.ndarray]:
    manifest = json.loads((FOLDER / "manifest.json").read_text())
    (entry,) = [m for m in manifest["models"] if m["file"] == name]
    rng = np.random.default_rng(0)
    sizes = {"seq": seq, "batch": batch}
    return {
        key: rng.standard_normal([sizes.get(d, d) for d in dims]).astype(np.float32)
        for key, dims in entry["inputs"].items()
    }


def point(
    op: str,
    models: tuple[onnx.ModelProto, onnx.ModelProto],
    sizes: tuple[int, int],
    key: str,
    args: argparse.Namespace,
) -> dict:
    """One point at (seq, batch) ``sizes``: both models (of ``op``'s file of the form
    measured) timed interleaved on runtime ``key``, their outputs checked equal first."""
    seq, batch = sizes
    name = _files(args)[op]
    inputs = feeds(name, seq, batch)
    sessions = [runtime.session(m, optimize=key == "ort") for m in models]
    expected, actual = (s.run(None, inputs) for s in sessions)
    for want, got in zip(expected, actual, strict=True):
        assert want.shape == got.shape and np.allclose(want, got, rtol=1e-4, atol=1e-5)
    calls = {k: (lambda s=s: s.run(None, inputs)) for k, s in zip("ab", sessions, strict=True)}
    times = best_per_repeat(
        calls, repeats=args.repeats, rounds=args.rounds, sample=0.01, clock=time.process_time
    )
    repeats = [b / a for a, b in zip(times["a"], times["b"], strict=True)]
    return {
        "runtime": key,
        "op": op,
        "form": _form(args),
        "direction": "forward",
        "hidden": HIDDEN,
        "seq": seq,
        "batch": batch,
        "ratio": round(min(times["b"]) / min(times["a"]), 4),
        "low": round(min(repeats), 4),
        "high": round(max(repeats), 4),
        "repeats": [round(r, 4) for r in repeats],
        "original_us": round(min(times["a"]) * 1e6, 2),
        "model": name.removesuffix(".onnx"),
    }


def _form(args: argparse.Namespace) -> str:
    return EXACT_BROADCAST_FORM if args.broadcast else EXACT_FORM


def _files(args: argparse.Namespace) -> dict[str, str]:
    return BROADCAST_FILES if args.broadcast else FILES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.exact_zero_step_costs")
    parser.add_argument("--ops", nargs="+", choices=list(FILES), help="default: every file's")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="one op, one batch, 2 repeats")
    parser.add_argument(
        "--broadcast", action="store_true", help="the files with initial states (see above)"
    )
    parser.add_argument("--table", type=pathlib.Path, help="default: the form's checked-in one")
    args = parser.parse_args(argv)
    files = _files(args)
    args.ops = [op for op in args.ops or list(files) if op in files]
    args.table = args.table or ROOT / "src" / "rnn_rewrite_rules" / "costs" / f"{_form(args)}.json"
    batches = BATCHES
    if args.quick:
        args.ops, args.repeats, args.rounds, batches = args.ops[:1], 2, 2, (1,)
    points = []
    for op in args.ops:
        models = rewritten(files[op])
        for seq in SEQS:
            for batch in batches:
                for key in RUNTIMES:
                    found = point(op, models, (seq, batch), key, args)
                    low, high = found["low"], found["high"]
                    print(
                        f"{files[op]} seq {seq} batch {batch} {costs.RUNTIMES[key]}: "
                        f"{found['ratio']:.2f}x [{low:.2f}-{high:.2f}]"
                        f" (original {found['original_us']:.0f} us)",
                        flush=True,
                    )
                    points.append(found)
    header = {"commit": report.git_commit(), **versions()}
    header["rnn-rewrite-rules"] = rnn_rewrite_rules.__version__
    data = {
        "generated_by": costs.FORM_TABLES[_form(args)],
        "measured": datetime.date.today().isoformat(),
        "versions": header,
        "methods": {
            "jax2onnx files": f"one thread; {args.repeats} repeats x {args.rounds} "
            "interleaved rounds, best of each; ratio = best(rewritten) / best(original)"
        },
        "points": points,
    }
    args.table.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

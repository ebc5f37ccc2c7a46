"""Streaming frames per second: original vs rewritten, one frame per call, state chained.

Each call's state outputs (``X_out`` for input ``X_in`` or ``X``) are the next call's state
inputs. Original and rewritten run interleaved, best of ``--rounds``, in CPU time of this
process (one thread: other processes' load on a shared machine does not inflate it); the
spread is the (worst - best) / best of the rounds.

    python -m benchmarks.streaming MODEL.onnx ... [--torch-steps 64,128,256,512]

``--torch-steps`` exports ``LSTMCell``/``GRUCell`` step models (batch 1) with torch's dynamo
exporter at those hidden sizes first (torch is needed for that only).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

import rnn_rewrite_rules
from rnn_rewrite_rules._streaming import (
    Call,
    Stream,
    frame_feeds,
    state_pairs,
)


def _ort(model: onnx.ModelProto) -> Call:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return lambda feeds: session.run(None, feeds)


def _openvino(model: onnx.ModelProto) -> Call:
    from rnn_rewrite_rules._openvino import compile_model

    compiled = compile_model(model.SerializeToString(), {"INFERENCE_NUM_THREADS": 1})
    request = compiled.create_infer_request()
    outputs = list(compiled.outputs)

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        result = request.infer(feeds)
        return [np.asarray(result[port]) for port in outputs]

    return run


RUNTIMES = {"onnxruntime": _ort, "openvino": _openvino}


def export_torch_steps(
    hidden_sizes: Sequence[int], out_dir: Path, features: int = 40
) -> list[Path]:
    """``LSTMCell``/``GRUCell`` one-step models, state in and out, torch dynamo export."""
    import torch

    class LstmStep(torch.nn.Module):
        def __init__(self, hidden: int) -> None:
            super().__init__()
            self.cell = torch.nn.LSTMCell(features, hidden)

        def forward(self, x, h, c):
            h_out, c_out = self.cell(x, (h, c))
            return h_out, c_out

    class GruStep(torch.nn.Module):
        def __init__(self, hidden: int) -> None:
            super().__init__()
            self.cell = torch.nn.GRUCell(features, hidden)

        def forward(self, x, h):
            return self.cell(x, h)

    paths = []
    torch.manual_seed(0)
    for hidden in hidden_sizes:
        for name, module, names in (
            ("lstmcell", LstmStep(hidden), (["x", "h", "c"], ["h_out", "c_out"])),
            ("grucell", GruStep(hidden), (["x", "h"], ["h_out"])),
        ):
            args = tuple(torch.randn(1, features if n == "x" else hidden) for n in names[0])
            path = out_dir / f"{name}_step_h{hidden}.onnx"
            program = torch.onnx.export(
                module.eval(), args, input_names=names[0], output_names=names[1], dynamo=True
            )
            program.save(str(path))
            paths.append(path)
    return paths


def measure(
    path: Path, runtimes: Sequence[str], rounds: int, frames: int, target: str = "portable"
) -> list[tuple[str, str, list[float], list[float], float]]:
    """(runtime, pairs, original fps per round, rewritten fps per round, max abs diff)."""
    original = onnx.load(str(path))
    pairs = state_pairs(original)
    if not pairs:
        raise SystemExit(f"{path}: no state input/output pairs (X_in -> X_out, X -> X_out)")
    rewritten = rnn_rewrite_rules.rewrite(original, target=target)
    nodes = f"{len(original.graph.node)}->{len(rewritten.graph.node)} nodes"
    feeds = frame_feeds(original, {})
    names = [o.name for o in original.graph.output]
    stream = Stream(names, feeds, pairs)
    rows = []
    for runtime in runtimes:
        runners = [RUNTIMES[runtime](original), RUNTIMES[runtime](rewritten)]
        last = [stream.run_frames(r, 8) for r in runners]
        diff = max(float(np.max(np.abs(last[0][n] - last[1][n]), initial=0.0)) for n in names)
        fps: list[list[float]] = [[], []]
        for _ in range(rounds):
            for which, runner in enumerate(runners):
                fps[which].append(stream.frames_per_second(runner, frames, time.process_time))
        described = ", ".join(f"{a}->{b}" for a, b in pairs) + f"; {nodes}"
        rows.append((runtime, described, fps[0], fps[1], diff))
    return rows


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / max(values)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--torch-steps", default="", help="hidden sizes, e.g. 64,128,256,512")
    parser.add_argument("--runtimes", default="onnxruntime,openvino")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--target", default="portable", choices=["portable", "onnxruntime"])
    args = parser.parse_args(argv)
    runtimes = [r for r in args.runtimes.split(",") if r]
    unknown = set(runtimes) - set(RUNTIMES)
    if unknown:
        parser.error(f"unknown runtime(s) {sorted(unknown)}; choose from {sorted(RUNTIMES)}")
    with tempfile.TemporaryDirectory() as tmp:
        models = list(args.models)
        if args.torch_steps:
            hidden = [int(h) for h in args.torch_steps.split(",")]
            models += export_torch_steps(hidden, Path(tmp))
        if not models:
            parser.error("no models: give paths or --torch-steps")
        print(f"{'model':<34} {'runtime':<11} {'orig fps':>9} {'new fps':>9} {'ratio':>6}"
              f"  spread orig/new  max|diff|  states")  # fmt: skip
        for path in models:
            for runtime, pairs, old, new, diff in measure(
                path, runtimes, args.rounds, args.frames, args.target
            ):
                ratio = max(new) / max(old)
                print(
                    f"{path.stem:<34} {runtime:<11} {max(old):>9.0f} {max(new):>9.0f} "
                    f"{ratio:>5.2f}x  {_spread(old):>6.1%}/{_spread(new):<6.1%}  "
                    f"{diff:9.2g}  {pairs}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What dropping zero initial states buys over one shared explicit zero state (issue 15).

For small stacks at seq 1 (where per-call overhead dominates) and at seq 16, times the two
targets' outputs side by side, interleaved, in ONNX Runtime and OpenVINO at one thread:
``portable`` (one ``ConstantOfShape`` zero state shared by all layers) and
``onnxruntime`` (no state input). Each repeat takes the best of ``--rounds`` rounds; the
ratio portable / onnxruntime is printed per repeat, then its median and range (the
spread: the machine is shared, so a ratio inside it is noise).

    python -m benchmarks.zero_state [--repeats 3] [--rounds 11]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Callable

import numpy as np
import onnx

import rnn_rewrite_rules
from benchmarks import measure
from benchmarks.tract_worker import interleaved
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model, random_inputs
from rnn_rewrite_rules.testing.unrolled import UnrolledRnnConfig, build_unrolled_rnn, rnn_inputs

Builder = Callable[[], tuple[onnx.ModelProto, Callable[[int, int], dict[str, np.ndarray]]]]


def _torchlib(cfg: RnnConfig) -> Builder:
    return lambda: (build_torchlib_model(cfg), lambda b, s: random_inputs(cfg, b, s, rng=0))


def _unrolled(cfg: UnrolledRnnConfig) -> Builder:
    """torch's unrolled ``nn.RNN`` (rerolled by our rules): the sequence length is fixed."""

    def build():
        model = build_unrolled_rnn(dataclasses.replace(cfg, seq=1))
        return model, lambda b, s: rnn_inputs(dataclasses.replace(cfg, seq=1), b, None, 0)

    return build


CONFIGS: dict[str, Builder] = {
    "lstm2x64": _torchlib(RnnConfig(num_layers=2, hidden_size=64, input_size=32)),
    "gru3x32bi": _torchlib(
        RnnConfig(op_type="GRU", num_layers=3, hidden_size=32, input_size=16, bidirectional=True)
    ),
    "lstm4x128": _torchlib(RnnConfig(num_layers=4, hidden_size=128, input_size=64)),
    # a plain RNN: ONNX Runtime multiplies a given initial_h by R even when it is zeros
    "rnn2x512": _unrolled(
        UnrolledRnnConfig(num_layers=2, hidden_size=512, input_size=512, transpose_node=True)
    ),
}
SIZES = ((1, 1), (4, 16))  # (batch, seq); the unrolled nn.RNN runs seq 1 only


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Callable[[], list]:
    session = runtime.session(model.SerializeToString(), threads=1)
    return lambda: session.run(None, feeds)


def _openvino(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Callable[[], list]:
    return measure.ov_caller(model.SerializeToString(), feeds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--quick", action="store_true", help="one model, a few calls (a smoke run)")
    args = parser.parse_args(argv)
    configs = dict(list(CONFIGS.items())[:1]) if args.quick else CONFIGS
    if args.quick:
        args.repeats, args.rounds = 1, 1
    runtimes = {"onnxruntime": _ort, "openvino": _openvino}
    print("ratio = latency(portable) / latency(onnxruntime target), one thread")
    print(f"{'model':10} {'batch x seq':11} {'runtime':12} {'best us':>16} ratios (median, range)")
    for name, build in configs.items():
        original, make_feeds = build()
        models = {
            target: rnn_rewrite_rules.rewrite(original, target=target)
            for target in ("portable", "onnxruntime")
        }
        for batch, seq in SIZES:
            if name.startswith("rnn") and seq != 1:
                continue
            feeds = make_feeds(batch, seq)
            for runtime_name, make in runtimes.items():
                calls = {target: make(model, feeds) for target, model in models.items()}
                outputs = [np.asarray(call()[0]) for call in calls.values()]
                assert np.allclose(*outputs, atol=1e-5), "the two targets disagree"
                ratios, bests = [], []
                for _ in range(args.repeats):
                    timed = interleaved(
                        calls, budget=0, min_rounds=args.rounds, max_rounds=args.rounds
                    )
                    best = {target: result[0] for target, result in timed.items()}
                    ratios.append(best["portable"] / best["onnxruntime"])
                    bests.append(best)
                portable = min(b["portable"] for b in bests) * 1e6
                minimal = min(b["onnxruntime"] for b in bests) * 1e6
                print(
                    f"{name:10} {f'{batch} x {seq}':11} {runtime_name:12} "
                    f"{portable:7.1f} / {minimal:6.1f} "
                    + " ".join(f"{r:.3f}" for r in ratios)
                    + f"  ({statistics.median(ratios):.3f}, {min(ratios):.3f}-{max(ratios):.3f})",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

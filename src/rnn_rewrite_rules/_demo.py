"""``rnn-rewrite demo``: the seed model rewritten, verified and timed, without torch."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import onnx_ir as ir

from rnn_rewrite_rules import _save, runtime
from rnn_rewrite_rules._rewrite_file import RewriteOptions, rewrite_file
from rnn_rewrite_rules.rules import DEFAULT_TARGET
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model, random_inputs

__all__ = ["SEED", "run"]

#: torch's ``nn.LSTM(256, 256, num_layers=4, batch_first=True)``.
SEED = RnnConfig(input_size=256, hidden_size=256, num_layers=4, batch_first=True)


def run(
    rules: Sequence[str] | None = None,
    *,
    target: str = DEFAULT_TARGET,
    batch: int = 5,
    seq: int = 1,
    repeat: int = 50,
    save_seed: str | None = None,
) -> list[str]:
    """Build the seed, rewrite and verify it with :func:`rewrite_file`, time both; the report.

    Raises:
        OnnxRuntimeMissing: onnxruntime is not installed.
        VerifyFailed: the rewrite changed the outputs.
    """
    ort_version = runtime.require_onnxruntime()
    proto = build_torchlib_model(SEED)
    lines = [
        "demo: nn.LSTM(256, 256, num_layers=4, batch_first=True) as torch.onnx.export(dynamo=True) "
        "writes it (built in memory)"
    ]
    if save_seed:
        seed_path = _save.check_output_path(save_seed, None, in_place=False)
        with _save.Staging(seed_path) as staging:
            staging.write(ir.serde.deserialize_model(proto))
            staging.commit()
        lines.append(f"  seed model written to {save_seed}")
    with tempfile.TemporaryDirectory(prefix="rnn-rewrite-demo-") as scratch:
        before_path, after_path = Path(scratch) / "seed.onnx", Path(scratch) / "rewritten.onnx"
        before_path.write_bytes(proto.SerializeToString())
        report = rewrite_file(
            before_path, after_path, RewriteOptions(rules=rules, target=target, verify=True)
        )
        before, after = before_path.read_bytes(), after_path.read_bytes()
    lines += report.lines(header=False)
    feeds = random_inputs(SEED, batch, seq, rng=0)
    created_b, run_b = runtime.latency(before, feeds, repeat)
    created_a, run_a = runtime.latency(after, feeds, repeat)
    _, plain_b = runtime.latency(before, feeds, repeat, optimize=False)
    _, plain_a = runtime.latency(after, feeds, repeat, optimize=False)
    return [
        *lines,
        f"latency: onnxruntime {ort_version}, 1 thread, batch {batch}, seq {seq}, "
        f"median of {repeat}",
        f"  {'':<30}  {'before':>9}  {'after':>9}",
        f"  {'nodes':<30}  {report.before.nodes:>9}  {report.after.nodes:>9}",
        f"  {'session load':<30}  {created_b * 1e3:>6.1f} ms  {created_a * 1e3:>6.1f} ms",
        f"  {'run':<30}  {run_b * 1e3:>6.2f} ms  {run_a * 1e3:>6.2f} ms  ({run_b / run_a:.2f}x)",
        f"  {'run, graph optimizations off':<30}  {plain_b * 1e3:>6.2f} ms  "
        f"{plain_a * 1e3:>6.2f} ms  ({plain_b / plain_a:.2f}x)",
    ]

"""int8 dynamic quantization after the rewrite, through ONNX Runtime's own quantizer.

``onnxruntime.quantization.quantize_dynamic`` turns an ``LSTM`` into
``com.microsoft.DynamicQuantizeLSTM`` only when its ``W`` and ``R`` are 3-D initializers:
a raw torchlib export computes them at run time (gate reordering above onnxscript's
constant-folding limit), so it gets none; after ``weight_folding`` every LSTM qualifies.
This module runs that quantizer (dynamic: int8 weights, uint8 activations; ``LSTM`` ->
``DynamicQuantizeLSTM``, ``MatMul`` with a constant ``B`` -> ``MatMulInteger``, ``Gather``
of a table, ``Transpose``, ...) and says what it converted and what stays float. There is
no quantizer of our own here.

One setting differs from the quantizer's defaults: ``reduce_range=True`` (weights in 7
bits: -64..64). ONNX Runtime's u8 x s8 integer GEMM on x86 CPUs without VNNI (AVX2,
AVX-512 without VNNI) multiplies with ``vpmaddubsw``, which adds two u8 x s8 products into
a saturating int16: 8-bit weights overflow it (255 * 127 * 2 > 32767) and the result is
silently wrong, not just less precise (an ``LSTM(64)`` of weights in +-0.125: 0.1 max abs
error at the first step, 0.27 on ``c_n``; exact int8 arithmetic gives 0.0035). With 7-bit
weights no pair can overflow (255 * 64 * 2 < 32767), so the file computes the same on every
CPU it may be run on; the price is one bit of weight precision on CPUs with VNNI. Measured
the same with ONNX Runtime 1.22, 1.30, 1.31 and 1.32: a property of the kernel, not a
regression.

What stays float: ``GRU`` and ``RNN`` (ONNX Runtime has no quantized GRU or RNN kernel),
and an ``LSTM`` whose weights are not constant initializers.

The quantizer reads and writes files: :func:`quantize_file` gives it a model on disk
(its external data next to it, as torch's exporter writes it) in a directory it may
write its shape-inferred copy to, and asks for external data in the output when the
tensors would not fit in one protobuf (2 GB). :func:`quantize_int8` does the same for a
model in memory, through a temporary directory.

The error it introduces is measured, not assumed: :func:`quantization_error` runs the
float model and the quantized one at ``--verify``'s sizes (the float model's size plan)
and compares the outputs to :data:`INT8_TOLERANCE`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

if TYPE_CHECKING:
    from rnn_rewrite_rules._verify import VerifyResult

__all__ = [
    "FLOAT_ONLY",
    "INT8_TOLERANCE",
    "QuantizeResult",
    "quantization_error",
    "quantize_file",
    "quantize_int8",
]

#: Max abs difference allowed between the float and the int8 model's outputs: LSTM/GRU
#: outputs lie in (-1, 1) and 7-bit weights (scale max|w| / 64 per tensor) move them by
#: about 1e-2 (0.002 to 0.009 on a 2-layer LSTM(64), ``c_n`` the largest, at seq 2 to 64).
INT8_TOLERANCE = 0.05
#: Recurrent ops ONNX Runtime cannot quantize: they stay float.
FLOAT_ONLY: dict[str, str] = {
    "GRU": "ONNX Runtime has no quantized GRU",
    "RNN": "ONNX Runtime has no quantized RNN",
}
#: What the quantizer writes, by the float op it replaces.
_QUANTIZED = {
    "DynamicQuantizeLSTM": "LSTM",
    "MatMulInteger": "MatMul",
    "ConvInteger": "Conv",
    "DynamicQuantizeMatMul": "MatMul",
}


@dataclasses.dataclass
class QuantizeResult:
    """The quantized model and what changed."""

    #: The quantized model (None from :func:`quantize_file`: it is on disk).
    model: onnx.ModelProto | None
    #: quantized op -> count (``DynamicQuantizeLSTM``, ``MatMulInteger``, ...)
    quantized: dict[str, int]
    #: recurrent ops left float -> (count, why)
    left_float: dict[str, tuple[int, str]]
    #: The model's bytes on disk (its file and external data), before and after.
    bytes_before: int
    bytes_after: int


def _ops(model: onnx.ModelProto) -> Counter[str]:
    """The ops of the main graph, a batch-0 guard's node counted as the node."""
    from rnn_rewrite_rules.passes.batch_zero_guard import guarded_branch

    ops: Counter[str] = Counter()
    for node in model.graph.node:
        branch = guarded_branch(node)
        ops.update(n.op_type for n in (branch.node if branch is not None else [node]))
    return ops


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The quantizer logs advice (pre-processing) on the root logger: not ours to print."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def _constant_weights(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    inputs = {i.name for i in model.graph.input}
    shapes = {t.name: len(t.dims) for t in model.graph.initializer if t.name not in inputs}
    return all(shapes.get(name) == 3 for name in node.input[1:3])


def _left_float(model: onnx.ModelProto) -> dict[str, tuple[int, str]]:
    """The recurrent ops the quantizer leaves float -> (count, why)."""
    left: dict[str, tuple[int, str]] = {}
    before = _ops(model)
    for op, why in FLOAT_ONLY.items():
        if before[op]:
            left[op] = (before[op], why)
    unfolded = sum(
        1 for n in model.graph.node if n.op_type == "LSTM" and not _constant_weights(model, n)
    )
    if unfolded:
        left["LSTM"] = (unfolded, "W or R is not a constant 3-D initializer")
    return left


def _lifted(source: Path, large: bool) -> tuple[Path, set[str]]:
    """What the quantizer reads: ``source``, or where it holds batch-0 guards
    (``passes.BatchZeroGuardPass``) a copy beside it with each guarded node in its guard's
    place, and the names of those nodes' outputs.

    Why: ONNX Runtime's quantizer does not reach a node in an ``If`` branch whose weights
    are the main graph's initializers (with ``EnableSubgraph`` it fails on them), so a
    guarded LSTM would stay float; :func:`_guard_again` puts the node it makes back in a
    guard (``DynamicQuantizeLSTM`` aborts at batch 0 too)."""
    model = onnx.load(source, load_external_data=False)
    if not any(_guarded_lstm(node) is not None for node in model.graph.node):
        return source, set()
    model = onnx.load(source)
    outputs: set[str] = set()
    nodes = []
    for node in model.graph.node:
        inner = _guarded_lstm(node)
        if inner is None:
            nodes.append(node)
            continue
        branch = next(a.g for a in node.attribute if a.name == "else_branch")
        names = dict(zip((o.name for o in branch.output), node.output, strict=True))
        renamed = [names.get(name, "") for name in inner.output]
        del inner.output[:]
        inner.output.extend(renamed)
        outputs.update(name for name in renamed if name)
        nodes.append(inner)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    lifted = source.with_name(f"{source.stem}.unguarded.onnx")
    onnx.save(model, lifted, save_as_external_data=large, location=f"{lifted.name}.data")
    return lifted, outputs


def _guarded_lstm(node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The LSTM in ``node`` where ``node`` is a batch-0 guard holding it alone."""
    from rnn_rewrite_rules.passes.batch_zero_guard import guarded_branch

    branch = guarded_branch(node)
    if branch is None or len(branch.node) != 1 or branch.node[0].op_type != "LSTM":
        return None
    return branch.node[0]


def _guard_again(target: Path, outputs: set[str], large: bool) -> None:
    """The quantized model at ``target`` with each node writing one of ``outputs`` (the
    lifted LSTMs, now ``DynamicQuantizeLSTM`` or still ``LSTM``) back in a batch-0 guard,
    the lifted guards' dead conditions removed."""
    import onnx_ir as ir

    from rnn_rewrite_rules._rnn_ops import REPLACES_BATCH_0_RUN
    from rnn_rewrite_rules.passes import BatchZeroGuardPass, RemoveDeadNodesPass

    model = ir.from_proto(onnx.load(target))
    for node in model.graph:
        if any(v.name in outputs for v in node.outputs):
            node.meta[REPLACES_BATCH_0_RUN] = True
    RemoveDeadNodesPass()(model)
    BatchZeroGuardPass()(model)
    proto = ir.to_proto(model)
    onnx.save(proto, target, save_as_external_data=large, location=f"{target.name}.data")


def _bytes_on_disk(path: Path) -> int:
    """The model file's size and that of each external data file it references."""
    from rnn_rewrite_rules._load import referenced_data_files

    files = {path, *(path.parent / name for name in referenced_data_files(path))}
    return sum(f.stat().st_size for f in files if f.is_file())


def quantize_file(source: str | Path, target: str | Path) -> QuantizeResult:
    """The model at ``source`` quantized by ``onnxruntime.quantization.quantize_dynamic``
    (7-bit weights: ``reduce_range``) into ``target``, with external data
    (``<target>.data``) when the tensors would not fit in one protobuf.

    The quantizer writes a shape-inferred copy next to ``source``: give it a directory of
    your own (a scratch copy), not the user's input folder.

    Raises:
        rnn_rewrite_rules.runtime.OnnxRuntimeMissing: onnxruntime is not installed.
    """
    from rnn_rewrite_rules._save import EMBED_LIMIT_BYTES
    from rnn_rewrite_rules.runtime import require_onnxruntime

    require_onnxruntime()
    from onnxruntime.quantization import quantize_dynamic

    source, target = Path(source), Path(target)
    left = _left_float(onnx.load(source, load_external_data=False))
    bytes_before = _bytes_on_disk(source)
    large = bytes_before > EMBED_LIMIT_BYTES
    read, guarded = _lifted(source, large)
    with _quiet():
        quantize_dynamic(
            read,
            target,
            reduce_range=True,  # 7-bit weights: no int16 overflow without VNNI (module doc)
            use_external_data_format=large,
        )
    if guarded:
        _guard_again(target, guarded, large)
    after = _ops(onnx.load(target, load_external_data=False))
    return QuantizeResult(
        model=None,
        quantized={op: after[op] for op in _QUANTIZED if after[op]},
        left_float=left,
        bytes_before=bytes_before,
        bytes_after=_bytes_on_disk(target),
    )


def quantize_int8(model: onnx.ModelProto) -> QuantizeResult:
    """``model`` (its tensors in memory) quantized by ``onnxruntime.quantization
    .quantize_dynamic`` (as :func:`quantize_file`), through files in a temporary directory
    (:func:`quantize_file`).

    Raises:
        rnn_rewrite_rules.runtime.OnnxRuntimeMissing: onnxruntime is not installed.
    """
    from rnn_rewrite_rules._save import EMBED_LIMIT_BYTES

    with tempfile.TemporaryDirectory(prefix="rnn-rewrite-int8-") as scratch:
        source, target = Path(scratch) / "float.onnx", Path(scratch) / "int8.onnx"
        large = model.ByteSize() > EMBED_LIMIT_BYTES
        onnx.save(model, source, save_as_external_data=large, location="float.onnx.data")
        result = quantize_file(source, target)
        result.model = onnx.load(target)
    return result


def quantization_error(
    original: onnx.ModelProto,
    quantized: onnx.ModelProto,
    *,
    tolerance: float = INT8_TOLERANCE,
    seed: int = 0,
) -> VerifyResult:
    """``--verify`` of the float ``original`` against the int8 model at ``tolerance``, at
    the sizes of the original's size plan (a :class:`rnn_rewrite_rules._verify
    .VerifyResult`)."""
    import onnx_ir as ir

    from rnn_rewrite_rules import _verify
    from rnn_rewrite_rules._size_plan import SizePlan
    from rnn_rewrite_rules._time_major import time_major_equivalent

    sizes = SizePlan.of(ir.serde.deserialize_model(original))
    plan = _verify.VerifyPlan(
        sizes, seed=seed, tolerance=tolerance, equivalent=time_major_equivalent
    )
    return _verify.verify(original.SerializeToString(), quantized.SerializeToString(), plan)

"""int8 dynamic quantization after the rewrite, through ONNX Runtime's own quantizer.

``onnxruntime.quantization.quantize_dynamic`` turns an ``LSTM`` into
``com.microsoft.DynamicQuantizeLSTM`` only when its ``W`` and ``R`` are 3-D initializers:
a raw torchlib export computes them at run time (gate reordering above onnxscript's
constant-folding limit), so it gets none; after ``weight_folding`` every LSTM qualifies.
This module runs that quantizer with its defaults (dynamic, int8 weights, uint8
activations; ``LSTM`` -> ``DynamicQuantizeLSTM``, ``MatMul`` with a constant ``B`` ->
``MatMulInteger``, ``Gather`` of a table, ``Transpose``, ...) and says what it converted
and what stays float. There is no quantizer of our own here.

What stays float: ``GRU`` and ``RNN`` (ONNX Runtime has no quantized GRU or RNN kernel),
and an ``LSTM`` whose weights are not constant initializers.

The error it introduces is measured, not assumed: :func:`quantization_error` runs the
float model and the quantized one on ``--verify``'s inputs and compares the outputs to
:data:`INT8_TOLERANCE`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Iterator

import onnx

__all__ = [
    "FLOAT_ONLY",
    "INT8_TOLERANCE",
    "QuantizeResult",
    "quantization_error",
    "quantize_int8",
]

#: Max abs difference allowed between the float and the int8 model's outputs: LSTM/GRU
#: outputs lie in (-1, 1) and int8 weights (scale max|w| / 127 per tensor) move them by
#: about 1e-2 (0.005 to 0.01 on a 4-layer LSTM(256) at seq 1 to 16).
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

    model: onnx.ModelProto
    #: quantized op -> count (``DynamicQuantizeLSTM``, ``MatMulInteger``, ...)
    quantized: dict[str, int]
    #: recurrent ops left float -> (count, why)
    left_float: dict[str, tuple[int, str]]
    bytes_before: int
    bytes_after: int


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(node.op_type for node in model.graph.node)


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


def quantize_int8(model: onnx.ModelProto) -> QuantizeResult:
    """``model`` quantized by ``onnxruntime.quantization.quantize_dynamic`` (defaults).

    Raises:
        rnn_rewrite_rules.runtime.OnnxRuntimeMissing: onnxruntime is not installed.
    """
    from rnn_rewrite_rules.runtime import require_onnxruntime

    require_onnxruntime()
    from onnxruntime.quantization import quantize_dynamic

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
    large = model.ByteSize() > 2**31 - 2**26
    with tempfile.TemporaryDirectory() as tmp, _quiet():
        path = os.path.join(tmp, "quantized.onnx")
        quantize_dynamic(model, path, use_external_data_format=large)
        result = onnx.load(path)
    after = _ops(result)
    quantized = {op: after[op] for op in _QUANTIZED if after[op]}
    return QuantizeResult(
        model=result,
        quantized=quantized,
        left_float=left,
        bytes_before=model.ByteSize(),
        bytes_after=result.ByteSize(),
    )


def quantization_error(
    original: onnx.ModelProto,
    quantized: onnx.ModelProto,
    *,
    tolerance: float = INT8_TOLERANCE,
    seed: int = 0,
):
    """``--verify`` of the float ``original`` against the int8 model at ``tolerance``
    (a :class:`rnn_rewrite_rules._verify.VerifyResult`)."""
    import onnx_ir as ir

    from rnn_rewrite_rules import _verify

    specs = _verify.input_specs(ir.serde.deserialize_model(original))
    return _verify.verify(
        original.SerializeToString(),
        quantized.SerializeToString(),
        specs,
        seed=seed,
        tolerance=tolerance,
    )

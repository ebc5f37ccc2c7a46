"""What a tensor holds, proven from the graph: all zeros, or finite (no inf, no NaN).

Graph inputs are never zeros (a caller feeds them) and are finite only when their
declared element type is an integer. ``x * 0`` is zeros only for a provably finite
``x``: ``inf * 0`` and ``NaN * 0`` are NaN.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array

__all__ = ["is_all_zeros", "is_finite"]

#: Ops whose output is all zeros whenever their first (data) input is.
ZERO_PRESERVING = frozenset(
    {
        "Slice", "Expand", "Identity", "Cast", "Unsqueeze", "Squeeze", "Reshape", "Transpose",
        "Tile", "Flatten", "Gather", "DequantizeLinear", "Neg", "Relu", "Abs",
    }
)  # fmt: skip
#: Ops whose output is finite whenever their first (data) input is.
_FINITE_PRESERVING = (ZERO_PRESERVING - {"Cast", "DequantizeLinear"}) | {"Tanh", "Sigmoid"}
#: Ops whose output is an integer tensor whatever their input.
_INTEGER_OUTPUT = frozenset({"Shape", "Size", "ArgMax", "ArgMin", "NonZero"})
_INTEGER_TYPES = frozenset(t for t in ir.DataType if t.is_integer() or t == ir.DataType.BOOL)
_MAX_DEPTH = 16


def _fill(node: ir.Node) -> np.ndarray:
    """ConstantOfShape's fill (float32 0 when the attribute is absent)."""
    attr = node.attributes.get("value")
    return np.zeros(1, np.float32) if attr is None else attr.as_tensor().numpy()


def is_all_zeros(value: ir.Value | None, depth: int = 0) -> bool:
    """True when every element of ``value`` is provably zero (never for graph inputs)."""
    if value is None or value.is_graph_input() or depth > _MAX_DEPTH:
        return False
    array = const_array(value)
    if array is not None:
        return bool(np.all(array == 0))
    node = value.producer()
    if node is None or node.domain != "":
        return False
    op_type = node.op_type
    if op_type == "ConstantOfShape":
        return bool(np.all(_fill(node) == 0))
    if op_type in ZERO_PRESERVING and node.inputs and value is node.outputs[0]:
        if op_type == "DequantizeLinear":  # (x - zero_point) * scale
            return _dequantizes_to_zero(node, depth)
        return is_all_zeros(node.inputs[0], depth + 1)
    if op_type == "Concat":
        return all(is_all_zeros(v, depth + 1) for v in node.inputs)
    if op_type == "Mul":
        a, b = node.inputs[:2]
        return (is_all_zeros(a, depth + 1) and is_finite(b, depth + 1)) or (
            is_all_zeros(b, depth + 1) and is_finite(a, depth + 1)
        )
    return False


def _dequantizes_to_zero(node: ir.Node, depth: int) -> bool:
    """``(x - zero_point) * scale`` is zero where ``x`` equals the zero point and no scale
    is inf or NaN (``0 * inf`` is NaN)."""
    x = node.inputs[0]
    scale = node.inputs[1] if len(node.inputs) > 1 else None
    if not is_finite(scale, depth + 1):
        return False
    zero_point = node.inputs[2] if len(node.inputs) > 2 else None
    if zero_point is None:
        return is_all_zeros(x, depth + 1)
    x_array, zp_array = const_array(x), const_array(zero_point)
    return x_array is not None and zp_array is not None and bool(np.all(x_array == zp_array))


def is_finite(value: ir.Value | None, depth: int = 0) -> bool:
    """True when no element of ``value`` can be inf or NaN."""
    if value is None or depth > _MAX_DEPTH:
        return False
    if value.is_graph_input():
        return value.dtype in _INTEGER_TYPES
    array = const_array(value)
    if array is not None:
        return array.dtype.kind in "iub" or bool(np.all(np.isfinite(array)))
    node = value.producer()
    if node is None or node.domain != "":
        return False
    op_type = node.op_type
    if op_type in _INTEGER_OUTPUT:
        return True
    if op_type == "Cast":
        to = ir.DataType(node.attributes.get_int("to", 0))
        return to in _INTEGER_TYPES or is_finite(node.inputs[0], depth + 1)
    if op_type == "ConstantOfShape":
        return bool(np.all(np.isfinite(_fill(node))))
    if op_type in _FINITE_PRESERVING and node.inputs and value is node.outputs[0]:
        return is_finite(node.inputs[0], depth + 1)
    if op_type == "Concat":
        return all(is_finite(v, depth + 1) for v in node.inputs)
    return False

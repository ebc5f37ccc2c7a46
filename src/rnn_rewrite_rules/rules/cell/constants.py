"""The value of a body or step value computed from constants alone.

:class:`Constants` evaluates a value computed from constants only (initializers,
``Constant`` nodes, values bound to a constant: a loop-invariant carried value to the
Loop's input, an iteration number to its number). Each node is run by ``onnx.reference``
at the graph's opset, ONNX's own reference of each op, and Casts the way ONNX Runtime
rounds them (:func:`~rnn_rewrite_rules.shape.constant.cast_as_runtime`): the value is
the one the graph computes, bit for bit, or None (an op outside :data:`_EVALUATED`, an
operand not constant, or one over :data:`_MAX_ELEMENTS` elements).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator

from rnn_rewrite_rules._ir import const_array
from rnn_rewrite_rules.shape.constant import cast_as_runtime

__all__ = ["Constants"]

#: Ops :class:`Constants` evaluates: deterministic, no subgraphs, no randomness.
_EVALUATED = frozenset(
    {
        "Add", "And", "Cast", "Concat", "Div", "Equal", "Gather", "Greater",
        "GreaterOrEqual", "Identity", "Less", "LessOrEqual", "Mul", "Neg", "Not", "Or",
        "Reshape", "Shape", "Slice", "Split", "Squeeze", "Sub", "Transpose", "Unsqueeze",
        "Xor",
    }
)  # fmt: skip
#: Above this many elements a value is not evaluated (a weight is a few million at most).
_MAX_ELEMENTS = 1 << 27


class Constants:
    """The numpy value of a value computed from constants alone, else None.

    ``bound`` maps a value (a body input) to a value or array it provably equals (a
    loop-invariant carried value to the Loop's input; an iteration number to its number
    while the condition is evaluated). ``opset`` is the ONNX opset the nodes run at.
    """

    def __init__(
        self, opset: int, bound: Mapping[ir.Value, ir.Value | np.ndarray] | None = None
    ) -> None:
        self._opset = opset
        self._bound = dict(bound or {})
        self._memo: dict[ir.Value, np.ndarray | None] = {}

    def __call__(self, value: ir.Value | None) -> np.ndarray | None:
        if value is None:
            return None
        if value not in self._memo:
            self._memo[value] = None  # a cycle (there is none in a valid graph) is unknown
            self._memo[value] = self._compute(value)
        return self._memo[value]

    def _compute(self, value: ir.Value) -> np.ndarray | None:
        if value in self._bound:
            bound = self._bound[value]
            return self(bound) if isinstance(bound, ir.Value) else np.asarray(bound)
        array = _constant(value)
        if array is not None:
            return array
        node = value.producer()
        if node is None or node.domain != "" or node.op_type not in _EVALUATED:
            return None
        operands: list[np.ndarray | None] = []
        for operand in node.inputs:  # the first operand not constant ends it
            array = None if operand is None else self(operand)
            if operand is not None and (array is None or array.size > _MAX_ELEMENTS):
                return None
            operands.append(array)
        try:
            results = _evaluate(node, operands, self._opset)
        except Exception:
            return None
        for output, result in zip(node.outputs, results, strict=True):
            if output is not value:
                self._memo.setdefault(output, result)
        return results[list(node.outputs).index(value)]


def _constant(value: ir.Value) -> np.ndarray | None:
    """:func:`~rnn_rewrite_rules._ir.const_array` without its side effect: onnx_ir's
    ``get_const_tensor`` names a ``Constant`` node's tensor after its output, which changes
    the node as saved (a read must leave the graph as it is)."""
    node = value.producer()
    if (
        node is None
        or node.op_type != "Constant"
        or node.domain != ""
        or value.const_value is not None
    ):
        return const_array(value)
    if len(node.attributes) != 1 or len(node.outputs) != 1:
        return None
    ((name, attribute),) = node.attributes.items()
    if attribute.is_ref():
        return None
    if name == "value":
        return attribute.as_tensor().numpy()
    if name in ("value_float", "value_floats"):
        return np.array(attribute.value, dtype=np.float32)
    if name in ("value_int", "value_ints"):
        return np.array(attribute.value, dtype=np.int64)
    return None


def _evaluate(node: ir.Node, operands: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """``node``'s outputs for these operands, as ONNX (and ONNX Runtime's Cast) define them."""
    if node.op_type == "Cast":
        to = ir.DataType(node.attributes.get_int("to", 0))
        assert operands[0] is not None
        return [np.asarray(cast_as_runtime(operands[0], to.numpy()))]
    proto = ir.serde.serialize_node(node)
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(node.inputs)]
    del proto.input[:]
    proto.input.extend(names)
    del proto.output[:]
    proto.output.extend(f"out{i}" for i in range(len(node.outputs)))
    feeds = {n: a for n, a in zip(names, operands, strict=True) if n}
    results = ReferenceEvaluator(proto, opsets={"": opset}).run(None, feeds)
    return [np.asarray(r) for r in results]

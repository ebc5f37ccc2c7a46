"""Remove ``Mul`` nodes that multiply a value by ones of its own shape (Keras 2's
dropout masks at inference: ``h * ones_like(h)`` before each gate's recurrent
``MatMul`` of an ``LSTM(recurrent_dropout=...)``, as tf2onnx writes them).

Pattern: ``y = Mul(v, ones)`` (either operand order), ``ones = ConstantOfShape(Shape(v),
value=1)`` or a constant scalar ``1``.
Condition: the ``Shape`` reads all of ``v``'s axes (no ``start``/``end``); the one is of
``v``'s element type (the ``value`` attribute or the constant's), so ``Mul`` reads two
values of one type; ``y`` is not an output of the model's graph or a function
(:func:`~rnn_rewrite_rules.normalize._values.names_an_output`).
Replacement: ``y``'s readers read ``v`` (:func:`~rnn_rewrite_rules.normalize._values.bypass`).
Equality: ``ones`` has ``v``'s shape (or is a scalar), so the product has ``v``'s shape;
``x * 1`` is ``x`` for every number, infinities and signed zeros included, and a NaN
stays a NaN.

onnxscript's rules fold ``Mul`` by a constant one only; the mask here is computed at run
time from the state's shape, hence this pass.
"""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array
from rnn_rewrite_rules.normalize._node_pass import NodePass
from rnn_rewrite_rules.normalize._values import ElementTypes, bypass, names_an_output

__all__ = ["MulByOnesPass"]


class MulByOnesPass(NodePass):
    """Every ``Mul`` of a value by ones of its shape, gone (see the module docstring);
    ``journal`` records each removal, to put back where no rule used it."""

    op_type = "Mul"

    def start(self, model: ir.Model) -> None:
        self._types = ElementTypes()

    def edit(self, node: ir.Node, model: ir.Model) -> bool:
        if len(node.inputs) != 2 or names_an_output(node, model):
            return False
        a, b = node.inputs
        for value, other in ((a, b), (b, a)):
            if value is not None and other is not None and self._ones_of(other, value):
                return bypass(node, value, self.journal)
        return False

    def _ones_of(self, ones: ir.Value, value: ir.Value) -> bool:
        """``ones`` is ones of ``value``'s shape and element type, or a scalar one."""
        dtype = self._types(value)
        if dtype is None:
            return False
        scalar = const_array(ones)
        if scalar is not None:
            return scalar.shape == () and _one(scalar, dtype)
        node = ones.producer()
        if node is None or (node.domain, node.op_type) != ("", "ConstantOfShape"):
            return False
        shape = node.inputs[0].producer() if node.inputs and node.inputs[0] else None
        if shape is None or (shape.domain, shape.op_type) != ("", "Shape"):
            return False
        if shape.inputs[0] is not value or "start" in shape.attributes:
            return False
        if "end" in shape.attributes:
            return False
        attr = node.attributes.get("value")
        if attr is None:
            return False  # the default is a float32 zero
        return _one(attr.as_tensor().numpy(), dtype)


def _one(array, dtype: ir.DataType) -> bool:
    """``array`` holds one element, 1, of type ``dtype``."""
    return (
        array.size == 1
        and ir.DataType.from_numpy(array.dtype) == dtype
        and bool(array.reshape(()) == 1)
    )

"""What a pass hands a rule's constant helpers (``rules._initializers.int64_constant``) as
their builder, outside the rewriter."""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["Placer"]


class Placer:
    """The two calls of a rewrite's builder :func:`int64_constant` makes, outside the
    rewriter: a ``Constant`` node before ``node``, or an initializer of the main graph."""

    def __init__(self, graph: ir.Graph | ir.Function, node: ir.Node, name: str) -> None:
        self._graph, self._node, self._name, self._count = graph, node, name, 0

    def Constant(self, value: ir.TensorProtocol) -> ir.Value:
        self._count += 1
        name = f"{self._name}_{self._count}"
        constant = ir.node("Constant", [], {"value": value}, name=name)
        constant.outputs[0].name = name
        constant.outputs[0].dtype = value.dtype
        constant.outputs[0].shape = ir.Shape(value.shape.numpy())
        self._graph.insert_before(self._node, constant)
        return constant.outputs[0]

    def initializer(self, tensor: ir.TensorProtocol, name: str) -> ir.Value:
        value = ir.Value(name=name, const_value=tensor, shape=ir.Shape(tensor.shape.numpy()))
        value.dtype = tensor.dtype
        assert isinstance(self._graph, ir.Graph)  # int64_constant: a function's are nodes
        self._graph.register_initializer(value)
        return value

"""``Gemm`` whose bias adds nothing, as the ``MatMul`` it is (jax2onnx's ``Gemm(beta=0)``).

Pattern: ``Y = Gemm(A, B, C, alpha=1, beta=b, transA=ta, transB=tb)``.
Condition: ``alpha`` is 1 and the bias adds zero: ``C`` absent, or ``beta`` 0 and ``C`` a
constant of finite values, or ``C`` a constant of zeros.
Replacement: ``Y = MatMul(A', B')``, ``A'``/``B'`` a ``Transpose`` where ``ta``/``tb``.
Equality: ``Gemm`` is ``alpha * A' @ B' + beta * C`` on 2-D ``A'``, ``B'`` (which is
``MatMul``'s product there); ``beta * C`` and a zero ``C`` are zeros, whose sum with the
product is the product as numbers (a ``-0`` may read ``+0`` in the original; ONNX Runtime
skips ``C`` at ``beta`` 0 and gives the product's bits). A non-finite ``C`` at ``beta``
0 is NaN by the ONNX definition but skipped by ONNX Runtime: not rewritten.

The cell recognisers read ``Gemm`` with ``alpha`` and ``beta`` 1 and ``MatMul``;
onnxscript's Gemm rules go the other way (``MatMul`` + ``Add`` -> ``Gemm``) or need a
Reshape around, hence this pass.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array, replace_node
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.normalize._journal import Replaced
from rnn_rewrite_rules.normalize._node_pass import NodePass

__all__ = ["GemmPass"]


class GemmPass(NodePass):
    """Every ``Gemm`` that is a product, a ``MatMul`` (see the module docstring).

    ``refusals``: (node name, reason) for each ``Gemm`` with a bias left as written;
    ``journal`` records each replacement, to put back where no rule used it.
    """

    op_type = "Gemm"

    def edit(self, node: ir.Node, model: ir.Model) -> bool:
        reason = product_reason(node)
        if reason is not None:
            self.refuse(node, reason)
            return False
        graph = node.graph
        if graph is None:
            return False
        self.record(_to_matmul(graph, node))
        return True


def product_reason(node: ir.Node) -> Refusal | None:
    """None when ``node`` (a ``Gemm``) is ``A' @ B'`` as numbers, else why not."""
    attrs = node.attributes
    if attrs.get_float("alpha", 1.0) != 1.0:
        return Refusal(f"{node.name}: alpha is {attrs.get_float('alpha', 1.0)}, not 1")
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is None:
        return None
    values = const_array(bias)
    if values is None:
        return Refusal(f"{node.name}: the bias C is not a constant")
    if attrs.get_float("beta", 1.0) == 0.0 and np.isfinite(values).all():
        return None
    if not values.any() and np.isfinite(values).all():
        return None
    return Refusal(f"{node.name}: the bias C adds more than zeros (beta and C)")


def _to_matmul(graph: ir.Graph | ir.Function, node: ir.Node) -> Replaced:
    inputs = list(node.inputs)
    a, b = node.inputs[0], node.inputs[1]
    added: list[ir.Node] = []
    operands = []
    for value, flag in ((a, "transA"), (b, "transB")):
        if node.attributes.get_int(flag, 0):
            transpose = ir.Node(
                "",
                "Transpose",
                [value],
                [ir.AttrInt64s("perm", [1, 0])],
                name=f"{node.name}_{flag}",
            )
            added.append(transpose)
            value = transpose.outputs[0]
        operands.append(value)
    matmul = ir.Node("", "MatMul", operands, name=node.name)
    added.append(matmul)
    graph.insert_before(node, added)
    replace_node(node, matmul.outputs[0])
    return Replaced(graph, node, inputs, matmul, added[:-1])

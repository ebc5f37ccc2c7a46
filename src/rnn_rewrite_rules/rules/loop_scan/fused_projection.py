"""Per-gate ``Slice``\\ s of one fused projection, read as one projection per gate
(Keras 3's GRU and SimpleRNN cells as tf2onnx writes them).

Pattern: ``y = Slice(P, starts, ends, axes)`` with ``P = MatMul(h, R) + b`` (either
order), ``P = MatMul(h, R)`` or ``P = Gemm(a, R, b)`` (torch's ``chunk`` of a ``Linear``),
inside a Loop body.
Condition: ``R`` is a constant ``[K, N]`` (``[N, K]`` with ``transB``) and ``b`` a
constant whose last axis is ``N`` or 1 (read with the Loop's invariants bound to their
initial values); ``P`` is ``[rows, N]``: ``h`` is a body input declared of rank 2, or
``P`` is a ``Gemm`` (its operands are matrices wherever it runs); ``starts``, ``ends``,
``axes`` (and ``steps``, all 1) are constants, or computed from ``N`` alone, read as
``Gather(Shape(P), 1)`` (``-1`` too; torch's ``chunk`` writes ``(N + 2) / 3 * k``); the
columns' axis (1 or -1) takes ``[s, e)``; the rows' (0), if named, starts at 0 and ends at
``2**31 - 1`` or more.
Replacement: ``y = MatMul(h, R[:, s:e]) + b[..., s:e]`` (``b`` as it is where its last
axis is 1); for a ``Gemm``, the same ``Gemm`` of ``R``'s columns ``s:e`` (its rows with
``transB``) and ``b[..., s:e]``.
Equality: a column of ``h @ R`` is ``h`` times that column of ``R`` (of ``Gemm``:
``alpha`` times that, plus ``beta`` times the column of ``b``); a bias broadcast along
the rows slices with its columns; ``Shape(P)[1]`` is ``N`` wherever ``P`` is computed. The
rows: a gate of the Loop the proof replaces is this slice plus the input's part,
``[batch, H]`` with the batch of ``X`` (``LoopToRnn`` proves ``X`` and the states): a slice
that dropped rows would not broadcast against it and the original would fail there, so
where it runs the slice keeps every row.

Not a normalisation pass: three products replace one, which changes the kernels a
Loop that stays a Loop runs; so only the Loop proof reads it, on a copy of the body
(:func:`split_projections`), and only the one node replacing the Loop computes from it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array, replace_node
from rnn_rewrite_rules.rules.cell import Constants
from rnn_rewrite_rules.rules.cell.columns import slice_columns

__all__ = ["split_projections"]


def _product(value: ir.Value) -> tuple[ir.Node, ir.Value | None] | None:
    """``(MatMul, bias)`` when ``value`` is ``MatMul(h, R) [+ bias]``; ``(Gemm, C)`` when
    it is a ``Gemm``."""
    node = value.producer()
    if node is None or node.domain != "":
        return None
    if node.op_type == "MatMul":
        return node, None
    if node.op_type == "Gemm" and len(node.inputs) >= 2:
        return node, node.inputs[2] if len(node.inputs) > 2 else None
    if node.op_type != "Add" or len(node.inputs) != 2:
        return None
    for a, b in (node.inputs, node.inputs[::-1]):
        matmul = None if a is None else a.producer()
        if matmul is not None and matmul.op_type == "MatMul" and matmul.domain == "":
            return matmul, b
    return None


def _width_bindings(product: ir.Value, width: int) -> dict[ir.Value, np.ndarray]:
    """``Gather(Shape(product), 1)`` (or ``-1``) -> ``width``, for every such value: what
    ``product``, ``[rows, width]``, gives them wherever it is computed."""
    bound: dict[ir.Value, np.ndarray] = {}
    for shape, _ in product.uses():
        if shape.op_type != "Shape" or shape.domain != "" or shape.attributes:
            continue
        for gather, index in shape.outputs[0].uses():
            indices = const_array(gather.inputs[1]) if len(gather.inputs) == 2 else None
            if (
                gather.op_type == "Gather"
                and gather.domain == ""
                and index == 0
                and gather.attributes.get_int("axis", 0) == 0
                and indices is not None
                and indices.dtype.kind == "i"
                and np.isin(indices, (1, -1)).all()
            ):
                bound[gather.outputs[0]] = np.full(indices.shape, width, np.int64)
    return bound


def _declared_rank_2(value: ir.Value, body: ir.Graph) -> bool:
    return value in body.inputs and value.shape is not None and len(value.shape) == 2


def _constant(array: np.ndarray) -> ir.Node:
    return ir.node("Constant", [], attributes={"value": ir.tensor(np.asarray(array, order="C"))})


def _gate_nodes(
    product: ir.Node, h: ir.Value, r: np.ndarray, b: np.ndarray | None, columns: tuple[int, int]
) -> list[ir.Node]:
    """The nodes computing columns ``[s, e)`` of ``product`` (``MatMul(h, R) [+ b]`` or
    ``Gemm(h, R, b)``; ``r`` is ``R`` as ``[K, N]``), the result last."""
    s, e = columns
    part = None if b is None else (b if b.shape[-1] == 1 else b[..., s:e])
    if product.op_type == "Gemm":
        transposed = product.attributes.get_int("transB", 0)
        nodes = [_constant(r[:, s:e].T if transposed else r[:, s:e])]
        inputs = [h, nodes[0].outputs[0]]
        if part is not None:
            nodes.append(_constant(part))
            inputs.append(nodes[-1].outputs[0])
        attributes = [ir.Attr(a.name, a.type, a.value) for a in product.attributes.values()]
        return [*nodes, ir.Node("", "Gemm", inputs, attributes)]
    nodes = [_constant(r[:, s:e])]
    nodes.append(ir.node("MatMul", [h, nodes[0].outputs[0]]))
    if part is not None:
        nodes.append(_constant(part))
        nodes.append(ir.node("Add", [nodes[1].outputs[0], nodes[-1].outputs[0]]))
    return nodes


def _split(node: ir.Node, body: ir.Graph, constants: Constants) -> bool:
    """Replace ``node`` (a ``Slice``) by its gate's own product, when the module's
    condition holds."""
    data = node.inputs[0] if node.inputs else None
    found = None if data is None else _product(data)
    if data is None or found is None:
        return False
    matmul, bias = found
    h, weight = matmul.inputs[:2]
    r = constants(weight)
    gemm = matmul.op_type == "Gemm"
    if h is None or r is None or r.ndim != 2 or not (gemm or _declared_rank_2(h, body)):
        return False
    transposed = matmul.attributes.get_int("transB", 0)
    if gemm and transposed:
        r = r.T
    width = r.shape[1]
    columns = slice_columns(node, width, constants.bind(_width_bindings(data, width)))
    b = None if bias is None else constants(bias)
    if columns is None or (bias is not None and (b is None or b.ndim == 0)):
        return False
    if b is not None and b.shape[-1] not in (1, r.shape[1]):
        return False
    nodes = _gate_nodes(matmul, h, r, b, columns)
    result = nodes[-1].outputs[0]
    body.insert_before(node, nodes)
    replace_node(node, result)  # the slice's name and declaration, on the value in its place
    return True


def split_projections(body: ir.Graph, constants: Constants) -> int:
    """Split, in ``body`` (a copy the caller owns), every per-gate ``Slice`` of a fused
    projection (see the module docstring); the number split."""
    count = 0
    for node in list(body):
        if node.op_type == "Slice" and node.domain == "":
            count += _split(node, body, constants)
    return count

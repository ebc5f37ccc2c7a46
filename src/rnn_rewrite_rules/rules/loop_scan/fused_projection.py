"""Per-gate ``Slice``\\ s of one fused projection, read as one projection per gate
(Keras 3's GRU and SimpleRNN cells as tf2onnx writes them).

Pattern: ``y = Slice(P, starts, ends, axes)`` with ``P = MatMul(h, R) + b`` (either
order) or ``P = MatMul(h, R)``, inside a Loop body.
Condition: ``R`` is a constant ``[K, N]`` and ``b`` a constant whose last axis is ``N``
or 1 (read with the Loop's invariants bound to their initial values); ``h`` is a body
input declared of rank 2, so ``P`` is ``[rows, N]``; ``starts``, ``ends``, ``axes`` (and
``steps``, all 1) are constants; the columns' axis (1 or -1) takes ``[s, e)``; the rows'
(0), if named, starts at 0 and ends at ``2**31 - 1`` or more.
Replacement: ``y = MatMul(h, R[:, s:e]) + b[..., s:e]`` (``b`` as it is where its last
axis is 1).
Equality: a column of ``h @ R`` is ``h`` times that column of ``R``; a bias broadcast
along the rows slices with its columns. The rows: a gate of the Loop the proof replaces
is this slice plus the input's part, ``[batch, H]`` with the batch of ``X`` (``LoopToRnn``
proves ``X`` and the states): a slice that dropped rows would not broadcast against it
and the original would fail there, so where it runs the slice keeps every row.

Not a normalisation pass: three products replace one, which changes the kernels a
Loop that stays a Loop runs; so only the Loop proof reads it, on a copy of the body
(:func:`split_projections`), and only the one node replacing the Loop computes from it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array, replace_node
from rnn_rewrite_rules.rules.cell import Constants

__all__ = ["split_projections"]

#: A rows' end at least this keeps every row (see the module docstring).
_ALL_ROWS = 2**31 - 1


def _product(value: ir.Value) -> tuple[ir.Node, ir.Value | None] | None:
    """``(MatMul, bias)`` when ``value`` is ``MatMul(h, R) [+ bias]``."""
    node = value.producer()
    if node is None or node.domain != "":
        return None
    if node.op_type == "MatMul":
        return node, None
    if node.op_type != "Add" or len(node.inputs) != 2:
        return None
    for a, b in (node.inputs, node.inputs[::-1]):
        matmul = None if a is None else a.producer()
        if matmul is not None and matmul.op_type == "MatMul" and matmul.domain == "":
            return matmul, b
    return None


def _columns(node: ir.Node, width: int) -> tuple[int, int] | None:
    """``[s, e)`` of the columns when ``node`` (a ``Slice`` of a ``[rows, width]`` value)
    keeps every row and those columns."""
    arrays = [const_array(v) if v is not None else None for v in node.inputs[1:]]
    if len(arrays) < 3 or any(a is None for a in arrays[:3]):
        return None
    starts, ends, axes = (np.asarray(a).reshape(-1) for a in arrays[:3])
    if len(arrays) > 3 and arrays[3] is not None and not np.all(arrays[3] == 1):
        return None
    if not len(starts) == len(ends) == len(axes):
        return None
    found = None
    for start, end, axis in zip(starts.tolist(), ends.tolist(), axes.tolist(), strict=True):
        if axis == 0:
            if start != 0 or end < _ALL_ROWS:
                return None
        elif axis in (1, -1) and found is None:
            s = max(0, start + width if start < 0 else start)
            e = min(width, end + width if end < 0 else end)
            found = (s, max(s, e))
        else:
            return None
    return found


def _declared_rank_2(value: ir.Value, body: ir.Graph) -> bool:
    return value in body.inputs and value.shape is not None and len(value.shape) == 2


def _split(node: ir.Node, body: ir.Graph, constants: Constants) -> bool:
    """Replace ``node`` (a ``Slice``) by its gate's own product, when the module's
    condition holds."""
    data = node.inputs[0] if node.inputs else None
    found = None if data is None else _product(data)
    if found is None:
        return False
    matmul, bias = found
    h, weight = matmul.inputs
    r = constants(weight)
    if h is None or r is None or r.ndim != 2 or not _declared_rank_2(h, body):
        return False
    columns = _columns(node, r.shape[1])
    b = None if bias is None else constants(bias)
    if columns is None or (bias is not None and (b is None or b.ndim == 0)):
        return False
    if b is not None and b.shape[-1] not in (1, r.shape[1]):
        return False
    s, e = columns
    nodes = [
        ir.node("Constant", [], attributes={"value": ir.tensor(np.ascontiguousarray(r[:, s:e]))})
    ]
    nodes.append(ir.node("MatMul", [h, nodes[0].outputs[0]]))
    result = nodes[-1].outputs[0]
    if b is not None:
        part = b if b.shape[-1] == 1 else b[..., s:e]
        nodes.append(
            ir.node("Constant", [], attributes={"value": ir.tensor(np.ascontiguousarray(part))})
        )
        nodes.append(ir.node("Add", [result, nodes[-1].outputs[0]]))
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

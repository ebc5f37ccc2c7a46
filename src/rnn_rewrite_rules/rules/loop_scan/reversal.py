"""Time reversals around a recurrence: ``ReverseSequence`` with every length the full
sequence, or a ``Slice`` stepping backwards over the whole time axis."""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array
from rnn_rewrite_rules.rules._graph import producer
from rnn_rewrite_rules.rules.bidirectional import is_reversal
from rnn_rewrite_rules.shape import ShapeProver

__all__ = ["reversed_source", "undone_reversal"]


def _time_length_vector(
    lengths: ir.Value, axis_of: dict[ir.Value, int], prover: ShapeProver
) -> bool:
    """``lengths`` is ``Expand(v, ...)`` (or ``v``) where ``v`` is provably the length of
    the time axis: read by ``Gather(Shape(V), j)`` / ``Slice(Shape(V))`` of a value ``V`` in
    ``axis_of`` whose axis ``j`` is the time axis, or proven by the shape prover."""
    expand = producer(lengths, "Expand")
    value = expand.inputs[0] if expand is not None else lengths
    cast = producer(value, "Cast")
    if cast is not None and cast.attributes.get_int("to", 0) == ir.DataType.INT64:
        value = cast.inputs[0]
    vector = prover.vector(value)
    length = vector[0] if vector is not None and len(vector) == 1 else None
    if length is not None and any(length == prover.dim(v, axis) for v, axis in axis_of.items()):
        return True
    gather = producer(value, "Gather")
    if gather is not None and gather.attributes.get_int("axis", 0) == 0:
        shape = producer(gather.inputs[0], "Shape")
        index = const_array(gather.inputs[1])
        if (
            shape is not None
            and not shape.attributes
            and index is not None
            and index.size == 1
            and shape.inputs[0] in axis_of
            and int(index.reshape(())) == axis_of[shape.inputs[0]]
        ):
            return True
    return False


def _full_reverse_sequence(
    node: ir.Node | None, axis_of: dict[ir.Value, int], prover: ShapeProver
) -> bool:
    """``node`` is ``ReverseSequence(time_axis=0, batch_axis=1)`` of a value whose every
    length is its whole time axis."""
    if node is None or node.domain != "" or node.op_type != "ReverseSequence":
        return False
    if (
        node.attributes.get_int("time_axis", 0) != 0
        or node.attributes.get_int("batch_axis", 1) != 1
    ):
        return False
    data, lengths = node.inputs[0], node.inputs[1]
    if data is None or lengths is None:
        return False
    return _time_length_vector(lengths, {**axis_of, data: 0}, prover)


def reversed_source(x: ir.Value, prover: ShapeProver) -> ir.Value | None:
    """``X0`` when ``x`` is ``X0`` reversed in time entirely, else None."""
    node = x.producer()
    if node is None:
        return None
    if is_reversal(node, prover) is None or _full_reverse_sequence(node, {}, prover):
        return node.inputs[0]
    return None


def _perm(node: ir.Node) -> list[int] | None:
    attr = node.attributes.get("perm")
    return None if attr is None else list(attr.as_ints())


def undone_reversal(y: ir.Value, prover: ShapeProver) -> ir.Value | None:
    """The value that reverses ``y`` (``[T, batch, H]``) back in time, through Transposes
    that compose to no change: None when there is none. Besides the chain, only ``Shape``
    nodes may read its values (the reversal's lengths); the chain stays valid for them."""
    axis_of = {y: 0}  # value -> which of its axes is y's time axis
    order = [0, 1, 2]  # order[i]: the axis of y that axis i of the current value is
    current = y
    while True:
        uses = [(u, i) for u, i in current.uses() if not (u.domain == "" and u.op_type == "Shape")]
        if len(uses) != 1 or current.is_graph_output():
            return None
        ((user, index),) = uses
        if index != 0:
            return None
        if user.domain == "" and user.op_type == "Transpose":
            perm = _perm(user)
            if perm is None or sorted(perm) != [0, 1, 2]:
                return None
            order = [order[p] for p in perm]
            current = user.outputs[0]
            axis_of[current] = order.index(0)
            continue
        if order != [0, 1, 2]:
            return None
        if is_reversal(user, prover) is None or _full_reverse_sequence(user, axis_of, prover):
            return user.outputs[0]
        return None

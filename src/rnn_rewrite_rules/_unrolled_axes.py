"""Axes declared dynamic but unrolled to the traced length (``--check``'s ``frozen-axis``).

torch's dynamo exporter writes ``nn.RNN`` and Python cell loops as one read per traced step
of the sequence axis: a chain of ``Gather``/``Slice`` at constant indices ``0..T-1``, a
``Split`` into a constant number of steps, or ``SplitToSequence`` read by ``SequenceAt`` at
constant positions. The input still declares the axis dynamic; at a longer input ONNX
Runtime silently returns the first ``T`` steps, at a shorter one it fails.

Proven from the graph alone: the read axis must be exactly one symbolic axis of a graph
input (shape prover), and the constant indices must be every step ``0..T-1`` (``T >= 2``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

import onnx_ir as ir

from rnn_rewrite_rules._rnn_ops import describe_node
from rnn_rewrite_rules.shape import Dim, ShapeProver

#: A read of one step: (the data value, its axis) -> [(index, reader node)].
Reads = dict[tuple[ir.Value, int], list[tuple[int, ir.Node]]]


def _const_ints(value: ir.Value | None) -> list[int] | None:
    if value is None or value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None or tensor.dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        return None
    return [int(v) for v in tensor.numpy().reshape(-1)]


def _axis(node: ir.Node, rank: int | None, default: int = 0) -> int | None:
    axis = node.attributes.get_int("axis", default)
    if axis < 0:
        return None if rank is None else axis + rank
    return axis


def _gather_step(node: ir.Node, prover: ShapeProver) -> tuple[int, int] | None:
    index = _const_ints(node.inputs[1])
    axis = _axis(node, prover.rank(node.inputs[0]))
    if index is None or len(index) != 1 or index[0] < 0 or axis is None:
        return None
    return axis, index[0]


def _slice_step(node: ir.Node, prover: ShapeProver) -> tuple[int, int] | None:
    inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts, ends = _const_ints(inputs[1]), _const_ints(inputs[2])
    axes = _const_ints(inputs[3]) if inputs[3] is not None else [0]
    steps = _const_ints(inputs[4]) if inputs[4] is not None else [1]
    if None in (starts, ends, axes, steps) or len(starts or []) != 1 or steps != [1]:
        return None
    assert starts is not None and ends is not None and axes is not None
    rank = prover.rank(node.inputs[0])
    axis = axes[0] + rank if axes[0] < 0 and rank is not None else axes[0]
    if axis < 0 or starts[0] < 0 or ends[0] != starts[0] + 1:
        return None
    return axis, starts[0]


def _step_reads(graph: ir.Graph, prover: ShapeProver) -> Reads:
    reads: Reads = collections.defaultdict(list)
    for node in graph:
        if node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None:
            continue
        step = None
        if node.op_type == "Gather" and len(node.inputs) > 1:
            step = _gather_step(node, prover)
        elif node.op_type == "Slice" and len(node.inputs) > 2:
            step = _slice_step(node, prover)
        elif node.op_type == "SplitToSequence" and len(node.inputs) == 1:
            axis = _axis(node, prover.rank(node.inputs[0]))
            for position, reader in _sequence_positions(node):
                if axis is not None:
                    reads[(node.inputs[0], axis)].append((position, reader))
        elif node.op_type == "Split":
            yield_split = _split_steps(node, prover)
            if yield_split is not None:
                axis, count = yield_split
                reads[(node.inputs[0], axis)].extend((i, node) for i in range(count))
        if step is not None:
            reads[(node.inputs[0], step[0])].append((step[1], node))
    return reads


def _sequence_positions(node: ir.Node) -> Iterator[tuple[int, ir.Node]]:
    for use in node.outputs[0].uses():
        reader = use.node
        if reader.op_type != "SequenceAt" or use.idx != 0:
            continue
        position = _const_ints(reader.inputs[1])
        if position is not None and len(position) == 1 and position[0] >= 0:
            yield position[0], reader


def _split_steps(node: ir.Node, prover: ShapeProver) -> tuple[int, int] | None:
    """A Split whose parts are single steps: sizes all 1, or each part squeezed on the axis."""
    axis = _axis(node, prover.rank(node.inputs[0]))
    count = len(node.outputs)
    if axis is None or count < 2:
        return None
    sizes = _const_ints(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
    if sizes is not None:
        return (axis, count) if sizes == [1] * count else None
    for part in node.outputs:
        uses = list(part.uses())
        squeezed = [u.node for u in uses if u.node.op_type == "Squeeze" and u.idx == 0]
        if not uses or len(squeezed) != len(uses):
            return None
        for squeeze in squeezed:
            axes = _const_ints(squeeze.inputs[1]) if len(squeeze.inputs) > 1 else None
            if axes is None and "axes" in squeeze.attributes:
                axes = list(squeeze.attributes.get_ints("axes", []))
            if axes != [axis]:
                return None
    return axis, count


def unrolled_axes(
    graph: ir.Graph, prover: ShapeProver, symbol_of: collections.abc.Callable[[Dim], str | None]
) -> Iterator[tuple[str, int, str, list[ir.Node]]]:
    """(declared name, traced length, the read value's description, the readers) for each
    symbolic axis read one constant step at a time at every index ``0..T-1``, ``T >= 2``."""
    for (value, axis), steps in _step_reads(graph, prover).items():
        indices = {index for index, _ in steps}
        length = len(indices)
        if length < 2 or indices != set(range(length)):
            continue
        dim = prover.dim(value, axis)
        name = None if dim is None else symbol_of(dim)
        if name is None:
            continue
        readers = list(dict.fromkeys(node for _, node in steps))
        yield name, length, value.name or "?", readers


def describe_readers(readers: list[ir.Node]) -> str:
    ops = collections.Counter(node.op_type for node in readers)
    kinds = ", ".join(op if n == 1 else f"{op} x{n}" for op, n in ops.items())
    return f"{describe_node(readers[0])} ({kinds})"


def fixed_windows(
    graph: ir.Graph, prover: ShapeProver, symbol_of: collections.abc.Callable[[Dim], str | None]
) -> Iterator[tuple[str, int, str, ir.Node]]:
    """(declared name, window length, the read value's description, the Slice) for each
    ``Slice`` of the constant window ``0..T-1`` (``T >= 2``, step 1) of a symbolic axis: what
    a re-rolled or merged chain of ``T`` traced steps reads (``MergeSeq1Chain``), still
    frozen at ``T``."""
    for node in graph:
        if node.op_type != "Slice" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 3:
            continue
        inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
        starts, ends = _const_ints(inputs[1]), _const_ints(inputs[2])
        axes = _const_ints(inputs[3]) if inputs[3] is not None else [0]
        steps = _const_ints(inputs[4]) if inputs[4] is not None else [1]
        if starts != [0] or steps != [1] or ends is None or len(ends) != 1 or axes is None:
            continue
        if not 2 <= ends[0] < 2**31 or len(axes) != 1 or inputs[0] is None:
            continue
        rank = prover.rank(inputs[0])
        axis = axes[0] + rank if axes[0] < 0 and rank is not None else axes[0]
        dim = prover.dim(inputs[0], axis)
        name = None if dim is None else symbol_of(dim)
        if name is not None:
            yield name, ends[0], inputs[0].name or "?", node

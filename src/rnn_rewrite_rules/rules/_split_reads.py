"""Sibling Slices that cut one axis into pieces, read as the outputs of one ``Split``.

Pattern: ``Slice(v, s_i, e_i, axis)`` for ``i = 1..n`` (n >= 2), every Slice of ``v``,
such as TorchScript's per-layer ``Slice(h0, [l], [l+1], [0])`` of a stacked
``[L*D, batch, H]`` state, or tf2onnx's per-direction ``Slice(Y, [d], [d+1], [1])`` of a
bidirectional node's ``Y`` before a ``sum``/``mul``/``ave`` merge.

Condition: each Slice has constant bounds on one axis, step 1; the size ``N`` of that
axis of ``v`` is a constant the shape prover proves; once clamped to ``N`` the ranges
(duplicates read as one) are non-empty and partition ``[0, N)``; the family's scope
holds (:class:`SplitReads` subclasses: which Slices are theirs).

Replacement: one ``Split(v, [e_1 - s_1, ...], axis)`` (in range order; ``split`` an
attribute before opset 13), each Slice's readers reading its range's output. Rooted at
one Slice at a time: the first rewrite emits the Split, the others reuse it.

Equality: a Split output is the same elements of ``v`` as the Slice of that range, in
the same order, at every size of the other axes (0 included), any element type.
Measured in ONNX Runtime 1.32 (one thread, with and without graph optimizations, best
of 3 x 100 runs, 15 interleaved rounds; issue 40): one Split against two Slices of
``[2, 1, 8]``, ``[2, 16, 256]``, ``[4, 64, 256]`` on axis 0 and ``[1, 2, 1, 64]``,
``[64, 2, 8, 64]``, ``[128, 2, 16, 128]`` on axis 1 took 0.80x-0.99x (median ratios),
never above 1: one kernel instead of n.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import MatchContext, MatchResult, RewriteRuleClassBase

from rnn_rewrite_rules._ir import opset_version
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.rules._graph import int64_constant, slice_bounds
from rnn_rewrite_rules.rules._rnn_node import keep_identity
from rnn_rewrite_rules.shape import ShapeProver

__all__ = ["SplitReads"]

#: (start, end) of one Slice once clamped to the axis.
Range = tuple[int, int]


def _clamp(bound: int, size: int) -> int:
    if bound < 0:
        bound += size
    return min(max(bound, 0), size)


def _range(node: ir.Node, size_of, prover: ShapeProver) -> tuple[int, Range] | Refusal:
    """(normalized axis, clamped range) of a one-axis, step-1 Slice of ``node.inputs[0]``;
    ``size_of(axis)`` gives the constant size of an axis, or None."""
    bounds = slice_bounds(node, prover.ints)
    if isinstance(bounds, Refusal):
        return bounds
    start, end, axis, step = bounds
    if step != 1:
        return Refusal(f"the Slice has step {step}, not 1")
    rank = prover.rank(node.inputs[0])
    if rank is None or not -rank <= axis < rank:
        return Refusal("the rank of the sliced value is not proven")
    axis %= rank
    size = size_of(axis)
    if size is None:
        return Refusal(f"axis {axis} of the sliced value is not a constant size")
    return axis, (_clamp(start, size), _clamp(end, size))


class SplitReads(RewriteRuleClassBase):
    """Slice(v, a:b), Slice(v, b:c), ... -> Split(v, [b-a, c-b, ...]) (see the module).

    Subclasses define :meth:`scope`: None when the Slices of ``v`` are theirs to take."""

    def __init__(self) -> None:
        super().__init__(remove_nodes=False)  # the other Slices stay until their turn

    def pattern(self, op, v):
        return op.Slice(v, _allow_other_inputs=True)

    def scope(
        self, v: ir.Value, slices: list[ir.Node], axis: int, prover: ShapeProver
    ) -> Refusal | None:
        raise NotImplementedError

    def check(self, context: MatchContext, v: ir.Value, **_: Any) -> MatchResult:
        check_result = MatchResult()
        root = context.root
        prover = ShapeProver(context.model.graph)
        slices = [  # a Slice already rewritten is dead until the round's cleanup
            use.node
            for use in v.uses()
            if use.idx == 0
            and use.node.domain == ""
            and use.node.op_type == "Slice"
            and (use.node is root or _read(use.node.outputs[0]))
        ]
        if any(node.outputs[0].is_graph_output() for node in slices):
            return check_result.fail("a Slice's output is a graph output", root)
        plan = _plan(v, slices, prover, _pieces(v, root))
        if isinstance(plan, Refusal):
            return check_result.fail(plan, root)
        reason = self.scope(v, slices, plan[0], prover)
        if reason is not None:
            return check_result.fail(reason, root)
        opset = opset_version(context.model, context.graph_or_function)
        if isinstance(opset, Refusal):
            return check_result.fail(opset, root)
        self._axis, self._ranges, self._index = plan[0], plan[1], plan[2][root]
        self._opset = opset
        self._graph = context.graph_or_function
        self._main_graph = context.graph_or_function is context.model.graph
        self._root = root
        return check_result

    def rewrite(self, op, v: ir.Value, **_: Any):
        split = self._existing(v)
        if split is None:
            sizes = [end - start for start, end in self._ranges]
            count = len(sizes)
            if self._opset < 13:
                outputs = op.Split(v, axis=self._axis, split=sizes, _outputs=count)
            else:
                as_node = not self._main_graph
                sizes_value = int64_constant(op, self._graph, sizes, as_node=as_node)
                outputs = op.Split(v, sizes_value, axis=self._axis, _outputs=count)
            keep_identity(outputs[0].producer(), self._root)
            return outputs[self._index]
        return split.outputs[self._index]

    def _existing(self, v: ir.Value) -> ir.Node | None:
        """A Split of ``v`` into the same pieces, before the Slice being rewritten."""
        sizes = [end - start for start, end in self._ranges]
        for node in self._graph:
            if node is self._root:
                return None
            if (node.domain, node.op_type) != ("", "Split") or not node.inputs:
                continue
            if node.inputs[0] is not v or node.attributes.get_int("axis", 0) != self._axis:
                continue
            if len(node.outputs) == len(sizes) and _split_sizes(node) == sizes:
                return node
        return None


def _read(value: ir.Value) -> bool:
    return bool(list(value.uses())) or value.is_graph_output()


def _pieces(v: ir.Value, root: ir.Node) -> tuple[int, list[Range]] | None:
    """(axis, ranges) of a Split of ``v`` with constant sizes that precedes ``root`` in
    its graph (an earlier rewrite's), else None."""
    graph = root.graph
    if graph is None:
        return None
    for node in graph:
        if node is root:
            return None
        if (node.domain, node.op_type) != ("", "Split") or not node.inputs:
            continue
        sizes = _split_sizes(node) if node.inputs[0] is v else None
        if sizes is None or len(sizes) != len(node.outputs):
            continue
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return node.attributes.get_int("axis", 0), [
            (start, start + size) for start, size in zip(starts, sizes, strict=True)
        ]
    return None


def _split_sizes(node: ir.Node) -> list[int] | None:
    attr = node.attributes.get("split")
    if attr is not None:
        return list(attr.as_ints())
    value = node.inputs[1] if len(node.inputs) > 1 else None
    tensor = None if value is None else ir.convenience.get_const_tensor(value)
    return None if tensor is None else [int(x) for x in tensor.numpy().reshape(-1)]


def _plan(
    v: ir.Value,
    slices: list[ir.Node],
    prover: ShapeProver,
    pieces: tuple[int, list[Range]] | None,
) -> tuple[int, list[Range], dict[ir.Node, int]] | Refusal:
    """(axis, ranges in order, each Slice's range index), or why the Slices of ``v`` are
    not the pieces of one Split (``pieces``: those of the Split an earlier rewrite
    emitted, which the others must read)."""

    def size_of(axis: int) -> int | None:
        dim = prover.dim(v, axis)
        return None if dim is None else dim.value

    if len(slices) < 2 and pieces is None:
        return Refusal("only one Slice reads the value: nothing to share")
    axes, ranges = set(), {}
    for node in slices:
        read = _range(node, size_of, prover)
        if isinstance(read, Refusal):
            return read
        axes.add(read[0])
        ranges[node] = read[1]
    if len(axes) != 1:
        return Refusal("the Slices cut different axes")
    (axis,) = axes
    if pieces is not None:
        if pieces[0] != axis or not set(ranges.values()) <= set(pieces[1]):
            return Refusal("the value is already split into other pieces")
        return axis, pieces[1], {node: pieces[1].index(r) for node, r in ranges.items()}
    ordered = sorted(set(ranges.values()))
    if len(ordered) < 2:
        return Refusal("every Slice reads the same range")
    position = 0
    for start, end in ordered:
        if start != position or end <= start:
            return Refusal(f"the Slices' ranges {ordered} do not partition axis {axis}")
        position = end
    if position != size_of(axis):
        return Refusal(f"the Slices' ranges {ordered} do not cover axis {axis}")
    index = {node: ordered.index(r) for node, r in ranges.items()}
    return axis, ordered, index

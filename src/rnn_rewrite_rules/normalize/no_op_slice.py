"""Remove a ``Slice`` that returns its input where it feeds an RNN's initial state: a
streaming model's ``Slice(state, [0], [1], [0])`` of a ``[1, batch, H]`` state.

Pattern: ``s = Slice(v, starts, ends, axes, steps)`` read as ``initial_h`` (or
``initial_c``) of an ``LSTM``/``GRU``/``RNN`` node of the main graph.
Condition: ``starts``, ``ends``, ``axes`` and ``steps`` are constants; every step is 1;
on every sliced axis, ``v``'s size ``d`` is proven from the graph alone
(:class:`~rnn_rewrite_rules.shape.ShapeProver`: declarations of graph inputs, constants,
op semantics) and the slice keeps all of it: the start clamps to 0 (``0``, or at most
``-d``) and the end to ``d`` (at least ``d``); ``s`` is not an output of the graph.
Replacement: ``s``'s readers read ``v`` (see :func:`bypass`; undone where no rule used
it, :class:`~rnn_rewrite_rules.normalize.Journal`).
Equality: a Slice with step 1 keeps, per axis, the elements from its clamped start to its
clamped end: all of them.

The RNN's requirement on ``initial_h`` (``[num_directions, batch, H]``) says only that
``s``'s first axis has the RNN's number of directions (``min(1, d) = 1``: ``d >= 1``),
not that ``v`` has no other rows: a Slice of a ``[2, batch, H]`` state keeps one of them.
Hence the proven size of ``v``; where it is not proven the Slice stays.
"""

from __future__ import annotations

from collections.abc import Container

import onnx_ir as ir

from rnn_rewrite_rules._rnn_ops import rnn_op
from rnn_rewrite_rules.normalize._journal import Edit, Journal
from rnn_rewrite_rules.normalize._node_pass import NodePass
from rnn_rewrite_rules.normalize._values import bypass, names_an_output
from rnn_rewrite_rules.shape import ShapeProver

__all__ = ["NoOpStateSlicePass"]

#: An end at or above this keeps every element of an axis of any size a tensor can have.
_FULL = 2**62


class NoOpStateSlicePass(NodePass):
    """Every no-op Slice read as an RNN's initial state, gone (see the module docstring);
    ``journal`` records each removal, to put back where no rule used it."""

    op_type = "Slice"
    subgraphs = False

    def start(self, model: ir.Model) -> None:
        self._prover: ShapeProver | None = None

    def edit(self, node: ir.Node, model: ir.Model) -> bool:
        if not _feeds_a_state(node) or names_an_output(node, model):
            return False
        self._prover = self._prover or ShapeProver(model.graph)
        source = node.inputs[0]
        if source is None or not _keeps_everything(node, self._prover):
            return False
        bounds = _Bounds(model.graph, node)
        inner = Journal()
        modified = bypass(node, source, inner)
        for edit in inner.edits:
            self.record(_SliceBypassed(edit, bounds))
        self._prover = None  # the graph changed: facts are proven again
        return modified


class _Bounds:
    """A Slice's bound inputs (1 to 4) as the pass found them: a bypass detaches them,
    and the cleanup between the passes and the undo drops what no node reads (an
    initializer, a ``Constant`` node)."""

    def __init__(self, graph: ir.Graph, node: ir.Node) -> None:
        self.node = node
        self.inputs = list(node.inputs[1:])
        self.initializers = [v for v in self.inputs if v is not None and v.is_initializer()]
        self.producers = [
            p for v in self.inputs if v is not None and (p := v.producer()) is not None
        ]
        self.graph = graph

    def restorable(self) -> bool:
        """Each dropped bound can come back as it was (its name is still free, its
        producer is a node without inputs)."""
        initializers = self.graph.initializers
        for value in self.initializers:
            if not value.is_initializer() and value.name in initializers:
                return False
        return all(p.graph is not None or not any(p.inputs) for p in self.producers)

    def restore(self) -> None:
        for initializer in self.initializers:
            if not initializer.is_initializer():
                self.graph.register_initializer(initializer)
        for producer in self.producers:
            if producer.graph is None:
                self.graph.insert_before(self.node, producer)
        for index, value in enumerate(self.inputs, start=1):
            self.node.replace_input_with(index, value)


class _SliceBypassed:
    """The bypass of a no-op Slice (``inner``), undone with its bounds put back."""

    def __init__(self, inner: Edit, bounds: _Bounds) -> None:
        self.inner, self.bounds = inner, bounds

    def undo(self, original: Container[ir.Node]) -> bool:
        if not self.bounds.restorable() or not self.inner.undo(original):
            return False
        self.bounds.restore()
        return True


def _feeds_a_state(node: ir.Node) -> bool:
    """A reader of ``node``'s output reads it as an RNN's initial state."""
    for user, index in node.outputs[0].uses():
        spec = rnn_op(user)
        if spec is not None and index in spec.state_inputs:
            return True
    return False


def _keeps_everything(node: ir.Node, prover: ShapeProver) -> bool:
    """``node`` (a Slice, opset 10 or later: bounds as inputs) keeps every element."""
    inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
    data, starts_v, ends_v, axes_v, steps_v = inputs[:5]
    rank = prover.rank(data)
    starts, ends = prover.ints(starts_v), prover.ints(ends_v)
    if rank is None or starts is None or ends is None or len(starts) != len(ends):
        return False
    axes = list(range(len(starts))) if axes_v is None else prover.ints(axes_v)
    steps = [1] * len(starts) if steps_v is None else prover.ints(steps_v)
    if axes is None or steps is None or not len(axes) == len(steps) == len(starts):
        return False
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        if step != 1 or not -rank <= axis < rank:
            return False
        dim = prover.dim(data, axis % rank)
        size = None if dim is None else dim.value
        if end >= _FULL and start == 0:
            continue
        if size is None or not (start == 0 or start <= -size) or end < size:
            return False
    return True

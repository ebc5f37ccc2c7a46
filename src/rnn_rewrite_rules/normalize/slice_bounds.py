"""Write as constants the bounds of a ``Slice`` that the shape prover proves: TorchScript's
``chunk``, whose bounds it computes from ``Shape`` at run time.

Pattern: ``Slice(v, starts, ends[, axes[, steps]])`` in the main graph (opset 10 or later:
bounds as inputs) with a bound that is not written as a constant: TorchScript writes
``x.chunk(4, -1)`` as ``d = Div(Add(Shape(x)[-1], 3), 4)`` and four Slices from ``k * d``
to ``(k + 1) * d``.
Condition: every such bound's elements are proven constants by the shape prover
(:meth:`~rnn_rewrite_rules.shape.ShapeProver.ints`: sizes from initializers, constants and
graph-input declarations, integer arithmetic on them; never value_info), it is 1-D and
its element type (int32 or int64) is proven and holds every element.
Replacement: the Slice reads an initializer holding those elements in that type (one per
bound value, shared by the Slices reading it); the computation left unread is removed (a
cell's check must not see a ``Shape`` reading its gates), and put back with the bound
where no rule used the Slice (:class:`~rnn_rewrite_rules.normalize.Journal`).
Equality: the prover's facts hold wherever the graph runs (a runtime rejects a feed of
another rank or static size; an initializer's shape is fixed), so the bound computed at
run time is that constant wherever the original runs, and the Slice is given the same
operands.

Then the readers of constant Slices see them: a cell's gate columns
(``rules.cell.columns``), a state read from a cache input (``rules.one_step``), Slices
read as one Split (``rules._split_reads``). Where a bound is not proven (a width read
from a symbolic axis), the Slice stays as written, with the reason in ``refusals``.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import free_name, taken_names
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.normalize._node_pass import NodePass
from rnn_rewrite_rules.normalize._values import ElementTypes
from rnn_rewrite_rules.shape import ShapeProver

__all__ = ["ProvenSliceBoundsPass"]

#: The Slice's bound inputs by index.
_BOUNDS = {1: "starts", 2: "ends", 3: "axes", 4: "steps"}
_INDEX_TYPES = (ir.DataType.INT32, ir.DataType.INT64)
#: Ops whose output depends on their input's shape only: a bound's computation ends there.
_SHAPE_OPS = frozenset(("Shape", "Size"))
#: A bound's computation (put back when no rule used the Slice) is at most this many nodes.
_MAX_NODES = 64


def _written_constant(value: ir.Value) -> bool:
    """``value`` is an initializer (not a graph input) or a ``Constant``'s output."""
    node = value.producer()
    if node is None:
        return value.is_initializer() and not value.is_graph_input()
    return node.op_type == "Constant" and node.domain == ""


class ProvenSliceBoundsPass(NodePass):
    """Every main-graph Slice's proven bounds, as constants (see the module docstring);
    ``journal`` records each Slice's, to put back where no rule used it; ``refusals``
    names each bound not proven."""

    op_type = "Slice"
    subgraphs = False  # a body's sizes are not facts of its inputs' declarations

    def start(self, model: ir.Model) -> None:
        self._prover = ShapeProver(model.graph)
        self._types = ElementTypes()
        #: each computed bound and the initializer that replaces it
        self._made: dict[ir.Value, ir.Value] = {}
        self._order = _Order(model.graph)
        self._taken: set[str] | None = None  # the names in use, once a constant is made

    def edit(self, node: ir.Node, model: ir.Model) -> bool:
        graph = node.graph
        if graph is not model.graph or len(node.inputs) < 3:
            return False
        computed = [
            (index, value)
            for index, value in enumerate(node.inputs[1:5], start=1)
            if value is not None and not _written_constant(value)
        ]
        if not computed:
            return False
        arrays: list[np.ndarray] = []
        for index, value in computed:
            array = self._proven(node, index, value)
            if isinstance(array, Refusal):
                self.refuse(node, array)
                return False
            arrays.append(array)
        chain = self._order.computation([value for _, value in computed])
        if chain is None:
            self.refuse(node, Refusal(f"{node.name}: its bounds take over {_MAX_NODES} nodes"))
            return False
        bounds = []
        for (index, value), array in zip(computed, arrays, strict=True):
            constant = self._constant(graph, value, array)
            node.replace_input_with(index, constant)
            bounds.append((index, value, constant))
        self.record(_BoundsReplaced(node, bounds, chain, self._order))
        _drop_unread(graph, chain)
        return True

    def _proven(self, node: ir.Node, index: int, value: ir.Value) -> np.ndarray | Refusal:
        """The elements of ``node``'s bound ``value`` (input ``index``) as an array of its
        type, or why they are not proven."""
        what = f"{node.name}: its {_BOUNDS[index]} ({value.name})"
        ints = self._prover.ints(value)
        if ints is None:
            return Refusal(f"{what} are not proven constant")
        if self._prover.rank(value) != 1:
            return Refusal(f"{what} are not a 1-D tensor")
        dtype = self._types(value)
        if dtype not in _INDEX_TYPES:
            return Refusal(f"{what} are not proven int32 or int64")
        limits = np.iinfo(dtype.numpy())
        if any(not limits.min <= v <= limits.max for v in ints):
            return Refusal(f"{what} do not fit {dtype.name.lower()}")
        return np.array(ints, dtype=dtype.numpy())

    def _constant(self, graph: ir.Graph, value: ir.Value, array: np.ndarray) -> ir.Value:
        """The initializer holding ``array`` in place of ``value`` (one per value)."""
        if value not in self._made:
            if self._taken is None:
                self._taken = taken_names(graph)
            name = free_name(self._taken, f"{value.name or 'slice_bound'}_proven")
            self._taken.add(name)
            tensor = ir.tensor(array, name=name)
            constant = ir.Value(
                name=name,
                type=ir.TensorType(tensor.dtype),
                shape=ir.Shape(array.shape),
                const_value=tensor,
            )
            graph.register_initializer(constant)
            self._made[value] = constant
        return self._made[value]


#: A node of a bound's computation and the inputs it read.
_Step = tuple[ir.Node, tuple[ir.Value | None, ...]]


class _Order:
    """The main graph's nodes in their order before the pass: where a removed node of a
    bound's computation goes back (before the first node after it still in the graph)."""

    def __init__(self, graph: ir.Graph) -> None:
        self.graph = graph
        self.nodes = list(graph)
        self.index = {node: k for k, node in enumerate(self.nodes)}

    def computation(self, values: Sequence[ir.Value]) -> list[_Step] | None:
        """The nodes computing ``values`` (up to a ``Shape``/``Size`` and its input,
        constants and graph inputs) with their inputs, in graph order; None past
        :data:`_MAX_NODES` or where one is not of the graph."""
        found: dict[ir.Node, None] = {}
        pending = [v.producer() for v in values]
        while pending:
            node = pending.pop()
            if node is None or node in found:
                continue
            if node not in self.index or len(found) >= _MAX_NODES:
                return None
            found[node] = None
            if node.op_type not in _SHAPE_OPS or node.domain != "":
                pending.extend(v.producer() for v in node.inputs if v is not None)
        return [(n, tuple(n.inputs)) for n in sorted(found, key=self.index.__getitem__)]

    def follower(self, node: ir.Node) -> ir.Node | None:
        """The first node after ``node`` (as it was) that is in the graph now."""
        for later in self.nodes[self.index[node] + 1 :]:
            if later.graph is self.graph:
                return later
        return None


def _drop_unread(graph: ir.Graph, chain: list[_Step]) -> None:
    """Remove the nodes of ``chain`` nothing reads any more (a rule's check must not see
    a dead ``Shape`` reading a value inside a cell), readers first."""
    for node, _ in reversed(chain):
        unread = not any(v.uses() or v.is_graph_output() for v in node.outputs)
        if node.graph is graph and unread:
            graph.remove(node, safe=True)


class _BoundsReplaced:
    """``node``'s bounds (input index, computed value, constant) replaced by constants;
    ``chain``: the nodes that computed them, put back with them where they were. Undone
    while the Slice is read by its readers of the time alone: where a rule removed it, or
    reads it from a node it emitted (a cell step reading its state from a cache Slice),
    the rule used it."""

    def __init__(
        self,
        node: ir.Node,
        bounds: list[tuple[int, ir.Value, ir.Value]],
        chain: list[_Step],
        order: _Order,
    ) -> None:
        self.node, self.bounds, self.chain, self.order = node, bounds, chain, order
        self.readers = {user for user, _ in node.outputs[0].uses()}
        self.initializers = [
            v for _, inputs in chain for v in inputs if v is not None and v.is_initializer()
        ]

    def undo(self, original: Container[ir.Node]) -> bool:
        del original  # the Slice is the exporter's own or gone
        graph, node = self.order.graph, self.node
        if node.graph is not graph:
            return False
        if any(node.inputs[i] is not constant for i, _, constant in self.bounds):
            return False
        if any(user not in self.readers for user, _ in node.outputs[0].uses()):
            return False  # a rule's node reads the Slice: it used the constant bounds
        dead = [(n, inputs) for n, inputs in reversed(self.chain) if n.graph is None]
        places = self._places(dead)
        if places is None:
            return False
        for initializer in self.initializers:
            if not initializer.is_initializer():
                graph.register_initializer(initializer)
        for (revived, inputs), place in zip(dead, places, strict=True):
            graph.insert_before(place, revived)
            for index, operand in enumerate(inputs):
                revived.replace_input_with(index, operand)
        for index, value, constant in self.bounds:
            node.replace_input_with(index, value)
            name = constant.name
            if not constant.uses() and name is not None and name in graph.initializers:
                graph.initializers.pop(name)
        return True

    def _places(self, dead: list[_Step]) -> list[ir.Node] | None:
        """For each removed node (last first), the node to put it before: the first after
        it as it was that is still there (or put back before it); None when one cannot
        come back before the Slice and after what it reads (an input no longer computed,
        an initializer's name taken, a rule's reordering)."""
        graph, order = self.order.graph, self.order
        position = {n: float(k) for k, n in enumerate(graph)}
        places: list[ir.Node] = []
        for revived, _ in dead:  # the ones before it in ``dead`` come after it
            found = [n for n, _ in dead[: len(places)]] + [order.follower(revived)]
            candidates = [n for n in found if n is not None]
            if not candidates:
                return None
            place = min(candidates, key=order.index.__getitem__)
            places.append(place)
            position[revived] = position[place] - 1e-4
        node_at = position.get(self.node)
        if node_at is None or any(position[n] >= node_at for n, _ in dead):
            return None
        for revived, inputs in dead:
            for value in inputs:
                if value is not None and not self._available(value, position, position[revived]):
                    return None
        return places

    def _available(self, value: ir.Value, position: dict[ir.Node, float], at: float) -> bool:
        """``value`` is computed before ``at``, is a graph input, or an initializer (one
        the cleanup dropped comes back when its name is free)."""
        source = value.producer()
        if source is None:
            if value.is_graph_input() or value.is_initializer():
                return True
            return value in self.initializers and value.name not in self.order.graph.initializers
        return source in position and position[source] < at

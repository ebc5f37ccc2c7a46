"""The number of steps a ``Loop`` runs when its condition compares the step number with
the trip count in floating point: the trip count :class:`LoopConditionPass` writes in
place of such a condition (see ``loop_condition``'s docstring for why it is exact).

For a trip count ``n`` and a body leaf ``Less(to(k + offset), to(n))`` read after step
``k``, the steps run are ``#{j in 0..n-1 : to(j - 1 + offset) < to(n)}``, computed as::

    ReduceSum(Cast(Less(Cast(Range(offset - 1, n + offset - 1, 1), to), Cast(n, to)), int64))

(``keepdims=0``: a scalar, as a Loop's trip count is). ``Range`` runs in ``n``'s own
integer type (int32 or int64); a ``Cast`` to a floating type rounds an integer's value,
whatever integer type holds it, so ``to(j - 1 + offset)`` is the original's. The
``Cast(n, to)`` is the graph's own where one stands before the Loop. Memory and time are
``O(n)`` elements, next to the ``n`` steps of input the Loop reads.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import free_name
from rnn_rewrite_rules._refusal import Refusal

__all__ = ["StepCount", "emit_step_count"]

_RANGE_TYPES = {ir.DataType.INT32: np.int32, ir.DataType.INT64: np.int64}


@dataclasses.dataclass
class StepCount:
    """The nodes and initializers made for one Loop's step count (its value:
    ``nodes[-1]``'s output), removed by :meth:`remove` when no rule used it."""

    graph: ir.Graph | ir.Function
    nodes: list[ir.Node]
    initializers: list[ir.Value]

    @property
    def value(self) -> ir.Value:
        return self.nodes[-1].outputs[0]

    def remove(self) -> None:
        self.graph.remove(self.nodes, safe=True)
        if isinstance(self.graph, ir.Graph):
            for value in self.initializers:
                if not value.uses() and self.graph.initializers.get(value.name or "") is value:
                    self.graph.initializers.pop(value.name or "")


@dataclasses.dataclass
class _Emitter:
    """Makes nodes before ``anchor`` in ``graph``, named after ``base`` with names not in
    ``taken``; constants as initializers in ``main`` (the model's graph), else as
    ``Constant`` nodes (a subgraph's new initializer could shadow an outer name)."""

    graph: ir.Graph | ir.Function
    anchor: ir.Node
    main: ir.Graph | None
    base: str
    taken: set[str]
    made: StepCount = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.made = StepCount(self.graph, [], [])

    def name(self, suffix: str) -> str:
        name = free_name(self.taken, f"{self.base}/{suffix}")
        self.taken.add(name)
        return name

    def node(self, op: str, inputs: list[ir.Value], suffix: str, **attributes) -> ir.Value:
        node = ir.node(op, inputs, attributes=attributes, name=self.name(suffix))
        node.outputs[0].name = self.name(f"{suffix}:0")
        self.graph.insert_before(self.anchor, node)
        self.made.nodes.append(node)
        return node.outputs[0]

    def constant(self, value: int, dtype: type, suffix: str) -> ir.Value:
        tensor = ir.tensor(np.array(value, dtype))
        if self.main is None or self.graph is not self.main:
            return self.node("Constant", [], suffix, value=tensor)
        initializer = ir.Value(name=self.name(suffix), const_value=tensor)
        initializer.type, initializer.shape = ir.TensorType(tensor.dtype), ir.Shape([])
        self.main.register_initializer(initializer)
        self.made.initializers.append(initializer)
        return initializer


def emit_step_count(
    loop: ir.Node,
    trips: ir.Value,
    trips_type: ir.DataType | None,
    offset: int,
    to: ir.DataType,
    main: ir.Graph | None,
    taken: set[str],
) -> StepCount | Refusal:
    """The nodes computing the steps ``loop`` runs (see the module docstring), placed
    before it; ``trips``: its trip count without widening ``Cast``\\ s, of ``trips_type``."""
    graph = loop.graph
    assert graph is not None
    if trips_type not in _RANGE_TYPES:
        return Refusal(f"Loop '{loop.name}': its trip count is not int32 or int64 (Range)")
    dtype = _RANGE_TYPES[trips_type]
    emit = _Emitter(graph, loop, main, f"{loop.name or 'Loop'}/step_count", taken)
    start = emit.constant(offset - 1, dtype, "start")
    limit = trips
    if offset != 1:
        limit = emit.node("Add", [trips, emit.constant(offset - 1, dtype, "shift")], "limit")
    steps = emit.node("Range", [start, limit, emit.constant(1, dtype, "delta")], "Range")
    steps_to = emit.node("Cast", [steps], "Cast", to=to)
    bound = _existing_cast(trips, to, graph, loop) or emit.node("Cast", [trips], "bound", to=to)
    running = emit.node("Less", [steps_to, bound], "Less")
    ones = emit.node("Cast", [running], "ones", to=ir.DataType.INT64)
    emit.node("ReduceSum", [ones], "ReduceSum", keepdims=0)
    emit.made.nodes[-1].outputs[0].type = ir.TensorType(ir.DataType.INT64)
    emit.made.nodes[-1].outputs[0].shape = ir.Shape([])
    return emit.made


def _existing_cast(
    value: ir.Value, to: ir.DataType, graph: ir.Graph | ir.Function, before: ir.Node
) -> ir.Value | None:
    """A ``Cast(value, to)`` of ``graph`` that stands before ``before`` (the Loop)."""
    earlier: set[ir.Node] = set()
    for node in graph:
        if node is before:
            break
        earlier.add(node)
    for user, index in value.uses():
        if (
            user in earlier
            and index == 0
            and user.op_type == "Cast"
            and user.domain == ""
            and user.attributes.get_int("to", 0) == to
        ):
            return user.outputs[0]
    return None

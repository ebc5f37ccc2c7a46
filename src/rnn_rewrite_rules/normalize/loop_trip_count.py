"""A ``Loop`` without a trip count whose conditions count its steps up to a bound, given
that bound as its trip count (tf2onnx on a Keras 2 ``GRU(reset_after=False)``: a
``while_loop`` with ``M`` left empty and ``time < T`` as its conditions).

Pattern: ``Loop("", c0, ...)`` whose initial condition ``c0`` is an ``And`` tree with a
leaf ``Less(a, B)`` and whose body condition is an ``And`` tree with a leaf
``Less(s, B)``: ``a`` a constant number ``>= 0``, ``s`` the step value ``k + offset``
after step ``k`` (the iteration number or a counter from a constant scalar, plus
constants: ``normalize._loop_reads``), ``offset >= 1``, ``B`` one integer value outside
the body (directly, or a carried value the body passes through), either side read through
``Cast``\\ s that keep integers exact or widen them (tf2onnx compares in float).
Condition: the types of ``B`` and of a counter hold each other's values (no wrap).
Replacement: ``M = B`` (``Cast(B, to=INT64)`` where ``B`` is another integer type).
Equality: the original runs the iterations its conditions let run; iteration 0 only where
``a < B``, so ``B >= 1``; iteration ``k >= 1`` only where the body leaf after step
``k - 1`` holds, ``to(k - 1 + offset) < to(B)``, which (``to`` rounds to nearest and never
decreases) needs ``k - 1 + offset < B``, so ``k < B``. It runs no more than ``max(B, 0)``
iterations, and with ``M = B`` the Loop stops at ``min(M, first false condition)``, the
same step (a negative ``M`` runs none in ONNX Runtime and ``onnx.reference``, as the
original, whose first condition is then false). ``LoopConditionPass`` then reads the
conditions against that trip count.

onnx_ir and onnxscript have no pass that gives a Loop its trip count; ``LoopToRnn`` needs
one, hence this pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container

import onnx_ir as ir

from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.normalize._loop_reads import (
    Read,
    comparison,
    label,
    leaves,
    read_loop,
    scalar_number,
)
from rnn_rewrite_rules.normalize._node_pass import NodePass
from rnn_rewrite_rules.normalize._values import ElementTypes
from rnn_rewrite_rules.shape import ShapeProver

__all__ = ["LoopTripCountPass", "TripCountGiven"]


@dataclasses.dataclass
class TripCountGiven:
    """``node``'s empty trip count became ``value`` (computed by ``cast`` when not None)."""

    node: ir.Node
    value: ir.Value
    cast: ir.Node | None

    def undo(self, original: Container[ir.Node]) -> bool:
        del original
        node = self.node
        if node.graph is None or node.inputs[0] is not self.value:
            return False  # a rule replaced the Loop, or a later edit is still in place
        node.replace_input_with(0, None)
        if self.cast is not None and not self.cast.outputs[0].uses():
            node.graph.remove(self.cast, safe=True)
        return True


class LoopTripCountPass(NodePass):
    """Every Loop without a trip count whose conditions stop it within a bound ``B``,
    given ``M = B`` (see the module docstring); ``journal`` records each, to put back
    where no rule used it."""

    op_type = "Loop"

    def start(self, model: ir.Model) -> None:
        self._prover = ShapeProver(model.graph)

    def edit(self, node: ir.Node, model: ir.Model) -> bool:
        if not node.inputs or node.inputs[0] is not None or node.graph is None:
            return False
        found = _bound(node, self._prover)
        if isinstance(found, Refusal):
            self.refuse(node, found)
            return False
        bound, dtype = found
        cast = None
        value = bound
        if dtype != ir.DataType.INT64:
            cast = ir.node("Cast", [bound], attributes={"to": ir.DataType.INT64})
            cast.outputs[0].name = f"{bound.name or 'bound'}_trip_count"
            node.graph.insert_before(node, cast)
            value = cast.outputs[0]
        node.replace_input_with(0, value)
        self.record(TripCountGiven(node, value, cast))
        return True


def _bound(node: ir.Node, prover: ShapeProver) -> tuple[ir.Value, ir.DataType] | Refusal:
    """The outer integer value ``B`` and its type, where ``node``'s conditions stop it
    within ``B`` steps (see the module docstring), else why not."""
    name = label(node)
    body_attr = node.attributes.get("body")
    first = node.inputs[1] if len(node.inputs) > 1 else None
    if body_attr is None or body_attr.type != ir.AttributeType.GRAPH or first is None:
        return Refusal(f"Loop {name}: no trip count, and no conditions to count its steps")
    types = ElementTypes()
    body = body_attr.as_graph()
    for leaf in leaves(body.outputs[0]):
        found = comparison(leaf)
        if found is None:
            continue
        step, limit = found
        loop = read_loop(node, types, prover, trips=limit)
        if isinstance(loop, Refusal):
            continue
        bound = loop.bound(limit)
        if isinstance(bound, Refusal):
            continue
        loop = read_loop(node, types, prover, trips=bound.base)  # counters hold B's type
        if isinstance(loop, Refusal):
            continue
        read = loop.step(step)
        dtype = types(bound.base)
        if isinstance(read, Refusal) or read[0] < 1 or dtype is None or not dtype.is_integer():
            continue
        if _starts_below(first, bound, loop.bound):
            return bound.base, dtype
    return Refusal(f"Loop {name}: no trip count, and no condition bounds its steps")


def _starts_below(first: ir.Value, bound: Read, read_bound) -> bool:
    """``first`` (the initial condition) has a leaf ``a < B``, ``a`` a constant ``>= 0``."""
    for leaf in leaves(first):
        found = comparison(leaf)
        if found is None:
            continue
        start, limit = found
        number = scalar_number(start)
        other = read_bound(limit)
        if number is None or number < 0 or isinstance(other, Refusal):
            continue
        if other.base is bound.base:
            return True
    return False

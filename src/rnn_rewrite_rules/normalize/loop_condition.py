"""Make a ``Loop``'s conditions constant true where they provably are on every iteration
but the last (tf2onnx's ``while_loop``: ``time < T and counter < T``), or where they
compare the step with the trip count in floating point, make the trip count the number
of steps they let run.

Pattern: ``Loop(M, c0, ...)`` whose initial condition ``c0`` is an ``And`` tree of
``Less(a, B)`` leaves and whose body condition is an ``And`` tree of ``Less(s, B)``
leaves; ``a`` a constant number (tf2onnx: ``0.0``), ``s`` a step value (the iteration
number, a counter ``+ 1`` per step from a constant scalar, either plus a constant
scalar), ``B`` a bound
(an outer value, or a carried value the body passes through: its initial value). Each
side may be read through ``Cast``\\ s (tf2onnx compares in float).
Condition: every leaf is true wherever the Loop still has an iteration to run. With
``n`` the trip count ``M`` without its widening integer ``Cast``\\ s: a bound that is
``n`` (through widening integer ``Cast``\\ s) needs ``a <= 0`` (initial leaf: ``0 < n``
whenever the Loop runs at all) and a step offset ``<= 1`` (body leaf after step ``k``:
``k + 1 < n`` for ``k <= M - 2``); ``M`` and a bound both known (constants, or sizes the
main graph's inputs declare, which ONNX Runtime enforces) are checked at the last step
that reads the condition (a step value grows with ``k``; a rounding ``Cast`` keeps that
order). A step value read through a ``Cast`` to a floating type is exact only below its
mantissa's range (``2**24`` for float32): there ``k + 1`` and ``n`` may round to one
value and the loop ends early. An initial leaf ``a <= 0`` against ``n >= 1`` holds in any
float type. The counter's own type holds ``n``'s (no wrap before the bound).
Counted leaves: a body leaf ``Less(to(k + offset), to(n))`` with ``to`` float32 or
float64 on both sides, ``offset <= 1`` and ``n`` not known in ``to``'s exact range is
not always true, but monotone: ``to`` rounds to nearest and never decreases, so the
leaf is true for the first steps and false from one on. Of several such leaves (one
``to``), the one with the largest offset turns false first. Float16 is refused: ONNX
Runtime has no float16 ``Less`` and compares in float32 between Casts it inserts, so its
steps are not float16's.
Replacement: ``c0`` reads a ``Constant`` true and the body's condition output is
``Identity(cond_in)`` (so true on every iteration); with a counted leaf, ``M`` becomes
``ReduceSum(Cast(Less(Cast(Range(offset - 1, n + offset - 1), to), Cast(n, to)),
int64))`` (``_step_count``), else it stays.
Equality: the original runs ``min(M, first false)`` iterations; every leaf is true on
every iteration before the ``M``-th, so it runs ``M``, as the replacement does. The
condition after the last iteration is not read (``M`` ends the loop). Counted: step
``j >= 1`` runs when ``j < M`` and the leaf read after step ``j - 1`` holds,
``to(j - 1 + offset) < to(n)``; step 0 runs when ``M >= 1`` (the initial leaves), where
``to(offset - 1) <= to(0) < to(n)`` holds too. The leaf being monotone, the steps run are
the ``j`` in ``0..M-1`` where it holds, which the ``ReduceSum`` counts (``Cast`` to a
floating type rounds an integer's value, whatever integer type holds it, so ``Range``
in ``n``'s type gives the original's floats). That is ``n`` below ``2**24`` and fewer
above, as in the original. ``O(n)`` memory: ``n`` elements of four types.

onnx_ir and onnxscript have no pass that reads a Loop's condition; ``LoopToRnn`` needs
a constant trip count, ``X``'s length or a count of steps, and a condition that cannot
end the loop early, hence this pass. :func:`condition_refusal` says why a Loop's
condition was left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import free_name, opset_version, taken_names
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.normalize._condition_proof import (
    Conditions,
    Counted,
    condition_refusal,
    read_conditions,
)
from rnn_rewrite_rules.normalize._loop_reads import identity_source, is_true, label
from rnn_rewrite_rules.normalize._node_pass import NodePass
from rnn_rewrite_rules.normalize._step_count import StepCount, emit_step_count
from rnn_rewrite_rules.normalize._unread import Unread

__all__ = [
    "Conditions",
    "ConditionsMadeTrue",
    "Counted",
    "LoopConditionPass",
    "Unread",
    "condition_refusal",
    "read_conditions",
]


@dataclasses.dataclass
class ConditionsMadeTrue:
    """``node``'s initial condition ``first`` and its body's ``cond_out`` were replaced
    by ``constant`` (a ``Constant`` node) and ``identity`` (``Identity(cond_in)``);
    ``count``: the step count that replaced its trip count ``trips`` (None: kept);
    ``unread``: what computed them alone, put back with them."""

    node: ir.Node
    first: ir.Value | None
    constant: ir.Node | None
    cond_out: ir.Value
    identity: ir.Node | None
    unread: list[Unread]
    trips: ir.Value | None = None
    count: StepCount | None = None

    def undo(self, original: Container[ir.Node]) -> bool:
        del original
        node, identity, constant = self.node, self.identity, self.constant
        graph = node.graph
        if graph is None:
            return False  # a rule replaced the Loop
        body = node.attributes["body"].as_graph()
        if identity is not None and body.outputs[0] is not identity.outputs[0]:
            return False
        if constant is not None and node.inputs[1] is not constant.outputs[0]:
            return False
        if self.count is not None and node.inputs[0] is not self.count.value:
            return False
        if not all(unread.restorable() for unread in self.unread):
            return False
        for unread in self.unread:
            unread.restore(node)
        if identity is not None:
            body.outputs[0] = self.cond_out
            body.remove(identity, safe=True)
        if constant is not None and self.first is not None:
            node.replace_input_with(1, self.first)
            graph.remove(constant, safe=True)
        if self.count is not None:
            node.replace_input_with(0, self.trips)
            self.count.remove()
        return True


class LoopConditionPass(NodePass):
    """Every Loop condition provably true before the last iteration, made constant true,
    a float one against the trip count replaced by the count of steps it lets run (see
    the module docstring); ``journal`` records each, to put back where no rule used it."""

    op_type = "Loop"

    def start(self, model: ir.Model) -> None:
        self.model = model
        #: the first Loop (in graph order) that read each trip count or first condition
        #: replaced: one two Loops share is put back before the first (see ``_loop``)
        self._first_reader: dict[ir.Value, ir.Node] = {}
        self._taken = taken_names(model)  # the model's value names, and those given

    def edit(self, node: ir.Node, model: ir.Model) -> bool:
        return self._loop(node, model)

    def _name(self, base: str) -> str:
        name = free_name(self._taken, base)
        self._taken.add(name)
        return name

    def _count(self, node: ir.Node, found: Conditions) -> StepCount | Refusal | None:
        """The step count replacing ``node``'s trip count (None: none needed)."""
        counted, model = found.counted, self.model
        if counted is None:
            return None
        assert node.graph is not None
        opset = opset_version(model, node.graph)
        if isinstance(opset, Refusal) or opset < 11:
            return Refusal(f"Loop {label(node)}: opset {opset} has no Range to count its steps")
        trips = found.loop.trips
        trips_type = found.loop.types(trips)
        return emit_step_count(
            node, trips, trips_type, counted.offset, counted.to, model.graph, self._taken
        )

    def _loop(self, node: ir.Node, model: ir.Model) -> bool:
        attr = node.attributes.get("body")
        graph = node.graph
        if attr is None or attr.type != ir.AttributeType.GRAPH or graph is None:
            return False
        found = read_conditions(node, model.graph)
        if isinstance(found, Refusal):
            return False
        count = self._count(node, found)
        if isinstance(count, Refusal):
            self.refuse(node, count)
            return False
        body = attr.as_graph()
        first = node.inputs[1] if len(node.inputs) > 1 else None
        trips = node.inputs[0]
        for value in (first, trips):
            if value is not None:
                self._first_reader.setdefault(value, node)
        if count is not None:
            node.replace_input_with(0, count.value)
        constant = None
        if first is not None and not is_true(first):
            constant = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(True))})
            constant.outputs[0].name = self._name(f"{first.name or 'cond'}_true")
            graph.insert_before(node, constant)
            node.replace_input_with(1, constant.outputs[0])
        cond_out, cond_in = body.outputs[0], body.inputs[1]
        identity = None
        if identity_source(cond_out) is not cond_in:
            identity = ir.node("Identity", [cond_in])
            identity.outputs[0].name = self._name(f"{cond_out.name or 'cond'}_true")
            identity.outputs[0].type, identity.outputs[0].shape = cond_out.type, cond_out.shape
            body.append(identity)
            body.outputs[0] = identity.outputs[0]
        if constant is None and identity is None:
            assert count is None  # a count comes from a condition
            return False
        if self.journal is not None:
            unread = [Unread.of(cond_out, body, None)] if identity is not None else []
            if constant is not None and first is not None:
                unread.append(Unread.of(first, graph, self._first_reader[first]))
            if count is not None and trips is not None:
                unread.append(Unread.of(trips, graph, self._first_reader[trips]))
            edit = ConditionsMadeTrue(node, first, constant, cond_out, identity, unread)
            edit.trips, edit.count = trips, count
            self.record(edit)
        return True

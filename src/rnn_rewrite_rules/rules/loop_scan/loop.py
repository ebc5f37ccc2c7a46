"""The proof that an ONNX ``Loop`` runs a recurrent cell over a sequence (tf2onnx, torch)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import opset_version
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.normalize._values import ElementTypes
from rnn_rewrite_rules.normalize.loop_condition import condition_refusal
from rnn_rewrite_rules.rules._graph import producer
from rnn_rewrite_rules.rules.cell import Cell, Constants, through_identity
from rnn_rewrite_rules.rules.loop_scan._common import (
    Recurrence,
    RecurrenceRule,
    classify_carried,
    initial_values,
    prove_carried,
    shape_elements,
    states_fit,
    used,
)
from rnn_rewrite_rules.rules.loop_scan.fused_projection import split_projections
from rnn_rewrite_rules.rules.loop_scan.reversal import reversed_source, undone_reversal
from rnn_rewrite_rules.shape import Dim, ShapeProver

__all__ = ["GUARD_INVARIANTS_REASON", "LoopToRnn", "plan_loop"]

#: Why a Loop over X's length that carries X itself around unchanged (jax2onnx's scan,
#: X read by Gather(X, t)) is kept. With the zero-step guard (only read outputs pass its
#: If, the stack of no step from a zero-trip Loop declared as the original's) the
#: rewritten files differed from the original at X's length 0 in ONNX Runtime
#: 1.32 (9 of jax2onnx 0.17.1's files; e.g. the stack's last axis 8 against 0), so
#: the guard's stack is not proven the Loop's here. From seq 8 on the rewrite ran at
#: 0.12x-0.33x the Loop's time: what equal zero-step outputs would gain.
GUARD_INVARIANTS_REASON = (
    "the Loop runs {cell} cell, but the trip count is X's length and X is carried around"
    " it ({count} values unchanged): at X's length 0 the guard's stack of no step is not"
    " proven to have the shape ONNX Runtime gives the Loop's"
)

#: A constant trip count above this is not unrolled to prove the condition.
_MAX_TRIPS = 1 << 16


def _scalar_int(array: np.ndarray | None) -> int | None:
    if array is None or array.ndim != 0 or array.dtype.kind not in "iu":
        return None
    return int(array)


def plan_loop(node: ir.Node, model: ir.Model) -> Recurrence | Refusal:
    """Prove ``node`` (a ``Loop``) is one recurrent layer, or say why not."""
    body_attr = node.attributes.get("body")
    if body_attr is None:
        return Refusal("the Loop has no body")
    opset = opset_version(model, model.graph)
    assert isinstance(opset, int)
    carried_init = list(node.inputs[2:])
    body = _read_body(body_attr.as_graph(), carried_init, opset)
    if isinstance(body, Refusal):
        return body
    try:
        return _plan(node, model, body, opset)
    finally:  # the copy's nodes read outer values: they must not count as readers
        for inner in ir.traversal.RecursiveGraphIterator(body):
            for index in range(len(inner.inputs)):
                inner.replace_input_with(index, None)


def _plan(node: ir.Node, model: ir.Model, body: ir.Graph, opset: int) -> Recurrence | Refusal:
    """:func:`plan_loop` on ``body``, the copy of the Loop's body the proof reads."""
    outer = Constants(opset)
    carried_init = list(node.inputs[2:])
    count = len(carried_init)
    iteration, cond_in, *carried_in = body.inputs
    cond_out, *rest = body.outputs
    carried_out, scans = rest[:count], rest[count:]
    masked = _mask_reason(body)
    if masked is not None:
        return masked

    if node.inputs[0] is None:
        return Refusal("the Loop has no trip count (the condition alone ends it)")
    trips = _scalar_int(outer(node.inputs[0]))  # None: a computed count, see the end
    if trips is None:  # sizes the main graph's inputs declare (a static sequence length)
        sizes = ShapeProver(model.graph).ints(node.inputs[0])
        trips = sizes[0] if sizes is not None and len(sizes) == 1 else None
    if trips is not None and not 1 <= trips <= _MAX_TRIPS:
        return Refusal(f"the trip count is {trips}, not 1..{_MAX_TRIPS}")
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        first = outer(node.inputs[1])
        if first is None or first.size != 1 or not bool(first.reshape(())):
            # why normalize.LoopConditionPass left it, naming the node
            reason = condition_refusal(node, model.graph)
            return reason or Refusal(
                "the first condition is not a constant true (normalize.LoopConditionPass"
                " makes it one: where the rewrite ran it, the Loop was kept for another"
                " reason, and the condition's spelling put back)"
            )

    carried = prove_carried(carried_in, carried_out, carried_init, opset)
    if isinstance(carried, Refusal):
        return carried
    cell, state_of = carried.cell, carried.state_of
    invariants, counters = carried.invariants, carried.counters

    # the condition is true after every step but the last
    if trips is None and through_identity(cond_out) is not cond_in:
        return Refusal(
            "the condition is not the one passed in and the trip count is not a constant"
        )
    if trips is not None:
        reason = _condition_reason(cond_out, cond_in, iteration, counters, trips, opset, invariants)
        if reason is not None:
            return reason

    # the step input is X[t]: Gather(X, t) with t the iteration number or a counter from 0
    gather = producer(cell.x, "Gather")
    if gather is None or gather.attributes.get_int("axis", 0) != 0:
        return Refusal("the step input is not Gather(X, t, axis=0)")
    x, index = gather.inputs
    if trips is None and x in invariants:  # X carried around: a guard, kept (see the reason)
        shapes = ShapeProver(model.graph)
        if shapes.elements(node.inputs[0]) != (shapes.dim(invariants[x], 0),):
            return Refusal("the trip count is neither a constant nor X's length")
        return _guard_reason(cell, invariants)
    if x is None or x.graph is body or x in body.inputs:
        return Refusal("the step input is not read from a sequence outside the body")
    start = None if index is None else _scalar_int(counters.get(index))
    if index is not iteration and start != 0:
        return Refusal("the step input is not X[t]: the index is not the iteration number")
    prover = ShapeProver(model.graph)
    narrowed: list[ir.Node] = []  # integer Casts read as the identity (see _narrowing)
    steps = _counted_steps(node.inputs[0]) if trips is None and opset >= 10 else None
    # X0 when x is X0 reversed in time (a count of steps reads x itself: its first steps)
    source = None if steps is not None else reversed_source(x, prover)
    sequence = x if source is None else source
    if prover.rank(sequence) != 3:
        return Refusal("X is not provably of rank 3")

    # outputs: final states, invariants, the stacked h_t; counters and side outputs unread
    outputs: list[str | ir.Value | None] = []
    h_t = through_identity(carried_out[carried.h_index])
    for j, value in enumerate(node.outputs):
        if not used(value):
            outputs.append(None)
        elif j < count and j in state_of:
            outputs.append(state_of[j])
        elif j < count and carried_in[j] in invariants:
            outputs.append(carried.inits[j])
        elif j < count:
            return Refusal(f"the final value of counter {j} is read")
        elif through_identity(scans[j - count]) is h_t:
            outputs.append("y")
        else:
            return Refusal(f"scan output {j - count} is not h_t (a side output is read)")

    h0, c0 = carried.initial_states
    fits = states_fit(prover, h0, c0, sequence, cell, narrowed)
    if isinstance(fits, Refusal):
        return fits
    if (
        trips is None
        and steps is None
        and shape_elements(node.inputs[0], prover, narrowed) != (prover.dim(sequence, 0),)
    ):
        return Refusal("the trip count is neither a constant nor X's length")
    whole = trips is None or prover.dim(x, 0) == Dim.const(trips)
    plan = Recurrence(node, cell, x, False, h0, c0, outputs, None if whole else trips)
    plan.broadcast = not fits
    plan.guarded = trips is None  # X's length or a count, which can be 0: see Recurrence
    plan.steps = steps
    plan.step_input = x
    plan.h_input = carried_in[carried.h_index]

    # a reversed X (ReverseSequence or Slice): a reverse node on the original, whose Y is
    # the Loop's stacked output reversed back where the graph does so
    if source is not None:
        plan.x, plan.reverse, plan.first_steps = source, True, None
        whole = trips is None or prover.dim(source, 0) == Dim.const(trips)
        plan.last_steps = None if whole else trips
        for k, kind in enumerate(outputs):
            if kind == "y":
                outputs[k] = "y_reversed"  # for any reader left besides the reversal
                undone = undone_reversal(node.outputs[k], prover)
                if undone is not None:
                    plan.replaced.append(undone)
    return plan


def _counted_steps(trips: ir.Value | None) -> ir.Value | None:
    """``trips`` when it is a count, never negative: ``ReduceSum`` over every axis
    (``keepdims=0``: a scalar) of a ``Cast`` of booleans to int64 (as
    ``normalize.LoopConditionPass`` counts the steps a float condition lets run); else
    None. Where the Loop runs, such a trip count ``n`` is at most ``X``'s length: the
    body's ``Gather(X, t)`` at ``t = len(X)`` fails (ONNX Runtime checks its indices)."""
    node = None if trips is None else trips.producer()
    if node is None or node.op_type != "ReduceSum" or node.domain != "" or len(node.inputs) != 1:
        return None
    attributes = node.attributes
    if attributes.get_int("keepdims", 1) != 0 or attributes.get_int("noop_with_empty_axes"):
        return None
    if attributes.get("axes") is not None:
        return None
    cast = node.inputs[0].producer() if node.inputs[0] is not None else None
    if cast is None or cast.op_type != "Cast" or cast.domain != "" or not cast.inputs:
        return None
    to = ir.DataType(cast.attributes.get_int("to", 0))  # int64: no sum wraps
    if to != ir.DataType.INT64 or ElementTypes()(cast.inputs[0]) != ir.DataType.BOOL:
        return None
    return trips


def _mask_reason(body: ir.Graph) -> Refusal | None:
    """Why ``body`` is not one node's step: it reads a step of a boolean sequence from
    outside (Keras' ``Masking``: where the mask is false the state is kept, so a mask can
    skip steps mid-sequence, which one RNN/LSTM/GRU node cannot say)."""
    types = ElementTypes()
    for inner in body:
        if inner.op_type != "Gather" or inner.domain != "" or inner.inputs[0] is None:
            continue
        sequence = inner.inputs[0]
        outside = sequence.graph is not body and sequence not in body.inputs
        if outside and types(sequence) == ir.DataType.BOOL:
            return Refusal(
                f"the body reads a mask per step ({sequence.name}): where it is false the"
                " state is kept, so steps may be skipped mid-sequence, which one"
                " RNN/LSTM/GRU node cannot say"
            )
    return None


def _read_body(
    written: ir.Graph, carried_init: list[ir.Value | None], opset: int
) -> ir.Graph | Refusal:
    """A copy of the Loop's body as the proof reads it: per-gate slices of one fused
    projection split (:func:`split_projections`; on a copy, since that changes kernels
    only the replacing node may run)."""
    count = len(carried_init)
    if len(written.inputs) != count + 2 or len(written.outputs) < count + 1:
        return Refusal("the body's inputs and outputs do not match the Loop's")
    body = written.clone(allow_outer_scope_values=True)
    inits = initial_values(carried_init)
    if isinstance(inits, Refusal):
        return inits
    carried = classify_carried(
        body.inputs[2:], body.outputs[1 : count + 1], inits, Constants(opset)
    )
    if not isinstance(carried, Refusal):
        split_projections(body, Constants(opset, carried[0]))
    return body


def _guard_reason(cell: Cell, invariants: dict[ir.Value, ir.Value]) -> Refusal:
    article = "an" if cell.op_type in ("LSTM", "RNN") else "a"
    return Refusal(
        GUARD_INVARIANTS_REASON.format(cell=f"{article} {cell.op_type}", count=len(invariants))
    )


def _condition_reason(
    cond_out: ir.Value,
    cond_in: ir.Value,
    iteration: ir.Value,
    counters: dict[ir.Value, np.ndarray],
    trips: int,
    opset: int,
    invariants: dict[ir.Value, ir.Value],
) -> Refusal | None:
    """None when the body's condition is provably true after each step ``0..trips-2``
    (evaluated at each step from the iteration number and the counters alone)."""
    if through_identity(cond_out) is cond_in:
        return None
    for step in range(trips - 1):
        bound: dict[ir.Value, ir.Value | np.ndarray] = dict(invariants)
        bound[iteration] = np.array(step, np.int64)
        bound[cond_in] = np.array(True)
        for counter, start in counters.items():
            bound[counter] = np.asarray(start + np.array(step, start.dtype), start.dtype)
        value = Constants(opset, bound)(cond_out)
        if value is None:
            return Refusal(
                "the condition depends on more than the step number (the loop may end early)"
            )
        if value.size != 1 or not bool(value.reshape(())):
            return Refusal(f"the condition is false after step {step} (the loop ends early)")
    return None


class LoopToRnn(RecurrenceRule):
    """Loop running an RNN/LSTM/GRU cell over X[t] -> one RNN/LSTM/GRU node."""

    op_type = "Loop"

    def plan(self, node: ir.Node, model: ir.Model) -> Recurrence | Refusal:
        return plan_loop(node, model)

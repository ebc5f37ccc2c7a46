"""The proof that an ONNX ``Loop`` runs a recurrent cell over a sequence (tf2onnx, torch)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import opset_version
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.normalize._values import ElementTypes
from rnn_rewrite_rules.normalize.loop_condition import condition_refusal
from rnn_rewrite_rules.normalize.sequence_scan import stack_fails_without_steps
from rnn_rewrite_rules.rules._graph import producer
from rnn_rewrite_rules.rules.cell import Constants, through_identity
from rnn_rewrite_rules.rules.loop_scan._common import (
    Carried,
    Recurrence,
    RecurrenceRule,
    classify_carried,
    initial_values,
    prove_carried,
    shape_elements,
    states_fit,
    tests_size,
    used,
)
from rnn_rewrite_rules.rules.loop_scan.fused_projection import split_projections
from rnn_rewrite_rules.rules.loop_scan.guarded_input import guard_read_by_else
from rnn_rewrite_rules.rules.loop_scan.reversal import reversed_source, undone_reversal
from rnn_rewrite_rules.rules.loop_scan.zero_step import (
    batch_dim,
    exact_branch_reason,
    zero_step_reason,
)
from rnn_rewrite_rules.shape import Dim, ShapeProver

__all__ = ["LoopToRnn", "plan_loop"]

#: A constant trip count above this is not unrolled to prove the condition.
_MAX_TRIPS = 1 << 16


def _scalar_int(array: np.ndarray | None) -> int | None:
    if array is None or array.ndim != 0 or array.dtype.kind not in "iu":
        return None
    return int(array)


def _true(array: np.ndarray | None) -> bool:
    return array is not None and array.size == 1 and bool(array.reshape(()))


def plan_loop(node: ir.Node, model: ir.Model) -> Recurrence | Refusal:
    """Prove ``node`` (a ``Loop``) is one recurrent layer, or say why not."""
    body_attr = node.attributes.get("body")
    if body_attr is None:
        return Refusal("the Loop has no body")
    kept = exact_branch_reason(node, model)
    if kept is not None:
        return kept
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


@dataclasses.dataclass
class _Body:
    """The parts of a Loop body's signature the proof reads (``count`` carried values)."""

    iteration: ir.Value
    cond_in: ir.Value
    carried_in: list[ir.Value]
    cond_out: ir.Value
    carried_out: list[ir.Value]
    scans: list[ir.Value]

    @classmethod
    def of(cls, body: ir.Graph, count: int) -> _Body:
        iteration, cond_in, *carried_in = body.inputs
        cond_out, *rest = body.outputs
        return cls(iteration, cond_in, carried_in, cond_out, rest[:count], rest[count:])


def _plan(node: ir.Node, model: ir.Model, body: ir.Graph, opset: int) -> Recurrence | Refusal:
    """:func:`plan_loop` on ``body``, the copy of the Loop's body the proof reads: the trip
    count, the cell the carried states run, the condition, the step input ``X[t]``, what
    each output is, the initial states, then the recurrence (reversed where ``X`` is)."""
    masked = _mask_reason(body)
    if masked is not None:
        return masked
    trips = _trip_count(node, model, opset)
    if isinstance(trips, Refusal):
        return trips
    parts = _Body.of(body, len(node.inputs) - 2)
    changed = _changed_sequence_reason(body, parts)
    if changed is not None:
        return changed
    carried = prove_carried(parts.carried_in, parts.carried_out, list(node.inputs[2:]), opset)
    if isinstance(carried, Refusal):
        return carried
    reason = _condition_reason(parts, carried, trips, opset)
    if reason is not None:
        return reason
    x = _step_input(node, model, body, parts, carried, trips)
    if isinstance(x, Refusal):
        return x
    outputs = _output_kinds(node, parts, carried)
    if isinstance(outputs, Refusal):
        return outputs
    return _recurrence(node, model, parts, carried, trips, x, outputs)


def _trip_count(node: ir.Node, model: ir.Model, opset: int) -> int | Refusal | None:
    """The Loop's trip count when it is a constant or a size the main graph's inputs
    declare (a static sequence length), None when it is computed (then it must be X's
    length: see :func:`_recurrence`); refused when absent or out of range, or when the
    first condition is not a constant true."""
    outer = Constants(opset)
    if node.inputs[0] is None:
        return Refusal("the Loop has no trip count (the condition alone ends it)")
    trips = _scalar_int(outer(node.inputs[0]))
    if trips is None:
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
                " makes it one: run it before the rules)"
            )
    return trips


def _step_input(
    node: ir.Node,
    model: ir.Model,
    body: ir.Graph,
    parts: _Body,
    carried: Carried,
    trips: int | None,
) -> ir.Value | Refusal:
    """``X``, where the step input is ``X[t]``: ``Gather(X, t, axis=0)`` of a sequence from
    outside the body, ``t`` the iteration number or a counter from 0; or of ``X`` carried
    around the Loop unchanged (jax2onnx's scan, then over ``X``'s own length): the value it
    is bound to, and :func:`_recurrence` makes the guard exact (:func:`_carries_x`)."""
    gather = producer(carried.cell.x, "Gather")
    if gather is None or gather.attributes.get_int("axis", 0) != 0:
        return Refusal("the step input is not Gather(X, t, axis=0)")
    x, index = gather.inputs
    start = None if index is None else _scalar_int(carried.counters.get(index))
    not_t = Refusal("the step input is not X[t]: the index is not the iteration number")
    invariants = carried.invariants
    if trips is None and x in invariants:
        shapes = _plan_prover(model, invariants[x], _guard_form(node, carried).size_tested)
        if shapes.elements(node.inputs[0]) != (shapes.dim(invariants[x], 0),):
            return Refusal("the trip count is neither a constant nor X's length")
        if index is not parts.iteration and start != 0:
            return not_t
        return invariants[x]  # X carried unchanged: the guard keeps the Loop (exact)
    if x is None or x.graph is body or x in body.inputs:
        return Refusal("the step input is not read from a sequence outside the body")
    if index is not parts.iteration and start != 0:
        return not_t
    return x


def _changed_sequence_reason(body: ir.Graph, parts: _Body) -> Refusal | None:
    """Why the body's steps are not ``X[t]`` of one sequence: it reads ``Gather(v, t)`` of
    a carried value ``v`` the body changes (``v_out`` is not ``v_in`` through Identity),
    so step ``t`` reads a sequence the earlier steps rewrote. A carried ``X`` passed
    through unchanged is ``X`` at every step (jax2onnx's scan)."""
    for inner in body:
        if inner.op_type != "Gather" or inner.domain != "" or len(inner.inputs) != 2:
            continue
        sequence, index = inner.inputs
        if sequence not in parts.carried_in or index is not parts.iteration:
            continue
        j = parts.carried_in.index(sequence)
        if through_identity(parts.carried_out[j]) is not sequence:
            return Refusal(
                f"the body reads its step from carried value {j} ({sequence.name}) and"
                " changes that value: step t reads a sequence the earlier steps rewrote,"
                " not X[t]"
            )
    return None


def _output_kinds(
    node: ir.Node, parts: _Body, carried: Carried
) -> list[str | ir.Value | None] | Refusal:
    """What each output of the Loop is (see :class:`Recurrence`): final states, invariants
    (their initial values), the stacked ``h_t``; counters and side outputs must be unread."""
    count = len(parts.carried_in)
    outputs: list[str | ir.Value | None] = []
    h_t = through_identity(parts.carried_out[carried.h_index])
    for j, value in enumerate(node.outputs):
        if not used(value):
            outputs.append(None)
        elif j < count and j in carried.state_of:
            outputs.append(carried.state_of[j])
        elif j < count and parts.carried_in[j] in carried.invariants:
            outputs.append(carried.inits[j])
        elif j < count:
            return Refusal(f"the final value of counter {j} is read")
        elif through_identity(parts.scans[j - count]) is h_t:
            outputs.append("y")
        else:
            return Refusal(f"scan output {j - count} is not h_t (a side output is read)")
    return outputs


def _recurrence(
    node: ir.Node,
    model: ir.Model,
    parts: _Body,
    carried: Carried,
    trips: int | None,
    x: ir.Value,
    outputs: list[str | ir.Value | None],
) -> Recurrence | Refusal:
    """The recurrence over ``x`` (or over ``X0`` when ``x`` is ``X0`` reversed in time),
    once the initial states fit and a computed trip count is proven ``X``'s length."""
    cell = carried.cell
    count = len(parts.carried_in)
    narrowed: list[ir.Node] = []  # integer Casts read as the identity (see _narrowing)
    steps = _counted_steps(node.inputs[0]) if trips is None else None
    form = _guard_form(node, carried)
    prover = (
        ShapeProver(model.graph) if trips is not None else _plan_prover(model, x, form.size_tested)
    )
    opset = opset_version(model, model.graph)
    if steps is not None and (isinstance(opset, Refusal) or opset < 10):
        return Refusal(f"opset {opset}'s Slice cannot read a count of steps of X")
    # X0 when x is X0 reversed in time (a count of steps reads x itself: its first steps)
    source = None if steps is not None else reversed_source(x, prover)
    sequence = x if source is None else source
    if prover.rank(sequence) != 3:
        return Refusal("X is not provably of rank 3")
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
    plan.guarded = trips is None and form.guarded
    plan.steps = steps
    plan.exact = trips is None and form.exact
    # where the original fails at 0 steps the guard only keeps the GRU from aborting:
    # its stack of no step need not equal anything
    if plan.guarded and not form.fails and not plan.exact:
        stacks = [parts.scans[k - count] for k, kind in enumerate(outputs) if kind == "y"]
        states = [parts.carried_in[j] for j in carried.state_of]
        # at length 0, where the facts of a guard read by its else branch do not hold
        plain = ShapeProver(model.graph)
        batch = batch_dim(sequence, plain)
        zero = zero_step_reason(node, stacks, states, batch, cell.hidden_size, model, plain)
        if zero is not None:
            return zero
    plan.step_input = x
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


@dataclasses.dataclass(frozen=True)
class _GuardForm:
    """The zero-step guard a Loop over ``X``'s length (or a count of steps) gets.

    ``fails``: the original fails at 0 steps. ``guarded``: there is a guard, unless the
    original fails at 0 steps, where only a GRU needs one (ONNX Runtime's GRU aborts on 0
    steps; the guard's test of an empty ``X`` also keeps it from batch 0). ``exact``: the
    guard keeps the Loop itself (it carries ``X``, :func:`_carries_x`, and runs at 0
    steps). ``size_tested``: the guard tests ``Size(X) == 0``
    (``_common.tests_size``), so the node runs only where ``X`` is not empty."""

    fails: bool
    guarded: bool
    exact: bool
    size_tested: bool


def _guard_form(node: ir.Node, carried: Carried) -> _GuardForm:
    fails = stack_fails_without_steps(node)
    guarded = not (fails and carried.cell.op_type != "GRU")
    exact = _carries_x(carried) and not fails
    size_tested = guarded and tests_size(exact, carried.cell)
    return _GuardForm(fails, guarded, exact, size_tested)


def _plan_prover(model: ir.Model, x: ir.Value, size_guarded: bool) -> ShapeProver:
    """The prover of a Loop over ``x``'s length, whose node runs only where ``x`` is not
    empty (``size_guarded``) or not of length 0: it reads a guard of the layer before by
    its ``else`` branch where that branch gave ``x`` wherever the node runs
    (:mod:`.guarded_input`)."""
    guard = guard_read_by_else(x, size_guarded=size_guarded)
    return ShapeProver(model.graph, () if guard is None else (guard,))


def _carries_x(carried: Carried) -> bool:
    """The body's step is ``Gather(X, t)`` of an ``X`` carried around it unchanged
    (jax2onnx's scan): the zero-step guard keeps the Loop itself (``Recurrence.exact``).

    Why not the lean guard: at ``X``'s length 0 ONNX Runtime shapes the Loop's stack of no
    step from its own inference of the body (``loop.cc``), and for these bodies that shape
    is neither the declaration's nor one the graph proves; it changes with the graph
    optimisation level (jax2onnx 0.17.1's ``hand_*`` files in ONNX Runtime 1.32: ``(0, 0,
    0)`` with optimisations off, ``(0, 0, 8)`` on; ``tests/test_jax_scan_loops.py`` holds
    the premise). Only the Loop itself gives it, so the guard's zero-step branch is the
    Loop as written, which is the original wherever it runs (``_common._kept_loop``)."""
    gather = producer(carried.cell.x, "Gather")
    return gather is not None and gather.inputs[0] in carried.invariants


def _condition_reason(
    parts: _Body, carried: Carried, trips: int | None, opset: int
) -> Refusal | None:
    """None when the body's condition is provably true after each step but the last: the
    condition passed in unchanged, a constant true (TorchScript's ``Identity(true)``), or,
    with a constant trip count, true after each step ``0..trips-2`` (evaluated at each step
    from the iteration number and the counters)."""
    cond_out, cond_in = parts.cond_out, parts.cond_in
    if through_identity(cond_out) is cond_in or _true(Constants(opset)(cond_out)):
        return None
    if trips is None:
        return Refusal(
            "the condition is not the one passed in and the trip count is not a constant"
        )
    for step in range(trips - 1):
        bound: dict[ir.Value, ir.Value | np.ndarray] = dict(carried.invariants)
        bound[parts.iteration] = np.array(step, np.int64)
        bound[cond_in] = np.array(True)
        for counter, start in carried.counters.items():
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

"""What the Loop and Scan rules share: the proven recurrence, its checks and its emission."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchContext, MatchResult, RewriteRuleClassBase

from rnn_rewrite_rules import costs
from rnn_rewrite_rules._compat import Builder, emit_node
from rnn_rewrite_rules._ir import name_values, opset_version
from rnn_rewrite_rules._refusal import Inapplicable, Refusal
from rnn_rewrite_rules._rnn_ops import mark_replaces_batch_0_run
from rnn_rewrite_rules.rules._broadcast import broadcast_batches, broadcast_opset_reason
from rnn_rewrite_rules.rules._graph import (
    array_constant,
    cached_ints,
    free_name,
    producer,
    slice_,
    squeeze,
    taken_names,
    unsqueeze,
)
from rnn_rewrite_rules.rules._kernels import missing_kernel, other_activations
from rnn_rewrite_rules.rules._rnn_node import keep_identity
from rnn_rewrite_rules.rules.cell import (
    EMPTY_INPUT_REASON,
    Cell,
    Constants,
    prove_cell,
    recurrent_node,
    through_identity,
)
from rnn_rewrite_rules.rules.loop_scan.exact_cost import (
    EXACT_BROADCAST_FORM,
    EXACT_COST_REASON,
    guard_cost_reason,
)
from rnn_rewrite_rules.rules.loop_scan.guarded_input import mark_guard
from rnn_rewrite_rules.rules.loop_scan.zero_step import EXACT_FORM
from rnn_rewrite_rules.rules.reroll._chain import redirect
from rnn_rewrite_rules.shape import Dim, ShapeProver
from rnn_rewrite_rules.shape.semantics import INT64_MAX, INT64_MIN

__all__ = [
    "BROADCAST_BRANCH_REASON",
    "EMPTY_INPUT_REASON",
    "FLOAT16_REASON",
    "GUARD_COST_REASON",
    "MAX_OUTPUTS",
    "Carried",
    "Recurrence",
    "RecurrenceRule",
    "classify_carried",
    "initial_values",
    "prove_carried",
    "shape_elements",
    "states_fit",
    "tests_size",
]

#: The name a guard's zero-step branch that keeps the Loop itself ends with, and its Loop.
EXACT_BRANCH = "exact_no_step"
#: Rules are made for nodes with up to this many outputs (one rule per count).
MAX_OUTPUTS = 16
_FLOAT16 = np.dtype(np.float16)


@dataclasses.dataclass
class Recurrence:
    """A Loop or Scan proven to run ``cell`` over ``x`` (``[T, batch, I]``, time-major).

    ``last_steps``/``first_steps``: the node reads only that many steps of ``x`` (the
    last or first ones), which must then be sliced off; None: all of ``x``.
    ``outputs[k]`` says what output ``k`` of the node is: ``"h"``, ``"c"`` (final
    states), ``"y"`` (the stacked ``h_t``, ``[T, batch, H]``), ``"y_reversed"`` (the
    same in reverse step order), a value it equals (an invariant) or None (unused).
    ``replaced``: values after the node to replace by ``Y`` instead (a reversal undone).
    ``broadcast``: the states' batch is not proven ``x``'s: all three are expanded to the
    batch they broadcast to, as the body's arithmetic does.
    ``guarded``: a Loop's trip count is ``x``'s length, which can be 0: then the Loop runs
    no step where the node would not run (ONNX Runtime's GRU aborts on 0 steps, its LSTM
    and RNN give zero states; at batch 0 its LSTM and GRU abort at any length), so the
    node sits in ``If(Size(x) == 0)`` (:func:`_guard_condition`) whose other branch gives
    the Loop's read outputs where ``x`` is empty: the initial states, and a stack from a
    pass-through Loop over ``x``'s length declared as the original (``_empty_stack``): at
    length 0 a stack of no step, whose shape ONNX Runtime takes from the body's scan
    output as it declares and infers it, only where the declaration fixes that shape
    (``loop_scan.zero_step``: ``(0, 0, H)`` for ``[?, H]``, ``(0, 1, H)`` for ``[1, H]``);
    at batch 0 ``[T, 0, H]``. ``onnx.reference``'s Loop cannot stack no step or empty
    steps.
    ``exact``: the guard's zero-step branch is the Loop itself, as written
    (:func:`_kept_loop`), for a Loop that carries ``x`` around unchanged (jax2onnx's scan,
    ``loop._carries_x``), whose stack of no step no declaration fixes; the branch runs
    wherever ``x`` is empty (``If(Size(x) == 0)``): at batch 0 too, where ONNX Runtime
    1.32 aborts on its LSTM and GRU nodes at any length (its RNN runs there, as OpenVINO
    runs all three; tract fails on the original Loop there). Equal at every length and
    batch: where the branch runs, it runs the original Loop on the same values, so gives
    what it gives, shapes included; elsewhere (``T >= 1``, a batch of at least 1) the
    trip count is ``x``'s length ``T`` and the
    condition is passed through from a constant true, so the Loop runs ``T`` steps, step
    ``t`` reading ``Gather(x, t) = x[t]`` (``x`` is carried unchanged: the same ``x`` at
    every step) and computing the proven cell from ``h0`` (``c0``), which is what the node
    computes: its ``Y[t]`` is the stacked ``h_t``, its ``Y_h`` (``Y_c``) the final states,
    and the invariants are their initial values.
    ``steps``: a Loop's trip count when it is a count ``n`` of steps, not ``x``'s
    length (``loop._counted_steps``: never negative, and at most ``x``'s length wherever
    the Loop runs): the node reads ``x[0:n]`` and the guard tests ``n == 0``.
    ``step_input``: the value the body's step reads (``x`` or its reversal). A Scan is not
    guarded: ONNX Runtime's Scan fails on 0 steps, so there is nothing to equal, and a
    guard would hide the node from the ``bidirectional`` merge.
    """

    node: ir.Node
    cell: Cell
    x: ir.Value
    reverse: bool
    h0: ir.Value
    c0: ir.Value | None
    outputs: list[str | ir.Value | None]
    first_steps: int | None = None
    last_steps: int | None = None
    replaced: list[ir.Value] = dataclasses.field(default_factory=list)
    broadcast: bool = False
    guarded: bool = False
    step_input: ir.Value | None = None
    steps: ir.Value | None = None
    exact: bool = False


def initial_values(carried_init: Sequence[ir.Value | None]) -> list[ir.Value] | Refusal:
    """The initial values of a body's carried values, or which one is absent."""
    for j, init in enumerate(carried_init):
        if init is None:
            return Refusal(f"carried value {j} has no initial value")
    return [init for init in carried_init if init is not None]


def classify_carried(
    carried_in: Sequence[ir.Value],
    carried_out: Sequence[ir.Value],
    carried_init: Sequence[ir.Value],
    outer: Constants,
) -> tuple[dict[ir.Value, ir.Value], dict[ir.Value, np.ndarray], list[int]] | Refusal:
    """The carried values of a body: invariants (passed through: body input -> the value
    it is bound to), counters (``+ 1`` per step from a constant scalar: body input -> its
    start) and the rest, the states (their positions)."""
    invariants: dict[ir.Value, ir.Value] = {}
    counters: dict[ir.Value, np.ndarray] = {}
    states: list[int] = []
    for j, (value_in, value_out, init) in enumerate(
        zip(carried_in, carried_out, carried_init, strict=True)
    ):
        start = outer(init)
        if through_identity(value_out) is value_in:
            invariants[value_in] = init
        elif _is_increment(value_out, value_in, outer) and start is not None and start.ndim == 0:
            counters[value_in] = start
        else:
            states.append(j)
    return invariants, counters, states


def _is_increment(value_out: ir.Value, value_in: ir.Value, constants: Constants) -> bool:
    """``value_out`` is ``value_in + 1`` (a scalar one, either side)."""
    add = producer(through_identity(value_out), "Add")
    if add is None:
        return False
    for a, b in (add.inputs, add.inputs[::-1]):
        one = constants(b)
        if a is value_in and one is not None and one.ndim == 0 and one == 1:
            return True
    return False


@dataclasses.dataclass
class Carried:
    """A Loop or Scan body's carried values, classified, and the cell its states run.

    ``inits``: the initial values; ``state_of``: position -> ``"h"`` or ``"c"``."""

    inits: list[ir.Value]
    invariants: dict[ir.Value, ir.Value]
    counters: dict[ir.Value, np.ndarray]
    cell: Cell
    state_of: dict[int, str]

    @property
    def h_index(self) -> int:
        return next(j for j, k in self.state_of.items() if k == "h")

    @property
    def initial_states(self) -> tuple[ir.Value, ir.Value | None]:
        """``h0`` and ``c0`` (None for a cell without ``c``)."""
        c0 = next((self.inits[j] for j, k in self.state_of.items() if k == "c"), None)
        return self.inits[self.h_index], c0


def prove_carried(
    carried_in: Sequence[ir.Value],
    carried_out: Sequence[ir.Value],
    carried_init: Sequence[ir.Value | None],
    opset: int,
) -> Carried | Refusal:
    """:func:`classify_carried`, then the cell the states compute (:func:`prove_cell`)."""
    inits = initial_values(carried_init)
    if isinstance(inits, Refusal):
        return inits
    carried = classify_carried(carried_in, carried_out, inits, Constants(opset))
    if isinstance(carried, Refusal):
        return carried
    invariants, counters, states = carried
    found = prove_cell(
        [(carried_in[j], carried_out[j]) for j in states], Constants(opset, invariants)
    )
    if isinstance(found, Refusal):
        return found
    cell, roles = found
    state_of = {states[i]: ("h", "c")[k] for k, i in enumerate(roles)}
    return Carried(inits, invariants, counters, cell, state_of)


def shape_elements(
    value: ir.Value | None, prover: ShapeProver, narrowed: list[ir.Node]
) -> tuple[Dim | None, ...] | None:
    """The elements of a shape computation (:meth:`ShapeProver.elements`), each size
    round-tripped through an integer type of at least 32 bits read as that size
    (:meth:`ShapeProver.narrowed_from`: tf2onnx computes shapes in int32, ``Shape ->
    Cast(int32) -> Slice -> Cast(int64)``); each such ``Cast`` is added to ``narrowed``.

    Equality where the caller uses them as a trip count or a state's batch: an int32
    round trip of a size changes it only at sizes of ``2**31`` or more, which the node
    replacing the Loop cannot run (ONNX Runtime's RNN/LSTM/GRU kernels hold sizes in
    ``int``): there the rewrite fails loudly, never with other values. That limit is
    every rule's that emits one of those nodes; a narrower round trip (int16: 32768) is
    not read through."""
    elements = prover.elements(value)
    if elements is None:
        return None
    read: list[Dim | None] = []
    for element in elements:
        source = None if element is None else prover.narrowed_from(element)
        if element is not None and source is not None and element.symbol is not None:
            cast = element.symbol.value.producer()
            if cast is not None:
                narrowed.append(cast)
        read.append(element if source is None else source)
    return tuple(read)


def _expanded_to(
    state: ir.Value, prover: ShapeProver, narrowed: list[ir.Node]
) -> tuple[Dim | None, ...] | None:
    r"""The shape ``state`` is expanded to (``Expand(v, shape)``, through integer
    ``Cast``\ s: see :func:`shape_elements`), else None."""
    node = producer(state, "Expand")
    if node is None or len(node.inputs) != 2:
        return None
    return shape_elements(node.inputs[1], prover, narrowed)


def states_fit(
    prover: ShapeProver,
    h0: ir.Value,
    c0: ir.Value | None,
    x: ir.Value,
    cell: Cell,
    narrowed: list[ir.Node] | None = None,
) -> bool | Refusal:
    """True when the initial ``h0`` (and ``c0``) are provably ``[batch of x, H]``; False
    when they are of rank 2 with a batch not proven ``x``'s (a graph input: the body
    broadcasts it against ``x``'s batch, the rewrite must too) and ``H`` columns, proven
    or implied (``h0`` read by ``MatMul(h, R)``, ``c0`` the same value); else why not."""
    hidden, batch = cell.hidden_size, prover.dim(x, 1)
    fits = True
    for state, name in ((h0, "h"), (c0, "c")):
        if state is None:
            continue
        if batch is not None and prover.dims(state) == (batch, Dim.const(hidden)):
            continue
        passed: list[ir.Node] = []
        if (
            narrowed is not None
            and batch is not None
            and _expanded_to(state, prover, passed) == (batch, Dim.const(hidden))
            and prover.rank(producer(state, "Expand").inputs[0]) == 0  # type: ignore[union-attr]
        ):
            narrowed.extend(passed)
            continue
        width = prover.dim(state, 1) == Dim.const(hidden) or (cell.h_width_read and state is h0)
        if prover.rank(state) != 2 or not width:
            return Refusal(f"cannot prove the initial {name} is [batch, {hidden}]")
        fits = False
    return fits


#: Why a Loop over ``X``'s length beside initial states of a batch not proven ``X``'s gets
#: no lean guard: at batch 0 and a length >= 1 the Loop's first step broadcasts a state of
#: batch 1 to ``X``'s empty batch (its final states and stack are ``[0, H]`` a step),
#: where the lean guard's branch passes the initial states through as given (``[1, H]``).
BROADCAST_BRANCH_REASON = (
    "the trip count is X's length and the initial states' batch is not proven X's: at"
    " batch 0 the Loop's steps broadcast the initial states to X's empty batch, which the"
    " zero-step guard's pass-through branch does not"
)
#: Why the exact guard beside such states is refused: its measured table
#: (``costs/exact_broadcast.json``: the guard and the broadcast, 8 small nodes) says it is
#: slower (``why``).
GUARD_COST_REASON = (
    "the trip count is X's length and the initial states' batch is not proven X's: the"
    " exact zero-step guard and the broadcast are not no slower: {why}"
)

#: Why a float16 cell is refused by default (the node's rounding is not the body's).
FLOAT16_REASON = (
    "the cell computes in float16 op by op: one float16 {op} node rounds otherwise (ONNX "
    "Runtime runs it in float32 between Casts), so outputs would change by float16 "
    "rounding; loop_scan.widened_rules() does that explicitly, on request"
)


def dtype_reason(cell: Cell, float32: bool, target: str) -> Refusal | None:
    """Why the node for ``cell`` must not be emitted on ``target``: a float16 cell unless
    ``float32`` (see :data:`FLOAT16_REASON`); an op or element type a runtime of the
    target has no kernel for (``rules._kernels``: float64 in ONNX Runtime and tract, no
    ``RNN`` in rten, a runtime of ``portable``)."""
    if cell.dtype == _FLOAT16 and not float32:
        return Refusal(FLOAT16_REASON.format(op=cell.op_type))
    emitted = np.dtype(np.float32) if cell.dtype == _FLOAT16 else cell.dtype
    return missing_kernel("", cell.op_type, emitted, (target,))


def _guard_cost(plan: Recurrence, model: ir.Model, target: str) -> Refusal | None:
    """Why ``plan``'s exact zero-step guard (and the broadcast of initial states of a
    batch not proven ``X``'s) is not no slower on ``target`` (``loop_scan.exact_cost``),
    or None."""
    if not plan.exact:
        return None
    cell = plan.cell
    batch = ShapeProver(model.graph).dim(plan.x, 1)
    number = None if batch is None else batch.value
    form = EXACT_BROADCAST_FORM if plan.broadcast else EXACT_FORM
    why = guard_cost_reason(costs.of(model), target, cell.op_type, cell.hidden_size, number, form)
    if why is None:
        return None
    if plan.broadcast:
        return Refusal(GUARD_COST_REASON.format(why=why))
    article = "an" if cell.op_type in ("LSTM", "RNN") else "a"
    return Refusal(EXACT_COST_REASON.format(cell=f"{article} {cell.op_type}", why=why))


def used(value: ir.Value) -> bool:
    return bool(value.uses()) or value.is_graph_output()


class RecurrenceRule(RewriteRuleClassBase):
    """Matches a ``Loop``/``Scan`` with ``num_outputs`` outputs.

    The matcher refuses a match when an output the pattern does not name is read and
    accepts a node with fewer outputs than it names, so one rule per output count.
    Subclasses implement :meth:`plan`, the proof; :meth:`check` keeps it for
    :meth:`rewrite` (rules are built per rewrite, so it is freed with them).
    """

    op_type = ""

    def __init__(self, num_outputs: int, float32: bool, target: str) -> None:
        suffix = "Widened" if float32 else ""
        super().__init__(name=f"{type(self).__name__}{suffix}[{num_outputs}]")
        self.num_outputs = num_outputs
        self.float32 = float32
        self.target = target

    def pattern(self, op, first):
        return getattr(op, self.op_type)(
            first,
            _allow_other_inputs=True,
            _allow_other_attributes=True,
            _outputs=[f"out{i}" for i in range(self.num_outputs)],
        )

    def plan(self, node: ir.Node, model: ir.Model) -> Recurrence | Refusal:
        raise NotImplementedError

    def check(self, context: MatchContext, out0: ir.Value, **_: Any) -> MatchResult:
        node = out0.producer()
        assert node is not None
        if len(node.outputs) != self.num_outputs:  # the matcher accepts fewer
            return MatchResult().fail(
                Inapplicable(f"node has {len(node.outputs)} outputs, not {self.num_outputs}"), node
            )
        if not any(used(v) for v in node.outputs):
            return MatchResult().fail("no output of the node is read", node)
        opset = opset_version(context.model, context.graph_or_function)
        if isinstance(opset, Refusal):
            return MatchResult().fail(opset, node)
        found = self.plan(node, context.model)
        if isinstance(found, Refusal):
            return MatchResult().fail(found, node)
        cell = found.cell
        reason = dtype_reason(cell, self.float32, self.target) or other_activations(
            cell.op_type, cell.written_activations, (self.target,)
        )
        if reason is not None:
            return MatchResult().fail(reason, node)
        if found.guarded and found.broadcast and not found.exact:
            return MatchResult().fail(BROADCAST_BRANCH_REASON, node)
        if found.cell.w.shape[1] == 0 and found.cell.op_type != "RNN":
            return MatchResult().fail(EMPTY_INPUT_REASON.format(op=found.cell.op_type), node)
        reason = _guard_cost(found, context.model, self.target)
        if reason is not None:
            return MatchResult().fail(reason, node)
        reason = broadcast_opset_reason(opset) if found.broadcast else None
        if reason is not None:
            return MatchResult().fail(reason, node)
        if opset < 10 and "y_reversed" in found.outputs:
            return MatchResult().fail(f"opset {opset}'s Slice cannot reverse Y (no steps)", node)
        self._plan = found
        self._opset = opset
        self._main = (
            context.model.graph if context.graph_or_function is context.model.graph else None
        )
        self._model = context.model
        return MatchResult()

    def rewrite(self, op, out0: ir.Value, **_):
        return emit(op, self._plan, self.num_outputs, self._opset, self._main, self._model)


def emit(
    op, plan: Recurrence, num_outputs: int, opset: int, main: ir.Graph | None, model: ir.Model
) -> list[ir.Value]:
    """The recurrent node for ``plan`` and the values replacing the node's outputs
    (``main``: the model's graph when the node is in it, for new initializers)."""
    if not plan.guarded:
        result, value_of = _emit_node(op, plan, num_outputs, opset, main)
        for old in plan.replaced:
            redirect(old, value_of("y"))
        _detach_body(plan.node)
    else:  # the body moves to the zero-step Loop
        result = _emit_guarded(op, plan, num_outputs, opset, main, model)
    return result


def _emit_guarded(
    op, plan: Recurrence, num_outputs: int, opset: int, main: ir.Graph | None, model: ir.Model
) -> list[ir.Value]:
    """``If(Size(x) == 0)``: the Loop's read outputs where ``x`` is empty (:func:`_no_step_values`;
    the Loop itself with ``plan.exact``: :func:`_kept_loop`), else the node's (built in a
    branch, so with ``Constant`` nodes: a subgraph holds no initializers). Only read
    outputs pass the ``If``; a reversal undone after the Loop reads an extra one, ``Y``."""
    # a builder of the rewriter's own kind (its class moved between onnxscript releases)
    branch = type(op)()
    taken_all, value_of = _emit_node(branch, plan, num_outputs, opset, None)
    read = [k for k in range(num_outputs) if plan.outputs[k] is not None]
    taken = [taken_all[k] for k in read]
    zero = type(op)()
    cache: dict[tuple[int, ...], ir.Value] = {}

    def ints(values: list[int]) -> ir.Value:
        return cached_ints(op, main, cache, values, as_node=main is None)

    condition = _guard_condition(op, plan, opset, ints)
    if plan.exact:  # the Loop itself (its stack of no step read again for a reversal)
        kept = _kept_loop(zero, plan, model)
        extra = [_stack_index(plan)] if plan.replaced else []
        skipped = [zero.Identity(kept[k]) for k in [*read, *extra]]
    else:
        trips = _pass_through_trips(zero, plan, opset, ints)
        true = _true(op, main) if tests_size(plan.exact, plan.cell) else None
        skipped = _no_step_values(zero, plan, read, model, (trips, true))
    if plan.replaced and not plan.exact:  # the reversal of a stack of no step is that stack
        stack = _no_step_values(zero, plan, [_stack_index(plan)], model, (trips, true))[0]
        taken.append(branch.Identity(value_of("y")))
        skipped.append(zero.Identity(stack))
    name = plan.node.name or plan.cell.op_type
    name_values([*zero.nodes, *branch.nodes], model, f"{name}_branch")
    tag = EXACT_BRANCH if plan.exact else "no_step"
    # a branch output's type and rank, which OpenVINO needs to compile an If (its value
    # is still only what the nodes compute)
    kinds = [*(plan.outputs[k] for k in read), *(["y"] if plan.replaced else [])]
    for kind, *pair in zip(kinds, skipped, taken, strict=True):
        if isinstance(kind, ir.Value):
            kind_type, kind_shape = kind.type, kind.shape
        else:
            rank = 3 if kind in ("y", "y_reversed") else 2
            kind_type = ir.TensorType(ir.DataType.from_numpy(plan.cell.dtype))
            kind_shape = ir.Shape([*[None] * (rank - 1), plan.cell.hidden_size])
        pair[1].type, pair[1].shape = kind_type, kind_shape
        # the stack of no step may have another rank (ONNX Runtime's inference)
        pair[0].type = kind_type
    graphs = [
        ir.Graph((), outputs, nodes=_live(builder.nodes, outputs), name=f"{name}_{tag}")
        for builder, outputs, tag in ((zero, skipped, tag), (branch, taken, "steps"))
    ]
    made = op.If(condition, then_branch=graphs[0], else_branch=graphs[1], _outputs=len(skipped))
    outputs = [made] if isinstance(made, ir.Value) else list(made)
    mark_guard(outputs[0])  # a later layer reads its else branch (guarded_input)
    for old in plan.replaced:
        redirect(old, outputs[-1])
    _detach_body(plan.node)
    result: list[ir.Value] = []
    for k in range(num_outputs):
        if k in read:
            result.append(outputs[read.index(k)])
        else:  # an unread output: a dead stand-in
            result.append(op.Identity(outputs[0]))
    return result


def _guard_condition(
    op, plan: Recurrence, opset: int, ints: Callable[[list[int]], ir.Value]
) -> ir.Value:
    """The guard's test: ``Size(x) == 0`` (``x`` is empty: its length or its batch is 0;
    ONNX Runtime 1.32 aborts the process on its LSTM and GRU nodes at batch 0 whatever the
    length, where the Loop runs), ``Or``-ed with ``n == 0`` for a count of steps ``n``.
    Where the cell's input size is 0 (``x`` is empty at every size) the lean guard tests
    ``len(x) == 0`` instead; the exact guard's Loop gives the outputs wherever it runs.
    It costs what ``len(x) == 0`` does (two nodes)."""
    zero = ints([0])
    if tests_size(plan.exact, plan.cell):
        empty = op.Equal(op.Size(plan.x), zero)
        return empty if plan.steps is None else op.Or(op.Equal(plan.steps, zero), empty)
    # x's length, not the trip count's own value: that may be read from a reversal of x
    # that dies with the Loop; a count of steps is read by the node's Slice of x anyway
    if plan.steps is not None:
        return op.Equal(plan.steps, zero)
    return op.Equal(_length(op, plan, opset, ints), zero)


def _true(op, main: ir.Graph | None) -> ir.Value:
    """A scalar ``True``: an initializer of the main graph (no node), else a ``Constant``."""
    array = np.array(True)
    if main is None:
        return op.Constant(value=ir.tensor(array))
    return array_constant(op, main, array, "rnn_rewrite_rules_true")


def tests_size(exact: bool, cell: Cell) -> bool:
    """A guard tests ``Size(x) == 0``: exact, or a cell that reads ``x_t`` (input size at
    least 1, so ``x`` is empty exactly where its length or batch is 0; a cell reading none
    is an ``RNN``'s, :data:`EMPTY_INPUT_REASON`, whose node runs at batch 0)."""
    return exact or cell.w.shape[1] >= 1


def _length(op, plan: Recurrence, opset: int, ints: Callable[[list[int]], ir.Value]) -> ir.Value:
    """``[len(x)]``."""
    if opset >= 15:
        return op.Shape(plan.x, start=0, end=1)
    return slice_(op, op.Shape(plan.x), [0], [1], [0], opset, ints)


def _pass_through_trips(
    op, plan: Recurrence, opset: int, ints: Callable[[list[int]], ir.Value]
) -> ir.Value:
    """The trip count of the lean guard's pass-through Loop (:func:`_empty_stack`): the
    Loop's own count of steps ``n`` or ``x``'s length (0 where the guard tests the length
    only). Its branch runs where ``x`` is empty: at length (or ``n``) 0 it runs no step; at
    batch 0 it stacks the initial ``h`` (``[0, H]``, ``x``'s batch) ``T`` (``n``) times,
    ``[T, 0, H]`` as the Loop's steps stack their ``h_t``."""
    if not tests_size(plan.exact, plan.cell):
        return op.Constant(value=ir.tensor(np.array(0, np.int64)))
    return plan.steps if plan.steps is not None else _length(op, plan, opset, ints)


def _stack_index(plan: Recurrence) -> int:
    """The Loop output that is the stacked ``h_t``."""
    return next(k for k, kind in enumerate(plan.outputs) if kind in ("y", "y_reversed"))


def _live(nodes: Sequence[ir.Node], outputs: Sequence[ir.Value]) -> list[ir.Node]:
    """``nodes`` (in order) that ``outputs`` depend on."""
    needed = set(outputs)
    kept: list[ir.Node] = []
    for node in reversed(nodes):
        if any(v in needed for v in node.outputs):
            kept.append(node)
            needed.update(v for v in node.inputs if v is not None)
    return kept[::-1]


def _no_step_values(
    op,
    plan: Recurrence,
    read: Sequence[int],
    model: ir.Model,
    pass_through: tuple[ir.Value, ir.Value | None],
) -> list[ir.Value]:
    """The Loop's outputs ``read`` where ``x`` is empty, as the Loop gives them: a carried
    value is its initial value (through an ``Identity``: a branch output of an outer
    value); a stack comes from :func:`_empty_stack` (``pass_through``: its trip count and
    condition), made once."""
    node = plan.node
    carried = len(node.inputs) - 2
    stack: ir.Value | None = None
    values: list[ir.Value] = []
    for k in read:
        if k < carried:
            initial = node.inputs[2 + k]
            assert initial is not None  # initial_values proved each given
            values.append(op.Identity(initial))
            continue
        if stack is None:
            stack = _empty_stack(op, plan, k - carried, model, *pass_through)
            values.append(stack)
        else:
            values.append(op.Identity(stack))
    return values


def _empty_stack(
    op, plan: Recurrence, index: int, model: ir.Model, trips: ir.Value, true: ir.Value | None
) -> ir.Value:
    """Scan output ``index`` of ``plan.node`` where ``x`` is empty: a Loop of ``trips``
    (:func:`_pass_through_trips`) whose body passes one state through and stacks it, the
    stack declared as the original body declares that output and the state with no shape.
    At batch 0 it stacks the empty initial state as the Loop's steps stack theirs. At 0
    steps ONNX Runtime shapes a stack of no step by that declaration merged with what it
    infers, which adds nothing here; ``loop_scan.zero_step`` proves the original's
    inference adds nothing either, so the same as the Loop's without its body
    (``tests/test_loop_zero_steps.py`` checks each declaration)."""
    node = plan.node
    body = node.attributes["body"].as_graph()
    declared = body.outputs[1 + len(node.inputs) - 2 + index]
    taken = taken_names(model)
    base = f"{node.name or plan.cell.op_type}_no_step"

    def named(value: ir.Value, suffix: str) -> ir.Value:
        value.name = free_name(taken, f"{base}_{suffix}")
        taken.add(value.name)
        return value

    scalar = ir.Shape([])
    iteration = named(ir.Value(type=ir.TensorType(ir.DataType.INT64), shape=scalar), "i")
    cond = named(ir.Value(type=ir.TensorType(ir.DataType.BOOL), shape=scalar), "cond")
    state = named(ir.Value(type=declared.type), "state")  # no shape: see zero_step
    nodes = [ir.node("Identity", [v]) for v in (cond, state, state)]
    for inner, suffix in zip(nodes, ("cond_out", "state_out", "stacked"), strict=True):
        named(inner.outputs[0], suffix)
    nodes[0].outputs[0].type, nodes[0].outputs[0].shape = cond.type, scalar
    nodes[1].outputs[0].type = declared.type
    nodes[2].outputs[0].type, nodes[2].outputs[0].shape = declared.type, declared.shape
    graph = ir.Graph(
        [iteration, cond, state],
        [inner.outputs[0] for inner in nodes],
        nodes=nodes,
        name=f"{base}_body",
    )
    # an explicit true condition where the Loop may run steps: ONNX's Loop runs on an absent
    # condition as on a true one, but onnx.reference's runs no step then
    return op.Loop(trips, true, plan.h0, body=graph, _outputs=2)[1]


def _kept_loop(op, plan: Recurrence, model: ir.Model) -> list[ir.Value]:
    """The Loop of ``plan`` as written (a copy of its body, its inputs, its name with
    :data:`EXACT_BRANCH` after it, its doc string and metadata): its outputs."""
    node = plan.node
    body = node.attributes["body"].as_graph().clone(allow_outer_scope_values=True)
    outputs = emit_node(
        op, "Loop", node.inputs, {"body": body}, domain="", num_outputs=len(node.outputs)
    )
    kept = outputs[0].producer()
    assert kept is not None
    names = {n.name for n in model.graph.all_nodes() if n.name}
    kept.name = free_name(names, f"{node.name or 'Loop'}_{EXACT_BRANCH}")
    kept.doc_string = node.doc_string
    kept.metadata_props.update(node.metadata_props)
    return outputs


@dataclasses.dataclass
class _Builder:
    """What the values of one emitted node are built with: the rewriter's builder, the
    opset, the graph new initializers go to (None: a subgraph, so ``Constant`` nodes)."""

    op: Builder
    plan: Recurrence
    opset: int
    main: ir.Graph | None
    cache: dict[tuple[int, ...], ir.Value] = dataclasses.field(default_factory=dict)
    casts: dict[ir.Value, ir.Value] = dataclasses.field(default_factory=dict)

    @property
    def cast_back(self) -> bool:
        """The cell computes in float16: the node runs in float32 between Casts."""
        return self.plan.cell.dtype != _COMPUTE

    def constant(self, array: np.ndarray, suffix: str) -> ir.Value:
        op, cell = self.op, self.plan.cell
        array = np.ascontiguousarray(array.astype(_COMPUTE))
        if self.main is None:  # a subgraph: a new name there could shadow one outside
            return op.Constant(value=ir.tensor(array))
        name = f"{self.plan.node.name or cell.op_type}_{suffix}"
        return array_constant(op, self.main, array, name)

    def ints(self, values: list[int]) -> ir.Value:
        as_node = self.main is None
        return cached_ints(self.op, self.main, self.cache, values, as_node=as_node)

    def squeezed(self, v: ir.Value, axis: int) -> ir.Value:
        out = squeeze(self.op, v, [axis], self.opset, self.ints)
        return self.op.Cast(out, to=ir.DataType.FLOAT16) if self.cast_back else out

    def to_compute(self, v: ir.Value) -> ir.Value:
        if self.cast_back and v not in self.casts:
            self.casts[v] = self.op.Cast(v, to=ir.DataType.FLOAT)
        return self.casts.get(v, v)


_COMPUTE = np.dtype(np.float32)


def _node_inputs(build: _Builder) -> list[ir.Value | None]:
    """``X`` (the steps the Loop runs, in float32), ``W``, ``R``, ``B``, and the states."""
    op, plan, opset, ints = build.op, build.plan, build.opset, build.ints
    cell = plan.cell
    x = plan.x
    if plan.steps is not None:
        x = op.Slice(x, ints([0]), unsqueeze(op, plan.steps, [0], opset, ints), ints([0]))
    elif plan.first_steps is not None:
        x = slice_(op, x, [0], [plan.first_steps], [0], opset, ints)
    elif plan.last_steps is not None:
        x = slice_(op, x, [-plan.last_steps], [INT64_MAX], [0], opset, ints)
    x, h0 = build.to_compute(x), build.to_compute(plan.h0)
    c0 = None if plan.c0 is None else build.to_compute(plan.c0)
    if plan.broadcast:  # X and the states expanded to the batch they broadcast to
        x, h0, c0 = broadcast_batches(op, x, h0, c0, opset, ints)
    inputs: list[ir.Value | None] = [
        x,
        build.constant(cell.w[np.newaxis], "W"),
        build.constant(cell.r[np.newaxis], "R"),
        build.constant(cell.b[np.newaxis], "B"),
        None,
    ]
    initial_h = unsqueeze(op, h0, [0], opset, ints)
    inputs.append(initial_h)
    if cell.op_type == "LSTM":
        assert c0 is not None
        inputs.append(initial_h if c0 is h0 else unsqueeze(op, c0, [0], opset, ints))
    return inputs


def _emit_node(
    op, plan: Recurrence, num_outputs: int, opset: int, main: ir.Graph | None
) -> tuple[list[ir.Value], Callable[[str], ir.Value]]:
    """The node, the values replacing the Loop's outputs, and a getter of the values
    it gives (``"y"``, ``"h"``, ...)."""
    build = _Builder(op, plan, opset, main)
    cell = plan.cell
    outputs = recurrent_node(
        op,
        cell.op_type,
        _node_inputs(build),
        hidden_size=cell.hidden_size,
        reverse=plan.reverse,
        activations=cell.written_activations,
        linear_before_reset=cell.linear_before_reset if cell.op_type == "GRU" else None,
    )
    keep_identity(outputs[0].producer(), plan.node)
    if not plan.guarded:  # the Loop runs at batch 0 (passes.BatchZeroGuardPass)
        mark_replaces_batch_0_run(outputs[0])
    value_of = _output_values(build, outputs)
    result: list[ir.Value] = []
    for index in range(num_outputs):
        kind = plan.outputs[index]
        if isinstance(kind, str):
            new = value_of(kind)
            if sum(1 for v in result if v is new):  # one value replaces one output
                new = op.Identity(new)
            result.append(new)
        elif kind is None:
            result.append(op.Identity(value_of("h")))  # an unread output: a dead stand-in
        else:  # an invariant: its initial value, through an Identity that takes the
            result.append(op.Identity(kind))  # output's name (the value keeps its own)
    return result, value_of


def _output_values(build: _Builder, outputs) -> Callable[[str], ir.Value]:
    """A getter of the values the node gives, each built once on first use: ``"h"``,
    ``"c"``, ``"y"`` (``[T, batch, H]``), ``"y_reversed"`` (Y in the other step order)."""
    values: dict[str, ir.Value] = {}

    def value_of(kind: str) -> ir.Value:
        if kind not in values:
            if kind == "h":
                values[kind] = build.squeezed(outputs[1], 0)
            elif kind == "c":
                values[kind] = build.squeezed(outputs[2], 0)
            elif kind == "y":
                values[kind] = build.squeezed(outputs[0], 1)
            else:
                y = build.squeezed(outputs[0], 1)
                ints = build.ints
                values[kind] = build.op.Slice(
                    y, ints([-1]), ints([INT64_MIN]), ints([0]), ints([-1])
                )
        return values[kind]

    return value_of


def _detach_body(node: ir.Node) -> None:
    """Drop the inputs of every node in ``node``'s subgraphs: the node is being replaced,
    and a value outside that only its body read (a reversed X) must become dead."""
    for attr in node.attributes.values():
        if attr.type != ir.AttributeType.GRAPH:
            continue
        for inner in ir.traversal.RecursiveGraphIterator(attr.as_graph()):
            for index in range(len(inner.inputs)):
                inner.replace_input_with(index, None)

"""Re-roll unrolled cell loops into one ONNX ``LSTM`` / ``GRU`` / ``RNN``: Python loops over
``nn.LSTMCell`` / ``nn.GRUCell``, and Keras layers with ``unroll=True`` as tf2onnx writes them.

Pattern (torch 2.13 ``dynamo=True`` and the TorchScript exporter write the same steps):
step ``t`` reads ``x_t = Gather(X, t, axis=0)`` (or ``Squeeze(Slice(X, [t], [t+1]), [0])``,
or tf2onnx's ``Squeeze(Split(X, axis=0)[t], [0])``: see ``_chain.read_step``;
``Gather(X, t, axis=1)``, ``x[:, t]``, for a batch-first ``X``) and computes one LSTM / GRU /
RNN cell step from ``x_t`` and ``h_{t-1}`` (``c_{t-1}``), as
:func:`rnn_rewrite_rules.rules.cell.prove_cell` proves it: PyTorch's
``Gemm(x_t, W_ih, b_ih, transB=1)`` and ``Gemm(h_{t-1}, W_hh, b_hh, transB=1)`` (or
``MatMul(v, W^T) [+ b]``) split into gates on axis 1, ``c_t = sigmoid(f) * c_{t-1} +
sigmoid(i) * tanh(g)``, ``h_t = sigmoid(o) * tanh(c_t)`` (LSTM), ``n = tanh(xn + r * hn)``,
``h_t = (h_{t-1} - n) * z + n`` (GRU). Gates are read by their role in the cell, so any
gate order gives the node's weights in ONNX's; ``b_hh`` stays ``Rb`` as PyTorch adds it.
An exporter's first step from a zero state may have its hidden projection folded into a
constant: that step is matched op by op against the next one, the constant against the
projection's value for ``h_0 = 0`` (``b_hh`` on every row);
the steps' ``h_t`` stacked by ``Concat(Unsqueeze(h_t, a), ..., axis=a)``, ``a`` 0 or 1.

Condition: every step computes the same cell (activations, and weights and biases bit
for bit; a bias ``[G*H]`` or one row ``[1, G*H]``), with the op's default activations
(and ``linear_before_reset=1``, a GRU's, the form measured); the steps are
chained ``h_{t-1} -> h_t`` (and ``c_{t-1} -> c_t``); step ``t`` reads index ``t`` of one
``X`` of rank 3 (forward) or index ``T-1-t`` (a reversed loop), every step on the same
axis; every value of a step is read only inside the step, by the next step or by the one
stacking ``Concat``, but ``x_t``, a function of ``X`` alone, which keeps any other reader
(dynamo shares one ``x[t]`` Gather between a forward and a reversed loop over ``X``);
``h_0`` (``c_0``) is provably ``[batch of X, H]`` (zeros built from ``Shape(X)``, or a
batch the first step's nodes prove, ``shape.consumers``: ``Concat(x_0, h_0)`` runs only
at one batch, and every value the rewrite replaces is computed from it), or
``[b, H]`` for a batch ``b`` not proven ``X``'s (an encoder's final state, a graph input:
the steps broadcast it), or the first step's hidden term is a folded constant equal to
``b_hh`` for a batch of 1 or ``X``'s static batch, or ``h_0`` (``c_0``) is zeros whose
batch is ``X``'s through an int32 round trip (tf2onnx; the node then reads zeros of
``X``'s batch, see ``_narrowed_zeros``). A loop of one step is not a recurrence
and is left alone. ``X`` is sliced to ``T`` steps unless its sequence axis is statically
``T`` (the original reads only those).

Replacement: ``LSTM`` (gate order ``iofc``) / ``GRU`` (``zrh``, ``linear_before_reset=1``)
/ ``RNN`` (a ``Tanh`` cell, rooted at the last step's ``Tanh``) with ``W``, ``R``, ``B`` as
new initializers and ``Unsqueeze``-d initial states, reading
``Transpose(X, [1, 0, 2])`` for a batch-first ``X``, and ``X`` and states of a batch of
their own expanded to the batch they broadcast to (``rules._broadcast``); ``h_T`` and
``c_T`` become ``Squeeze(Y_h / Y_c, [0])`` and the stack ``Squeeze(Y, [1])``
(``Transpose``-d to ``[batch, T, H]`` for a stack on axis 1).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array, opset_version, same_bits, subgraph_owners
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn_ops import mark_replaces_batch_0_run
from rnn_rewrite_rules.rules._broadcast import broadcast_batches, broadcast_opset_reason
from rnn_rewrite_rules.rules._graph import producer, read_axes
from rnn_rewrite_rules.rules._kernels import missing_kernel
from rnn_rewrite_rules.rules.cell import (
    DEFAULT_ACTIVATIONS,
    EMPTY_INPUT_REASON,
    Cell,
    Constants,
    gate_inputs,
    nodes_computing_every,
    prove_cell,
    recurrent_node,
    step_nodes,
    through_identity,
    zero_state_row,
)
from rnn_rewrite_rules.rules.reroll._chain import (
    ChainRule,
    KeptUnrolled,
    cost_refusal,
    read_step,
    redirect,
    static_size,
    walk_back,
)
from rnn_rewrite_rules.shape import Dim, ShapeProver
from rnn_rewrite_rules.shape.consumers import SizeEquality, required_equal
from rnn_rewrite_rules.shape.values import is_all_zeros

__all__ = ["RerollCell", "plan_cell_chain"]

#: The op each cell's ``h_t`` is computed by (the rule's pattern).
_ROOT_OP = {"LSTM": "Mul", "GRU": "Add", "RNN": "Tanh"}
#: Ops between ``h_t`` and the gates: ``o * act(c_t)`` (LSTM), ``(h - n) * z + n`` (GRU).
_UPDATE_OPS = ("Mul", "Add", "Sub")
_FLOATS = (np.float32, np.float64, np.float16)


def _read(value: ir.Value | None) -> tuple[ir.Value, int, int] | None:
    """``(X, t, axis)`` for ``Gather(X, t, axis)`` with a scalar t >= 0 on axis 0 (``x[t]``)
    or 1 (``x[:, t]``, a batch-first ``X``), or the Slice form (axis 0)."""
    gather = producer(value, "Gather")
    if gather is not None:
        index = const_array(gather.inputs[1])
        axis = gather.attributes.get_int("axis", 0)
        data = gather.inputs[0]
        if index is None or index.ndim != 0 or axis not in (0, 1) or int(index) < 0:
            return None
        return None if data is None else (data, int(index), axis)
    read = read_step(value)
    return None if read is None else (*read, 0)


@dataclasses.dataclass
class _CellStep:
    """One step of the chain: its states, its read of ``X`` and the nodes computing it."""

    h: ir.Value
    c: ir.Value | None
    #: the states read; the folded first step's ``h_prev`` is what a GRU's update reads
    #: (None for an LSTM, whose only reader of ``h_0`` was folded)
    h_prev: ir.Value | None
    c_prev: ir.Value | None
    x: ir.Value  # x_t
    source: ir.Value  # X
    index: int
    #: X's time axis: 0, or 1 for a batch-first ``X`` read by ``x[:, t]``.
    axis: int
    nodes: set[ir.Node]
    #: the cell the step computes; None for a first step whose hidden projection the
    #: exporter folded into a constant (``folded_rows`` rows of ``b_hh``: h_0 is zeros)
    cell: Cell | None
    folded_rows: int = 0


def _step_inputs(
    h: ir.Value, constants: Constants, source: ir.Value | None
) -> tuple[ir.Value, list[ir.Value]] | Refusal:
    """``x_t`` (a gate input reading one step of ``source``, or of any tensor when None)
    and the candidates for ``h_(t-1)`` (the gates' other inputs). The gates are within
    three ops of ``h_t`` (see :data:`_UPDATE_OPS`). Else why not: the first Sigmoid gate's
    reason (every cell has one; a Tanh may be the cell state's)."""
    inputs: list[ir.Value] = []
    reasons: list[Refusal] = []
    frontier = [h]
    for _ in range(3):
        following: list[ir.Value] = []
        for value in frontier:
            found = gate_inputs(value, constants)
            if isinstance(found, Refusal):
                sigmoid = producer(value, "Sigmoid") is not None
                reasons.insert(0 if sigmoid else len(reasons), found)
            else:
                inputs += [v for v in found if v not in inputs]
            node = value.producer()
            if node is not None and node.domain == "" and node.op_type in _UPDATE_OPS:
                following += [v for v in node.inputs if v is not None]
        frontier = following
    reads = [v for v in inputs if (r := _read(v)) is not None and r[0] is (source or r[0])]
    if reads:
        return reads[0], [v for v in inputs if v is not reads[0]]
    if reasons and not inputs:
        return reasons[0]
    return Refusal("no gate reads one step of X (Gather(X, t) or Slice)")


def _cell_states(root: ir.Node) -> list[tuple[ir.Value, ir.Value]]:
    """``(c_t, c_(t-1))`` candidates of an LSTM step ``h_t = root(o, act(c_t))`` with
    ``c_t = Add(Mul(f, c_(t-1)), Mul(i, g))``: the Mul operands no activation computes."""
    found = []
    for operand in root.inputs:
        act = None if operand is None else operand.producer()
        if act is None or act.domain != "" or not act.inputs or act.inputs[0] is None:
            continue
        c = through_identity(act.inputs[0])
        add = producer(c, "Add")
        for term in () if add is None else add.inputs:
            mul = producer(term, "Mul")
            for value in () if mul is None else mul.inputs:
                if value is not None and producer(value, "Sigmoid", "Tanh", "Relu") is None:
                    found.append((c, value))
    return found


def _step_nodes(
    outputs: list[ir.Value], inputs: list[ir.Value | None], x: ir.Value, constants: Constants
) -> set[ir.Node]:
    """The nodes computing ``outputs`` from ``inputs`` and constants, ``x_t``'s read
    included (the prover read every other value as a constant)."""
    stops = {v for v in inputs if v is not None} | {x}
    nodes = step_nodes(outputs, stops, constants)
    x_node = x.producer()
    return nodes if x_node is None else nodes | {x_node}


def _parse_step(
    root: ir.Node, op_type: str, constants: Constants, source: ir.Value | None = None
) -> _CellStep | Refusal:
    """The step whose ``h_t`` ``root`` computes, proven by :func:`prove_cell` (``source``:
    the chain's ``X``, else any tensor the step reads one step of)."""
    if root.op_type != _ROOT_OP[op_type] or root.domain != "":
        return Refusal({"LSTM": "not a Mul", "GRU": "not an Add"}.get(op_type, "not a Tanh"))
    h = root.outputs[0]
    found = _step_inputs(h, constants, source)
    if isinstance(found, Refusal):
        return found
    x, h_prevs = found
    if not h_prevs:
        return Refusal("no gate reads h_(t-1) besides x_t")
    c_states: list[tuple[ir.Value, ir.Value] | None] = [None]
    if op_type == "LSTM":
        c_states = list(_cell_states(root))
        if not c_states:
            return Refusal("c_t is not an Add of f * c_(t-1) and i * g (LSTM)")
    reasons: list[Refusal] = []
    for h_prev in h_prevs:
        for c_state in c_states:
            states = [(h_prev, h)] + ([] if c_state is None else [(c_state[1], c_state[0])])
            proven = prove_cell(states, constants, recurrent_bias=True)
            if isinstance(proven, Refusal):
                reasons.append(proven)
            elif proven[0].op_type != op_type or proven[1] != tuple(range(len(states))):
                reasons.append(Refusal(f"{root.name} computes a {proven[0].op_type} cell"))
            elif proven[0].x is not x:
                reasons.append(Refusal(f"the gates of {root.name} do not read x_t"))
            else:
                c, c_prev = (None, None) if c_state is None else c_state
                read = _read(x)
                assert read is not None
                nodes = _step_nodes([h] if c is None else [h, c], [h_prev, c_prev], x, constants)
                return _CellStep(h, c, h_prev, c_prev, x, *read, nodes, proven[0])
    return reasons[0]


class _Mirror:
    """Whether an earlier step computes what ``later`` does with its hidden projection
    folded into a constant (the exporter's first step from a zero ``h_0``): the two
    computations are matched op by op (commutative operands either way round), ``later``'s
    ``x_t``, ``h_(t-1)`` and ``c_(t-1)`` standing for the earlier step's own."""

    def __init__(self, later: _CellStep, constants: Constants) -> None:
        self.later, self.constants = later, constants
        self.pairs: dict[ir.Value, ir.Value] = {}  # later's value -> the earlier step's
        self.nodes: set[ir.Node] = set()
        self.rows: set[int] = set()  # the folded constants' rows
        #: why a constant in place of the hidden projection is not its zero-state value
        self.reason: Refusal | None = None

    def same(self, a: ir.Value | None, b: ir.Value | None) -> bool:
        if a is None or b is None:
            return a is b
        if b in self.pairs:
            return self.pairs[b] is a
        self.pairs[b] = a
        later = self.later
        if b is later.x:
            return _read(a) is not None
        if b is later.h_prev or b is later.c_prev:
            return True
        fixed_a, fixed_b = self.constants(a), self.constants(b)
        if fixed_b is not None:
            return fixed_a is not None and same_bits(fixed_a, fixed_b)
        if fixed_a is not None:
            return self._folded(fixed_a, b)
        return self._same_node(a, b)

    def _folded(self, fixed: np.ndarray, b: ir.Value) -> bool:
        """``fixed`` is the rows ``b`` (a hidden projection) gives for a zero ``h_(t-1)``."""
        h_prev = self.later.h_prev
        row = None if h_prev is None else zero_state_row(b, h_prev, self.constants)
        if row is None:
            return False
        if fixed.ndim != 2 or fixed.shape[1] != row.shape[0]:
            self.reason = Refusal(
                f"the folded first step has shape {list(fixed.shape)}, not [batch, {row.shape[0]}]"
            )
            return False
        self.rows.add(int(fixed.shape[0]))
        if not same_bits(fixed, np.broadcast_to(row, fixed.shape)):
            self.reason = Refusal("the folded first step is not b_hh (a non-zero initial state)")
            return False
        return True

    def _same_node(self, a: ir.Value, b: ir.Value) -> bool:
        na, nb = a.producer(), b.producer()
        if na is None or nb is None or a.index() != b.index() or not _same_op(na, nb):
            return False
        self.nodes.add(na)
        if na.op_type in ("Add", "Mul") and len(na.inputs) == 2:
            pairs = dict(self.pairs)
            if self.same(na.inputs[0], nb.inputs[0]) and self.same(na.inputs[1], nb.inputs[1]):
                return True
            self.pairs = pairs
            return self.same(na.inputs[1], nb.inputs[0]) and self.same(na.inputs[0], nb.inputs[1])
        return all(self.same(u, v) for u, v in zip(na.inputs, nb.inputs, strict=True))


def _same_op(a: ir.Node, b: ir.Node) -> bool:
    """One op with the same attributes, inputs and outputs counts."""
    if (a.domain, a.op_type, len(a.inputs), len(a.outputs)) != (
        b.domain,
        b.op_type,
        len(b.inputs),
        len(b.outputs),
    ):
        return False
    if a.attributes.keys() != b.attributes.keys():
        return False
    return all(a.attributes[k].value == b.attributes[k].value for k in a.attributes)


def _folded_step(
    root: ir.Node, later: _CellStep, constants: Constants
) -> _CellStep | Refusal | None:
    """The first step ``root`` ends, when it is ``later``'s computation with the hidden
    projection folded into a constant equal to its bias (``b_hh``) on every row; why not
    when it is that but for the constant; else None (not such a step)."""
    mirror = _Mirror(later, constants)
    h = root.outputs[0]
    if later.h_prev is not h or not mirror.same(h, later.h) or not mirror.rows:
        return mirror.reason
    c = None if later.c is None else mirror.pairs.get(later.c)
    if later.c is not None and c is not later.c_prev:
        return None
    x = mirror.pairs[later.x]
    read = _read(x)
    assert read is not None
    x_node = x.producer()
    nodes = mirror.nodes | (set() if x_node is None else {x_node})
    h_prev = None if later.h_prev is None else mirror.pairs.get(later.h_prev)
    c_prev = None if later.c_prev is None else mirror.pairs.get(later.c_prev)
    (rows,) = mirror.rows if len(mirror.rows) == 1 else (0,)
    return _CellStep(h, c, h_prev, c_prev, x, *read, nodes, None, rows)


@dataclasses.dataclass
class _CellPlan:
    """A proven chain and the node replacing it."""

    steps: list[_CellStep]
    cell: Cell  # the last step's: every step computes it
    x: ir.Value
    reverse: bool
    h0: ir.Value | None
    c0: ir.Value | None
    #: X is sliced to the steps (its sequence axis is not statically their count)
    slice_x: bool
    concat: ir.Node | None
    #: ``h_0`` (``c_0``) of a batch not proven ``X``'s: all are expanded to the batch they
    #: broadcast to (``rules._broadcast``), as the steps' arithmetic does.
    broadcast: bool = False
    #: ``X``'s time axis (1: batch-first, read by ``x[:, t]``) and the stack's (1:
    #: ``[batch, T, H]``).
    time_axis: int = 0
    stack_axis: int = 0
    #: ``h_0`` / ``c_0`` read as zeros of ``X``'s batch, built by the rewrite (zeros whose
    #: batch is ``X``'s through an int32 round trip: see :func:`_narrowed_zeros`)
    rebuilt: tuple[bool, bool] = (False, False)

    @property
    def hidden_size(self) -> int:
        return self.cell.hidden_size


def _graph_opset(root: ir.Node, main_graph: ir.Graph | None) -> int:
    for graph in (root.graph, main_graph):
        version = None if graph is None else graph.opset_imports.get("")
        if version is not None:
            return version
    return 1


def _prove_steps(root: ir.Node, op_type: str, constants: Constants) -> list[_CellStep] | Refusal:
    """The chain's steps, first first: the walk back from ``root``, each step proven on its
    own, then a first step with a folded hidden projection."""
    last = _parse_step(root, op_type, constants)
    if isinstance(last, Refusal):
        return last
    steps = walk_back(last, lambda node, x: _parse_step(node, op_type, constants, x))
    before = None if steps[0].h_prev is None else steps[0].h_prev.producer()
    if before is not None and before.op_type == root.op_type and before.domain == "":
        folded = _folded_step(before, steps[0], constants)
        if isinstance(folded, Refusal):
            return folded
        if folded is not None and folded.source is last.source:
            steps.insert(0, folded)
    if len(steps) < 2:
        return Refusal("a single cell step is not a loop (left alone)")
    return steps


def _direction(steps: list[_CellStep]) -> bool | Refusal:
    """True for a reversed loop (step t reads index T-1-t), False for a forward one."""
    count = len(steps)
    indices = [s.index for s in steps]
    if indices == list(range(count)):
        return False
    if indices == list(range(count - 1, -1, -1)):
        return True
    return Refusal(f"the steps read indices {indices}, not 0..{count - 1} in order or reversed")


def _one_cell(steps: list[_CellStep], op_type: str) -> Cell | Refusal:
    """The cell every step computes (the last step's), chained through ``c``, in the form
    the node is emitted in."""
    cell = next(s.cell for s in steps if s.cell is not None)
    for t, step in enumerate(steps):
        if t and op_type == "LSTM" and step.c_prev is not steps[t - 1].c:
            return Refusal(f"step {t} does not read c_{t} of the step before")
        other = None if step.cell is None else _other_cell(step.cell, cell)
        if other is not None:
            return Refusal(f"step {t} uses {other}")
    if cell.activations != DEFAULT_ACTIVATIONS[op_type]:
        return Refusal(f"the activations {list(cell.activations)} are not {op_type}'s default")
    if op_type == "GRU" and cell.linear_before_reset != 1:
        return Refusal("the GRU applies the reset before R_n (linear_before_reset=0)")
    if cell.dtype not in _FLOATS:
        return Refusal("the weights are not one floating-point type")
    return cell


def _other_cell(a: Cell, b: Cell) -> str | None:
    """What differs between two cells (weights and biases compared bit for bit)."""
    if (a.activations, a.linear_before_reset) != (b.activations, b.linear_before_reset):
        return "other activations"
    if not (same_bits(a.w, b.w) and same_bits(a.r, b.r)):
        return "other weights"
    if a.biased != b.biased or not same_bits(a.b, b.b):
        return "another bias"
    return None


def _reader_refusal(steps: list[_CellStep], stack: list[ir.Node]) -> Refusal | None:
    """Every value of a step is read inside the step, by the next one or by the stack
    (``stack``: its Unsqueezes); a step's read of X (X[t], a function of X alone) may have
    other readers (dynamo shares one Gather between a forward and a reversed loop): the
    rewrite leaves it to them."""
    allowed_h_readers = {id(u) for u in stack}
    count = len(steps)
    for t, step in enumerate(steps):
        following = steps[t + 1].nodes if t + 1 < count else set()
        for node in step.nodes:
            for value in node.outputs:
                if t + 1 == count and (value is step.h or value is step.c):
                    continue  # the final states: any reader
                if value is step.x:
                    continue
                for user, _ in value.uses():
                    if user in step.nodes or user in following:
                        continue
                    if value is step.h and id(user) in allowed_h_readers:
                        continue
                    return Refusal(
                        f"a value of step {t} ({value.name}) has a reader outside the loop"
                    )
                if value.is_graph_output():
                    return Refusal(f"a value of step {t} ({value.name}) is a graph output")
    return None


@dataclasses.dataclass
class _States:
    h0: ir.Value | None
    c0: ir.Value | None
    broadcast: bool
    rebuilt: tuple[bool, bool] = (False, False)


def _first_step_facts(
    steps: list[_CellStep], prover: ShapeProver, constants: Constants
) -> SizeEquality:
    """Sizes the first step's nodes prove equal by running (``shape.consumers``: a
    ``Concat(x_0, h_0)``), from the nodes its ``h_1`` and ``c_1`` are both computed from:
    every value the rewrite replaces is computed from those two, in the chain's graph."""
    first = steps[0]
    if first.cell is None:
        return SizeEquality()
    ends = [first.h] if first.c is None else [first.h, first.c]
    stops = {v for v in (first.x, first.h_prev, first.c_prev) if v is not None}
    return required_equal(prover, nodes_computing_every(ends, stops, constants))


def _initial_states(
    steps: list[_CellStep], cell: Cell, prover: ShapeProver, batch_axis: int, equal: SizeEquality
) -> _States | Refusal:
    """``h_0`` and ``c_0`` the node reads (None: its own zeros), proven of X's batch (by the
    prover, or ``equal``: the first step's nodes) or of a batch the steps broadcast. Zero
    states stay: the initial_state family shares or drops
    them (by target); a folded first step has no h_0 here (LSTM: no hidden projection reads
    one; GRU: proven zeros)."""
    first, x, hidden = steps[0], steps[0].source, cell.hidden_size
    h0, c0 = first.h_prev, first.c_prev
    op_type = cell.op_type
    broadcast = False
    h_rebuilt = first.cell is not None and _narrowed_zeros(prover, h0, x, hidden, batch_axis)
    c_rebuilt = _narrowed_zeros(prover, c0, x, hidden, batch_axis)
    if first.cell is None:
        rows = first.folded_rows
        if rows != 1 and static_size(prover, x, batch_axis) != rows:
            return Refusal("the folded first step fixes a batch X does not provably have")
    elif h0 is None or not (h_rebuilt or _state_ok(prover, h0, x, hidden, batch_axis, equal)):
        if h0 is None or not _broadcasts(prover, h0, hidden):
            return Refusal("cannot prove h_0 is [batch of X, H] or [batch, H]")
        broadcast = True
    if op_type == "GRU" and first.cell is None:
        # the update reads h_0 itself: it must be zeros of X's batch
        proven = h0 is not None and _state_ok(prover, h0, x, hidden, batch_axis, equal)
        if h0 is None or not (
            is_all_zeros(h0) and (proven or _folded_zero(prover, h0, x, batch_axis))
        ):
            return Refusal("the folded first step's h_0 is not provably zeros of X's batch")
        h0 = None
    c0_ok = c0 is not None and _state_ok(prover, c0, x, hidden, batch_axis, equal)
    c0_proven = c0 is not None and (c_rebuilt or c0_ok)
    if (
        op_type == "LSTM"
        and not c0_proven
        and first.cell is not None
        and c0 is not None
        and _broadcasts(prover, c0, hidden)
        and not _folded_zero(prover, c0, x, batch_axis)
    ):
        c0_proven = broadcast = True
    c0_folded = c0 is not None and _folded_zero(prover, c0, x, batch_axis)
    if op_type == "LSTM" and not (c0_proven or c0_folded):
        return Refusal("cannot prove c_0 is [batch of X, H]")
    if not c0_proven:
        c0 = None  # zeros of batch 1 that the steps broadcast: the node's own zeros have X's
    return _States(h0, c0, broadcast, (h_rebuilt, c_rebuilt and c0 is not None))


def plan_cell_chain(
    root: ir.Node, op_type: str, main_graph: ir.Graph | None = None
) -> _CellPlan | Refusal:
    """Prove that ``root`` (producing ``h_T``) ends an unrolled cell loop.

    ``main_graph``: the model's main graph (whose inputs' declared shapes are facts);
    None when ``root`` is in it."""
    constants = Constants(_graph_opset(root, main_graph))
    steps = _prove_steps(root, op_type, constants)
    if isinstance(steps, Refusal):
        return steps
    reverse = _direction(steps)
    if isinstance(reverse, Refusal):
        return reverse
    cell = _one_cell(steps, op_type)
    if isinstance(cell, Refusal):
        return cell
    if op_type != "RNN" and cell.w.shape[1] == 0:
        return Refusal(EMPTY_INPUT_REASON.format(op=op_type))
    x = steps[-1].source
    prover = ShapeProver(root.graph if main_graph is None else main_graph)
    if prover.rank(x) != 3:
        return Refusal("X is not provably of rank 3")
    time_axis = steps[-1].axis
    if any(step.axis != time_axis for step in steps):
        return Refusal("the steps read X on different axes")
    concat, stack_axis, unsqueezes = _find_stack([s.h for s in (steps[::-1] if reverse else steps)])
    reason = _reader_refusal(steps, unsqueezes)
    if reason is not None:
        return reason
    equal = _first_step_facts(steps, prover, constants)
    states = _initial_states(steps, cell, prover, 1 - time_axis, equal)
    if isinstance(states, Refusal):
        return states
    slice_x = static_size(prover, x, time_axis) != len(steps)
    return _CellPlan(
        steps, cell, x, reverse, states.h0, states.c0, slice_x, concat, states.broadcast,
        time_axis, stack_axis, states.rebuilt,
    )  # fmt: skip


def _state_ok(
    prover: ShapeProver,
    state: ir.Value,
    x: ir.Value,
    hidden: int,
    batch_axis: int,
    equal: SizeEquality,
) -> bool:
    """``state`` is provably ``[batch of X, H]`` (the batch: ``X``'s ``batch_axis``, by the
    prover or by what the first step's nodes prove, ``equal``)."""
    dims, batch = prover.dims(state), prover.dim(x, batch_axis)
    if dims is None or len(dims) != 2 or dims[1] != Dim.const(hidden):
        return False
    return dims[0] == batch or equal.same(dims[0], batch)


def _narrowed_zeros(
    prover: ShapeProver, state: ir.Value | None, x: ir.Value, hidden: int, batch_axis: int
) -> bool:
    """``state`` is provably zeros ``[n, H]`` with ``n`` the batch of ``X`` round-tripped
    through a type of at least 32 bits (tf2onnx's ``Cast(int32) -> Slice -> Concat ->
    Cast(int64)`` of ``Shape(X)``; :meth:`ShapeProver.narrowed_from`).

    Below ``2**31`` that is ``X``'s batch. At and above, ``n`` is another number: the
    steps' first sums (``x_t``'s term of ``X``'s batch plus ``h_0``'s) then run only where
    ``n`` is 1 and broadcast the zero row, so every row of the state is zero either way:
    zeros of ``X``'s batch (:attr:`_CellPlan.rebuilt`) give the same steps wherever the
    original runs."""
    if state is None or not is_all_zeros(state):
        return False
    dims = prover.dims(state)
    if dims is None or len(dims) != 2 or dims[1] != Dim.const(hidden):
        return False
    batch = prover.dim(x, batch_axis)
    return batch is not None and dims[0] != batch and prover.narrowed_from(dims[0]) == batch


def _broadcasts(prover: ShapeProver, state: ir.Value, hidden: int) -> bool:
    """``state`` is provably ``[b, H]`` for some batch ``b`` (an encoder's final state, a
    graph input): the steps broadcast it against ``X``'s batch."""
    return prover.rank(state) == 2 and prover.dim(state, 1) == Dim.const(hidden)


def _folded_zero(prover: ShapeProver, value: ir.Value, x: ir.Value, batch_axis: int) -> bool:
    """A constant zero state whose batch is 1 or X's static batch."""
    array = const_array(value)
    if array is None or array.ndim != 2 or np.any(array != 0):
        return False
    return array.shape[0] == 1 or static_size(prover, x, batch_axis) == array.shape[0]


def _find_stack(hs: list[ir.Value]) -> tuple[ir.Node | None, int, list[ir.Node]]:
    """The ``Concat(Unsqueeze(h, a), ..., axis=a)`` stacking ``hs`` in order on axis ``a``
    0 (``[T, batch, H]``) or 1 (``[batch, T, H]``, ``torch.stack(hs, 1)``), ``a``, and its
    Unsqueezes (each read only by the Concat)."""
    for unsqueeze, _ in hs[0].uses():
        axis = _stack_axis(unsqueeze, hs[0])
        if axis is None:
            continue
        ((concat, _),) = unsqueeze.outputs[0].uses()  # _stack_axis: its only reader
        if (
            concat.op_type == "Concat"
            and concat.domain == ""
            and concat.attributes.get_int("axis", 0) == axis
            and len(concat.inputs) == len(hs)
        ):
            producers = [None if v is None else v.producer() for v in concat.inputs]
            stack = [p for p, h in zip(producers, hs, strict=True) if _stack_axis(p, h) == axis]
            if len(stack) == len(hs):
                return concat, axis, [p for p in stack if p is not None]
    return None, 0, []


def _stack_axis(node: ir.Node | None, h: ir.Value) -> int | None:
    """``a`` when ``node`` is ``Unsqueeze(h, a)``, ``a`` 0 or 1, whose output only the
    stacking Concat reads, else None."""
    if (
        node is None
        or node.op_type != "Unsqueeze"
        or node.domain != ""
        or node.inputs[0] is not h
        or len(node.outputs[0].uses()) != 1
        or node.outputs[0].is_graph_output()
    ):
        return None
    axes = read_axes(node)
    return axes[0] if axes in ([0], [1]) else None


class RerollCell(ChainRule[_CellPlan]):
    """h_T of an unrolled LSTMCell/GRUCell loop -> Squeeze(Y_h) of one LSTM/GRU node."""

    def __init__(self, op_type: str, target: str = "portable") -> None:
        super().__init__(name=f"RerollCell[{op_type}]")
        self.op_type = op_type
        self.target = target

    def pattern(self, op, a, b):
        if self.op_type == "RNN":
            return op.Tanh(a)
        return op.Mul(a, b) if self.op_type == "LSTM" else op.Add(a, b)

    def plan_chain(self, root: ir.Node, main_graph: ir.Graph) -> _CellPlan | Refusal:
        """Refuses a step whose ``h`` feeds another step before walking back: every step
        of a chain is a candidate root, and walking back from each is quadratic."""
        constants = Constants(_graph_opset(root, main_graph))
        last = _parse_step(root, self.op_type, constants)
        if not isinstance(last, Refusal) and self._feeds_a_step(last.h, constants):
            return Refusal("h_T feeds another step: not the last step")
        return plan_cell_chain(root, self.op_type, main_graph)

    def _feeds_a_step(self, h: ir.Value, constants: Constants) -> bool:
        for user, _ in h.uses():
            for candidate in _downstream(user, 6):
                if candidate.op_type != _ROOT_OP[self.op_type]:
                    continue
                step = _parse_step(candidate, self.op_type, constants)
                if not isinstance(step, Refusal) and step.h_prev is h:
                    return True
        return False

    def refuse(self, context, plan: _CellPlan) -> Refusal | None:
        c = plan.steps[-1].c
        if c is not None and not _readers_after(context.graph_or_function, c, context.root, plan):
            return Refusal("a reader of c_T comes before h_T")
        opset = opset_version(context.model, context.graph_or_function)
        if any(plan.rebuilt) and isinstance(opset, int) and opset < 9:
            return Refusal(f"opset {opset} has no ConstantOfShape (to build zeros of X's batch)")
        if plan.broadcast and not isinstance(opset, Refusal):  # else the check refuses
            reason = broadcast_opset_reason(opset)
            if reason is not None:
                return Refusal(reason)
        return None

    def decline(self, context, plan: _CellPlan) -> KeptUnrolled | None:
        missing = missing_kernel("", self.op_type, plan.cell.dtype, (self.target,))
        if missing is not None:  # the unrolled steps run there
            return KeptUnrolled(f"re-roll kept unrolled: {missing}")
        # the node emitted is what rten converts (default activations, no clip, layout 0,
        # GRU linear_before_reset=1): the cost table alone decides, on every target
        hidden, seq = plan.hidden_size, len(plan.steps)
        args = (context, self.target, self.op_type, plan.x, hidden, seq, plan.reverse, plan.h0)
        batch_axis = 1 - plan.time_axis
        if plan.time_axis == 1 or plan.stack_axis == 1:  # the node between Transposes
            label = "batch-first, Transposes included: "
            kept = cost_refusal(*args, batch_axis, form="batch_first", label=label)
            if kept is not None:
                return kept
        return cost_refusal(*args, batch_axis)

    def rewrite(self, op, **_):
        plan, emit = self.plan, self.emitter(op)
        prefix = f"reroll_{plan.steps[-1].h.name or 'cell'}"
        cell = plan.cell
        w = emit.constant(cell.w[np.newaxis], f"{prefix}_W")
        r = emit.constant(cell.r[np.newaxis], f"{prefix}_R")
        b = emit.constant(cell.b[np.newaxis], f"{prefix}_B") if cell.biased else None
        x = plan.x
        if plan.slice_x:
            x = emit.first_steps(x, len(plan.steps), reverse=False, axis=plan.time_axis)
        h0, c0 = plan.h0, plan.c0
        if any(plan.rebuilt):
            batch_axis = 1 - plan.time_axis
            zeros = emit.zeros(x, batch_axis, plan.hidden_size, cell.dtype)
            h0 = zeros if plan.rebuilt[0] else h0
            c0 = zeros if plan.rebuilt[1] else c0
        if plan.time_axis == 1:  # batch-first: the node reads [T, batch, I]
            x = op.Transpose(x, perm=[1, 0, 2])
        if plan.broadcast:
            assert h0 is not None
            x, h0, c0 = broadcast_batches(op, x, h0, c0, emit.opset, emit.ints)
        inputs = [x, w, r, b, None, emit.unsqueeze(h0, 0)]
        if self.op_type == "LSTM":
            inputs.append(emit.unsqueeze(c0, 0))
        outputs = recurrent_node(
            op,
            self.op_type,
            inputs,
            hidden_size=plan.hidden_size,
            reverse=plan.reverse,
            linear_before_reset=1 if self.op_type == "GRU" else None,
        )
        mark_replaces_batch_0_run(outputs[0])  # the steps run at batch 0
        y, y_h = outputs[:2]
        y_c = outputs[2] if self.op_type == "LSTM" else None
        last = plan.steps[-1]
        if y_c is not None and last.c is not None and _outside_uses(last):
            redirect(last.c, emit.squeeze(y_c, 0))
        if plan.concat is not None:
            stack = emit.squeeze(y, 1)  # [T, batch, H]
            if plan.stack_axis == 1:
                stack = op.Transpose(stack, perm=[1, 0, 2])
            redirect(plan.concat.outputs[0], stack)
        return emit.squeeze(y_h, 0)


def _outside_uses(step: _CellStep) -> bool:
    c = step.c
    assert c is not None
    return c.is_graph_output() or any(user not in step.nodes for user, _ in c.uses())


def _downstream(node: ir.Node, depth: int) -> list[ir.Node]:
    seen, frontier = [node], [node]
    for _ in range(depth):
        frontier = [u for n in frontier for v in n.outputs for u, _ in v.uses()]
        seen += frontier
    return seen


def _readers_after(graph, value: ir.Value, root: ir.Node, plan: _CellPlan) -> bool:
    """Every reader of ``value`` outside the last step comes after ``root`` in graph order
    (the replacement is inserted right after ``root``). A reader inside a subgraph reads
    it where the node of ``graph`` holding that subgraph (an ``If``, a ``Loop``) is."""
    last_step = plan.steps[-1].nodes
    owners = None
    readers: set[int] = set()
    for user, _ in value.uses():
        if user in last_step:
            continue
        reader: ir.Node | None = user
        while reader is not None and reader.graph is not graph:
            owners = subgraph_owners(graph) if owners is None else owners
            reader = None if reader.graph is None else owners.get(reader.graph)
        if reader is not None:
            readers.add(id(reader))
    for node in graph:
        if node is root:
            return True
        if id(node) in readers:
            return False
    return True

"""Re-roll Python loops over ``nn.LSTMCell`` / ``nn.GRUCell`` into one ONNX ``LSTM`` / ``GRU``.

Pattern (torch 2.13 ``dynamo=True`` and the TorchScript exporter write the same steps):
step ``t`` reads ``x_t = Gather(X, t, axis=0)`` (or ``Squeeze(Slice(X, [t], [t+1]), [0])``;
``Gather(X, t, axis=1)``, ``x[:, t]``, for a batch-first ``X``),
``gx = Gemm(x_t, W_ih, b_ih, transB=1)`` and ``gh = Gemm(h_{t-1}, W_hh, b_hh, transB=1)``
(or ``MatMul(v, W^T) [+ b]``), split into gates on axis 1 by ``Split`` (``num_outputs``
or equal constant sizes), in PyTorch's gate order:

* LSTM ``i, f, g, o`` of ``Split(gx + gh)``: ``c_t = sigmoid(f) * c_{t-1} + sigmoid(i) *
  tanh(g)``, ``h_t = sigmoid(o) * tanh(c_t)``;
* GRU ``r, z, n`` of ``Split(gx)`` and ``Split(gh)``: ``r = sigmoid(xr + hr)``,
  ``z = sigmoid(xz + hz)``, ``n = tanh(xn + r * hn)``, ``h_t = (h_{t-1} - n) * z + n``;

the steps' ``h_t`` stacked by ``Concat(Unsqueeze(h_t, a), ..., axis=a)``, ``a`` 0 or 1.

Condition: every step uses the same constant weights and biases (a bias ``[G*H]`` or one
row ``[1, G*H]``) and the same ops in the same gate positions (each operand is checked to
be the gate the formula needs, so a swapped gate order does not match); the steps are
chained ``h_{t-1} -> h_t`` (and ``c_{t-1} -> c_t``); step ``t`` reads index ``t`` of one
``X`` of rank 3 (forward) or index ``T-1-t`` (a reversed loop), every step on the same
axis; every value of a step is read only inside the step, by the next step or by the one
stacking ``Concat``, but ``x_t``, a function of ``X`` alone, which keeps any other reader
(dynamo shares one ``x[t]`` Gather between a forward and a reversed loop over ``X``);
``h_0`` (``c_0``) is provably ``[batch of X, H]`` (zeros built from ``Shape(X)``), or
``[b, H]`` for a batch ``b`` not proven ``X``'s (an encoder's final state, a graph input:
the steps broadcast it), or the first step's hidden term is a folded constant equal to
``b_hh`` for a batch of 1 or ``X``'s static batch. A loop of one step is not a recurrence
and is left alone. ``X`` is sliced to ``T`` steps unless its sequence axis is statically
``T`` (the original reads only those).

Replacement: ``LSTM`` (gate order ``iofc``) / ``GRU`` (``zrh``, ``linear_before_reset=1``)
with ``W``, ``R``, ``B`` as new initializers and ``Unsqueeze``-d initial states, reading
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
from rnn_rewrite_rules._rnn_ops import RNN_OPS
from rnn_rewrite_rules.rules._broadcast import broadcast_batches, broadcast_opset_reason
from rnn_rewrite_rules.rules._graph import producer, read_axes
from rnn_rewrite_rules.rules._kernels import missing_kernel
from rnn_rewrite_rules.rules.cell import recurrent_node
from rnn_rewrite_rules.rules.reroll._chain import (
    ChainRule,
    KeptUnrolled,
    cost_refusal,
    read_step,
    redirect,
    same_constant,
    static_size,
    walk_back,
    weight_array,
)
from rnn_rewrite_rules.shape import Dim, ShapeProver
from rnn_rewrite_rules.shape.values import is_all_zeros

__all__ = ["RerollCell", "plan_cell_chain"]

#: PyTorch gate blocks in ONNX order.
_GATE_ORDER = {"LSTM": (0, 3, 1, 2), "GRU": (1, 0, 2)}


@dataclasses.dataclass
class _Linear:
    """``v @ weight.T + bias`` (PyTorch layout ``weight [out, in]``)."""

    input: ir.Value
    weight: ir.Value | None
    bias: ir.Value | None
    nodes: tuple[ir.Node, ...]
    transposed: bool  # weight is W^T (MatMul form)
    folded: np.ndarray | None = None


def _linear(value: ir.Value | None) -> _Linear | Refusal:
    """A ``Gemm(v, W, b, transB=1)`` or ``MatMul(v, W^T) [+ b]``."""
    gemm = producer(value, "Gemm")
    if gemm is not None:
        a = gemm.attributes
        if (
            a.get_int("transA", 0)
            or not a.get_int("transB", 0)
            or a.get_float("alpha", 1.0) != 1.0
            or a.get_float("beta", 1.0) != 1.0
        ):
            return Refusal("a Gemm is not v @ W^T + b (transA/transB/alpha/beta)")
        bias = gemm.inputs[2] if len(gemm.inputs) > 2 else None
        return _Linear(gemm.inputs[0], gemm.inputs[1], bias, (gemm,), False)
    add = producer(value, "Add")
    bias = None
    nodes: tuple[ir.Node, ...] = ()
    if add is not None:
        a, b = add.inputs
        if producer(a, "MatMul") is None:
            a, b = b, a
        value, bias, nodes = a, b, (add,)
    matmul = producer(value, "MatMul")
    if matmul is None:
        return Refusal("a gate projection is not Gemm or MatMul [+ Add]")
    return _Linear(matmul.inputs[0], matmul.inputs[1], bias, (*nodes, matmul), True)


def _weights(linear: _Linear, gates: int) -> tuple[np.ndarray, np.ndarray | None] | Refusal:
    """(weight [G*H, in], bias [G*H] | None) as constants."""
    weight = weight_array(linear.weight)
    if weight is None or weight.ndim != 2:
        return Refusal("a gate weight is not a constant matrix")
    weight = weight.T if linear.transposed else weight
    bias = None
    if linear.bias is not None:
        bias = weight_array(linear.bias)
        if bias is None:
            return Refusal("a gate bias is not a constant")
        if bias.shape == (1, weight.shape[0]):  # [1, G*H]: added to a [batch, G*H] row
            bias = bias[0]  # by row, as a [G*H] one is (X of rank 3: a step is 2-D)
        if bias.shape != (weight.shape[0],):
            return Refusal(
                f"a gate bias has shape {list(bias.shape)}, not [{weight.shape[0]}] or "
                f"[1, {weight.shape[0]}]"
            )
    if weight.shape[0] % gates:
        return Refusal(f"a gate weight has {weight.shape[0]} rows, not a multiple of {gates}")
    return weight, bias


def _split(value: ir.Value | None, gates: int) -> tuple[ir.Node, int] | None:
    """(Split node, output index) when ``value`` is one of ``gates`` equal parts on axis 1
    (of the rank-2 gate projections): sizes from the ``split`` input (opset >= 13) or
    attribute, else an even split (``num_outputs`` of opset 18 is the output count; the
    parts' width ``G*H`` is a multiple of ``G``, checked with the weights)."""
    node = producer(value, "Split")
    if node is None or len(node.outputs) != gates:
        return None
    if node.attributes.get_int("axis", 0) not in (1, -1):
        return None
    sizes = node.inputs[1] if len(node.inputs) > 1 else None
    if sizes is not None:
        array = const_array(sizes)
        parts = None if array is None or array.ndim != 1 else array.tolist()
    else:
        attribute = node.attributes.get("split")
        parts = [] if attribute is None else list(attribute.as_ints())  # []: even
    if parts is None or len(set(parts)) > 1:
        return None
    return node, list(node.outputs).index(value)


def _read(value: ir.Value | None) -> tuple[ir.Value, int, int] | None:
    """``(X, t, axis)`` for ``Gather(X, t, axis)`` with a scalar t >= 0 on axis 0 (``x[t]``)
    or 1 (``x[:, t]``, a batch-first ``X``), or the Slice form (axis 0)."""
    gather = producer(value, "Gather")
    if gather is not None:
        index = const_array(gather.inputs[1])
        axis = gather.attributes.get_int("axis", 0)
        if index is None or index.ndim != 0 or axis not in (0, 1) or int(index) < 0:
            return None
        return gather.inputs[0], int(index), axis
    read = read_step(value)
    return None if read is None else (*read, 0)


def _pair(node: ir.Node | None, first, second):
    """Operands (a, b) of a commutative ``node`` with ``first(a)`` and ``second(b)`` true."""
    if node is None or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if first(a) and second(b):
        return a, b
    if first(b) and second(a):
        return b, a
    return None


def _sigmoid(value) -> bool:
    return producer(value, "Sigmoid") is not None


def _tanh(value) -> bool:
    return producer(value, "Tanh") is not None


def _anything(_value) -> bool:
    return True


@dataclasses.dataclass
class _CellStep:
    h: ir.Value
    c: ir.Value | None
    h_prev: ir.Value | None
    c_prev: ir.Value | None
    source: ir.Value
    index: int
    x_linear: _Linear
    h_linear: _Linear | None  # None: folded first step
    folded: np.ndarray | None
    nodes: set[ir.Node]
    #: X's time axis: 0, or 1 for a batch-first ``X`` read by ``x[:, t]``.
    axis: int = 0


def _gate_input(value, split: ir.Node, index: int) -> bool:
    return _split(value, len(split.outputs)) == (split, index)


def _hidden_linear(value: ir.Value) -> tuple[_Linear | None, np.ndarray | None] | Refusal:
    folded = const_array(value)
    if folded is not None:
        return None, folded
    linear = _linear(value)
    return linear if isinstance(linear, Refusal) else (linear, None)


def _lstm_step(root: ir.Node, source: ir.Value | None = None) -> _CellStep | Refusal:
    """``h_t = Mul(sigmoid(o), tanh(c_t))`` with ``c_t = f * c + i * g``.

    The two projections are an ``Add``'s operands, either way round: the step input is the
    one that reads a step of ``source`` (given: the loop's ``X``), else of any tensor (a
    first step whose ``h_0`` is itself a ``Gather``, an encoder's ``h_n[0]``, reads two)."""
    if root.op_type != "Mul":
        return Refusal("not a Mul")
    pair = _pair(root, _sigmoid, _tanh)
    if pair is None:
        return Refusal("h_t is not sigmoid(o) * tanh(c_t)")
    o_sig, c_tanh = (v.producer() for v in pair)
    c = c_tanh.inputs[0]
    c_add = producer(c, "Add")
    if c_add is None:
        return Refusal("c_t is not an Add of f * c_{t-1} and i * g")
    terms = [producer(v, "Mul") for v in c_add.inputs]
    if None in terms:
        return Refusal("c_t is not an Add of f * c_{t-1} and i * g")
    ig = next((t for t in terms if _pair(t, _sigmoid, _tanh) is not None), None)
    fc = next((t for t in terms if t is not ig), None)
    if ig is None or fc is None:
        return Refusal("c_t has no i * g term")
    i_sig, g_tanh = (v.producer() for v in _pair(ig, _sigmoid, _tanh))
    fc_pair = _pair(fc, _sigmoid, _anything)
    if fc_pair is None:
        return Refusal("c_t has no f * c_{t-1} term")
    f_sig = fc_pair[0].producer()
    c_prev = fc_pair[1]
    located = _split(o_sig.inputs[0], 4)
    if located is None:
        return Refusal("the gates are not 4 equal parts of one Split on axis 1")
    split = located[0]
    for node, index, gate in ((i_sig, 0, "i"), (f_sig, 1, "f"), (g_tanh, 2, "g"), (o_sig, 3, "o")):
        if not _gate_input(node.inputs[0], split, index):
            return Refusal(
                f"gate {gate} is not part {index} of the Split (PyTorch order i, f, g, o)"
            )
    add = producer(split.inputs[0], "Add")
    if add is None:
        return Refusal("the Split's input is not an Add of the two projections")
    read = None
    for x_side, h_side in (add.inputs, tuple(reversed(add.inputs))):
        x_linear = _linear(x_side)
        if isinstance(x_linear, Refusal):
            continue
        read = _read(x_linear.input)
        if read is None or (source is not None and read[0] is not source):
            read = None
            continue
        hidden = _hidden_linear(h_side)
        if isinstance(hidden, Refusal):
            return hidden
        h_linear, folded = hidden
        break
    if read is None:
        return Refusal("no projection reads one step of X (Gather(X, t) or Slice)")
    nodes = {root, o_sig, c_tanh, c_add, ig, fc, i_sig, g_tanh, f_sig, split, add}
    nodes |= set(x_linear.nodes) | {x_linear.input.producer()}
    if h_linear is not None:
        nodes |= set(h_linear.nodes)
    h_prev = None if h_linear is None else h_linear.input
    return _CellStep(
        root.outputs[0], c, h_prev, c_prev, *read[:2], x_linear, h_linear, folded, nodes, read[2]
    )


def _gru_step(root: ir.Node, source: ir.Value | None = None) -> _CellStep | Refusal:
    """``h_t = Add(Mul(Sub(h_{t-1}, n), z), n)`` (which projection reads the step input is
    fixed by the formula: ``source`` is not needed)."""
    del source
    if root.op_type != "Add":
        return Refusal("not an Add")
    pair = _pair(root, lambda v: producer(v, "Mul") is not None, _tanh)
    if pair is None:
        return Refusal("h_t is not (h_{t-1} - n) * z + n")
    mul, n = pair[0].producer(), pair[1]
    inner = _pair(mul, lambda v: producer(v, "Sub") is not None, _sigmoid)
    if inner is None:
        return Refusal("h_t is not (h_{t-1} - n) * z + n")
    sub, z_sig = inner[0].producer(), inner[1].producer()
    if sub.inputs[1] is not n:
        return Refusal("the Sub is not h_{t-1} - n")
    h_prev = sub.inputs[0]
    n_tanh = n.producer()
    n_add = producer(n_tanh.inputs[0], "Add")
    n_pair = _pair(n_add, lambda v: producer(v, "Mul") is not None, _anything)
    if n_pair is None:
        return Refusal("n is not tanh(xn + r * hn)")
    r_mul, xn = n_pair[0].producer(), n_pair[1]
    r_pair = _pair(r_mul, _sigmoid, _anything)
    if r_pair is None:
        return Refusal("n is not tanh(xn + r * hn)")
    r_sig, hn = r_pair[0].producer(), r_pair[1]
    x_part, h_part = _split(xn, 3), _split(hn, 3)
    if x_part is None or h_part is None or x_part[1] != 2 or h_part[1] != 2:
        return Refusal("xn and hn are not part 2 of Splits in 3 (PyTorch order r, z, n)")
    x_split, h_split = x_part[0], h_part[0]
    gate_nodes = []
    for sig, index, gate in ((r_sig, 0, "r"), (z_sig, 1, "z")):
        add = producer(sig.inputs[0], "Add")
        ok = _pair(
            add,
            lambda v, i=index: _gate_input(v, x_split, i),
            lambda v, i=index: _gate_input(v, h_split, i),
        )
        if ok is None:
            return Refusal(
                f"gate {gate} is not sigmoid(part {index} of both Splits) (order r, z, n)"
            )
        gate_nodes.append(add)
    x_linear = _linear(x_split.inputs[0])
    if isinstance(x_linear, Refusal):
        return x_linear
    read = _read(x_linear.input)
    if read is None:
        return Refusal("the input projection does not read one step of X (Gather(X, t) or Slice)")
    hidden = _hidden_linear(h_split.inputs[0])
    if isinstance(hidden, Refusal):
        return hidden
    h_linear, folded = hidden
    if h_linear is not None and not (
        h_linear.input is h_prev or same_constant(h_linear.input, h_prev)
    ):
        return Refusal("the hidden projection and the update read different h_{t-1}")
    nodes = {root, mul, sub, z_sig, n_tanh, n_add, r_mul, r_sig, x_split, h_split, *gate_nodes}
    nodes |= set(x_linear.nodes) | {x_linear.input.producer()}
    if h_linear is not None:
        nodes |= set(h_linear.nodes)
    return _CellStep(
        root.outputs[0], None, h_prev, None, *read[:2], x_linear, h_linear, folded, nodes, read[2]
    )


_STEP = {"LSTM": _lstm_step, "GRU": _gru_step}


@dataclasses.dataclass
class _CellPlan:
    steps: list[_CellStep]
    x: ir.Value
    reverse: bool
    w: np.ndarray
    r: np.ndarray
    b: np.ndarray | None
    h0: ir.Value | None
    c0: ir.Value | None
    slice_x: bool
    concat: ir.Node | None
    #: ``h_0`` (``c_0``) of a batch not proven ``X``'s: all are expanded to the batch they
    #: broadcast to (``rules._broadcast``), as the steps' arithmetic does.
    broadcast: bool = False
    #: ``X``'s time axis (1: batch-first, read by ``x[:, t]``) and the stack's (1:
    #: ``[batch, T, H]``).
    time_axis: int = 0
    stack_axis: int = 0


def _state_ok(
    prover: ShapeProver, state: ir.Value, x: ir.Value, hidden: int, batch_axis: int
) -> bool:
    """``state`` is provably ``[batch of X, H]`` (the batch: ``X``'s ``batch_axis``)."""
    return prover.dims(state) == (prover.dim(x, batch_axis), Dim.const(hidden))


def _broadcasts(prover: ShapeProver, state: ir.Value, hidden: int) -> bool:
    """``state`` is provably ``[b, H]`` for some batch ``b`` (an encoder's final state, a
    graph input): the steps broadcast it against ``X``'s batch."""
    return prover.rank(state) == 2 and prover.dim(state, 1) == Dim.const(hidden)


def plan_cell_chain(
    root: ir.Node, op_type: str, main_graph: ir.Graph | None = None
) -> _CellPlan | Refusal:
    """Prove that ``root`` (producing ``h_T``) ends an unrolled cell loop.

    ``main_graph``: the model's main graph (whose inputs' declared shapes are facts);
    None when ``root`` is in it."""
    parse = _STEP[op_type]
    last = parse(root)
    if isinstance(last, Refusal):
        return last
    steps = walk_back(last, parse)
    count = len(steps)
    if count < 2:
        return Refusal("a single cell step is not a loop (left alone)")
    indices = [s.index for s in steps]
    if indices == list(range(count)):
        reverse = False
    elif indices == list(range(count - 1, -1, -1)):
        reverse = True
    else:
        return Refusal(f"the steps read indices {indices}, not 0..{count - 1} in order or reversed")
    first = steps[0]
    for t, step in enumerate(steps):
        if step.h_linear is None and t:
            return Refusal(f"step {t}'s hidden projection is a constant")
        if t and op_type == "LSTM" and step.c_prev is not steps[t - 1].c:
            return Refusal(f"step {t} does not read c_{t} of the step before")
    gates = RNN_OPS[("", op_type)].gates
    reference = next(s for s in steps if s.h_linear is not None)
    assert reference.h_linear is not None
    for t, step in enumerate(steps):
        pairs = [(step.x_linear, reference.x_linear)]
        if step.h_linear is not None:
            pairs.append((step.h_linear, reference.h_linear))
        for mine, theirs in pairs:
            if mine.transposed != theirs.transposed or not same_constant(
                mine.weight, theirs.weight
            ):
                return Refusal(f"step {t} uses other weights")
            if (mine.bias is None) != (theirs.bias is None) or (
                mine.bias is not None and not same_constant(mine.bias, theirs.bias)
            ):
                return Refusal(f"step {t} uses another bias")
    x_weights = _weights(reference.x_linear, gates)
    h_weights = _weights(reference.h_linear, gates)
    for found in (x_weights, h_weights):
        if isinstance(found, Refusal):
            return found
    (w, b_ih), (r, b_hh) = x_weights, h_weights
    hidden = r.shape[0] // gates
    if r.shape != (gates * hidden, hidden):
        return Refusal(f"W_hh has shape {list(r.shape)}, not [{gates}*H, H]")
    if w.shape[0] != gates * hidden:
        return Refusal(f"W_ih has shape {list(w.shape)}, not [{gates}*H, I] with H = {hidden}")
    if len({w.dtype, r.dtype}) != 1 or w.dtype not in (np.float32, np.float64, np.float16):
        return Refusal("the weights are not one floating-point type")
    x = last.source
    prover = ShapeProver(root.graph if main_graph is None else main_graph)
    if prover.rank(x) != 3:
        return Refusal("X is not provably of rank 3")
    time_axis = last.axis
    if any(step.axis != time_axis for step in steps):
        return Refusal("the steps read X on different axes")
    batch_axis = 1 - time_axis

    # Every value of a step is read inside the step, by the next one or by the stack; a
    # step's read of X (X[t], a function of X alone) may have other readers (dynamo shares
    # one Gather between a forward and a reversed loop): the rewrite leaves it to them.
    stack_inputs = [s.h for s in (steps[::-1] if reverse else steps)]
    concat, stack_axis, unsqueezes = _find_stack(stack_inputs)
    allowed_h_readers = {id(u) for u in unsqueezes}
    for t, step in enumerate(steps):
        following = steps[t + 1].nodes if t + 1 < count else set()
        for node in step.nodes:
            for value in node.outputs:
                if t + 1 == count and (value is step.h or value is step.c):
                    continue  # the final states: any reader
                if value is step.x_linear.input:
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

    h0 = first.h_prev
    c0 = first.c_prev
    broadcast = False
    if first.h_linear is None:
        folded = first.folded
        assert folded is not None
        expected = np.zeros(gates * hidden, r.dtype) if b_hh is None else b_hh
        if folded.ndim != 2 or folded.shape[1] != gates * hidden:
            return Refusal(
                f"the folded first step has shape {list(folded.shape)}, not [batch, G*H]"
            )
        if not same_bits(folded, np.broadcast_to(expected, folded.shape)):
            return Refusal("the folded first step is not b_hh (a non-zero initial state)")
        if folded.shape[0] != 1 and static_size(prover, x, batch_axis) != folded.shape[0]:
            return Refusal("the folded first step fixes a batch X does not provably have")
    elif not _state_ok(prover, h0, x, hidden, batch_axis):
        if not _broadcasts(prover, h0, hidden):
            return Refusal("cannot prove h_0 is [batch of X, H] or [batch, H]")
        broadcast = True
    if op_type == "GRU" and first.h_linear is None:
        # the update reads h_0 itself: it must be zeros of X's batch
        proven = _state_ok(prover, h0, x, hidden, batch_axis)
        if not (is_all_zeros(h0) and (proven or _folded_zero(prover, h0, x, batch_axis))):
            return Refusal("the folded first step's h_0 is not provably zeros of X's batch")
        h0 = None
    c0_proven = c0 is not None and _state_ok(prover, c0, x, hidden, batch_axis)
    if (
        op_type == "LSTM"
        and not c0_proven
        and first.h_linear is not None
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
    # zero states stay: the initial_state family shares or drops them (by target); a folded
    # first step has no h_0 here (LSTM: no hidden projection reads one; GRU: proven zeros)
    order = _GATE_ORDER[op_type]

    def reorder(array: np.ndarray) -> np.ndarray:
        blocks = np.split(array, gates)  # along the rows
        return np.concatenate([blocks[i] for i in order])

    zeros = np.zeros(gates * hidden, w.dtype)
    bias = None
    if b_ih is not None or b_hh is not None:
        parts = [zeros if v is None else reorder(v) for v in (b_ih, b_hh)]
        bias = np.concatenate(parts)[np.newaxis]
    return _CellPlan(
        steps,
        x,
        reverse,
        reorder(w)[np.newaxis],
        reorder(r)[np.newaxis],
        bias,
        h0,
        c0,
        static_size(prover, x, time_axis) != count,
        concat,
        broadcast,
        time_axis,
        stack_axis,
    )


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
            if all(_stack_axis(p, h) == axis for p, h in zip(producers, hs, strict=True)):
                return concat, axis, producers
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
        return op.Mul(a, b) if self.op_type == "LSTM" else op.Add(a, b)

    def plan_chain(self, root: ir.Node, main_graph: ir.Graph) -> _CellPlan | Refusal:
        return plan_cell_chain(root, self.op_type, main_graph)

    def refuse(self, context, plan: _CellPlan) -> Refusal | None:
        h = plan.steps[-1].h
        parse = _STEP[self.op_type]
        for user, _ in h.uses():
            for candidate in _downstream(user, 6):
                step = parse(candidate)
                if not isinstance(step, Refusal) and step.h_prev is h:
                    return Refusal("h_T feeds another step: not the last step")
        c = plan.steps[-1].c
        if c is not None and not _readers_after(context.graph_or_function, c, context.root, plan):
            return Refusal("a reader of c_T comes before h_T")
        opset = opset_version(context.model, context.graph_or_function)
        if plan.broadcast and not isinstance(opset, Refusal):  # else the check refuses
            reason = broadcast_opset_reason(opset)
            if reason is not None:
                return Refusal(reason)
        return None

    def decline(self, context, plan: _CellPlan) -> KeptUnrolled | None:
        missing = missing_kernel("", self.op_type, plan.w.dtype, (self.target,))
        if missing is not None:  # the unrolled steps run there
            return KeptUnrolled(f"re-roll kept unrolled: {missing}")
        # the node emitted is what rten converts (default activations, no clip, layout 0,
        # GRU linear_before_reset=1): the cost table alone decides, on every target
        hidden, seq = int(plan.r.shape[2]), len(plan.steps)
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
        w = emit.constant(plan.w, f"{prefix}_W")
        r = emit.constant(plan.r, f"{prefix}_R")
        b = None if plan.b is None else emit.constant(plan.b, f"{prefix}_B")
        x = plan.x
        if plan.slice_x:
            x = emit.first_steps(x, len(plan.steps), reverse=False, axis=plan.time_axis)
        if plan.time_axis == 1:  # batch-first: the node reads [T, batch, I]
            x = op.Transpose(x, perm=[1, 0, 2])
        h0, c0 = plan.h0, plan.c0
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
            hidden_size=int(plan.r.shape[2]),
            reverse=plan.reverse,
            linear_before_reset=1 if self.op_type == "GRU" else None,
        )
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
    step_nodes = plan.steps[-1].nodes
    owners = None
    readers: set[int] = set()
    for user, _ in value.uses():
        if user in step_nodes:
            continue
        while user is not None and user.graph is not graph:
            owners = subgraph_owners(graph) if owners is None else owners
            user = owners.get(user.graph)  # type: ignore[arg-type]
        if user is not None:
            readers.add(id(user))
    for node in graph:
        if node is root:
            return True
        if id(node) in readers:
            return False
    return True

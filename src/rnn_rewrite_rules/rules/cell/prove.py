"""The recurrent cell one step computes, proven from the graph.

:func:`prove_cell` proves that the step outputs ``h_t`` (and ``c_t``) are one step of an
``RNN``, ``LSTM`` or ``GRU`` cell applied to the state inputs ``h_(t-1)`` (and
``c_(t-1)``) and one step input ``x_t``, and returns the weights in ONNX's layout and
gate order, or a :class:`Refusal` with the reason of the closest attempt. It reads the
values only: the states may be a Loop's or Scan's carried values, an unrolled step's
inputs or graph inputs. Gates are told apart by what they do in the cell (the one
multiplying ``c_(t-1)`` is ``f``...), never by where they sit in a Split, so any gate
order (Keras ``i, f, c, o``, ONNX ``i, o, f, c``, PyTorch ``i, f, g, o``) is read from
the step itself.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import same_bits
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.rules._graph import input_at, producer, read_axes
from rnn_rewrite_rules.rules.cell.columns import slice_columns
from rnn_rewrite_rules.rules.cell.node_step import NodeStep, node_step
from rnn_rewrite_rules.rules.cell.polynomial import Polynomial, polynomial
from rnn_rewrite_rules.shape.constant import Constants

__all__ = [
    "DEFAULT_ACTIVATIONS",
    "ONNX_GATES",
    "Cell",
    "gate_inputs",
    "prove_cell",
    "through_identity",
    "zero_state_row",
]

#: Activations read from a body (ONNX's RNN ops take them by name, without parameters).
_ACTS = ("Sigmoid", "Tanh", "Relu")
#: Each op's default activations (written out only when a body differs).
DEFAULT_ACTIVATIONS = {
    "RNN": ("Tanh",),
    "GRU": ("Sigmoid", "Tanh"),
    "LSTM": ("Sigmoid", "Tanh", "Tanh"),
}

#: ONNX gate order of each cell: the gate names in W/R/B block order.
ONNX_GATES = {"RNN": ("h",), "GRU": ("z", "r", "h"), "LSTM": ("i", "o", "f", "c")}


def through_identity(value: ir.Value) -> ir.Value:
    """``value`` with any chain of ``Identity`` nodes above it skipped."""
    node = producer(value, "Identity")
    while node is not None and node.inputs[0] is not None:
        value = node.inputs[0]
        node = producer(value, "Identity")
    return value


def _label(item: ir.Node | ir.Value) -> str:
    """How a refusal names a node or value: its name, else what it is."""
    if item.name:
        return item.name
    return item.op_type if isinstance(item, ir.Node) else "an unnamed value"


@dataclasses.dataclass
class _Linear:
    """``sum_s s @ weights[s] + bias``: a gate's pre-activation, per source value."""

    weights: dict[ir.Value, np.ndarray]  # source -> [in, width]
    bias: np.ndarray | None  # [width], added to the sum
    #: h_(t-1) is not read by a plain MatMul here (split out of TF 1's Concat(x_t, h), or
    #: the GRU's r * h_(t-1)): its width is not implied by ``R``'s rows
    indirect: bool = False
    #: biases added to one source's product alone (``Gemm(s, W, b)``, ``MatMul(s, W) + b``):
    #: the node keeps them apart as ``Wb`` (x_t's) and ``Rb`` (h_(t-1)'s), as the graph adds them
    attached: dict[ir.Value, np.ndarray] = dataclasses.field(default_factory=dict)


def _linear(value: ir.Value | None, constants: Constants) -> _Linear | Refusal:
    """Read ``value`` as a sum of ``MatMul(s, W)`` / ``Gemm`` terms and a constant bias,
    through ``Add`` and column blocks (an axis-1 ``Split``, or a ``Slice`` of columns)."""
    if value is None:
        return Refusal("an operand is missing")
    array = constants(value)
    if array is None:
        array = _expanded(value, constants)
    if array is not None:
        return _bias(array)
    node = value.producer()
    if node is None or node.domain != "":
        return Refusal(f"{_label(value)} is not a MatMul, Gemm, Add or bias")
    if node.op_type == "Add":
        parts: list[_Linear] = []
        for operand in node.inputs:
            part = _linear(operand, constants)
            if isinstance(part, Refusal):
                return part
            parts.append(part)
        return _attach(node, parts) or _sum(parts)
    if node.op_type == "MatMul":
        weight = constants(node.inputs[1])
        if weight is None or weight.ndim != 2 or node.inputs[0] is None:
            return Refusal(f"{_label(node)}'s right operand is not a constant matrix")
        return _Linear({node.inputs[0]: weight}, None)
    if node.op_type == "Gemm":
        a = node.attributes
        if (
            a.get_int("transA", 0)
            or a.get_float("alpha", 1.0) != 1
            or a.get_float("beta", 1.0) != 1
        ):
            return Refusal(f"{_label(node)} is not v @ W + b (transA, alpha or beta)")
        weight = constants(node.inputs[1])
        if weight is None or weight.ndim != 2 or node.inputs[0] is None:
            return Refusal(f"{_label(node)}'s weight is not a constant matrix")
        weight = weight.T if a.get_int("transB", 0) else weight
        terms = [_Linear({node.inputs[0]: weight}, None)]
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            bias = _linear(_batch_unsqueezed(node.inputs[2], constants), constants)
            if isinstance(bias, Refusal):
                return Refusal(f"{_label(node)}'s bias: {bias}")
            if bias.weights:  # Gemm(x_t, W, h @ R): the other product is the bias
                return _sum([*terms, bias])
            terms.append(bias)
        return _attach(node, terms) or _sum(terms)
    if node.op_type == "Split":
        return _split_block(node, value, constants)
    if node.op_type == "Slice":
        return _slice_block(node, constants)
    return Refusal(
        f"{_label(value)} is computed by {node.op_type}, not a MatMul, Gemm, Add or bias"
    )


def _batch_unsqueezed(value: ir.Value, constants: Constants) -> ir.Value:
    """``v`` for ``Gemm``'s bias ``C = Squeeze(v)`` (axes absent, ``[0]`` or ``[-2]``) of a
    product ``v = s @ W`` with ``W`` a constant matrix of more than one column, else
    ``value`` (tf2onnx at batch 1: ``Gemm(x_t, W, Squeeze(MatMul(h, R)))``).

    Equality: ``v`` is ``[B, N]`` (``s`` a state or ``x_t``, ``[B, *]``), ``N > 1``. At
    ``B = 1`` the Squeeze gives ``[N]``, which Gemm broadcasts to the same ``[M, N]`` rows
    as ``[1, N]``; at ``B > 1`` a Squeeze without axes keeps ``[B, N]`` (no dimension is
    1), and one with axes fails, where the rewrite may run."""
    node = producer(value, "Squeeze")
    if node is None or node.inputs[0] is None:
        return value
    axes = read_axes(node, lambda v: _ints(constants(v)))
    if axes is None and input_at(node, 1) is not None:
        return value  # axes computed at run time
    if axes not in (None, [0], [-2]):
        return value
    product = producer(node.inputs[0], "MatMul")
    weight = None if product is None else constants(product.inputs[1])
    if weight is None or weight.ndim != 2 or weight.shape[1] < 2:
        return value
    return node.inputs[0]


def _ints(array: np.ndarray | None) -> list[int] | None:
    return None if array is None else [int(a) for a in array.reshape(-1)]


def _bias(array: np.ndarray) -> _Linear | Refusal:
    """A constant term: a scalar (added to every column), ``[width]`` or ``[1, width]``
    (added to each row: the same value at every batch size)."""
    if array.size == 1 and array.ndim <= 2:
        return _Linear({}, array.reshape(()))  # a scalar: broadcast over every column
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1:
        return Refusal(f"a bias term has shape {list(array.shape)}, not [width] or [1, width]")
    return _Linear({}, array)


#: An ``Expand`` of a constant is evaluated up to this many elements (a bias row).
_MAX_EXPANDED = 1 << 20


def _expanded(value: ir.Value, constants: Constants) -> np.ndarray | None:
    """``Expand(b, shape)`` of a constant ``b`` to a constant ``shape`` (jax2onnx's bias in
    a scan body: ``Expand(Reshape(b, [1, 4H]), [1, 4H])``): its value, ``b`` broadcast
    as ONNX's Expand does (to ``broadcast(b.shape, shape)``); None for anything else or
    a shape that does not broadcast."""
    node = producer(value, "Expand")
    if node is None or len(node.inputs) != 2:
        return None
    data, shape = constants(node.inputs[0]), constants(node.inputs[1])
    if data is None or shape is None or shape.ndim != 1 or shape.dtype.kind not in "iu":
        return None
    try:
        target = np.broadcast_shapes(data.shape, tuple(int(d) for d in shape))
    except ValueError:
        return None
    if math.prod(target) > _MAX_EXPANDED:
        return None
    return np.broadcast_to(data, target)


def _attach(node: ir.Node, parts: list[_Linear]) -> _Linear | None:
    """``MatMul(s, W) + b`` or ``Gemm(s, W, b)``: one source's product and a constant, the
    bias kept with the source; None for any other sum."""
    if len(parts) != 2 or node.inputs[0] is None:
        return None
    product, bias = parts if not parts[1].weights else parts[::-1]
    term = producer(node.inputs[0] if product is parts[0] else node.inputs[1], "MatMul")
    if node.op_type == "Add" and term is None:
        return None
    if len(product.weights) != 1 or product.bias is not None or product.attached:
        return None
    if bias.weights or bias.attached or bias.bias is None:
        return None
    ((source, weight),) = product.weights.items()
    if bias.bias.ndim and bias.bias.shape[0] != weight.shape[1]:
        return None  # the widths disagree: _sum says so
    return _Linear({source: weight}, None, product.indirect, {source: bias.bias})


def _sum(parts: list[_Linear]) -> _Linear | Refusal:
    weights: dict[ir.Value, np.ndarray] = {}
    attached: dict[ir.Value, np.ndarray] = {}
    bias = None
    for part in parts:
        for source, added in part.attached.items():
            attached[source] = added if source not in attached else attached[source] + added
        for source, weight in part.weights.items():
            if source in weights:
                if weights[source].shape != weight.shape:
                    return Refusal("two terms read one value with different shapes")
                weights[source] = weights[source] + weight
            else:
                weights[source] = weight
        if part.bias is not None:
            bias = part.bias if bias is None else bias + part.bias
    widths = {w.shape[1] for w in weights.values()}
    widths |= {b.shape[0] for b in (bias, *attached.values()) if b is not None and b.ndim}
    if len(widths) > 1:
        return Refusal(f"the terms of a sum have widths {sorted(widths)}")
    return _Linear(weights, bias, attached=attached)


def _split_block(
    node: ir.Node, value: ir.Value, constants: Constants, split: ir.Value | None = None
) -> _Linear | Refusal:
    """Part ``k`` of ``Split(S, axis=1)``: columns of ``S``'s terms (sizes from the
    ``split`` input or attribute, else equal parts). ``split``: read the terms of this
    value instead of the Split's input (the input is an activation of it)."""
    if node.attributes.get_int("axis", 0) not in (1, -1):
        return Refusal(f"{_label(node)} does not split axis 1")
    whole = _linear(node.inputs[0] if split is None else split, constants)
    if isinstance(whole, Refusal):
        return whole
    width = _width(whole)
    if width is None:
        return Refusal(f"{_label(node)} splits a value of unknown width")
    sizes_input = node.inputs[1] if len(node.inputs) > 1 else None
    if sizes_input is not None:
        sizes = constants(sizes_input)
        if sizes is None:
            return Refusal(f"{_label(node)}'s sizes are not constant")
        parts = [int(s) for s in sizes.reshape(-1)]
    elif node.attributes.get("split") is not None:
        parts = list(node.attributes["split"].as_ints())
    else:
        count = len(node.outputs)
        if width % count:
            return Refusal(f"{_label(node)} splits {width} columns into {count} parts unevenly")
        parts = [width // count] * count
    if sum(parts) != width or len(parts) != len(node.outputs):
        return Refusal(f"{_label(node)}'s sizes {parts} do not cover {width} columns")
    index = list(node.outputs).index(value)
    start = sum(parts[:index])
    return _columns(whole, start, start + parts[index])


def _slice_block(node: ir.Node, constants: Constants) -> _Linear | Refusal:
    """``Slice(S, [0, s], [big, e], [0, 1])``: columns ``[s, e)`` of ``S``'s terms, every
    row kept (:mod:`.columns` says why that holds wherever the step runs)."""
    whole = _linear(node.inputs[0], constants)
    if isinstance(whole, Refusal):
        return whole
    width = _width(whole)
    found = None if width is None else slice_columns(node, width)
    if found is None:
        return Refusal(f"{_label(node)} is not a Slice of constant columns keeping every row")
    return _columns(whole, *found)


def _columns(whole: _Linear, start: int, stop: int) -> _Linear:
    """Columns ``[start, stop)`` of every term of ``whole`` (a scalar bias stays one)."""
    weights = {s: w[:, start:stop] for s, w in whole.weights.items()}

    def columns(bias: np.ndarray) -> np.ndarray:
        return bias[start:stop] if bias.ndim else bias

    bias = None if whole.bias is None else columns(whole.bias)
    attached = {s: columns(b) for s, b in whole.attached.items()}
    return _Linear(weights, bias, attached=attached)


def _width(linear: _Linear) -> int | None:
    for weight in linear.weights.values():
        return int(weight.shape[1])
    return None if linear.bias is None or not linear.bias.ndim else int(linear.bias.shape[0])


def _all_biases(linear: _Linear) -> np.ndarray | None:
    """The sum of every bias of ``linear``, free or attached."""
    total = linear.bias
    for added in linear.attached.values():
        total = added if total is None else total + added
    return total


def _biases(linear: _Linear, source: ir.Value) -> np.ndarray | None:
    """The sum of ``linear``'s bias and what is attached to ``source``'s product."""
    parts = [b for b in (linear.bias, linear.attached.get(source)) if b is not None]
    return None if not parts else parts[0] if len(parts) == 1 else parts[0] + parts[1]


@dataclasses.dataclass(frozen=True)
class Cell:
    """One step of an ONNX recurrent op, proven from a body.

    ``w`` ``[G*H, I]``, ``r`` ``[G*H, H]``, ``b`` ``[2*G*H]`` are in ONNX's gate order
    (:data:`ONNX_GATES`) in the element type the body computes in (``dtype``).
    """

    op_type: str
    x: ir.Value
    w: np.ndarray
    r: np.ndarray
    b: np.ndarray
    activations: tuple[str, ...]  # ONNX's: RNN (f,), GRU (f, g), LSTM (f, g, h)
    linear_before_reset: int
    #: a gate reads h_(t-1) by ``MatMul(h, R)`` with ``R`` of H rows, so ``h_0`` has H
    #: columns wherever the body runs (not so through TF 1's Concat, nor an elementwise op)
    h_width_read: bool = False
    #: the step adds a bias (else ``b`` is zeros, and the node may go without ``B``)
    biased: bool = True

    @property
    def hidden_size(self) -> int:
        return int(self.r.shape[1])

    @property
    def written_activations(self) -> tuple[str, ...] | None:
        """The node's ``activations`` attribute: None for the op's defaults."""
        default = DEFAULT_ACTIVATIONS[self.op_type]
        return None if self.activations == default else self.activations

    @property
    def dtype(self) -> np.dtype:
        return self.w.dtype


@dataclasses.dataclass
class _Gate:
    linear: _Linear
    name: str


def _act(value: ir.Value | None, *op_types: str, split_ok: bool = False) -> ir.Node | None:
    """The activation node of one of ``op_types`` (default attributes) that computes
    ``value``: ``Act(pre)``, or with ``split_ok`` (a gate, read by :func:`_gate_linear`)
    ``Split(Act(S), axis=1)[k]`` too (TF 1's GRUCell activates its gates before
    splitting them, which is the same elementwise)."""
    split = producer(value, "Split") if split_ok else None
    node = producer(value if split is None else split.inputs[0], *op_types)
    if node is None or node.attributes:
        return None
    return node


def _pre_activation(value: ir.Value, constants: Constants) -> _Linear | Refusal:
    """The terms of the pre-activation of a gate ``value`` :func:`_act` accepted."""
    split = producer(value, "Split")
    if split is None:
        node = value.producer()
        assert node is not None
        return _linear(node.inputs[0], constants)
    activation = producer(split.inputs[0], *_ACTS)
    assert activation is not None
    return _split_block(split, value, constants, activation.inputs[0])


def _operands(node: ir.Node | None, first: Callable, second: Callable):
    """Operands ``(a, b)`` of a commutative binary ``node`` with ``first(a)`` and
    ``second(b)`` both true (tried both ways), else None."""
    if node is None or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if first(a) and second(b):
        return a, b
    if first(b) and second(a):
        return b, a
    return None


def _is(target: ir.Value) -> Callable[[ir.Value | None], bool]:
    return lambda v: v is target


def _any(_value: ir.Value | None) -> bool:
    return True


def _is_state(state: ir.Value, constants: Constants) -> Callable[[ir.Value | None], bool]:
    """``state`` itself, or a constant of the same bits (a first step reading two equal
    zero constants as ``h_0``)."""
    fixed = constants(state)

    def check(value: ir.Value | None) -> bool:
        if value is state:
            return True
        other = None if fixed is None else constants(value)
        return other is not None and same_bits(fixed, other)

    return check


@dataclasses.dataclass
class _Assembled:
    """A cell's weights in ONNX's layout and gate order, and what its gates read."""

    x: ir.Value
    w: np.ndarray
    r: np.ndarray
    b: np.ndarray  # [2*G*H]: Wb then Rb
    width_read: bool
    biased: bool

    def cell(self, op_type: str, activations: tuple[str, ...]) -> Cell:
        """The cell of ``op_type`` (an RNN or LSTM: ``linear_before_reset`` 0) these
        weights make, with ``activations``."""
        return Cell(
            op_type, self.x, self.w, self.r, self.b, activations, 0, self.width_read, self.biased
        )


def _assemble(
    op_type: str, gates: dict[str, _Linear], h_prev: ir.Value, apart: bool
) -> _Assembled | Refusal:
    """(x_t, W, R, B) from each gate's linear terms in ONNX order; every gate reads
    ``h_prev`` and one common ``x_t``. With ``apart``, a bias the graph adds to
    ``h_prev``'s product alone goes to ``Rb``; every other bias (all, without) to ``Wb``."""
    x = None
    w_blocks, r_blocks = [], []
    w_biases: list[np.ndarray | None] = []
    r_biases: list[np.ndarray | None] = []
    hidden = None
    width_read = False
    for name in ONNX_GATES[op_type]:
        linear = _split_concat(gates[name], lambda v: v is h_prev)
        if isinstance(linear, Refusal):
            return linear
        width_read = width_read or not linear.indirect
        sources = [s for s in linear.weights if s is not h_prev]
        if len(sources) != 1:
            return Refusal(f"gate {name} does not read exactly one step input besides h_(t-1)")
        if x is None:
            x = sources[0]
        elif sources[0] is not x:
            return Refusal(f"gate {name} reads another step input than the gates before")
        r = linear.weights.get(h_prev)
        if r is None:
            return Refusal(f"gate {name} does not read h_(t-1)")
        w = linear.weights[x]
        hidden = w.shape[1] if hidden is None else hidden
        if w.shape[1] != hidden or (r is not None and r.shape != (hidden, hidden)):
            return Refusal(f"gate {name}'s weights are not [I, H] and [H, H] with H = {hidden}")
        w_blocks.append(w.T)
        r_blocks.append(r.T)
        if apart:
            w_biases.append(_biases(linear, x))
            r_biases.append(linear.attached.get(h_prev))
        else:
            w_biases.append(_all_biases(linear))
            r_biases.append(None)
    assert x is not None and hidden is not None
    biases = [b for b in w_biases + r_biases if b is not None]
    arrays = w_blocks + r_blocks + biases
    if len({a.dtype for a in arrays}) != 1 or arrays[0].dtype.kind != "f":
        return Refusal("the weights are not all of one floating-point type")
    dtype = arrays[0].dtype
    b = [
        np.zeros(hidden, dtype) if b is None else np.broadcast_to(b, (hidden,))
        for b in w_biases + r_biases
    ]
    w, r = np.concatenate(w_blocks), np.concatenate(r_blocks)
    return _Assembled(x, w, r, np.concatenate(b), width_read, bool(biases))


def _split_concat(linear: _Linear, is_h: Callable[[ir.Value], bool]) -> _Linear | Refusal:
    """``linear`` with a ``MatMul(Concat(x, h, axis=1), W)`` source (TF's ``LSTMCell``,
    ``GRUCell``) read as ``x @ W_x + h @ W_h``: ``W``'s rows split where ``h``'s ``H``
    columns (the gate's width: ``h`` is a state, proven ``[batch, H]``) begin or end."""
    weights: dict[ir.Value, np.ndarray] = {}
    indirect = linear.indirect
    bias = linear.bias
    attached = dict(linear.attached)
    for source, weight in linear.weights.items():
        concat = producer(source, "Concat")
        if concat is None:
            parts = [(source, weight)]
        else:
            if concat.attributes.get_int("axis", 0) not in (1, -1) or len(concat.inputs) != 2:
                return Refusal(f"{_label(concat)} does not join two values on axis 1")
            hidden, rows = weight.shape[1], weight.shape[0]
            first, second = concat.inputs
            if first is None or second is None or is_h(first) == is_h(second) or rows <= hidden:
                return Refusal(f"{_label(concat)} does not join a step input and h_(t-1)")
            cut = hidden if is_h(first) else rows - hidden
            parts = [(first, weight[:cut]), (second, weight[cut:])]
            indirect = True
            if source in attached:  # added to the joint product: one bias of the sum
                added = attached.pop(source)
                bias = added if bias is None else bias + added
        for value, part in parts:
            assert value is not None
            if value in weights:
                return Refusal(f"{_label(value)} is read twice by one gate")
            weights[value] = part
    return _Linear(weights, bias, indirect, attached)


def _gate_linear(
    activated: ir.Value | None, constants: Constants, name: str, gates: dict[str, _Linear]
) -> Refusal | None:
    """Reads the terms of gate ``name`` (its activated value) into ``gates``."""
    if activated is None:
        return Refusal(f"gate {name} is missing")
    linear = _pre_activation(activated, constants)
    if isinstance(linear, Refusal):
        return Refusal(f"gate {name}: {linear}")
    gates[name] = linear
    return None


def _rnn_cell(h: ir.Value, h_prev: ir.Value, constants: Constants, apart: bool) -> Cell | Refusal:
    """``h_t = act(x_t @ W + h_(t-1) @ R + b)`` with ``act`` Tanh, Relu or Sigmoid."""
    node = _act(h, *_ACTS)
    if node is None:
        return Refusal("h_t is not an activation of a sum (RNN)")
    gates: dict[str, _Linear] = {}
    reason = _gate_linear(h, constants, "h", gates)
    if reason is not None:
        return reason
    found = _assemble("RNN", gates, h_prev, apart)
    return found if isinstance(found, Refusal) else found.cell("RNN", (node.op_type,))


def _lstm_cell(
    h: ir.Value,
    c: ir.Value,
    h_prev: ir.Value,
    c_prev: ir.Value,
    constants: Constants,
    apart: bool,
) -> Cell | Refusal:
    """``c_t = f(f_t) * c_(t-1) + f(i) * g(g_t)``, ``h_t = f(o) * h(c_t)`` with ``f``
    ``g``, ``h`` activations (Sigmoid, Tanh, Tanh by default; Keras' ``activation``)."""
    found = None
    mul = producer(h, "Mul")
    for o, h_c in (mul.inputs, mul.inputs[::-1]) if mul is not None else ():
        outer = _act(h_c, *_ACTS)
        if outer is None or outer.inputs[0] is None:
            continue
        if through_identity(outer.inputs[0]) is c and _act_op(o):
            found = o, outer
            break
    if found is None:
        return Refusal("h_t is not f(o) * h(c_t) (LSTM)")
    f_op = _act_op(found[0])
    assert f_op is not None  # found: o is activated
    add = producer(c, "Add")
    if add is None:
        return Refusal("c_t is not f * c_(t-1) + i * g (LSTM)")

    def gate(value: ir.Value | None) -> bool:  # activated as o is (ONNX's one f)
        return _act_op(value) == f_op

    terms = [producer(v, "Mul") for v in add.inputs]
    f_term = next((t for t in terms if t is not None and _operands(t, gate, _is(c_prev))), None)
    i_term = next((t for t in terms if t is not None and t is not f_term), None)
    # with g's activation f's too, i and g are interchangeable: either reading is exact
    ig = _operands(i_term, gate, _act_op)
    if f_term is None or ig is None:
        return Refusal("c_t is not f(f) * c_(t-1) + f(i) * g(g) with o's f (LSTM)")
    f_sig = _operands(f_term, gate, _is(c_prev))[0]
    activations = (f_op, _act_op(ig[1]) or "", found[1].op_type)  # ig[1] is activated
    gates: dict[str, _Linear] = {}
    for name, activated in (("i", ig[0]), ("o", found[0]), ("f", f_sig), ("c", ig[1])):
        reason = _gate_linear(activated, constants, name, gates)
        if reason is not None:
            return reason
    assembled = _assemble("LSTM", gates, h_prev, apart)
    return assembled if isinstance(assembled, Refusal) else assembled.cell("LSTM", activations)


def _act_op(value: ir.Value | None) -> str | None:
    """The activation op computing a gate ``value`` (see :func:`_act`), else None."""
    node = _act(value, *_ACTS, split_ok=True)
    return None if node is None else node.op_type


def _activated(value: ir.Value | None) -> bool:
    return _act_op(value) is not None


#: What the GRU's update is, and its other spellings.
_NOT_GRU_UPDATE = "h_t is not z * h_(t-1) + (1 - z) * n nor (h_(t-1) - n) * z + n (GRU)"


def _gru_update(
    h: ir.Value, h_prev: ir.Value, constants: Constants
) -> tuple[ir.Value, ir.Value] | Refusal:
    """(z, n) of ``h_t = z * h_(t-1) + (1 - z) * n``, read as the polynomial
    ``z h_(t-1) + n - z n`` (:mod:`.polynomial`): Keras' ``z * h + (1 - z) * n``,
    PyTorch's ``(h - n) * z + n``, flax's ``(1 - z) * n + z * h``, ``n + z * (h - n)``,
    one-minus as ``Sub(1, z)`` or ``Add(Neg(z), 1)``, in any order and association.
    ``(1 - z) * h_(t-1) + z * n`` (the update gate weighing the candidate) is refused:
    ONNX's ``z`` weighs ``h_(t-1)``."""
    node = h.producer()
    if node is None or node.domain != "" or node.op_type not in ("Add", "Sub"):
        spelled = (
            "not computed in the step"
            if node is None
            else f"{node.name} ({node.op_type})"
            if node.name
            else f"a {node.op_type}"
        )
        return Refusal(f"h_t is {spelled}, not an Add or a Sub (GRU)")
    is_h = _is_state(h_prev, constants)
    found = polynomial(h, constants, lambda v: h_prev if is_h(v) else None)
    if isinstance(found, Refusal):
        return Refusal(f"h_t: {found} (GRU)")
    poly, atoms = found
    z_n = _update_atoms(poly, atoms, h_prev)
    if z_n is not None:
        return z_n
    if _swapped(poly, atoms, h_prev):
        return Refusal(
            "h_t is (1 - z) * h_(t-1) + z * n: the update gate weighs the candidate, "
            "ONNX's weighs h_(t-1) (GRU)"
        )
    return Refusal(_NOT_GRU_UPDATE)


def _update_atoms(
    poly: Polynomial, atoms: list[ir.Value], h_prev: ir.Value
) -> tuple[ir.Value, ir.Value] | None:
    """(z, n) with ``poly == z h_(t-1) + n - z n``, else None."""
    if h_prev not in atoms:
        return None
    for z in atoms:
        for n in atoms:
            if len({z, n, h_prev}) == 3 and poly == {
                _pair(z, h_prev, atoms): 1.0,
                (n,): 1.0,
                _pair(z, n, atoms): -1.0,
            }:
                return z, n
    return None


def _swapped(poly: Polynomial, atoms: list[ir.Value], h_prev: ir.Value) -> bool:
    """``poly == h_(t-1) - z h_(t-1) + z n`` for some atoms z, n."""
    return h_prev in atoms and any(
        len({z, n, h_prev}) == 3
        and poly == {(h_prev,): 1.0, _pair(z, h_prev, atoms): -1.0, _pair(z, n, atoms): 1.0}
        for z in atoms
        for n in atoms
    )


def _pair(a: ir.Value, b: ir.Value, atoms: list[ir.Value]) -> tuple[ir.Value, ir.Value]:
    """The monomial ``a b`` as :func:`polynomial` keys it (atoms in appearance order)."""
    return (a, b) if atoms.index(a) < atoms.index(b) else (b, a)


@dataclasses.dataclass
class _Candidate:
    """The GRU's candidate ``n``: its gate's terms, the reset gate ``r`` and, with
    ``linear_before_reset=1``, the bias ``Rb_h`` added inside the reset."""

    linear: _Linear
    reset: ir.Value
    linear_before_reset: int
    rh_bias: np.ndarray | None = None


_NEITHER = "n is neither tanh(x_n + r * (h @ R_n + b)) nor tanh(x_n + (r * h) @ R_n + b) (GRU)"


def _candidate(
    pre: ir.Value | None, h_prev: ir.Value, constants: Constants
) -> _Candidate | Refusal:
    """``pre = x_n + r * (h_(t-1) @ R_n + b)`` (linear_before_reset=1), else
    ``x_n + (r * h_(t-1)) @ R_n + b`` (0)."""
    add = producer(pre, "Add")
    for a, b in () if add is None else (add.inputs, add.inputs[::-1]):
        pair = _operands(producer(b, "Mul"), _activated, _any)
        if pair is not None and producer(pair[1], "MatMul", "Gemm", "Add", "Split", "Slice"):
            return _reset_after(a, pair[1], pair[0], h_prev, constants)
    return _reset_before(pre, h_prev, constants)


def _reset_after(
    x_part: ir.Value | None,
    h_part: ir.Value,
    reset: ir.Value,
    h_prev: ir.Value,
    constants: Constants,
) -> _Candidate | Refusal:
    """``x_n + r * (h_(t-1) @ R_n + b)``: ``x_part`` and ``h_part`` are linear terms."""
    x_linear = _linear(x_part, constants)
    h_linear = _linear(h_part, constants)
    if isinstance(x_linear, Refusal):
        return Refusal(f"gate h: {x_linear}")
    if isinstance(h_linear, Refusal):
        return Refusal(f"gate h: {h_linear}")
    if h_prev in x_linear.weights or list(h_linear.weights) != [h_prev]:
        return Refusal("the reset gate multiplies a term that is not h_(t-1) @ R_n + b (GRU)")
    weights = {**x_linear.weights, h_prev: h_linear.weights[h_prev]}
    linear = _Linear(weights, x_linear.bias, attached=dict(x_linear.attached))
    return _Candidate(linear, reset, 1, _biases(h_linear, h_prev))


def _reset_before(
    pre: ir.Value | None, h_prev: ir.Value, constants: Constants
) -> _Candidate | Refusal:
    """``x_n + (r * h_(t-1)) @ R_n + b``: the terms read ``Mul(r, h_(t-1))`` instead of
    ``h_(t-1)``."""
    linear = _linear(pre, constants)
    if isinstance(linear, Refusal):
        return Refusal(_NEITHER)

    def reset_h(value: ir.Value | None) -> bool:
        return _operands(producer(value, "Mul"), _activated, _is(h_prev)) is not None

    linear = _split_concat(linear, reset_h)
    if isinstance(linear, Refusal):
        return Refusal(_NEITHER)
    reset = [s for s in linear.weights if reset_h(s)]
    if len(reset) != 1 or h_prev in linear.weights:
        return Refusal(_NEITHER)
    r_value = _operands(reset[0].producer(), _activated, _is(h_prev))[0]
    weights = {(h_prev if s is reset[0] else s): w for s, w in linear.weights.items()}
    attached = {(h_prev if s is reset[0] else s): b for s, b in linear.attached.items()}
    return _Candidate(_Linear(weights, linear.bias, True, attached), r_value, 0)  # (r * h) @ R_n


def _gru_cell(h: ir.Value, h_prev: ir.Value, constants: Constants, apart: bool) -> Cell | Refusal:
    """``n = tanh(x_n + r * (h_(t-1) @ R_n + b))`` (linear_before_reset=1) or
    ``tanh(x_n + (r * h_(t-1)) @ R_n + b)`` (0), gates ``r, z`` Sigmoid of sums."""
    found = _gru_update(h, h_prev, constants)
    if isinstance(found, Refusal):
        return found
    z, n = found
    n_node = _act(n, *_ACTS)
    if n_node is None or not _activated(z):
        return Refusal("GRU gates are not f(z) and g(n)")
    activations = (_act_op(z) or "", n_node.op_type)  # z is activated
    gates: dict[str, _Linear] = {}
    reason = _gate_linear(z, constants, "z", gates)
    if reason is not None:
        return reason
    candidate = _candidate(n_node.inputs[0], h_prev, constants)
    if isinstance(candidate, Refusal):
        return candidate
    gates["h"] = candidate.linear
    if _act_op(candidate.reset) != activations[0]:
        return Refusal("the reset gate's activation is not the update gate's (GRU)")
    reason = _gate_linear(candidate.reset, constants, "r", gates)
    if reason is not None:
        return reason
    assembled = _assemble("GRU", gates, h_prev, apart)
    if isinstance(assembled, Refusal):
        return assembled
    bias, rh_bias = assembled.b.copy(), candidate.rh_bias
    if rh_bias is not None:  # Rb_h, added inside the reset (linear_before_reset=1)
        bias[5 * assembled.r.shape[1] :] = rh_bias
    return Cell(
        "GRU", assembled.x, assembled.w, assembled.r, bias, activations,
        candidate.linear_before_reset, assembled.width_read,
        assembled.biased or rh_bias is not None,
    )  # fmt: skip


def gate_inputs(gate: ir.Value, constants: Constants) -> list[ir.Value] | Refusal:
    """The values an activated ``gate``'s pre-activation multiplies by constant weights
    (either side of TF 1's ``Concat(x_t, h)``): a cell step's ``x_t`` and ``h_(t-1)``, for
    a caller that knows neither yet (an unrolled step); [] when no activation computes
    ``gate``, why its pre-activation is not such a sum when one does."""
    if _act_op(gate) is None:
        return []
    linear = _pre_activation(gate, constants)
    if isinstance(linear, Refusal):
        return linear
    sources: list[ir.Value] = []
    for source in linear.weights:
        concat = producer(source, "Concat")
        parts = [source] if concat is None else concat.inputs
        sources += [v for v in parts if v is not None and v not in sources]
    return sources


def zero_state_row(value: ir.Value, h_prev: ir.Value, constants: Constants) -> np.ndarray | None:
    """The row ``value`` equals where ``h_prev`` is zeros, when ``value`` is ``h_prev``'s
    product by constant weights plus constant biases (a hidden projection): its bias
    (zeros without); else None. What an exporter folds a zero state's first step into."""
    linear = _linear(value, constants)
    if isinstance(linear, Refusal) or list(linear.weights) != [h_prev]:
        return None
    weight = linear.weights[h_prev]
    bias = _all_biases(linear)
    width = int(weight.shape[1])
    return np.zeros(width, weight.dtype) if bias is None else np.broadcast_to(bias, (width,))


def prove_cell(
    states: list[tuple[ir.Value, ir.Value]],
    constants: Constants,
    *,
    recurrent_bias: bool = False,
) -> tuple[Cell, tuple[int, ...]] | Refusal:
    """The cell the carried ``(input, output)`` pairs ``states`` compute, and which of
    them is ``h`` (and ``c``): ``(cell, (h_index,))`` or ``(cell, (h_index, c_index))``.

    One carried state: an ``RNN`` or ``GRU`` cell; two: an ``LSTM`` cell (either may be
    ``h``). Any other body form is refused with the reason of the closest attempt.

    ``recurrent_bias``: a bias the step adds to ``h_(t-1)``'s product alone (PyTorch's
    ``b_hh``) is the node's ``Rb``; without, every bias is summed into ``Wb`` (the GRU's
    ``Rb_h`` inside the reset stays apart either way).

    A step that is one node over one step (:mod:`.node_step`) is that node's cell.
    """
    stepped = node_step([(prev, through_identity(out)) for prev, out in states], constants)
    if stepped is not None:
        return stepped if isinstance(stepped, Refusal) else _node_cell(stepped)
    if len(states) == 1:
        ((h_prev, h),) = states
        h = through_identity(h)
        if producer(h, *_ACTS) is not None:
            found = _rnn_cell(h, h_prev, constants, recurrent_bias)
        else:
            found = _gru_cell(h, h_prev, constants, recurrent_bias)
        return found if isinstance(found, Refusal) else (found, (0,))
    if len(states) == 2:
        reasons = []
        for h_index, c_index in ((0, 1), (1, 0)):
            (h_prev, h), (c_prev, c) = states[h_index], states[c_index]
            found = _lstm_cell(
                through_identity(h), through_identity(c), h_prev, c_prev, constants, recurrent_bias
            )
            if not isinstance(found, Refusal):
                return found, (h_index, c_index)
            reasons.append(found)
        return reasons[0]
    return Refusal(
        f"{len(states)} carried values are neither counters nor invariants (a cell carries 1 or 2)"
    )


def _node_cell(step: NodeStep) -> tuple[Cell, tuple[int, ...]]:
    """The :class:`Cell` of a step node, and which state is ``h`` (and ``c``)."""
    cell = Cell(
        step.op_type, step.x, step.w, step.r, step.b, step.activations,
        step.linear_before_reset, h_width_read=True, biased=step.biased,
    )  # fmt: skip
    h_index = step.roles.index("h")
    return cell, (h_index,) if len(step.roles) == 1 else (h_index, step.roles.index("c"))


def step_nodes(outputs: list[ir.Value], stops: set[ir.Value], constants: Constants) -> set[ir.Node]:
    """The nodes computing ``outputs`` from ``stops`` and constants: one step's nodes."""
    nodes: set[ir.Node] = set()
    pending = list(outputs)
    while pending:
        value = pending.pop()
        node = value.producer()
        if value in stops or node is None or node in nodes or constants(value) is not None:
            continue
        nodes.add(node)
        pending += [v for v in node.inputs if v is not None]
    return nodes


def nodes_computing_every(
    outputs: list[ir.Value], stops: set[ir.Value], constants: Constants
) -> set[ir.Node]:
    """The nodes of :func:`step_nodes` that every one of ``outputs`` is computed from.

    Each runs on every run that computes any of ``outputs``, in the graph they are in (an
    ``If`` branch or loop body computing them runs these too), and a runtime that prunes
    one prunes them: what such a node requires to run (``shape.consumers``) holds
    wherever the outputs are computed."""
    common: set[ir.Node] | None = None
    for output in outputs:
        nodes = step_nodes([output], stops, constants)
        common = nodes if common is None else common & nodes
    return common or set()

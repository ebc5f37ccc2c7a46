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
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.rules._graph import producer
from rnn_rewrite_rules.rules.cell.constants import Constants

__all__ = ["DEFAULT_ACTIVATIONS", "ONNX_GATES", "Cell", "prove_cell", "through_identity"]

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
    while node is not None:
        value = node.inputs[0]
        node = producer(value, "Identity")
    return value


@dataclasses.dataclass
class _Linear:
    """``sum_s s @ weights[s] + bias``: a gate's pre-activation, per source value."""

    weights: dict[ir.Value, np.ndarray]  # source -> [in, width]
    bias: np.ndarray | None  # [width]
    #: h_(t-1) is not read by a plain MatMul here (split out of TF 1's Concat(x_t, h), or
    #: the GRU's r * h_(t-1)): its width is not implied by ``R``'s rows
    indirect: bool = False


def _linear(value: ir.Value, constants: Constants) -> _Linear | Refusal:
    """Read ``value`` as a sum of ``MatMul(s, W)`` / ``Gemm`` terms and a constant bias,
    through ``Add`` and column blocks of an axis-1 ``Split``."""
    array = constants(value)
    if array is not None:
        if array.size == 1 and array.ndim <= 2:
            return _Linear({}, array.reshape(()))  # a scalar: broadcast over every column
        if array.ndim == 2 and array.shape[0] == 1:
            array = array[0]
        if array.ndim != 1:
            return Refusal(f"a bias term has shape {list(array.shape)}, not [width] or [1, width]")
        return _Linear({}, array)
    node = value.producer()
    if node is None or node.domain != "":
        return Refusal(f"{value.name} is not a MatMul, Gemm, Add or bias")
    if node.op_type == "Add":
        parts = [_linear(v, constants) for v in node.inputs]
        for part in parts:
            if isinstance(part, Refusal):
                return part
        return _sum(parts)  # type: ignore[arg-type]
    if node.op_type == "MatMul":
        weight = constants(node.inputs[1])
        if weight is None or weight.ndim != 2:
            return Refusal(f"{node.name}'s right operand is not a constant matrix")
        return _Linear({node.inputs[0]: weight}, None)
    if node.op_type == "Gemm":
        a = node.attributes
        if (
            a.get_int("transA", 0)
            or a.get_float("alpha", 1.0) != 1
            or a.get_float("beta", 1.0) != 1
        ):
            return Refusal(f"{node.name} is not v @ W + b (transA, alpha or beta)")
        weight = constants(node.inputs[1])
        if weight is None or weight.ndim != 2:
            return Refusal(f"{node.name}'s weight is not a constant matrix")
        weight = weight.T if a.get_int("transB", 0) else weight
        terms = [_Linear({node.inputs[0]: weight}, None)]
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            bias = _linear(node.inputs[2], constants)
            if isinstance(bias, Refusal) or bias.weights:
                return Refusal(f"{node.name}'s bias is not a constant")
            terms.append(bias)
        return _sum(terms)
    if node.op_type == "Split":
        return _split_block(node, value, constants)
    return Refusal(f"{value.name} is computed by {node.op_type}, not a MatMul, Gemm, Add or bias")


def _sum(parts: list[_Linear]) -> _Linear | Refusal:
    weights: dict[ir.Value, np.ndarray] = {}
    bias = None
    for part in parts:
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
    widths |= {b.shape[0] for b in (bias,) if b is not None and b.ndim}
    if len(widths) > 1:
        return Refusal(f"the terms of a sum have widths {sorted(widths)}")
    return _Linear(weights, bias)


def _split_block(
    node: ir.Node, value: ir.Value, constants: Constants, split: ir.Value | None = None
) -> _Linear | Refusal:
    """Part ``k`` of ``Split(S, axis=1)``: columns of ``S``'s terms (sizes from the
    ``split`` input or attribute, else equal parts). ``split``: read the terms of this
    value instead of the Split's input (the input is an activation of it)."""
    if node.attributes.get_int("axis", 0) not in (1, -1):
        return Refusal(f"{node.name} does not split axis 1")
    whole = _linear(node.inputs[0] if split is None else split, constants)
    if isinstance(whole, Refusal):
        return whole
    width = _width(whole)
    if width is None:
        return Refusal(f"{node.name} splits a value of unknown width")
    sizes_input = node.inputs[1] if len(node.inputs) > 1 else None
    if sizes_input is not None:
        sizes = constants(sizes_input)
        if sizes is None:
            return Refusal(f"{node.name}'s sizes are not constant")
        parts = [int(s) for s in sizes.reshape(-1)]
    elif node.attributes.get("split") is not None:
        parts = list(node.attributes["split"].as_ints())
    else:
        count = len(node.outputs)
        if width % count:
            return Refusal(f"{node.name} splits {width} columns into {count} parts unevenly")
        parts = [width // count] * count
    if sum(parts) != width or len(parts) != len(node.outputs):
        return Refusal(f"{node.name}'s sizes {parts} do not cover {width} columns")
    index = list(node.outputs).index(value)
    start = sum(parts[:index])
    stop = start + parts[index]
    weights = {s: w[:, start:stop] for s, w in whole.weights.items()}
    bias = whole.bias
    if bias is not None and bias.ndim:  # a scalar stays one
        bias = bias[start:stop]
    return _Linear(weights, bias)


def _width(linear: _Linear) -> int | None:
    for weight in linear.weights.values():
        return int(weight.shape[1])
    return None if linear.bias is None or not linear.bias.ndim else int(linear.bias.shape[0])


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

    @property
    def hidden_size(self) -> int:
        return int(self.r.shape[1])

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
    activation = split.inputs[0].producer()
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


def _assemble(
    op_type: str, gates: dict[str, _Linear], h_prev: ir.Value
) -> tuple[ir.Value, np.ndarray, np.ndarray, np.ndarray, bool] | Refusal:
    """(x_t, W, R, B) from each gate's linear terms in ONNX order; every gate reads
    ``h_prev`` and one common ``x_t``."""
    x = None
    w_blocks, r_blocks, b_blocks = [], [], []
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
        r_blocks.append(None if r is None else r.T)
        b_blocks.append(linear.bias)
    assert x is not None and hidden is not None
    arrays = [b for b in w_blocks + r_blocks + b_blocks if b is not None]
    if len({a.dtype for a in arrays}) != 1 or arrays[0].dtype.kind != "f":
        return Refusal("the weights are not all of one floating-point type")
    dtype = arrays[0].dtype
    w_bias = [
        np.zeros(hidden, dtype) if b is None else np.broadcast_to(b, (hidden,)) for b in b_blocks
    ]
    w, r = np.concatenate(w_blocks), np.concatenate(r_blocks)
    return x, w, r, np.concatenate(w_bias), width_read


def _split_concat(linear: _Linear, is_h: Callable[[ir.Value], bool]) -> _Linear | Refusal:
    """``linear`` with a ``MatMul(Concat(x, h, axis=1), W)`` source (TF's ``LSTMCell``,
    ``GRUCell``) read as ``x @ W_x + h @ W_h``: ``W``'s rows split where ``h``'s ``H``
    columns (the gate's width: ``h`` is a state, proven ``[batch, H]``) begin or end."""
    weights: dict[ir.Value, np.ndarray] = {}
    indirect = linear.indirect
    for source, weight in linear.weights.items():
        concat = producer(source, "Concat")
        if concat is None:
            parts = [(source, weight)]
        else:
            if concat.attributes.get_int("axis", 0) not in (1, -1) or len(concat.inputs) != 2:
                return Refusal(f"{concat.name} does not join two values on axis 1")
            hidden, rows = weight.shape[1], weight.shape[0]
            first, second = concat.inputs
            if is_h(first) == is_h(second) or rows <= hidden:
                return Refusal(f"{concat.name} does not join a step input and h_(t-1)")
            cut = hidden if is_h(first) else rows - hidden
            parts = [(first, weight[:cut]), (second, weight[cut:])]
            indirect = True
        for value, part in parts:
            assert value is not None
            if value in weights:
                return Refusal(f"{value.name} is read twice by one gate")
            weights[value] = part
    return _Linear(weights, linear.bias, indirect)


def _gate_linear(
    activated: ir.Value, constants: Constants, name: str, gates: dict[str, _Linear]
) -> Refusal | None:
    """Reads the terms of gate ``name`` (its activated value) into ``gates``."""
    linear = _pre_activation(activated, constants)
    if isinstance(linear, Refusal):
        return Refusal(f"gate {name}: {linear}")
    gates[name] = linear
    return None


def _rnn_cell(h: ir.Value, h_prev: ir.Value, constants: Constants) -> Cell | Refusal:
    """``h_t = act(x_t @ W + h_(t-1) @ R + b)`` with ``act`` Tanh, Relu or Sigmoid."""
    node = _act(h, *_ACTS)
    if node is None:
        return Refusal("h_t is not an activation of a sum (RNN)")
    gates: dict[str, _Linear] = {}
    reason = _gate_linear(h, constants, "h", gates)
    if reason is not None:
        return reason
    found = _assemble("RNN", gates, h_prev)
    if isinstance(found, Refusal):
        return found
    x, w, r, b, width_read = found
    bias = np.concatenate([b, np.zeros_like(b)])
    return Cell("RNN", x, w, r, bias, (node.op_type,), 0, width_read)


def _lstm_cell(
    h: ir.Value, c: ir.Value, h_prev: ir.Value, c_prev: ir.Value, constants: Constants
) -> Cell | Refusal:
    """``c_t = f(f_t) * c_(t-1) + f(i) * g(g_t)``, ``h_t = f(o) * h(c_t)`` with ``f``
    ``g``, ``h`` activations (Sigmoid, Tanh, Tanh by default; Keras' ``activation``)."""
    found = None
    mul = producer(h, "Mul")
    for o, h_c in (mul.inputs, mul.inputs[::-1]) if mul is not None else ():
        outer = _act(h_c, *_ACTS)
        if outer is not None and through_identity(outer.inputs[0]) is c and _act_op(o):
            found = o, outer
            break
    if found is None:
        return Refusal("h_t is not f(o) * h(c_t) (LSTM)")
    f_op = _act_op(found[0])
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
    f_sig = _operands(f_term, gate, _is(c_prev))[0]  # type: ignore[index]
    activations = (f_op, _act_op(ig[1]), found[1].op_type)
    gates: dict[str, _Linear] = {}
    for name, activated in (("i", ig[0]), ("o", found[0]), ("f", f_sig), ("c", ig[1])):
        reason = _gate_linear(activated, constants, name, gates)
        if reason is not None:
            return reason
    assembled = _assemble("LSTM", gates, h_prev)
    if isinstance(assembled, Refusal):
        return assembled
    x, w, r, b, width_read = assembled
    bias = np.concatenate([b, np.zeros_like(b)])
    return Cell("LSTM", x, w, r, bias, activations, 0, width_read)  # type: ignore[arg-type]


def _act_op(value: ir.Value | None) -> str | None:
    """The activation op computing a gate ``value`` (see :func:`_act`), else None."""
    node = _act(value, *_ACTS, split_ok=True)
    return None if node is None else node.op_type


def _activated(value: ir.Value | None) -> bool:
    return _act_op(value) is not None


def _is_one(constants: Constants) -> Callable[[ir.Value | None], bool]:
    def check(value: ir.Value | None) -> bool:
        array = constants(value)
        return array is not None and array.size == 1 and array.ndim <= 1 and float(array) == 1.0

    return check


def _gru_update(
    h: ir.Value, h_prev: ir.Value, constants: Constants
) -> tuple[ir.Value, ir.Value] | Refusal:
    """(z, n) of ``h_t = z * h_(t-1) + (1 - z) * n`` (Keras) or ``(h_(t-1) - n) * z + n``
    (PyTorch), commuted either way."""
    add = producer(h, "Add")
    if add is None:
        return Refusal("h_t is not an Add (GRU)")
    # Keras: Add(Mul(z, h_prev), Mul(Sub(1, z), n))
    muls = [producer(v, "Mul") for v in add.inputs]
    if None not in muls:
        for first, second in (muls, muls[::-1]):
            zh = _operands(first, _activated, _is(h_prev))
            if zh is None:
                continue
            z = zh[0]
            one_minus = _operands(second, lambda v: producer(v, "Sub") is not None, _any)
            if one_minus is None:
                continue
            sub = one_minus[0].producer()
            if sub.inputs[1] is z and _is_one(constants)(sub.inputs[0]):
                return z, one_minus[1]
            one_minus = _operands(second, _any, lambda v: producer(v, "Sub") is not None)
            sub = one_minus[1].producer() if one_minus else None
            if sub is not None and sub.inputs[1] is z and _is_one(constants)(sub.inputs[0]):
                return z, one_minus[0]
    # PyTorch: Add(Mul(Sub(h_prev, n), z), n)
    for mul_value, n in (add.inputs, add.inputs[::-1]):
        found = _operands(
            producer(mul_value, "Mul"), lambda v: producer(v, "Sub") is not None, _activated
        )
        if found is None:
            continue
        sub = found[0].producer()
        if sub.inputs[0] is h_prev and sub.inputs[1] is n:
            return found[1], n
    return Refusal("h_t is not z * h_(t-1) + (1 - z) * n nor (h_(t-1) - n) * z + n (GRU)")


def _gru_cell(h: ir.Value, h_prev: ir.Value, constants: Constants) -> Cell | Refusal:
    """``n = tanh(x_n + r * (h_(t-1) @ R_n + b))`` (linear_before_reset=1) or
    ``tanh(x_n + (r * h_(t-1)) @ R_n + b)`` (0), gates ``r, z`` Sigmoid of sums."""
    found = _gru_update(h, h_prev, constants)
    if isinstance(found, Refusal):
        return found
    z, n = found
    n_node = _act(n, *_ACTS)
    if n_node is None or not _activated(z):
        return Refusal("GRU gates are not f(z) and g(n)")
    activations = (_act_op(z), n_node.op_type)
    gates: dict[str, _Linear] = {}
    reason = _gate_linear(z, constants, "z", gates)
    if reason is not None:
        return reason
    pre = n_node.inputs[0]
    # linear_before_reset=1: pre = x-part + Mul(r, h-part), with the two linear parts
    add = producer(pre, "Add")
    r_value = None
    linear_before_reset = 1
    x_part = h_part = None
    if add is not None:
        for a, b in (add.inputs, add.inputs[::-1]):
            mul = producer(b, "Mul")
            pair = _operands(mul, _activated, _any)
            if pair is not None and producer(pair[1], "MatMul", "Gemm", "Add", "Split"):
                r_value, x_part, h_part = pair[0], a, pair[1]
                break
    if r_value is None:
        # linear_before_reset=0: pre's terms read Mul(r, h_prev) instead of h_prev
        linear_before_reset = 0
        neither = Refusal(
            "n is neither tanh(x_n + r * (h @ R_n + b)) nor tanh(x_n + (r * h) @ R_n + b) (GRU)"
        )
        linear = _linear(pre, constants)
        if isinstance(linear, Refusal):
            return neither

        def reset_h(value: ir.Value) -> bool:
            return _operands(producer(value, "Mul"), _activated, _is(h_prev)) is not None

        linear = _split_concat(linear, reset_h)
        if isinstance(linear, Refusal):
            return neither
        reset = [
            s for s in linear.weights if _operands(producer(s, "Mul"), _activated, _is(h_prev))
        ]
        if len(reset) != 1 or h_prev in linear.weights:
            return neither
        r_value = _operands(reset[0].producer(), _activated, _is(h_prev))[0]  # type: ignore[index]
        weights = {(h_prev if s is reset[0] else s): w for s, w in linear.weights.items()}
        gates["h"] = _Linear(weights, linear.bias, indirect=True)  # (r * h) @ R_n
        rh_bias = None
    else:
        x_linear = _linear(x_part, constants)
        h_linear = _linear(h_part, constants)
        for part in (x_linear, h_linear):
            if isinstance(part, Refusal):
                return Refusal(f"gate h: {part}")
        if h_prev in x_linear.weights or list(h_linear.weights) != [h_prev]:  # type: ignore[union-attr]
            return Refusal("the reset gate multiplies a term that is not h_(t-1) @ R_n + b (GRU)")
        rh_bias = h_linear.bias  # type: ignore[union-attr]
        gates["h"] = _Linear({**x_linear.weights, h_prev: h_linear.weights[h_prev]}, x_linear.bias)  # type: ignore[union-attr]
    if _act_op(r_value) != activations[0]:
        return Refusal("the reset gate's activation is not the update gate's (GRU)")
    reason = _gate_linear(r_value, constants, "r", gates)
    if reason is not None:
        return reason
    assembled = _assemble("GRU", gates, h_prev)
    if isinstance(assembled, Refusal):
        return assembled
    x, w, r, b, width_read = assembled
    hidden = r.shape[1]
    recurrent_bias = np.zeros_like(b)
    if rh_bias is not None:
        recurrent_bias[2 * hidden :] = rh_bias
    bias = np.concatenate([b, recurrent_bias])
    cell = Cell("GRU", x, w, r, bias, activations, linear_before_reset, width_read)  # type: ignore[arg-type]
    return cell


def prove_cell(
    states: list[tuple[ir.Value, ir.Value]], constants: Constants
) -> tuple[Cell, tuple[int, ...]] | Refusal:
    """The cell the carried ``(input, output)`` pairs ``states`` compute, and which of
    them is ``h`` (and ``c``): ``(cell, (h_index,))`` or ``(cell, (h_index, c_index))``.

    One carried state: an ``RNN`` or ``GRU`` cell; two: an ``LSTM`` cell (either may be
    ``h``). Any other body form is refused with the reason of the closest attempt.
    """
    if len(states) == 1:
        ((h_prev, h),) = states
        h = through_identity(h)
        if producer(h, *_ACTS) is not None:
            found = _rnn_cell(h, h_prev, constants)
        else:
            found = _gru_cell(h, h_prev, constants)
        return found if isinstance(found, Refusal) else (found, (0,))
    if len(states) == 2:
        reasons = []
        for h_index, c_index in ((0, 1), (1, 0)):
            (h_prev, h), (c_prev, c) = states[h_index], states[c_index]
            found = _lstm_cell(through_identity(h), through_identity(c), h_prev, c_prev, constants)
            if not isinstance(found, Refusal):
                return found, (h_index, c_index)
            reasons.append(found)
        return reasons[0]
    return Refusal(
        f"{len(states)} carried values are neither counters nor invariants (a cell carries 1 or 2)"
    )

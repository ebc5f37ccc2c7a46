"""Drop initial states that are provably all zeros (the ONNX default) and their shape work.

Pattern: an ``LSTM``/``GRU``/``RNN``/``DynamicQuantizeLSTM`` node whose ``initial_h``
(input 5) or ``initial_c`` (input 6, LSTM) is zeros built at run time or stored, as
exporters write them:

* torchlib: ``Slice(Expand(0.0, Concat([L*D], Shape(x)[batch], [H])), [l*D], [(l+1)*D])``;
* TorchScript: ``ConstantOfShape(Concat([L*D], Unsqueeze(Gather(Shape(x), b)), [H]))``
  (``value`` 0 or absent), sliced per layer;
* tf2onnx / keras: ``Unsqueeze(ConstantOfShape([batch, H]), 0)``, concatenated over
  directions; ``Expand(0, shape)``; ``Mul(finite, 0)``; a zero initializer.

Condition, both proven from constants and the graph's structure only:

1. every element is zero: the value is a zero constant, ``ConstantOfShape`` with a zero
   (or no) ``value``, or ``Slice``/``Expand``/``Identity``/``Cast``/``Unsqueeze``/
   ``Squeeze``/``Reshape``/``Transpose``/``Tile`` of zeros, ``Concat`` of zeros, or
   ``Mul`` of zeros by a provably *finite* tensor (``x * 0`` is NaN for an infinite
   ``x``, so ``Mul(h0_input, 0)`` is not zeros);
2. its shape is ``[D, batch, H]`` (layout 1: ``[batch, D, H]``) with ``batch`` the same
   symbolic dimension as ``X``'s (see ``_shape_algebra.canonical_dim``) or, for a
   static batch declared by the graph input, that number. A zero constant
   ``[D, 1, H]`` fed to a model with a dynamic batch fails at run time for other
   batches; dropping it would hide that frozen axis, so it is left alone.

Replacement: the same RNN node with that input empty (ONNX defines a missing state as
zeros), which lets the ``Shape``/``Concat``/``ConstantOfShape``/``Slice`` chain die.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleSet

from rnn_rewrite_rules._rnn import const_array, rnn_facts
from rnn_rewrite_rules._shape_algebra import (
    Term,
    canonical_dim,
    evaluate,
    node_axes,
    node_ints,
    static_dim,
)
from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._rnn_node import RnnNodeRule, copy_rnn_node, rnn_node_rules

__all__ = [
    "FAMILY",
    "DropZeroInitialState",
    "is_all_zeros",
    "is_finite",
    "rules",
    "state_shape",
]

#: Ops whose output is all zeros whenever their first (data) input is.
_ZERO_PRESERVING = frozenset(
    {"Slice", "Expand", "Identity", "Cast", "Unsqueeze", "Squeeze", "Reshape", "Transpose", "Tile"}
)
#: Ops whose output is finite whenever their first (data) input is.
_FINITE_PRESERVING = _ZERO_PRESERVING - {"Cast"}
_MAX_DEPTH = 12


def _fill_value(node: ir.Node) -> np.ndarray:
    """ConstantOfShape's fill (float32 0 when the attribute is absent)."""
    attr = node.attributes.get("value")
    return np.zeros(1, np.float32) if attr is None else attr.as_tensor().numpy()


def is_all_zeros(value: ir.Value | None, depth: int = 0) -> bool:
    """True when every element of ``value`` is provably zero (never for graph inputs)."""
    if value is None or value.is_graph_input() or depth > _MAX_DEPTH:
        return False
    array = const_array(value)
    if array is not None:
        return bool(np.all(array == 0))
    node = value.producer()
    if node is None or node.domain != "":
        return False
    if node.op_type == "ConstantOfShape":
        return bool(np.all(_fill_value(node) == 0))
    if node.op_type in _ZERO_PRESERVING:
        return is_all_zeros(node.inputs[0], depth + 1)
    if node.op_type == "Concat":
        return all(is_all_zeros(v, depth + 1) for v in node.inputs)
    if node.op_type == "Mul":
        a, b = node.inputs[:2]
        return (is_all_zeros(a, depth + 1) and is_finite(b, depth + 1)) or (
            is_all_zeros(b, depth + 1) and is_finite(a, depth + 1)
        )
    return False


def is_finite(value: ir.Value | None, depth: int = 0) -> bool:
    """True when no element of ``value`` can be inf or NaN (never for float graph inputs)."""
    if value is None or depth > _MAX_DEPTH:
        return False
    if value.is_graph_input():
        return value.dtype is not None and value.dtype.is_integer()
    array = const_array(value)
    if array is not None:
        return array.dtype.kind in "iub" or bool(np.all(np.isfinite(array)))
    node = value.producer()
    if node is None or node.domain != "":
        return False
    if node.op_type in ("Shape", "Size"):
        return True
    if node.op_type == "ConstantOfShape":
        return bool(np.all(np.isfinite(_fill_value(node))))
    if node.op_type in _FINITE_PRESERVING:
        return is_finite(node.inputs[0], depth + 1)
    if node.op_type == "Concat":
        return all(is_finite(v, depth + 1) for v in node.inputs)
    return False


def _broadcast(a: list[Term] | None, b: list[Term] | None) -> list[Term] | None:
    """Numpy broadcasting of two symbolic shapes, when it is provable."""
    if a is None or b is None:
        return None
    one = Term(1)
    a, b = [one] * (len(b) - len(a)) + a, [one] * (len(a) - len(b)) + b
    result = []
    for x, y in zip(a, b, strict=True):
        if x in (one, y):
            result.append(y)
        elif y == one:
            result.append(x)
        else:
            return None
    return result


def _slice_shape(node: ir.Node, shape: list[Term]) -> list[Term] | None:
    if len(node.inputs) == 1:  # Slice-1 (opset < 10): attributes
        get = node.attributes.get
        starts, ends = get("starts"), get("ends")
        if starts is None or ends is None:
            return None
        starts, ends = list(starts.as_ints()), list(ends.as_ints())
        axes = list(get("axes").as_ints()) if get("axes") is not None else list(range(len(starts)))
        steps = [1] * len(starts)
    else:
        starts, ends = node_ints(node.inputs[1]), node_ints(node.inputs[2])
        n = len(starts or [])
        axes = (
            node_ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else list(range(n))
        )
        steps = node_ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] else [1] * n
    if None in (starts, ends, axes, steps) or not len(starts) == len(ends) == len(axes) == len(
        steps
    ):
        return None
    result = list(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis += len(shape) if axis < 0 else 0
        if not 0 <= axis < len(shape):
            return None
        dim = shape[axis]
        if dim.is_constant:
            result[axis] = Term(len(range(dim.coef)[slice(start, end, step)]))
        elif not (start == 0 and end >= 2**31 - 1 and step == 1):
            return None
    return result


def state_shape(value: ir.Value | None, depth: int = 0) -> list[Term] | None:
    """The symbolic shape of a (zero) state tensor, or None if it cannot be proven."""
    if value is None or depth > _MAX_DEPTH or value.is_graph_input():
        return None
    array = const_array(value)
    if array is not None:
        return [Term(int(d)) for d in array.shape]
    node = value.producer()
    if node is None or node.domain != "":
        return None
    op_type, inputs = node.op_type, node.inputs

    def inner(index: int = 0) -> list[Term] | None:
        return state_shape(inputs[index], depth + 1) if len(inputs) > index else None

    if op_type in ("Identity", "Cast"):
        return inner()
    if op_type == "ConstantOfShape":
        terms = evaluate(inputs[0])
        return None if terms is None else list(terms)
    if op_type == "Expand":
        terms = evaluate(inputs[1])
        return _broadcast(inner(), None if terms is None else list(terms))
    if op_type == "Mul":
        return _broadcast(inner(0), inner(1))
    shape = inner()
    if shape is None:
        return None
    if op_type == "Slice":
        return _slice_shape(node, shape)
    if op_type == "Transpose":
        perm = node.attributes.get("perm")
        perm = list(perm.as_ints()) if perm is not None else list(reversed(range(len(shape))))
        return [shape[p] for p in perm] if sorted(perm) == list(range(len(shape))) else None
    if op_type in ("Unsqueeze", "Squeeze"):
        axes = node_axes(node, 1)
        if axes is None:
            return None
        if op_type == "Unsqueeze":
            rank = len(shape) + len(axes)
            axes = sorted(a + rank if a < 0 else a for a in axes)
            result = list(shape)
            for a in axes:
                result.insert(a, Term(1))
            return result
        axes = {a + len(shape) if a < 0 else a for a in axes}
        if any(shape[a] != Term(1) for a in axes if 0 <= a < len(shape)):
            return None
        return [d for i, d in enumerate(shape) if i not in axes]
    if op_type == "Reshape":
        terms = evaluate(inputs[1])
        if terms is None or node.attributes.get_int("allowzero", 0):
            return None
        result = []
        for i, t in enumerate(terms):
            if t.is_constant and t.coef == 0 and i < len(shape):
                result.append(shape[i])
            elif t.is_constant and t.coef < 0:
                return None
            else:
                result.append(t)
        return result
    if op_type == "Tile":
        repeats = node_ints(inputs[1]) if len(inputs) > 1 else None
        if repeats is None or len(repeats) != len(shape):
            return None
        if any(r != 1 and not d.is_constant for d, r in zip(shape, repeats, strict=True)):
            return None
        return [d if r == 1 else Term(d.coef * r) for d, r in zip(shape, repeats, strict=True)]
    if op_type == "Concat":
        shapes = [shape] + [state_shape(v, depth + 1) for v in inputs[1:]]
        axis = node.attributes.get_int("axis", 0)
        axis += len(shape) if axis < 0 else 0
        if any(s is None or len(s) != len(shape) for s in shapes) or not 0 <= axis < len(shape):
            return None
        if not all(s[axis].is_constant for s in shapes):
            return None
        result = list(shape)
        result[axis] = Term(sum(s[axis].coef for s in shapes))
        return result
    return None


def _shape_reason(node: ir.Node, state: ir.Value) -> str | None:
    """None when ``state`` provably has the shape the node requires, else why not."""
    facts = rnn_facts(node)
    if isinstance(facts, str):
        return facts
    x = node.inputs[0]
    if x is None:
        return "the node has no X"
    batch_axis = 0 if facts.layout == 1 else 1
    batch = canonical_dim(x, batch_axis)
    static = static_dim(x, batch_axis)
    d, h = Term(facts.num_directions), Term(facts.hidden_size)
    shape = state_shape(state)
    if shape is None:
        return "cannot prove the zero state's shape"
    expected = [batch, d, h] if facts.layout == 1 else [d, batch, h]
    state_batch = shape[batch_axis] if len(shape) == 3 else None
    ok_batch = state_batch == batch or (static is not None and state_batch == Term(static))
    if (
        len(shape) != 3
        or not ok_batch
        or [shape[i] for i in range(3) if i != batch_axis]
        != [t for i, t in enumerate(expected) if i != batch_axis]
    ):
        return "the zero state's shape is not provably [D, batch of X, H] (a frozen axis?)"
    return None


def _state_indices(op_type: str) -> tuple[int, ...]:
    return (5, 6) if op_type in ("LSTM", "DynamicQuantizeLSTM") else (5,)


class DropZeroInitialState(RnnNodeRule):
    """RNN(..., initial_h=zeros, initial_c=zeros) -> RNN(..., "", "")."""

    def check_node(self, context, node: ir.Node) -> MatchResult:
        check_result = MatchResult()
        inputs = node.inputs
        candidates = [
            i for i in _state_indices(self.op_type) if i < len(inputs) and inputs[i] is not None
        ]
        zeros = [i for i in candidates if is_all_zeros(inputs[i])]
        if not zeros:
            return check_result.fail("no initial state is a provable all-zero tensor")
        self._zero_states = []
        for i in zeros:
            reason = _shape_reason(node, inputs[i])
            if reason is not None:
                return check_result.fail(reason, inputs[i])
            self._zero_states.append(i)
        return check_result

    def rewrite(self, op, out0: ir.Value, **_):
        node = self.node(out0)
        return copy_rnn_node(op, node, self.num_outputs, dict.fromkeys(self._zero_states))


rules = RewriteRuleSet(rnn_node_rules(DropZeroInitialState))

FAMILY = RuleFamily(
    name="initial_state",
    description=(__doc__ or "").partition("\n")[0],
    rule_set=rules,
    install_by_default=True,
    # tract 0.23.9 panics (``UndeterminedSymbol("batch")``) on an LSTM/GRU without
    # ``initial_h`` when the batch axis is symbolic, though ONNX defines the missing state as
    # zeros; ``portable=True`` leaves the exporter's zero states in place for such runtimes.
    portable=False,
    fixes=(),
)

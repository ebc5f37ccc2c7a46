"""Symbolic evaluation of small int64 shape computations.

Each element of a shape tensor is a :class:`Term`: an integer coefficient times a
product of symbolic dimensions. A symbolic dimension is ``(value, axis)`` after
looking through ``Transpose`` and ``Identity``, so ``Shape(Transpose(Y))[1]`` and
``Shape(Y)[2]`` are the same dimension. Dimensions an RNN node fixes statically
(``num_directions`` and ``hidden_size`` of its ``Y``) are replaced by integers.

Only ops whose integer semantics are exact are evaluated: ``Shape``, ``Slice``
(step 1), ``Gather``, ``Concat``, ``Unsqueeze``, ``Squeeze``, ``Reshape`` to 1-D,
``Mul``, ``Cast`` to int32/int64, ``Identity`` and constants. Anything else makes
the result unknown (``None``), so a caller can only ever prove too little.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._rnn import const_array, rnn_facts

__all__ = [
    "Dim",
    "Term",
    "canonical_dim",
    "evaluate",
    "node_axes",
    "node_ints",
    "rank_of",
    "static_dim",
]

#: A symbolic dimension: (value, axis), compared by value identity.
Dim = tuple[ir.Value, int]

_MAX_DEPTH = 16


@dataclasses.dataclass(frozen=True)
class Term:
    """``coef * prod(dims)``; ``dims`` sorted so that equal products compare equal."""

    coef: int
    dims: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def dim(d: Dim) -> Term:
        return Term(1, ((id(d[0]), d[1]),))

    def __mul__(self, other: Term) -> Term:
        return Term(self.coef * other.coef, tuple(sorted(self.dims + other.dims)))

    @property
    def is_constant(self) -> bool:
        return not self.dims

    def divide(self, other: Term) -> Term | None:
        """``self / other`` when it is provably a product of dims, else None."""
        if other.coef == 0 or self.coef % other.coef:
            return None
        remaining = list(self.dims)
        for d in other.dims:
            if d not in remaining:
                return None
            remaining.remove(d)
        return Term(self.coef // other.coef, tuple(remaining))


def rank_of(value: ir.Value) -> int | None:
    """Rank from a Transpose perm, an RNN output, Squeeze/Unsqueeze/Reshape, a constant or shape."""
    node = value.producer()
    if node is not None and node.domain == "" and node.op_type == "Transpose":
        perm = node.attributes.get("perm")
        if perm is not None:
            return len(perm.as_ints())
    if node is not None and not isinstance(rnn_facts(node), str):
        return 4 if value is node.outputs[0] else 3
    if node is not None and node.domain == "" and node.op_type in ("Squeeze", "Unsqueeze"):
        axes = node_axes(node, 1)
        inner = rank_of(node.inputs[0]) if node.inputs[0] is not None else None
        if axes is not None and inner is not None:
            return inner + (len(axes) if node.op_type == "Unsqueeze" else -len(axes))
    if node is not None and node.domain == "" and node.op_type == "Reshape":
        target = node_ints(node.inputs[1]) if len(node.inputs) > 1 else None
        if target is not None:
            return len(target)
    array = const_array(value)
    if array is not None:
        return array.ndim
    if value.shape is not None:
        return len(value.shape)
    return None


def canonical_dim(value: ir.Value, axis: int) -> Term:
    """The dimension ``axis`` of ``value``, looking through shape-preserving ops to RNN facts.

    Followed back: ``Identity``, ``Transpose``, ``Squeeze``/``Unsqueeze`` with constant axes,
    ``Reshape`` elements that are a constant ``0`` (copy) or a positive constant, ``Concat``
    on another axis, and RNN outputs (``seq``/``batch`` are those of ``X``; ``D`` and ``H``
    are integers). Each step is a fact the runtime enforces, so equal terms are equal sizes.
    """
    for _ in range(_MAX_DEPTH):
        step = _dim_source(value, axis)
        if step is None:
            break
        if isinstance(step, Term):
            return step
        value, axis = step
    return Term.dim((value, axis))


def static_dim(value: ir.Value, axis: int) -> int | None:
    """The size of ``axis`` when :func:`canonical_dim` ends at a static int or at a graph
    input whose declared shape has an int there (the runtime rejects other inputs)."""
    for _ in range(_MAX_DEPTH):
        step = _dim_source(value, axis)
        if step is None:
            break
        if isinstance(step, Term):
            return step.coef if step.is_constant else None
        value, axis = step
    if value.is_graph_input() and value.shape is not None and 0 <= axis < len(value.shape):
        dim = value.shape[axis]
        return dim if isinstance(dim, int) else None
    return None


def _dim_source(value: ir.Value, axis: int) -> tuple[ir.Value, int] | Term | None:
    """Where dimension ``axis`` of ``value`` comes from, one node back (None: nowhere known)."""
    node = value.producer()
    if node is None:
        return None
    facts = rnn_facts(node)
    if not isinstance(facts, str):
        x = node.inputs[0]
        if x is None:
            return None
        # layout 0: Y [seq, D, batch, H], Y_h/Y_c [D, batch, H]
        # layout 1: Y [batch, seq, D, H], Y_h/Y_c [batch, D, H]
        if value is node.outputs[0]:
            sources = (
                [(x, 0), facts.num_directions, (x, 1), facts.hidden_size]
                if facts.layout == 0
                else [(x, 0), (x, 1), facts.num_directions, facts.hidden_size]
            )
        else:
            sources = (
                [facts.num_directions, (x, 1), facts.hidden_size]
                if facts.layout == 0
                else [(x, 0), facts.num_directions, facts.hidden_size]
            )
        if not 0 <= axis < len(sources):
            return None
        source = sources[axis]
        return Term(source) if isinstance(source, int) else source
    if node.domain != "" or not node.inputs or node.inputs[0] is None:
        return None
    data = node.inputs[0]
    if node.op_type in ("Identity", "Cast", "Relu", "Tanh", "Sigmoid", "Neg"):
        return data, axis
    if node.op_type == "Dropout" and value is node.outputs[0]:
        return data, axis
    if node.op_type == "Transpose":
        perm = node.attributes.get("perm")
        if perm is None or not 0 <= axis < len(perm.as_ints()):
            return None
        return data, perm.as_ints()[axis]
    if node.op_type in ("Squeeze", "Unsqueeze"):
        axes = node_axes(node, 1)
        rank = rank_of(value)
        if axes is None or rank is None or not 0 <= axis < rank:
            return None
        if node.op_type == "Unsqueeze":
            axes = sorted(a + rank if a < 0 else a for a in axes)
            if axis in axes:
                return Term(1)
            return data, axis - sum(1 for a in axes if a < axis)
        inner = rank + len(axes)
        kept = [a for a in range(inner) if a not in {b + inner if b < 0 else b for b in axes}]
        return data, kept[axis]
    if node.op_type == "Reshape":
        terms = evaluate(node.inputs[1]) if len(node.inputs) > 1 else None
        if terms is None or not 0 <= axis < len(terms):
            return None
        term = terms[axis]
        if not term.is_constant:
            return term  # a dimension the target copied from some Shape: already canonical
        if term.coef == 0 and not node.attributes.get_int("allowzero", 0):
            return data, axis
        return term if term.coef > 0 else None
    if node.op_type == "Concat":
        concat_axis = node.attributes.get_int("axis", 0)
        rank = rank_of(value)
        if rank is None or (concat_axis + rank if concat_axis < 0 else concat_axis) == axis:
            return None
        return data, axis
    return None


@dataclasses.dataclass(frozen=True)
class _Shape:
    """An evaluated int tensor of rank 0 or 1."""

    terms: tuple[Term, ...]
    scalar: bool = False


def node_ints(value: ir.Value | None) -> list[int] | None:
    """A constant int tensor of rank <= 1 as a list (None if not constant)."""
    array = const_array(value)
    if array is None or array.dtype.kind not in "iu" or array.ndim > 1:
        return None
    return [int(v) for v in np.atleast_1d(array)]


def _attr_ints(node: ir.Node, name: str) -> list[int] | None:
    attr = node.attributes.get(name)
    return None if attr is None else list(attr.as_ints())


def node_axes(node: ir.Node, index: int) -> list[int] | None:
    """Axes from input ``index`` (opset >= 13) or the ``axes`` attribute."""
    if len(node.inputs) > index and node.inputs[index] is not None:
        return node_ints(node.inputs[index])
    return _attr_ints(node, "axes")


def _shape_op(node: ir.Node, _inputs: Callable) -> _Shape | None:
    data = node.inputs[0]
    rank = rank_of(data)
    if rank is None:
        return None
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", rank)
    start, end = (max(0, min(rank, v + rank if v < 0 else v)) for v in (start, end))
    return _Shape(tuple(canonical_dim(data, axis) for axis in range(start, end)))


def _slice(node: ir.Node, inputs: Callable) -> _Shape | None:
    (data,) = inputs(1)
    if len(node.inputs) == 1:  # Slice-1 (opset < 10): attributes
        starts, ends = _attr_ints(node, "starts"), _attr_ints(node, "ends")
        axes, steps = _attr_ints(node, "axes") or [0], [1]
    else:
        starts, ends = node_ints(node.inputs[1]), node_ints(node.inputs[2])
        has = len(node.inputs) > 3 and node.inputs[3] is not None
        axes = node_ints(node.inputs[3]) if has else [0]
        has = len(node.inputs) > 4 and node.inputs[4] is not None
        steps = node_ints(node.inputs[4]) if has else [1]
    if None in (data, starts, ends, axes, steps) or data.scalar:
        return None
    if len(starts) != 1 or len(ends) != 1 or axes not in ([0], [-1]) or steps != [1]:
        return None
    return _Shape(data.terms[starts[0] : ends[0]])  # Python slicing clamps as ONNX does


def _gather(node: ir.Node, inputs: Callable) -> _Shape | None:
    (data,) = inputs(1)
    indices = const_array(node.inputs[1])
    if data is None or data.scalar or indices is None or indices.ndim > 1:
        return None
    if node.attributes.get_int("axis", 0) not in (0, -1):
        return None
    n = len(data.terms)
    picked = []
    for index in np.atleast_1d(indices).tolist():
        index = int(index) + (n if index < 0 else 0)
        if not 0 <= index < n:
            return None
        picked.append(data.terms[index])
    return _Shape(tuple(picked), scalar=indices.ndim == 0)


def _concat(node: ir.Node, inputs: Callable) -> _Shape | None:
    parts = inputs(len(node.inputs))
    if any(p is None or p.scalar for p in parts):
        return None
    return _Shape(tuple(t for p in parts for t in p.terms))


def _unsqueeze(node: ir.Node, inputs: Callable) -> _Shape | None:
    (data,) = inputs(1)
    if data is None or not data.scalar or node_axes(node, 1) not in ([0], [-1]):
        return None
    return _Shape(data.terms)


def _squeeze(node: ir.Node, inputs: Callable) -> _Shape | None:
    (data,) = inputs(1)
    if (
        data is None
        or data.scalar
        or len(data.terms) != 1
        or node_axes(node, 1) not in ([0], [-1], None)
    ):
        return None
    return _Shape(data.terms, scalar=True)


def _reshape(node: ir.Node, inputs: Callable) -> _Shape | None:
    (data,) = inputs(1)
    target = node_ints(node.inputs[1])
    if data is None or target is None or len(target) != 1:
        return None
    if target[0] not in (-1, len(data.terms)):
        return None
    return _Shape(data.terms)


def _mul(node: ir.Node, inputs: Callable) -> _Shape | None:
    a, b = inputs(2)
    if a is None or b is None:
        return None
    if len(a.terms) == 1 and len(b.terms) != 1:
        a, b = b, a
    if len(b.terms) == 1:
        return _Shape(tuple(t * b.terms[0] for t in a.terms), scalar=a.scalar and b.scalar)
    if len(a.terms) != len(b.terms):
        return None
    return _Shape(
        tuple(x * y for x, y in zip(a.terms, b.terms, strict=True)), scalar=a.scalar and b.scalar
    )


def _same(node: ir.Node, inputs: Callable) -> _Shape | None:
    if node.op_type == "Cast" and node.attributes.get_int("to", 0) not in (
        ir.DataType.INT64,
        ir.DataType.INT32,
    ):
        return None
    return inputs(1)[0]


_EVALUATORS = {
    "Shape": _shape_op,
    "Slice": _slice,
    "Gather": _gather,
    "Concat": _concat,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Reshape": _reshape,
    "Mul": _mul,
    "Cast": _same,
    "Identity": _same,
}


def _evaluate(value: ir.Value | None, depth: int) -> _Shape | None:
    if value is None or depth > _MAX_DEPTH:
        return None
    array = const_array(value)
    if array is not None and not value.is_graph_input():
        if array.dtype.kind not in "iu" or array.ndim > 1:
            return None
        return _Shape(tuple(Term(int(v)) for v in np.atleast_1d(array)), scalar=array.ndim == 0)
    node = value.producer()
    if node is None or node.domain != "" or node.op_type not in _EVALUATORS:
        return None
    if node.op_type == "Concat" and node.attributes.get_int("axis", 0) not in (0, -1):
        return None

    def inputs(n: int) -> list[_Shape | None]:
        return [_evaluate(v, depth + 1) for v in node.inputs[:n]]

    return _EVALUATORS[node.op_type](node, inputs)


def evaluate(value: ir.Value | None) -> tuple[Term, ...] | None:
    """The symbolic elements of a 1-D int shape tensor, or None if unprovable."""
    result = _evaluate(value, 0)
    if result is None or result.scalar:
        return None
    return result.terms

"""Graph helpers the rule families share.

Reading: a node's producer of one op type, an optional input, constant int lists,
Squeeze/Unsqueeze axes (attribute before opset 13, input after), one-axis Slice
parameters, and whether two values are one computation written twice. Emitting:
Squeeze/Unsqueeze/Slice in the form of the graph's opset, and constants (int64 lists,
arrays) whose new names collide with no value of the model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._compat import Builder
from rnn_rewrite_rules._ir import (
    const_array,
    free_name,
    fresh_name,
    input_at,
    same_bits,
    taken_names,
)
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.rules._initializers import array_constant, cached_ints, int64_constant

__all__ = [
    "Ints",
    "array_constant",
    "cached_ints",
    "const_ints",
    "free_name",
    "fresh_name",
    "int64_constant",
    "producer",
    "read_axes",
    "same_attribute",
    "same_attributes",
    "same_value",
    "slice_",
    "slice_bounds",
    "slice_params",
    "squeeze",
    "taken_names",
    "unsqueeze",
]

#: Makes the int64 1-D constant of a list (what a rewrite's Squeeze axes and Slice bounds read).
Ints = Callable[[list[int]], ir.Value]


def producer(value: ir.Value | None, *op_types: str) -> ir.Node | None:
    """The producer of ``value`` when it is a default-domain node of one of ``op_types``."""
    node = None if value is None else value.producer()
    if node is None or node.domain != "" or node.op_type not in op_types:
        return None
    return node


def const_ints(value: ir.Value | None) -> list[int] | None:
    """A constant int tensor of rank <= 1 as a list (None if not constant)."""
    array = const_array(value)
    if array is None or array.dtype.kind not in "iu" or array.ndim > 1:
        return None
    return [int(v) for v in np.atleast_1d(array)]


#: Standard ops whose output is not a function of their inputs and attributes alone.
_RANDOM = frozenset(
    {
        "Bernoulli",
        "Dropout",
        "Multinomial",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
    }
)
#: How many producers deep ``same_value`` compares two computations.
SAME_VALUE_DEPTH = 16


def same_value(a: ir.Value | None, b: ir.Value | None, depth: int = SAME_VALUE_DEPTH) -> bool:
    """``a`` and ``b`` hold the same tensor whatever the graph's inputs are.

    True when they are one value, two constants of one type, shape and bits (``+0.0`` is
    not ``-0.0``: ``_ir.same_bits``), or the
    same output of two default-domain nodes of one deterministic op (no random op, no
    graph attribute) with equal attributes whose inputs are pairwise the same value, at
    most ``depth`` producers deep. Exporters write one computation twice (the input of a
    forward and of a reverse half, a Cast or broadcast per layer); common-subexpression
    elimination would merge them, but it rewrites the user's whole graph, while a rule
    needs only this proof about its own inputs.
    """
    return _same(a, b, depth, {})


def _same(
    a: ir.Value | None, b: ir.Value | None, depth: int, memo: dict[tuple[int, int], bool]
) -> bool:
    if a is b:
        return a is not None
    if a is None or b is None:
        return False
    key = (id(a), id(b))
    if key in memo:
        return memo[key]
    memo[key] = False  # a cycle (impossible in a valid graph) proves nothing
    memo[key] = result = _same_uncached(a, b, depth, memo)
    return result


def _same_uncached(a: ir.Value, b: ir.Value, depth: int, memo: dict[tuple[int, int], bool]) -> bool:
    first, second = const_array(a), const_array(b)
    if first is not None or second is not None:
        return first is not None and second is not None and same_bits(first, second)
    x, y = a.producer(), b.producer()
    if depth <= 0 or x is None or y is None or a.index() != b.index():
        return False
    if (x.domain, x.op_type, x.overload) != (y.domain, y.op_type, y.overload):
        return False
    if x.domain not in ("", "ai.onnx") or x.op_type in _RANDOM:
        return False
    if len(x.inputs) != len(y.inputs) or not same_attributes(x, y):
        return False
    return all(_same(u, v, depth - 1, memo) for u, v in zip(x.inputs, y.inputs, strict=True))


def same_attributes(x: ir.Node, y: ir.Node) -> bool:
    """``x`` and ``y`` have the same attributes of equal values (never graphs or a
    function's attribute references, which are not values here)."""
    if set(x.attributes) != set(y.attributes):
        return False
    return all(same_attribute(attr, y.attributes[name]) for name, attr in x.attributes.items())


def same_attribute(attr: ir.Attr, other: ir.Attr) -> bool:
    """Two attributes of one type and value: tensors and floats by their bits
    (``_ir.same_bits``: ``clip=0.0`` is not ``clip=-0.0``); never graphs or a function's
    attribute references, which are not values here."""
    if attr.is_ref() or other.is_ref() or attr.type != other.type:
        return False
    kind = attr.type
    if kind in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
        return False
    if kind in (ir.AttributeType.TENSOR, ir.AttributeType.TENSORS):
        tensors = [attr.value] if kind == ir.AttributeType.TENSOR else list(attr.value)
        others = [other.value] if kind == ir.AttributeType.TENSOR else list(other.value)
        return len(tensors) == len(others) and all(
            t.dtype == o.dtype and same_bits(t.numpy(), o.numpy())
            for t, o in zip(tensors, others, strict=True)
        )
    if kind in (ir.AttributeType.FLOAT, ir.AttributeType.FLOATS):
        return same_bits(np.asarray(attr.value, np.float64), np.asarray(other.value, np.float64))
    return attr.value == other.value


def read_axes(
    node: ir.Node, ints: Callable[[ir.Value], list[int] | None] = const_ints
) -> list[int] | None:
    """Squeeze/Unsqueeze axes: the ``axes`` attribute (opset < 13), else input 1 as
    ``ints`` reads it (a constant by default; a rule passes its prover's ``ints``)."""
    attr = node.attributes.get("axes")
    if attr is not None:
        return list(attr.as_ints())
    value = input_at(node, 1)
    return None if value is None else ints(value)


def slice_bounds(
    node: ir.Node, ints: Callable[[ir.Value], list[int] | None] = const_ints
) -> tuple[int, int, int, int] | Refusal:
    """(start, end, axis, step) of a one-axis Slice with constant bounds, any opset: the
    attributes (opset < 10), else inputs 1-4 as ``ints`` reads them (a constant by default;
    a rule passes its prover's ``ints``)."""
    if node.attributes.get("starts") is not None:  # opset < 10: attributes
        starts: list[int] | None = list(node.attributes["starts"].as_ints())
        ends_attr = node.attributes.get("ends")
        ends = list(ends_attr.as_ints()) if ends_attr is not None else None
        axes_attr = node.attributes.get("axes")
        axes = list(axes_attr.as_ints()) if axes_attr is not None else None
        steps: list[int] | None = [1]
    else:
        start_value, end_value = input_at(node, 1), input_at(node, 2)
        if start_value is None or end_value is None:
            return Refusal("the Slice has no starts or ends")
        starts, ends = ints(start_value), ints(end_value)
        if starts is None or ends is None:
            return Refusal("the Slice's bounds are not constant")
        axes_value, steps_value = input_at(node, 3), input_at(node, 4)
        axes = None if axes_value is None else ints(axes_value)
        steps = [1] * len(starts) if steps_value is None else ints(steps_value)
        if (axes_value is not None and axes is None) or steps is None:
            return Refusal("the Slice's axes or steps are not constant")
    if starts is None or ends is None or steps is None:
        return Refusal("the Slice has no starts or ends")
    if axes is None:
        axes = list(range(len(starts)))
    if not len(starts) == len(ends) == len(axes) == len(steps) == 1:
        return Refusal("the Slice does not slice exactly one axis")
    return starts[0], ends[0], axes[0], steps[0]


def slice_params(node: ir.Node) -> tuple[int, int, int, int] | None:
    """:func:`slice_bounds` of an opset >= 10 Slice with constant inputs, else None."""
    bounds = slice_bounds(node) if len(node.inputs) >= 3 else None
    return None if isinstance(bounds, Refusal) else bounds


def squeeze(op: Builder, value: ir.Value, axes: list[int], opset: int, ints: Ints) -> ir.Value:
    """``Squeeze(value, axes)``: axes an input from opset 13, an attribute before."""
    if opset >= 13:
        return op.Squeeze(value, ints(axes))
    return op.Squeeze(value, axes=axes)


def slice_(
    op: Builder,
    value: ir.Value,
    starts: list[int],
    ends: list[int],
    axes: list[int],
    opset: int,
    ints: Ints,
) -> ir.Value:
    """``Slice(value, starts, ends, axes)``: inputs from opset 10, attributes before."""
    if opset >= 10:
        return op.Slice(value, ints(starts), ints(ends), ints(axes))
    return op.Slice(value, starts=starts, ends=ends, axes=axes)


def unsqueeze(op: Builder, value: ir.Value, axes: list[int], opset: int, ints: Ints) -> ir.Value:
    """``Unsqueeze(value, axes)``: axes an input from opset 13, an attribute before."""
    if opset >= 13:
        return op.Unsqueeze(value, ints(axes))
    return op.Unsqueeze(value, axes=axes)

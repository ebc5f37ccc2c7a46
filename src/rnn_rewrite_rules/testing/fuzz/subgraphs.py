"""Builders of the subgraph surroundings: ``If`` and ``Loop`` nodes around a model's
values, and conditions that depend on optional inputs present at run time.

The mutators of :mod:`.surroundings` draw their arguments; the regression tests call them
with fixed ones.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules.testing.fuzz.case import Graph

__all__ = [
    "add_if",
    "add_loop_rank_check",
    "add_rank_if_two_outputs",
    "add_signed_zero_guards",
    "declare_scan_output",
    "narrow_cast_condition",
    "signed_zero_condition",
    "signed_zero_read",
    "slice_axes_condition",
    "split_sizes_condition",
    "squeeze_axes_condition",
    "wrap_in_if",
    "wrap_in_loop",
]

_I64 = TensorProto.INT64


def _branch(g: Graph, ops: list[str], value: str, elem: int) -> onnx.GraphProto:
    """A graph whose outputs are ``op(value)``, one per op."""
    names = [g.fresh() for _ in ops]
    pairs = zip(ops, names, strict=True)
    nodes = [helper.make_node(op, [value], [n], name=g.fresh()) for op, n in pairs]
    infos = [helper.make_tensor_value_info(n, elem, None) for n in names]
    return helper.make_graph(nodes, g.fresh(), [], infos)


def add_if(
    model: onnx.ModelProto,
    cond: str,
    value: str,
    elem: int,
    rank: int,
    *,
    ops: tuple[str, str] = ("Identity", "Neg"),
    at: int | None = None,
) -> str:
    """``If(cond, ops[0](value), ops[1](value))`` as a new graph output of ``elem`` and
    ``rank``, appended or inserted at node index ``at``; returns its name."""
    g = Graph(model)
    out = g.fresh()
    node = helper.make_node(
        "If",
        [cond],
        [out],
        name=g.fresh(),
        then_branch=_branch(g, [ops[0]], value, elem),
        else_branch=_branch(g, [ops[1]], value, elem),
    )
    model.graph.node.insert(len(model.graph.node) if at is None else at, node)
    return g.output(out, elem, rank)


def add_rank_if_two_outputs(
    model: onnx.ModelProto, source: str, source_rank: int, value: str, elem: int, rank: int
) -> list[str]:
    """``If(Size(Shape(source)) == source_rank)`` whose then-branch returns one value,
    ``Identity(value)``, for both of its outputs (the else-branch ``Neg``, ``Abs``)."""
    g = Graph(model)
    size = g.one("Size", g.one("Shape", source))
    cond = g.one("Equal", size, g.const(np.array(source_rank, np.int64)))
    then_branch = _branch(g, ["Identity"], value, elem)
    shared = then_branch.output[0].name
    then_branch.output.append(helper.make_tensor_value_info(shared, elem, None))
    outs = [g.fresh(), g.fresh()]
    model.graph.node.append(
        helper.make_node(
            "If",
            [cond],
            outs,
            name=g.fresh(),
            then_branch=then_branch,
            else_branch=_branch(g, ["Neg", "Abs"], value, elem),
        )
    )
    return [g.output(out, elem, rank) for out in outs]


def add_loop_rank_check(
    model: onnx.ModelProto, value: str, elem: int, rank: int, declared: int
) -> str:
    """A one-trip ``Loop`` carrying ``value`` whose body input declares rank ``declared``;
    the body returns ``If(Size(Shape(v)) == declared, Identity(v), Neg(v))``."""
    g = Graph(model)
    it, cond_in, v_in, cond_out, v_out = (g.fresh() for _ in range(5))
    rank_name, shape, size, check = (g.fresh() for _ in range(4))
    constant = numpy_helper.from_array(np.array(declared, np.int64), g.fresh())
    nodes = [
        helper.make_node("Identity", [cond_in], [cond_out], name=g.fresh()),
        helper.make_node("Constant", [], [rank_name], name=g.fresh(), value=constant),
        helper.make_node("Shape", [v_in], [shape], name=g.fresh()),
        helper.make_node("Size", [shape], [size], name=g.fresh()),
        helper.make_node("Equal", [size, rank_name], [check], name=g.fresh()),
        helper.make_node(
            "If",
            [check],
            [v_out],
            name=g.fresh(),
            then_branch=_branch(g, ["Identity"], v_in, elem),
            else_branch=_branch(g, ["Neg"], v_in, elem),
        ),
    ]
    dims = [f"{v_in}_{k}" for k in range(declared)]
    body = helper.make_graph(
        nodes,
        g.fresh(),
        [
            helper.make_tensor_value_info(it, _I64, []),
            helper.make_tensor_value_info(cond_in, TensorProto.BOOL, []),
            helper.make_tensor_value_info(v_in, elem, dims),
        ],
        [
            helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []),
            helper.make_tensor_value_info(v_out, elem, None),
        ],
    )
    trips = g.const(np.array(1, np.int64))
    out = g.fresh()
    model.graph.node.append(
        helper.make_node("Loop", [trips, "", value], [out], name=g.fresh(), body=body)
    )
    return g.output(out, elem, rank)


def slice_axes_condition(g: Graph, dims: list[int], axis: int) -> tuple[str, dict]:
    """``Shape(Slice(ones(dims), [0], [1], axes))[axis] == dims[axis]`` with ``axes`` a
    graph input fed ``[axis]`` (false at run time when ``dims[axis] > 1``; absent axes
    would slice axis 0 and make it true). Returns the condition and the fixed feeds."""
    t = g.const(np.ones(dims, np.float32))
    axes = g.input(g.fresh(), _I64, [1])
    zero, one = g.const(np.array([0], np.int64)), g.const(np.array([1], np.int64))
    sliced = g.one("Slice", t, zero, one, axes)
    size = g.one("Gather", g.one("Shape", sliced), g.const(np.array(axis, np.int64)))
    cond = g.one("Equal", size, g.const(np.array(dims[axis], np.int64)))
    return cond, {axes: np.array([axis], np.int64)}


def squeeze_axes_condition(g: Graph, dims: list[int]) -> tuple[str, dict]:
    """``rank(Squeeze(Unsqueeze(ones(dims), [0, 1]), axes)) == len(dims) + 1`` with
    ``axes`` a graph input fed ``[0]`` (true at run time; absent axes squeeze more)."""
    t = g.const(np.ones(dims, np.float32))
    axes = g.input(g.fresh(), _I64, [1])
    wider = g.one("Unsqueeze", t, g.const(np.array([0, 1], np.int64)))
    rank = g.one("Size", g.one("Shape", g.one("Squeeze", wider, axes)))
    cond = g.one("Equal", rank, g.const(np.array(len(dims) + 1, np.int64)))
    return cond, {axes: np.array([0], np.int64)}


def split_sizes_condition(g: Graph, length: int) -> tuple[str, dict]:
    """``Shape(Split(ones(length), sizes)[0])[0] == 1`` with ``sizes`` a graph input fed
    ``[1, length - 1]`` (true at run time; an even split would make it false)."""
    t = g.const(np.ones(length, np.float32))
    sizes = g.input(g.fresh(), _I64, [2])
    first = g.node("Split", [t, sizes], n_out=2, axis=0)[0]
    size = g.one("Gather", g.one("Shape", first), g.const(np.array(0, np.int64)))
    cond = g.one("Equal", size, g.const(np.array(1, np.int64)))
    return cond, {sizes: np.array([1, length - 1], np.int64)}


def narrow_cast_condition(g: Graph, small: int) -> tuple[str, dict]:
    """``Cast(2**32 + small, to=int32) == small`` (true: the Cast wraps)."""
    wide = g.const(np.array(2**32 + small, np.int64))
    narrow = g.one("Cast", wide, to=TensorProto.INT32)
    return g.one("Equal", narrow, g.const(np.array(small, np.int32))), {}


def signed_zero_condition(g: Graph, zero: float) -> str:
    """``Less(Div(1, zero), 0)``: true for ``-0.0``, false for ``+0.0`` (two constants
    that ``==`` calls equal and that are not one value)."""
    zero_name = g.one("Constant", value=numpy_helper.from_array(np.array(zero, np.float32)))
    one = g.one("Constant", value=numpy_helper.from_array(np.array(1.0, np.float32)))
    return g.one("Less", g.one("Div", one, zero_name), zero_name)


def add_signed_zero_guards(
    model: onnx.ModelProto, value: str, elem: int, rank: int, zeros: tuple[float, float]
) -> str:
    """``Concat(If(c0, value, Neg(value)), If(c1, value, Neg(value)), axis=0)`` with
    ``ck = Less(Div(1, zeros[k]), 0)``, as a new graph output of ``elem`` and ``rank``:
    two guards that ``MergeGuards`` may fuse only when the zeros have the same sign."""
    g = Graph(model)
    guards = []
    for zero in zeros:
        cond = signed_zero_condition(g, zero)
        out = g.fresh()
        model.graph.node.append(
            helper.make_node(
                "If",
                [cond],
                [out],
                name=g.fresh(),
                then_branch=_branch(g, ["Identity"], value, elem),
                else_branch=_branch(g, ["Neg"], value, elem),
            )
        )
        guards.append(out)
    return g.output(g.one("Concat", *guards, axis=0), elem, rank)


def signed_zero_read(model: onnx.ModelProto, node: onnx.NodeProto, value: str, zero: float):
    """``node`` reads ``Where(Less(Div(1, zero), 0), value, Neg(value))`` (``value`` for
    ``-0.0``, ``-value`` for ``+0.0``) in place of ``value``, computed right before it."""
    g = Graph(model)
    start = len(model.graph.node)
    cond = signed_zero_condition(g, zero)
    source = g.one("Where", cond, value, g.one("Neg", value))
    added = list(model.graph.node[start:])
    del model.graph.node[start:]
    at = list(model.graph.node).index(node)
    for offset, new in enumerate(added):
        model.graph.node.insert(at + offset, new)
    node.input[:] = [source if name == value else name for name in node.input]


def declare_scan_output(body: onnx.GraphProto, index: int, dims: list | None) -> None:
    """The body output ``index`` declared ``dims`` (None: no type at all, and the body's
    carried inputs and value_info untyped too: nothing for inference to start from)."""
    output = body.output[index]
    if dims is None:
        output.CopyFrom(helper.make_empty_tensor_value_info(output.name))
        for value in body.input[2:]:
            value.CopyFrom(helper.make_empty_tensor_value_info(value.name))
        del body.value_info[:]
    else:
        elem = output.type.tensor_type.elem_type
        output.CopyFrom(helper.make_tensor_value_info(output.name, elem, dims))


def _one_zero_like(g: Graph, info: onnx.ValueInfoProto) -> onnx.GraphProto:
    """A branch returning zeros of one element with ``info``'s type and rank."""
    tensor = info.type.tensor_type
    rank = len(tensor.shape.dim) if tensor.HasField("shape") else 1
    zeros = np.zeros([1] * rank, helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    out = g.fresh()
    node = helper.make_node(
        "Constant", [], [out], name=g.fresh(), value=numpy_helper.from_array(zeros)
    )
    return helper.make_graph([node], g.fresh(), [], [_retyped(info, out, 0)])


def wrap_in_if(model: onnx.ModelProto, pick: str) -> None:
    """The whole main graph moved into the then-branch of ``If(pick)`` (a new bool graph
    input); the else-branch returns zeros of one element per output."""
    g = Graph(model)
    graph = model.graph
    then = helper.make_graph(list(graph.node), g.fresh(), [], list(graph.output))
    branches = [_one_zero_like(g, info) for info in graph.output]
    orelse = helper.make_graph(
        [n for b in branches for n in b.node], g.fresh(), [], [b.output[0] for b in branches]
    )
    outs = [g.fresh() for _ in graph.output]
    node = helper.make_node(
        "If", [pick], outs, name=g.fresh(), then_branch=then, else_branch=orelse
    )
    infos = [_retyped(o, name, 0) for o, name in zip(graph.output, outs, strict=True)]
    del graph.node[:]
    graph.node.append(node)
    del graph.output[:]
    graph.output.extend(infos)
    graph.input.append(helper.make_tensor_value_info(pick, TensorProto.BOOL, []))


def wrap_in_loop(model: onnx.ModelProto) -> None:
    """The whole main graph moved into the body of a one-trip ``Loop``: each output is
    stacked once more (one more leading axis)."""
    g = Graph(model)
    graph = model.graph
    it, cond_in, cond_out = g.fresh(), g.fresh(), g.fresh()
    body = helper.make_graph(
        [*graph.node, helper.make_node("Identity", [cond_in], [cond_out], name=g.fresh())],
        g.fresh(),
        [
            helper.make_tensor_value_info(it, _I64, []),
            helper.make_tensor_value_info(cond_in, TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []), *graph.output],
    )
    trips = g.const(np.array(1, np.int64))
    go = g.const(np.array(True))
    outs = [g.fresh() for _ in graph.output]
    infos = [_retyped(o, name, 1) for o, name in zip(graph.output, outs, strict=True)]
    del graph.node[:]
    graph.node.append(helper.make_node("Loop", [trips, go], outs, name=g.fresh(), body=body))
    del graph.output[:]
    graph.output.extend(infos)


def _retyped(info: onnx.ValueInfoProto, name: str, more_axes: int) -> onnx.ValueInfoProto:
    """``info``'s element type under ``name``, its rank plus ``more_axes``, sizes unknown."""
    tensor = info.type.tensor_type
    rank = len(tensor.shape.dim) + more_axes if tensor.HasField("shape") else None
    return helper.make_tensor_value_info(
        name, tensor.elem_type, None if rank is None else [None] * rank
    )

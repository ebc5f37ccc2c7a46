"""Hostile near misses for the shape prover's new proofs, each against ONNX Runtime:

* ``Slice`` with starts and ends computed at run time keeps the sizes of the axes they do
  not slice (explicit, negative, reordered axes; negative and larger steps; repeated axes
  prove nothing): the kept sizes are the output's at random bounds and sizes, 0 included;
* an ``If`` output whose branches differ (another rank, a number, a branch whose Reshape
  fails) is named by the ``If``'s own axes, never by one branch's sizes;
* ``Transpose``'s ``perm`` on an input of unknown rank proves no rank: ONNX Runtime's
  optimiser cancels a Transpose pair it cannot check, so such a graph runs at another rank.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.normalize import Journal, ProvenSliceBoundsPass
from rnn_rewrite_rules.shape import ShapeProver


def _ints(name: str, values: list[int]) -> onnx.NodeProto:
    tensor = numpy_helper.from_array(np.array(values, np.int64), name)
    return helper.make_node("Constant", [], [name], value=tensor)


def _model(nodes: list, inputs: list, outputs: list[str]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "hostile",
        inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


SLICES = [
    (None, None, 1),
    (None, None, 2),
    ([-1], None, 1),
    ([0, 2], None, 2),
    ([2, 0], [1, -1], 2),
    ([-3], [2], 1),
    ([1, -1], None, 2),
    (None, [-1, 1], 2),
]


@pytest.mark.parametrize(("axes", "steps", "count"), SLICES)
def test_a_slice_with_computed_bounds_keeps_the_axes_it_does_not_slice(axes, steps, count):
    nodes, names = [], ["x", "starts", "ends"]
    if axes is not None or steps is not None:
        nodes.append(_ints("axes", axes if axes is not None else list(range(count))))
        names.append("axes")
    if steps is not None:
        nodes.append(_ints("steps", steps))
        names.append("steps")
    nodes.append(helper.make_node("Slice", names, ["y"]))
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["A", "B", "C"]),
        helper.make_tensor_value_info("starts", TensorProto.INT64, [count]),
        helper.make_tensor_value_info("ends", TensorProto.INT64, [count]),
    ]
    model = _model(nodes, inputs, ["y"])
    graph = ir.serde.deserialize_model(model).graph
    dims = ShapeProver(graph).dims(graph.outputs[0])
    assert dims is not None and len(dims) == 3
    sliced = {a % 3 for a in (axes if axes is not None else range(count))}
    kept = {}
    for axis, dim in enumerate(dims):
        symbol = None if dim is None else dim.symbol
        if symbol is not None and symbol.value is graph.inputs[0]:
            kept[axis] = symbol.axis
    assert kept == {a: a for a in range(3) if a not in sliced}
    session = runtime.session(model)
    rng = np.random.default_rng(count)
    for _ in range(40):
        shape = tuple(int(s) for s in rng.integers(0, 5, 3))
        feeds = {
            "x": np.zeros(shape, np.float32),
            "starts": rng.integers(-6, 6, count),
            "ends": rng.integers(-6, 6, count),
        }
        (y,) = session.run(None, feeds)
        assert all(y.shape[a] == shape[k] for a, k in kept.items()), (feeds, y.shape)


def test_repeated_axes_prove_nothing() -> None:
    nodes = [_ints("axes", [1, -2]), helper.make_node("Slice", ["x", "s", "e", "axes"], ["y"])]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["A", "B", "C"]),
        helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        helper.make_tensor_value_info("e", TensorProto.INT64, [2]),
    ]
    graph = ir.serde.deserialize_model(_model(nodes, inputs, ["y"])).graph
    assert ShapeProver(graph).dims(graph.outputs[0]) is None


ELSE_BRANCHES = {
    "rank_2": [_ints("a0", [0]), helper.make_node("ReduceSum", ["x", "a0"], ["e"], keepdims=0)],
    "batch_3": [
        helper.make_node(
            "Constant", [], ["e"], value=numpy_helper.from_array(np.zeros((2, 3, 5), np.float32))
        )
    ],
    "reshape_fails": [
        _ints("target", [7, -1, 3]),
        helper.make_node("Reshape", ["x", "target"], ["e"]),
    ],
}


def _if_model(else_nodes: list) -> onnx.ModelProto:
    then = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        else_nodes, "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)]
    )
    nodes = [helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "B", 5]),
        helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
    ]
    return _model(nodes, inputs, ["y"])


@pytest.mark.parametrize("name", sorted(ELSE_BRANCHES))
def test_an_if_whose_branches_differ_is_named_by_its_own_axes(name: str) -> None:
    model = _if_model(ELSE_BRANCHES[name])
    graph = ir.serde.deserialize_model(model).graph
    prover = ShapeProver(graph)
    y = graph.outputs[0]
    dims = prover.dims(y)
    x = graph.inputs[0]
    if dims is not None:  # never x's sizes: the else branch gives others
        assert all(d is None or d.symbol is None or d.symbol.value is not x for d in dims[:2])
    then_dims, _ = prover.branch_dims(y)
    assert then_dims is not None and then_dims[1] == prover.dim(x, 1)
    for flag in (True, False):
        feeds = {"x": np.zeros((4, 2, 5), np.float32), "flag": np.array(flag)}
        try:
            (out,) = runtime.run(model, feeds)
        except Exception:  # the failing branch
            assert name == "reshape_fails" and not flag
            continue
        assert dims is None or len(dims) == out.ndim


def _transpose_pair() -> onnx.ModelProto:
    """``x`` of no declared rank through two Transposes, the length of ``Shape`` of the
    result bounding a Slice of ``v``."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
        helper.make_node("Transpose", ["t"], ["u"], perm=[1, 0, 2]),
        helper.make_node("Relu", ["u"], ["y"]),
        helper.make_node("Shape", ["y"], ["shape"]),
        helper.make_node("Shape", ["shape"], ["rank"]),
        _ints("zero", [0]),
        helper.make_node("Slice", ["v", "zero", "rank"], ["out"]),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, [5]),
    ]
    return _model(nodes, inputs, ["out", "y"])


def test_transpose_perm_on_an_input_of_unknown_rank_proves_no_rank() -> None:
    """The premise: with graph optimisations on, ONNX Runtime runs the pair at rank 2
    (off, and in onnx.reference, it fails); so ``Shape(Shape(y))`` is not the constant
    ``[3]`` and ProvenSliceBoundsPass leaves the Slice's end computed."""
    model = _transpose_pair()
    feeds = {"x": np.ones((2, 3), np.float32), "v": np.arange(5, dtype=np.float32)}
    out, _ = runtime.run(model, feeds, optimize=True)
    assert out.shape == (2,)
    graph = ir.serde.deserialize_model(model).graph
    rank = next(n for n in graph if n.op_type == "Slice").inputs[2]
    assert ShapeProver(graph).ints(rank) is None
    ir_model = ir.serde.deserialize_model(model)
    ProvenSliceBoundsPass(Journal())(ir_model)
    after = ir.serde.serialize_model(ir_model)
    assert runtime.run(after, feeds, optimize=True)[0].shape == (2,)

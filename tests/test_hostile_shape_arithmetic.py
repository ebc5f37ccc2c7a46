"""Hostile near misses for the shape prover's integer arithmetic, through
``ProvenSliceBoundsPass`` (which writes a proven Slice bound as a constant): arithmetic
that wraps at run time (int64 past ``2**63``, int32 past ``2**31``, int8 past 127) must not
be proven the exact integer, and arithmetic that does not wrap still is.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.normalize import Journal, ProvenSliceBoundsPass
from rnn_rewrite_rules.shape import Dim, ShapeProver

#: name -> (bound element type, the ops computing ``end`` from ``w`` (x's width, 8), in
#: that type, as (op, inputs, constant operand)); the last one's output is ``end``.
CASES = {
    # 8 * 2**61 is 0 in int64: the Slice reads 0, not 8
    "int64_mul_wraps": (np.int64, [("Mul", 2**61), ("Div", 2**61)]),
    # 8 * 2**28 is -2**31 in int32: -8 after the Div
    "int32_mul_wraps": (np.int32, [("Mul", 2**28), ("Div", 2**28)]),
    # 8 + 120 is -128 in int8: the Slice reads nothing, not the whole row
    "int8_add_wraps": (np.int8, [("Add", 120)]),
    # INT64_MAX + 8 is negative: the Slice reads nothing, not the whole row
    "int64_max_plus": (np.int64, [("Add", 2**63 - 1)]),
    # wraps and unwraps: the ring's arithmetic, 8 either way
    "int64_add_sub": (np.int64, [("Add", 2**63 - 4), ("Sub", 2**63 - 4)]),
    # no wrap: proven (the pass writes 8 // 2 * 2 - 1 = 7)
    "int64_exact": (np.int64, [("Div", 2), ("Mul", 2), ("Sub", 1)]),
}


def _constant(name: str, values: list[int], dtype: type) -> onnx.NodeProto:
    tensor = numpy_helper.from_array(np.array(values, dtype), name)
    return helper.make_node("Constant", [], [name], name=f"{name}_node", value=tensor)


def _model(dtype: type, steps: list[tuple[str, int]]) -> onnx.ModelProto:
    """``y = x[:, 0:end]`` with ``end`` computed from ``Shape(x)[1]`` (8) by ``steps`` in
    ``dtype``, cast to int64 for the Slice."""
    to = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [
        _constant("one", [1], np.int64),
        _constant("zero", [0], np.int64),
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "one"], ["w64"], name="width", axis=0),
        helper.make_node("Cast", ["w64"], ["v0"], name="narrow", to=to),
    ]
    for k, (op, operand) in enumerate(steps):
        nodes.append(_constant(f"c{k}", [operand], dtype))
        nodes.append(helper.make_node(op, [f"v{k}", f"c{k}"], [f"v{k + 1}"], name=f"{op}_{k}"))
    nodes.append(
        helper.make_node("Cast", [f"v{len(steps)}"], ["end"], name="widen", to=TensorProto.INT64)
    )
    nodes.append(helper.make_node("Slice", ["x", "zero", "end", "one"], ["y"], name="slice"))
    graph = helper.make_graph(
        nodes,
        "hostile_arithmetic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _passed(model: onnx.ModelProto) -> onnx.ModelProto:
    ir_model = ir.serde.deserialize_model(model)
    ProvenSliceBoundsPass(Journal())(ir_model)
    return ir.serde.serialize_model(ir_model)


def _end(model: onnx.ModelProto) -> list[int] | None:
    ir_model = ir.serde.deserialize_model(model)
    (end,) = next(n for n in ir_model.graph if n.name == "widen").outputs
    return ShapeProver(ir_model.graph).ints(end)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("batch", [0, 1, 3])
def test_the_pass_keeps_what_the_slice_reads(name: str, batch: int) -> None:
    """The Slice after the pass gives the original's output in onnx.reference, and in ONNX
    Runtime where it runs the element type's arithmetic."""
    dtype, steps = CASES[name]
    model = _model(dtype, steps)
    after = _passed(model)
    feeds = {"x": np.arange(batch * 8, dtype=np.float32).reshape(batch, 8)}
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    (got,) = ReferenceEvaluator(after).run(None, feeds)
    np.testing.assert_array_equal(got, want)
    if dtype is not np.int8:  # ONNX Runtime's CPU Add has no int8 kernel
        (want,) = runtime.run(model, feeds)
        (got,) = runtime.run(after, feeds)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("name", "proven"),
    [
        ("int64_mul_wraps", None),
        ("int32_mul_wraps", None),
        ("int8_add_wraps", None),
        ("int64_max_plus", None),
        ("int64_add_sub", None),
        ("int64_exact", [7]),
    ],
)
def test_wrapping_arithmetic_is_not_proven(name: str, proven: list[int] | None) -> None:
    """Without the bound, the first three were proven 8 (the Slice then read the whole
    row where the original reads none, or all but the last 8)."""
    dtype, steps = CASES[name]
    assert _end(_model(dtype, steps)) == proven


@pytest.mark.parametrize("name", ["int64_mul_wraps", "int32_mul_wraps", "int64_max_plus"])
def test_the_slice_of_a_wrapping_bound_is_not_proven_whole(name: str) -> None:
    """The prover's size of the sliced axis: not 8 (the original's is 0 there)."""
    dtype, steps = CASES[name]
    graph = ir.serde.deserialize_model(_model(dtype, steps)).graph
    (y,) = graph.outputs
    assert ShapeProver(graph).dim(y, 1) != Dim.const(8)


def _width(*nodes: onnx.NodeProto) -> list[onnx.NodeProto]:
    """``w = Shape(x)[1:2]`` (8), then ``nodes`` computing ``end``."""
    shape = helper.make_node("Shape", ["x"], ["shape"])
    return [
        shape,
        _constant("i1", [1], np.int64),
        helper.make_node("Gather", ["shape", "i1"], ["w"]),
        *nodes,
    ]


_H = helper.make_node
#: Bound computations the pass proves or leaves, each against ONNX Runtime (``end`` 1-D).
BOUNDS = {
    "shape_start_end": [_H("Shape", ["x"], ["end"], start=-1)],  # opset 15's Shape slice
    "gather_negative": _width(
        _constant("im1", [-1], np.int64), _H("Gather", ["shape", "im1"], ["end"])
    ),
    "empty": [_H("Shape", ["scalar"], ["end"])],
    "div_truncates": _width(
        _H("Neg", ["w"], ["n"]), _constant("k", [3], np.int64), _H("Div", ["n", "k"], ["end"])
    ),
    "sub_then_div": _width(
        _constant("k", [10], np.int64),
        _H("Sub", ["w", "k"], ["n"]),
        _constant("k3", [3], np.int64),
        _H("Div", ["n", "k3"], ["end"]),
    ),
    "max_negative": _width(_constant("k", [-4], np.int64), _H("Max", ["w", "k"], ["end"])),
    "neg": _width(_H("Neg", ["w"], ["end"])),
}


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_computed_bounds_against_onnx_runtime(name: str) -> None:
    nodes = [*BOUNDS[name], _constant("start", [0], np.int64), _constant("axis", [1], np.int64)]
    operands = ["end", "end"] if name == "empty" else ["start", "end", "axis"]  # no axis
    nodes.append(_H("Slice", ["x", *operands], ["y"]))
    graph = helper.make_graph(
        nodes,
        "bounds",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
            helper.make_tensor_value_info("scalar", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    after = _passed(model)
    for batch in (0, 1, 3):
        feeds = {
            "x": np.arange(batch * 8, dtype=np.float32).reshape(batch, 8),
            "scalar": np.array(1, np.float32),
        }
        for optimize in (False, True):
            (want,) = runtime.run(model, feeds, optimize=optimize)
            (got,) = runtime.run(after, feeds, optimize=optimize)
            np.testing.assert_array_equal(got, want)

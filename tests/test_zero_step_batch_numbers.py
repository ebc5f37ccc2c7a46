"""The numbers ONNX's inference may know for a Loop's ``X`` batch (``loop_scan.zero_step``).

A main-graph input's symbolic size gives none; an axis a ``Transpose``, ``Identity`` or a
``Slice`` of other axes reads gives what the axis read gives; an ``If`` output's size
only a number every bounded branch gives. A ``Slice`` of the axis itself, or of a
negative axis, bounds nothing (None): the zero-step guard is then refused.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules.rules.loop_scan.zero_step import _inferred_numbers
from rnn_rewrite_rules.shape import Dim, ShapeProver


def _model(nodes: list[onnx.NodeProto], batch: int | str = "B") -> ir.Model:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", batch, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [x], [y])
    return ir.serde.deserialize_model(helper.make_model(graph))


def _const(name: str, values: list[int]) -> onnx.NodeProto:
    array = numpy_helper.from_array(np.array(values, np.int64))
    return helper.make_node("Constant", [], [name], value=array)


def _slice(axes: list[int]) -> list[onnx.NodeProto]:
    return [
        _const("starts", [0] * len(axes)),
        _const("ends", [2] * len(axes)),
        _const("axes", axes),
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"]),
    ]


def _numbers(model: ir.Model, axis: int = 1) -> frozenset[int] | None:
    (y,) = model.graph.outputs
    return _inferred_numbers(Dim.sym(y, axis), model, ShapeProver(model.graph))


@pytest.mark.parametrize(
    ("nodes", "axis"),
    [
        ([helper.make_node("Identity", ["x"], ["y"])], 1),
        ([helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0, 2])], 0),
        (_slice([0]), 1),  # a Slice of the steps keeps the batch
        (_slice([0, 2]), 1),
    ],
)
def test_an_axis_read_from_a_symbolic_input_size_gives_no_number(
    nodes: list[onnx.NodeProto], axis: int
) -> None:
    assert _numbers(_model(nodes), axis) == frozenset()


def test_an_input_size_that_is_a_number_gives_it() -> None:
    assert _numbers(_model(_slice([0]), batch=1)) == frozenset({1})


@pytest.mark.parametrize("axes", [[1], [-2], [0, -1]])
def test_a_slice_of_the_axis_or_of_a_negative_axis_bounds_nothing(axes: list[int]) -> None:
    assert _numbers(_model(_slice(axes))) is None


def test_a_transpose_without_perm_bounds_nothing() -> None:
    assert _numbers(_model([helper.make_node("Transpose", ["x"], ["y"])])) is None

"""``normalize.mul_by_ones``: ``Mul(v, ConstantOfShape(Shape(v), value=1))`` (Keras 2's
dropout mask at inference, ``h * ones_like(h)``) and ``Mul(v, 1)`` read as ``v``.

Small graphs: the pass bypasses the products of ones of ``v``'s own shape and type, and
keeps every near miss (a two, the shape of another value, part of the shape, ones of
another type). The Keras 2 ``LSTM(recurrent_dropout=0.2)`` tf2onnx writes becomes one
LSTM with the original's outputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.normalize import MulByOnesPass
from tests.exporter_files import DATA
from tests.exporter_support import assert_same_on_sequences
from tests.test_cell_update_spellings import op_counts


def _model(ones: list[onnx.NodeProto], ones_name: str = "ones") -> onnx.ModelProto:
    """``y = Relu(Mul(v, ones))``, ``v = Relu(x)``, ``x`` and ``w`` float ``[B, 3]``."""
    nodes = [
        helper.make_node("Relu", ["x"], ["v"]),
        *ones,
        helper.make_node("Mul", ["v", ones_name], ["product"]),
        helper.make_node("Relu", ["product"], ["y"]),
    ]
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", 3]) for name in ("x", "w")
    ]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 3])
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _like(of: str = "v", value: float = 1.0, dtype=np.float32, **shape_attrs):
    return [
        helper.make_node("Shape", [of], ["shape"], **shape_attrs),
        helper.make_node(
            "ConstantOfShape",
            ["shape"],
            ["ones"],
            value=numpy_helper.from_array(np.array([value], dtype)),
        ),
    ]


def _scalar(value: float = 1.0, shape: tuple[int, ...] = ()):
    array = numpy_helper.from_array(np.full(shape, value, np.float32))
    return [helper.make_node("Constant", [], ["ones"], value=array)]


def _bypassed(model: onnx.ModelProto) -> bool:
    ir_model = ir.serde.deserialize_model(model)
    changed = MulByOnesPass()(ir_model).modified
    assert changed == all(n.op_type != "Mul" for n in ir_model.graph)
    return changed


@pytest.mark.parametrize("ones", [_like(), _scalar()], ids=["ones_like", "scalar_one"])
def test_a_product_by_ones_of_its_shape_is_the_value(ones) -> None:
    model = _model(ones)
    assert _bypassed(model)
    result = ir.serde.serialize_model(_apply(model))
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)}
    feeds["w"] = feeds["x"]
    for want, got in zip(runtime.run(model, feeds), runtime.run(result, feeds), strict=True):
        np.testing.assert_array_equal(got, want)


def _apply(model: onnx.ModelProto) -> ir.Model:
    ir_model = ir.serde.deserialize_model(model)
    MulByOnesPass()(ir_model)
    return ir_model


@pytest.mark.parametrize(
    "ones",
    [
        _like(value=2.0),  # twos
        _like(of="w"),  # ones of another value's shape: may broadcast v
        _like(start=1),  # ones of part of v's shape
        _like(dtype=np.float64),  # another type (the original fails)
        _scalar(2.0),
        _scalar(1.0, (1, 3)),  # a constant of a shape: may broadcast v
    ],
    ids=["two", "other_shape", "shape_start", "float64", "scalar_two", "row_of_ones"],
)
def test_near_misses_keep_the_product(ones) -> None:
    assert not _bypassed(_model(ones))


def test_the_keras2_recurrent_dropout_lstm_becomes_one_lstm() -> None:
    path = DATA / "tf2onnx_keras2" / "lstm_recurrent_dropout.onnx"
    model = onnx.load(path)
    assert op_counts(model)["ConstantOfShape"] >= 1 and op_counts(model)["LSTM"] == 0
    result = rnn_rewrite_rules.rewrite(model)
    assert op_counts(result)["LSTM"] == 1
    assert_same_on_sequences(model, result)

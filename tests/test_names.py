"""Rewrites never take a name that is in use, never reuse an overridable initializer, and
never emit an op form that is invalid where it lands (a function at another opset)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import rnn_rewrite_rules
from rnn_rewrite_rules.rules import layer_output
from tests.reasons import refusal_reasons

H = 4


def _body(opset: int) -> list[onnx.NodeProto]:
    """LSTM -> Transpose -> Reshape by a target computed from Shape (torchlib's layer output)."""
    return [
        helper.make_node("LSTM", ["x", "w", "r"], ["y", "yh", "yc"], hidden_size=H),
        helper.make_node("Transpose", ["y"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Shape", ["t"], ["s"]),
        helper.make_node(
            "Constant", [], ["idx"], value=numpy_helper.from_array(np.array([0, 1], np.int64))
        ),
        helper.make_node("Gather", ["s", "idx"], ["sb"], axis=0),
        helper.make_node(
            "Constant", [], ["h"], value=numpy_helper.from_array(np.array([H], np.int64))
        ),
        helper.make_node("Concat", ["sb", "h"], ["target"], axis=0),
        helper.make_node("Reshape", ["t", "target"], ["out"]),
    ]


def _weights() -> list[onnx.TensorProto]:
    rng = np.random.default_rng(0)
    return [
        numpy_helper.from_array(rng.standard_normal((1, 4 * H, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((1, 4 * H, H)).astype(np.float32), "r"),
    ]


def _x() -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", "b", 3])


def _out() -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("out", TensorProto.FLOAT, ["s", "b", H])


def _function_model(function_opset: int, model_opset: int) -> onnx.ModelProto:
    fn = helper.make_function(
        "local", "F", ["x", "w", "r"], ["out"], _body(function_opset),
        [helper.make_opsetid("", function_opset)],
    )  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("F", ["x", "w", "r"], ["out"], domain="local")],
        "g",
        [_x()],
        [_out()],
        _weights(),
    )
    opsets = [helper.make_opsetid("", model_opset), helper.make_opsetid("local", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[fn])
    model.ir_version = 9
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]


def test_rewrite_inside_a_function_at_the_models_opset() -> None:
    model = _function_model(11, 11)
    after = rnn_rewrite_rules.rewrite(model)
    ops = [n.op_type for n in after.functions[0].node]
    assert ops == ["LSTM", "Squeeze"], ops
    assert [a.name for a in after.functions[0].node[1].attribute] == ["axes"]  # opset 11 form
    x = np.random.default_rng(1).standard_normal((2, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(_run(after, x), _run(model, x), atol=1e-6)


def test_function_at_another_opset_than_the_model_is_left_alone() -> None:
    """ONNX Runtime inlines the function at the model's opset 18, where Squeeze's opset-11
    ``axes`` attribute is invalid; the opset-18 form is invalid at 11."""
    model = _function_model(11, 18)
    after = rnn_rewrite_rules.rewrite(model)
    assert [n.op_type for n in after.functions[0].node] == [n.op_type for n in _body(11)]
    assert any(
        "imports opset 11" in r and "the model 18" in r
        for r in refusal_reasons(layer_output.FAMILY.rules, model)
    )
    x = np.random.default_rng(2).standard_normal((4, 2, 3)).astype(np.float32)
    np.testing.assert_allclose(_run(after, x), _run(model, x), atol=1e-6)


def _main_graph_model(extra_input: onnx.ValueInfoProto, extra_init=None) -> onnx.ModelProto:
    """A bidirectional layer (its rewrite needs a new [0, 0, 2H] initializer)."""
    body = _body(18)
    body[0] = helper.make_node(
        "LSTM", ["x", "w", "r"], ["y", "yh", "yc"], hidden_size=H, direction="bidirectional"
    )
    body[5] = helper.make_node(
        "Constant", [], ["h"], value=numpy_helper.from_array(np.array([2 * H], np.int64))
    )
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((2, 4 * H, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((2, 4 * H, H)).astype(np.float32), "r"),
    ]
    if extra_init is not None:
        weights.append(extra_init)
    body.append(helper.make_node("Identity", [extra_input.name], ["echo"]))
    outputs = [
        helper.make_tensor_value_info("out", TensorProto.FLOAT, ["s", "b", 2 * H]),
        helper.make_tensor_value_info("echo", TensorProto.INT64, [3]),
    ]
    graph = helper.make_graph(body, "g", [_x(), extra_input], outputs, weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


TARGET_NAME = "rnn_rewrite_rules_0_0_8"


@pytest.mark.parametrize("overridable", [False, True], ids=["graph input", "overridable init"])
def test_new_initializer_never_takes_or_reuses_an_input_name(overridable) -> None:
    """A graph input (or an initializer listed as one, with the very same values) that is
    named like the constant a rewrite makes: it is neither reused nor shadowed."""
    extra = helper.make_tensor_value_info(TARGET_NAME, TensorProto.INT64, [3])
    init = None
    if overridable:
        init = numpy_helper.from_array(np.array([0, 0, 2 * H], np.int64), TARGET_NAME)
    model = _main_graph_model(extra, init)
    after = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(after, full_check=True)
    reshape = next(n for n in after.graph.node if n.op_type == "Reshape")
    assert reshape.input[1] != TARGET_NAME
    assert reshape.input[1].startswith(TARGET_NAME)
    x = np.random.default_rng(3).standard_normal((5, 2, 3)).astype(np.float32)
    fed = np.array([0, 0, 7], np.int64)  # overriding the input must not change the rewrite
    session = ort.InferenceSession(after.SerializeToString())
    original = ort.InferenceSession(model.SerializeToString())
    feeds = {"x": x, TARGET_NAME: fed}
    np.testing.assert_allclose(session.run(None, feeds)[0], original.run(None, feeds)[0], atol=1e-6)

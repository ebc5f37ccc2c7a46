"""One near-miss per guard of a rule's proof, each asserting the refusal reason.

Each of these graphs differs from one the rule rewrites in exactly the fact a single guard
checks, so removing that guard makes the test fail (these three survived mutation by hand).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules.rules import initial_state, layer_output
from tests.reasons import refusal_reasons

H, INPUT, BATCH = 3, 2, 2


def _lstm_model(state_nodes: list[onnx.NodeProto], inputs=(), *, batch=BATCH) -> onnx.ModelProto:
    """An LSTM on x [seq, batch, I] whose initial_h is the value ``h0``."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((1, 4 * H, INPUT)).astype(np.float32)
    r = rng.standard_normal((1, 4 * H, H)).astype(np.float32)
    lstm = helper.make_node("LSTM", ["x", "w", "r", "", "", "h0"], ["y"], hidden_size=H)
    graph = helper.make_graph(
        [*state_nodes, lstm],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", batch, INPUT]), *inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", 1, batch, H])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(r, "r"),
            numpy_helper.from_array(np.zeros((1, batch, H), np.float32), "zeros"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def _has_state(model: onnx.ModelProto) -> bool:
    lstm = next(n for n in model.graph.node if n.op_type == "LSTM")
    return len(lstm.input) > 5 and lstm.input[5] != ""


def test_zeros_times_a_finite_tensor_is_dropped() -> None:
    """The positive twin: ``zeros * Shape-derived`` (finite) is zeros."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
        helper.make_node("Gather", ["sf", "one"], ["g"]),
        helper.make_node("Mul", ["zeros", "g"], ["h0"]),
    ]
    assert not _has_state(
        rnn_rewrite_rules.rewrite(_lstm_model(nodes), ["initial_state"], target="onnxruntime")
    )


def test_zeros_times_an_input_reduction_is_not_zeros() -> None:
    """``0 * ReduceMax(x)`` is NaN where x holds inf: the state is not provably zero."""
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
        helper.make_node("Mul", ["zeros", "m"], ["h0"]),
    ]
    model = _lstm_model(nodes)
    assert _has_state(rnn_rewrite_rules.rewrite(model, ["initial_state"], target="onnxruntime"))
    reasons = refusal_reasons(initial_state.FAMILY.rules, model)
    assert any("no initial state is a provable all-zero tensor" in r for r in reasons), reasons


def test_graph_input_state_is_not_zeros_even_with_the_right_shape() -> None:
    """h0 a graph input declared [1, 2, H] with X's batch also declared 2: the shape proof
    passes, so only the zeros guard keeps the caller's state."""
    h0 = helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, BATCH, H])
    model = _lstm_model([], [h0])
    assert _has_state(rnn_rewrite_rules.rewrite(model, ["initial_state"], target="onnxruntime"))
    reasons = refusal_reasons(initial_state.FAMILY.rules, model)
    assert any("no initial state is a provable all-zero tensor" in r for r in reasons), reasons


def test_reshape_target_with_two_minus_ones_is_refused() -> None:
    """``Reshape(Transpose(Y), [-1, -1, H])`` is invalid: never turned into a Squeeze."""
    nodes = [
        helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=H),
        helper.make_node("Transpose", ["y"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "target"], ["out"]),
    ]
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", INPUT])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["seq", "batch", H])],
        [
            numpy_helper.from_array(rng.standard_normal((1, 4 * H, INPUT)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal((1, 4 * H, H)).astype(np.float32), "r"),
            numpy_helper.from_array(np.array([-1, -1, H], np.int64), "target"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    after = rnn_rewrite_rules.rewrite(model, ["layer_output"])
    assert [n.op_type for n in after.graph.node] == ["LSTM", "Transpose", "Reshape"]
    reasons = refusal_reasons(layer_output.FAMILY.rules, model)
    assert any("more than one -1" in r for r in reasons), reasons


def test_declared_shape_of_a_computed_weight_is_not_a_fact() -> None:
    """R computed by a Concat and annotated [2, 15, 5] (really [2, 16, 4]), no hidden_size:
    H comes from what the prover proves of the Concat, so the target is [0, 0, 8]."""
    rng = np.random.default_rng(0)
    halves = [rng.standard_normal((1, 4 * 4, 4)).astype(np.float32) for _ in range(2)]
    w = rng.standard_normal((2, 16, INPUT)).astype(np.float32)
    nodes = [
        helper.make_node("Concat", ["r_f", "r_b"], ["r"], axis=0),
        helper.make_node("LSTM", ["x", "w", "r"], ["y"], direction="bidirectional"),
        helper.make_node("Transpose", ["y"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "target"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", INPUT])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["seq", "batch", 8])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(halves[0], "r_f"),
            numpy_helper.from_array(halves[1], "r_b"),
            numpy_helper.from_array(np.array([0, 0, -1], np.int64), "target"),
        ],
        value_info=[helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 15, 5])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    after = rnn_rewrite_rules.rewrite(model, ["layer_output"])
    targets = [
        numpy_helper.to_array(t).tolist() for t in after.graph.initializer if t.data_type == 7
    ]
    assert [0, 0, 8] in targets, targets
    x = rng.standard_normal((3, 2, INPUT)).astype(np.float32)
    # onnx.reference: ONNX Runtime requires the hidden_size attribute
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    actual = ReferenceEvaluator(after).run(None, {"x": x})[0]
    np.testing.assert_allclose(actual, expected, atol=1e-6)


def test_wrong_rank_annotation_does_not_make_a_squeeze() -> None:
    """A value_info giving the Transpose output rank 3 changes nothing: the rewrite keeps
    the original's output shape (a Squeeze on a misread rank would not)."""
    import onnxruntime as ort

    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=H),
        helper.make_node("Transpose", ["y"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "target"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", INPUT])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["seq", "batch", H])],
        [
            numpy_helper.from_array(rng.standard_normal((1, 4 * H, INPUT)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal((1, 4 * H, H)).astype(np.float32), "r"),
            numpy_helper.from_array(np.array([0, -1, H], np.int64), "target"),
        ],
        value_info=[helper.make_tensor_value_info("t", TensorProto.FLOAT, [3, 2, H])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    after = rnn_rewrite_rules.rewrite(model)
    for seq, batch in ((3, 2), (1, 6), (4, 1)):
        x = rng.standard_normal((seq, batch, INPUT)).astype(np.float32)
        expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        actual = ort.InferenceSession(after.SerializeToString()).run(None, {"x": x})[0]
        assert actual.shape == expected.shape
        np.testing.assert_allclose(actual, expected, atol=1e-6)

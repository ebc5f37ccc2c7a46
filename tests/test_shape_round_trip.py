"""Integer round trips of shape values: tf2onnx's ``Cast(int64 -> int32) ... Cast(int32 ->
int64)`` of a batch size, in the prover (a narrowed symbol) and in ``initial_state`` (the
zero state it builds, proven ``[D, batch of X, H]`` from its consumer, the RNN node)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import initial_state
from rnn_rewrite_rules.shape import Dim, ShapeProver
from tests.reasons import refusal_reasons
from tests.support import apply, op_counts

H, INPUT = 3, 4
RULES = initial_state.FAMILY.rules_for("portable")
INT32, INT64 = TensorProto.INT32, TensorProto.INT64


def _keras_lstm(
    narrow: int = INT32, *, between: list[onnx.NodeProto] | None = None, shaped: str = "expand"
) -> onnx.ModelProto:
    """tf2onnx's Keras 3 LSTM: x batch-major, zero states
    ``Unsqueeze(Expand(0, Cast64(Concat(Slice(Cast32(Shape(x)), 0, 1), [H]))), 0)``.

    ``narrow``: the type of the round trip; ``between``: nodes from ``packed`` (the narrow
    Concat) to ``packed_out`` (default: none, ``packed`` is it); ``shaped``: how the
    int64 shape makes the zeros (``expand``, or ``reshape`` of ``batch * H`` zeros)."""
    between = between or [helper.make_node("Identity", ["packed"], ["packed_out"])]
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape32"], to=narrow),
        helper.make_node("Slice", ["shape32", "zero1", "one1", "zero1"], ["batch32"]),
        helper.make_node("Concat", ["batch32", "hidden"], ["packed"], axis=0),
        *between,
        helper.make_node("Cast", ["packed_out"], ["packed64"], to=INT64),
    ]
    if shaped == "expand":
        nodes.append(helper.make_node("Expand", ["zero_f", "packed64"], ["zeros"]))
    else:  # Reshape reads the round trip: -1 there would infer the size
        nodes += [
            helper.make_node("Slice", ["shape", "zero1", "one1", "zero1"], ["batch64"]),
            helper.make_node("Mul", ["batch64", "hidden64"], ["flat"]),
            helper.make_node("Expand", ["zero_f", "flat"], ["flat_zeros"]),
            helper.make_node("Reshape", ["flat_zeros", "packed64"], ["zeros"]),
        ]
    nodes += [
        helper.make_node("Unsqueeze", ["zeros", "zero1"], ["h0"]),
        helper.make_node(
            "LSTM", ["xt", "w", "r", "b", "", "h0", "h0"], ["", "y_h"], hidden_size=H, name="lstm"
        ),
        helper.make_node("Squeeze", ["y_h", "zero1"], ["out"]),
    ]
    rng = np.random.default_rng(0)
    narrow_type = helper.tensor_dtype_to_np_dtype(narrow)
    consts = {
        "w": rng.standard_normal((1, 4 * H, INPUT)).astype(np.float32),
        "r": rng.standard_normal((1, 4 * H, H)).astype(np.float32),
        "b": rng.standard_normal((1, 8 * H)).astype(np.float32),
        "zero1": np.array([0], np.int64),
        "one1": np.array([1], np.int64),
        "hidden": np.array([H], narrow_type),
        "hidden64": np.array([H], np.int64),
        "zero_narrow": np.array(0, narrow_type),
        "zero_f": np.array(0.0, np.float32),
    }
    graph = helper.make_graph(
        nodes,
        "keras_lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["unk__1", "unk__2", INPUT])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, H])],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 10 + seq)
    return {"x": rng.standard_normal((batch, seq, INPUT)).astype(np.float32)}


def _assert_equivalent(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    """Equal in ORT at several (batch, seq); at batch 0 in onnx.reference (ORT aborts the
    process on an LSTM with batch 0)."""
    for batch, seq in ((1, 1), (3, 5), (7, 2)):
        feeds = _feeds(batch, seq)
        assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) < 1e-6
    feeds = _feeds(0, 2)
    expected = [np.asarray(v) for v in ReferenceEvaluator(before).run(None, feeds)]
    actual = [np.asarray(v) for v in ReferenceEvaluator(after).run(None, feeds)]
    assert [a.shape for a in actual] == [e.shape for e in expected] == [(0, H)]


def _value(model: ir.Model, name: str) -> ir.Value:
    for node in model.graph:
        for output in node.outputs:
            if output.name == name:
                return output
    raise KeyError(name)


# ------------------------------------------------------------------ the prover


def test_a_narrowed_size_is_its_own_symbol_that_names_the_size_it_narrows() -> None:
    model = ir.serde.deserialize_model(_keras_lstm())
    prover = ShapeProver(model.graph)
    batch = Dim.sym(model.graph.inputs[0], 0)
    (narrowed, hidden) = prover.elements(_value(model, "packed64")) or ()
    assert narrowed is not None and narrowed != batch and narrowed.narrowed
    assert hidden == Dim.const(H)
    assert not narrowed.nonnegative  # int32 wraps to negatives
    assert prover.narrowed_from(narrowed) == batch
    assert prover.narrowed_from(batch) is None  # not narrowed
    # Expand rejects a negative size: where it runs, its axis is the narrowed element
    assert prover.dims(_value(model, "zeros")) == (narrowed, Dim.const(H))


def test_arithmetic_on_a_narrowed_size_is_not_tracked() -> None:
    """``Add(w, 0)`` in int32 may wrap (``2**31 - 1 + 1``): the result is unknown."""
    add = [helper.make_node("Add", ["packed", "zero_narrow"], ["packed_out"])]
    model = ir.serde.deserialize_model(_keras_lstm(between=add))
    prover = ShapeProver(model.graph)
    elements = prover.elements(_value(model, "packed64"))
    assert elements is not None and elements[0] is None


def test_a_round_trip_through_int16_is_not_read_as_the_size() -> None:
    """The int16 batch wraps at 2**15: unknown (int16 elements are not tracked), or at
    most a narrowed symbol no 32-bit reader takes for the batch."""
    model = ir.serde.deserialize_model(_keras_lstm(TensorProto.INT16))
    prover = ShapeProver(model.graph)
    packed = prover.elements(_value(model, "packed64"))
    assert packed is None or packed[0] is None or prover.narrowed_from(packed[0]) is None
    (narrowed,) = prover.elements(_value(model, "batch32")) or (None,)
    assert narrowed is not None and narrowed.narrowed
    assert prover.narrowed_from(narrowed) is None
    assert prover.narrowed_from(narrowed, min_bits=16) == Dim.sym(model.graph.inputs[0], 0)


# ------------------------------------------------------------------ initial_state


def test_onnxruntime_rejects_a_state_whose_batch_is_not_x_s() -> None:
    """The fact the proof rests on: a wrapped batch (any number but X's) fails the node."""
    model = _keras_lstm()
    body = [n for n in model.graph.node if n.op_type == "LSTM"]
    (lstm,) = body
    lstm.input[5] = lstm.input[6] = "h0_wrong"
    model.graph.input.append(helper.make_tensor_value_info("h0_wrong", TensorProto.FLOAT, None))
    feeds = {**_feeds(3, 2), "h0_wrong": np.zeros((1, 2, H), np.float32)}
    with pytest.raises(Exception, match=r"initial_h|batch_size|shape"):
        runtime.run(model, feeds)


def test_tf2onnx_zero_state_through_int32_is_shared_and_equal() -> None:
    before = _keras_lstm()
    after, count = apply(RULES, before)
    assert count == 1
    counts = op_counts(after)
    assert counts["Cast"] == 0 and counts["Expand"] == 0, counts
    assert counts["ConstantOfShape"] == 1
    (shape,) = [n for n in after.graph.node if n.op_type == "Shape"]
    assert shape.input[0] == "x"  # the batch read from the graph input
    _assert_equivalent(before, after)


def test_tf2onnx_zero_state_is_dropped_for_onnxruntime() -> None:
    before = _keras_lstm()
    after, count = apply(initial_state.FAMILY.rules_for("onnxruntime"), before)
    assert count == 1
    assert op_counts(after)["Cast"] == 0
    (lstm,) = [n for n in after.graph.node if n.op_type == "LSTM"]
    assert list(lstm.input[5:]) in ([], ["", ""], [""])
    _assert_equivalent(before, after)


@pytest.mark.parametrize(
    ("narrow", "shaped", "extra"),
    [
        pytest.param(TensorProto.INT16, "expand", None, id="int16-wraps-at-32768"),
        pytest.param(INT32, "reshape", None, id="reshape-reads-the-wrapped-value"),
        pytest.param(INT32, "expand", "add", id="int32-arithmetic"),
    ],
)
def test_near_misses_refuse(narrow: int, shaped: str, extra: str | None) -> None:
    """int16 wraps at a batch a real input has; a Reshape runs on a wrapped -1 (it infers
    the size) so its output is not the narrowed element; arithmetic in int32 may wrap."""
    between = None
    if extra == "add":
        between = [helper.make_node("Add", ["packed", "zero_narrow"], ["packed_out"])]
    before = _keras_lstm(narrow, between=between, shaped=shaped)
    after, count = apply(RULES, before)
    assert count == 0
    reasons = refusal_reasons(RULES, before)
    assert any("is not provably [D, batch of X, H]" in r for r in reasons), reasons
    for batch, seq in ((2, 3),):
        feeds = _feeds(batch, seq)
        assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) == 0


def test_keras_stacked_lstm_file_goes_to_its_lstm_nodes() -> None:
    """The committed tf2onnx export of two stacked Keras LSTMs: every zero-state chain
    (Shape, Cast, Slice, Concat, Cast, Expand, Unsqueeze per layer) goes."""
    import rnn_rewrite_rules

    path = "tests/data/exporters/tf2onnx/stack_lstm_lstm.onnx"
    before = onnx.load(path)
    after = rnn_rewrite_rules.rewrite(before)
    counts = op_counts(after)
    assert counts["Cast"] == 0 and counts["Expand"] == 0 and counts["LSTM"] == 2, counts
    assert len(after.graph.node) < len(before.graph.node)
    for batch, seq in ((1, 1), (3, 4)):
        feeds = {"x": np.random.default_rng(seq).standard_normal((batch, seq, 6)).astype("f")}
        assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) < 1e-5


def test_reshape_does_not_read_a_narrowed_element_as_a_size_even_with_allowzero() -> None:
    """A wrapped int32 may be -1, which infers the size whatever ``allowzero`` says."""
    from rnn_rewrite_rules.shape import reshape

    model = ir.serde.deserialize_model(_keras_lstm())
    prover = ShapeProver(model.graph)
    (narrowed, hidden) = prover.elements(_value(model, "packed64")) or ()
    assert narrowed is not None and hidden is not None
    batch = Dim.sym(model.graph.inputs[0], 0)
    for allowzero in (0, 1):
        assert reshape((batch, hidden), (narrowed, hidden), allowzero) == (None, hidden)

"""initial_state: zero states as every exporter builds them become one shared explicit zero
state (target ``portable``) or are dropped (target ``onnxruntime``); near misses are left."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import initial_state
from rnn_rewrite_rules.testing.exporters import (
    NEAR_MISS_STATE_FORMS,
    ZERO_STATE_FORMS,
    ExporterSpec,
    build_exporter_model,
    exporter_inputs,
    exporter_specs,
    quantized_lstm_model,
)
from tests.exporter_support import (
    all_op_counts,
    assert_spec_equivalent,
    assert_target_form,
    rnn_nodes,
)
from tests.near_misses import BATCH, FLOAT, INPUT, INT64, H, assert_refused, rnn_model, zeros
from tests.reasons import refusal_reasons
from tests.support import apply

FAMILY = ["initial_state"]
TARGETS = ["portable", "onnxruntime"]
_SHAPE_OPS = ("Shape", "ConstantOfShape", "Expand", "Gather", "Tile", "Mul")
#: What the exporter's zero-state work may leave behind in the portable form.
_PORTABLE_OPS = ("Expand", "Tile", "Mul", "Slice", "Unsqueeze")


def _apply(model: onnx.ModelProto, target: str) -> tuple[onnx.ModelProto, int]:
    """One pass of the family's rules for ``target``, dead nodes removed, checked."""
    return apply(rnn_rewrite_rules.rules(FAMILY, target=target), model)


def _state_inputs(node: onnx.NodeProto) -> list[str]:
    return (
        [name for name in node.input[5:7] if name]
        if node.op_type == "LSTM"
        else [name for name in node.input[5:6] if name]
    )


def _spec(form: str, **fields) -> ExporterSpec:
    if form == "zero_constant":
        fields.setdefault("static_batch", 3)
    return ExporterSpec(initial_state=form, **fields)


@pytest.mark.parametrize("form", ZERO_STATE_FORMS)
@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize(
    ("style", "opset", "layers", "direction", "batch_first"),
    [
        ("torchscript", 9, 2, "bidirectional", True),
        ("torchscript", 17, 1, "forward", False),
        ("tf2onnx", 11, 2, "forward", True),
        ("tf2onnx", 13, 1, "bidirectional", False),
        ("plain", 21, 3, "reverse", False),
    ],
)
@pytest.mark.parametrize("target", TARGETS)
def test_zero_forms_are_replaced(
    form, op_type, style, opset, layers, direction, batch_first, target
):
    spec = _spec(
        form,
        op_type=op_type,
        style=style,
        opset=opset,
        num_layers=layers,
        direction=direction,
        batch_first=batch_first,
    )
    before = build_exporter_model(spec)
    after = rnn_rewrite_rules.rewrite(before, FAMILY, target=target)
    onnx.checker.check_model(after, full_check=True)
    assert len(rnn_nodes(after)) == layers
    assert_target_form(after, target, before)
    counts = all_op_counts(after)
    # portable drops the state of a static batch too: every runtime takes that
    if target == "onnxruntime" or spec.static_batch is not None:
        assert not any(counts[op] for op in _SHAPE_OPS), counts  # the zero-state work died
    else:
        assert not any(counts[op] for op in _PORTABLE_OPS), counts
        assert counts["ConstantOfShape"] == 1, counts  # one D and H for every layer
        assert counts["Shape"] <= 1, counts
    assert_spec_equivalent(before, after, spec)


@pytest.mark.parametrize("form", ["constant_of_shape", "expand", "keras", "mul"])
@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize("target", TARGETS)
def test_zero_forms_of_layout1_nodes(form, op_type, target) -> None:
    """States [batch, D, H]: proven against X's batch axis 0; run by the reference evaluator."""
    spec = _spec(form, op_type=op_type, style="plain", layout=1, opset=14, num_layers=2)
    before = build_exporter_model(spec)
    after, count = _apply(before, target)
    assert count == 2
    assert_target_form(after, target, before)
    assert_spec_equivalent(before, after, spec, after_engine="reference")


@pytest.mark.parametrize("form", NEAR_MISS_STATE_FORMS)
@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("target", TARGETS)
def test_near_misses_are_left_alone(form, op_type, layers, target) -> None:
    spec = _spec(form, op_type=op_type, num_layers=layers, direction="bidirectional")
    before = build_exporter_model(spec)
    after, count = _apply(before, target)
    assert count == 0
    assert all(_state_inputs(n) for n in rnn_nodes(after))
    assert_spec_equivalent(before, after, spec)


def test_mul_of_an_input_by_zero_is_not_zeros() -> None:
    """Why ``Mul(h0, 0)`` stays: an infinite h0 makes it NaN, and the outputs with it."""
    spec = _spec("mul_input", op_type="GRU")
    model = build_exporter_model(spec)
    feeds = exporter_inputs(spec, 2, 3)
    feeds["h0"][0, 0, 0] = np.inf
    y, _ = runtime.run(model, feeds)
    assert np.isnan(y).any()
    assert all(_apply(model, target)[1] == 0 for target in TARGETS)


def test_wrong_shape_zero_constant_freezes_the_batch() -> None:
    """Zeros [D, 1, H] with a dynamic batch: the original fails at batch 3; never rewritten."""
    spec = _spec("wrong_shape_constant", op_type="LSTM")
    model = build_exporter_model(spec)
    runtime.run(model, exporter_inputs(spec, 1, 3))
    with pytest.raises(Exception, match=r"initial_h|shape|dimension"):
        runtime.run(model, exporter_inputs(spec, 3, 3))
    assert all(_apply(model, target)[1] == 0 for target in TARGETS)


@pytest.mark.parametrize("target", TARGETS)
def test_zero_constant_of_the_static_batch_is_replaced_other_static_batch_is_not(target) -> None:
    spec = _spec("zero_constant", op_type="LSTM", static_batch=2)
    before = build_exporter_model(spec)
    after, count = _apply(before, target)
    assert count == 1
    assert_target_form(after, target, before)
    assert_spec_equivalent(before, after, spec)
    # the same zeros [1, 2, H] fed to a model whose input declares batch 4: wrong shape
    other = onnx.ModelProto()
    other.CopyFrom(before)
    dims = other.graph.input[0].type.tensor_type.shape.dim
    dims[1].dim_value = 4
    del other.graph.output[:]  # keep the checker quiet about the now inconsistent output
    other.graph.output.extend(
        [
            onnx.helper.make_tensor_value_info(o.name, onnx.TensorProto.FLOAT, None)
            for o in before.graph.output
        ]
    )
    rules = rnn_rewrite_rules.rules(FAMILY, target=target)
    assert apply(rules, other, check=False)[1] == 0


@pytest.mark.parametrize("target", TARGETS)
def test_zeros_of_a_different_tensors_batch_are_left_alone(target) -> None:
    """ConstantOfShape([1, Shape(other)[0], H]) for an RNN reading x: batch not provably x's."""
    model = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 15]>
        g (float[s, b, 2] x, float[n, 3] other, float[1, 9, 2] w, float[1, 9, 3] r)
            => (float[s, 1, b, 3] y) {
            shape = Shape <start: int = 0, end: int = 1> (other)
            one = Constant <value: tensor = int64[1] {1}> ()
            three = Constant <value: tensor = int64[1] {3}> ()
            target = Concat <axis: int = 0> (one, shape, three)
            h0 = ConstantOfShape (target)
            y = GRU <hidden_size: int = 3> (x, w, r, "", "", h0)
        }
        """
    )
    assert _apply(model, target)[1] == 0
    # the same graph reading x's batch is proven
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    shape_node = fixed.graph.node[0]
    shape_node.input[0] = "x"
    for attr in shape_node.attribute:
        attr.i = {"start": 1, "end": 2}[attr.name]
    after, count = _apply(fixed, target)
    assert count == (1 if target == "onnxruntime" else 0)  # portable: already explicit
    assert_target_form(after, target, fixed)


@pytest.mark.parametrize("target", TARGETS)
def test_dynamic_quantize_lstm_zero_states(target) -> None:
    before = quantized_lstm_model(direction="bidirectional", outputs=("y", "h"))
    after, count = _apply(before, target)
    assert count == 1
    assert_target_form(after, target, before)
    spec = ExporterSpec(input_size=4, hidden_size=5, direction="bidirectional")
    assert_spec_equivalent(before, after, spec, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
def test_idempotent(target) -> None:
    spec = _spec("constant_of_shape", op_type="LSTM", num_layers=3, style="torchscript")
    once, count = _apply(build_exporter_model(spec), target)
    assert count == 3
    twice, count = _apply(once, target)
    assert count == 0 and twice.graph == once.graph


@given(
    spec=exporter_specs(
        initial_state=st.sampled_from([*ZERO_STATE_FORMS, *NEAR_MISS_STATE_FORMS]),
        static_batch=st.sampled_from([None, 2]),
        wrap=st.sampled_from([None, None, "if", "scan"]),
    ),
    target=st.sampled_from(TARGETS),
)
def test_property_zero_forms_replaced_near_misses_kept(spec: ExporterSpec, target: str) -> None:
    before = build_exporter_model(spec)
    after = rnn_rewrite_rules.rewrite(before, target=target)
    onnx.checker.check_model(after, full_check=True)
    nodes = rnn_nodes(after)
    if spec.initial_state in ZERO_STATE_FORMS:
        assert_target_form(after, target, before)
    else:
        assert all(_state_inputs(n) for n in nodes)
    assert_spec_equivalent(before, after, spec, sizes=((2, 3), (1, 1), (3, 2)))


def test_a_subgraph_input_s_declared_type_is_not_the_state_type() -> None:
    """In a Loop body, ``X`` is a body input declared double: not a fact; the constant
    float ``W`` gives the zero state's element type."""
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    from rnn_rewrite_rules.rules import initial_state

    hidden, size = 2, 3
    rng = np.random.default_rng(0)
    lstm = helper.make_node("LSTM", ["v", "w", "r", "", "", "h0"], ["y"], hidden_size=hidden)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("ConstantOfShape", ["h0_shape"], ["h0"]),
            lstm,
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v", TensorProto.DOUBLE, ["s", 1, size]),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, [])],
        [
            numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, size), np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, hidden), np.float32), "r"),
            numpy_helper.from_array(np.array([1, 1, hidden], np.int64), "h0_shape"),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["", "", "x"], ["x_out"], body=body)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", 1, size])],
        [helper.make_tensor_value_info("x_out", TensorProto.FLOAT, ["s", 1, size])],
    )
    model = ir.serde.deserialize_model(helper.make_model(graph))
    body_graph = model.graph.node(0).attributes["body"].as_graph()
    node = body_graph.node(2)
    dtype = initial_state._state_type(node, node.inputs[5], model.graph)
    assert dtype == ir.DataType.FLOAT


# near misses -----------------------------------------------------------------------


def _lstm(h0: str = "", c0: str = "") -> onnx.NodeProto:
    return helper.make_node("LSTM", ["x", "w", "r", "", "", h0, c0], ["y"], hidden_size=H)


def test_state_refused_when_the_rank_of_x_is_not_proven() -> None:
    model = rnn_model([_lstm("h0")], x_shape=None, constants={"h0": zeros(1, BATCH, H)})
    assert_refused(initial_state.FAMILY, model, "the rank of X is not proven")


def test_state_refused_when_its_shape_is_not_proven() -> None:
    nodes = [helper.make_node("ConstantOfShape", ["dims"], ["h0"]), _lstm("h0")]
    dims = helper.make_tensor_value_info("dims", INT64, None)  # not even its rank
    model = rnn_model(nodes, inputs=(dims,))
    assert_refused(initial_state.FAMILY, model, "cannot prove the zero state's shape")


def test_state_of_a_frozen_batch_is_refused_with_its_shape() -> None:
    model = rnn_model([_lstm("h0")], constants={"h0": zeros(1, 1, H)})
    assert_refused(
        initial_state.FAMILY,
        model,
        "the zero state's shape [1, 1, 3] is not provably [D, batch of X, H] (a frozen axis?)",
    )


def test_every_zero_state_must_have_the_right_shape() -> None:
    """h0 is fine, c0 is frozen: neither is dropped (the check looks at both)."""
    constants = {"h0": zeros(1, BATCH, H), "c0": zeros(1, 1, H)}
    model = rnn_model([_lstm("h0", "c0")], x_shape=["seq", BATCH, INPUT], constants=constants)
    assert_refused(
        initial_state.FAMILY,
        model,
        "the zero state's shape [1, 1, 3] is not provably [D, batch of X, H] (a frozen axis?)",
    )


def test_only_the_zero_states_are_dropped() -> None:
    """h0 is the caller's, c0 zeros: c0 goes, h0 stays (the LSTM's input 6 is a state)."""
    h0 = helper.make_tensor_value_info("h0", FLOAT, [1, BATCH, H])
    model = rnn_model(
        [_lstm("h0", "c0")],
        x_shape=["seq", BATCH, INPUT],
        inputs=(h0,),
        constants={"c0": zeros(1, BATCH, H)},
    )
    after = rnn_rewrite_rules.rewrite(model, ["initial_state"], target="onnxruntime")
    assert list(after.graph.node[0].input) == ["x", "w", "r", "", "", "h0"]


def test_both_zero_states_are_dropped() -> None:
    constants = {"h0": zeros(1, BATCH, H), "c0": zeros(1, BATCH, H)}
    model = rnn_model([_lstm("h0", "c0")], x_shape=["seq", BATCH, INPUT], constants=constants)
    after = rnn_rewrite_rules.rewrite(model, ["initial_state"], target="onnxruntime")
    assert list(after.graph.node[0].input) == ["x", "w", "r"]


def test_layout_one_state_is_batch_first() -> None:
    """layout=1: the state is [batch, D, H]; the time-major shape is refused, and kept."""

    def node(h0: str) -> onnx.NodeProto:
        return helper.make_node("GRU", ["x", "w", "r", "", "", h0], ["y"], hidden_size=H, layout=1)

    x_shape = [BATCH + 1, "seq", INPUT]
    good = rnn_model(
        [node("h0")], x_shape=x_shape, constants={"h0": zeros(BATCH + 1, 1, H)}, gates=3
    )
    after = rnn_rewrite_rules.rewrite(good, ["initial_state"], target="onnxruntime")
    assert list(after.graph.node[0].input) == ["x", "w", "r"]
    bad = rnn_model(
        [node("h0")], x_shape=x_shape, constants={"h0": zeros(1, BATCH + 1, H)}, gates=3
    )
    assert_refused(
        initial_state.FAMILY,
        bad,
        "the zero state's shape [1, 3, 3] is not provably [D, batch of X, H] (a frozen axis?)",
    )


_SHARED_ZEROS = """
    <ir_version: 8, opset_import: ["" : 15]>
    g (float[s, b, 2] x, float[1, 9, 2] w, float[1, 9, 3] r) => (float[s, 1, b, 3] y{extra_out}) {{
        batch = Shape <start: int = 1, end: int = 2> (x)
        three = Constant <value: tensor = int64[1] {{3}}> ()
        target = Concat <axis: int = 0> (batch, three)
        zero = Constant <value: tensor = float {{0}}> ()
        state = Expand (zero, target)
        axes = Constant <value: tensor = int64[1] {{0}}> ()
        h0 = Unsqueeze (state, axes)
        y = GRU <hidden_size: int = 3> (x, w, r, "", "", h0){extra_node}
    }}
"""


@pytest.mark.parametrize("read", ["Sigmoid", "Loop"])
def test_portable_zeros_read_by_another_node_are_left_alone(read: str) -> None:
    """Near miss: the Expand that makes the zeros is also read by a node that is no RNN's
    state (a zero-step guard's Loop, say): it stays computed, so an explicit state would
    add nodes; ``onnxruntime`` still drops the state (no node added)."""
    extra = {
        "Sigmoid": "\n        kept = Sigmoid (state)",
        "Loop": (
            "\n        trips = Constant <value: tensor = int64 {0}> ()"
            "\n        kept, stack = Loop (trips, , state) <body = b (int64 i, bool c, float s)"
            " => (bool c2, float s2, float s3) { c2 = Identity (c) s2 = Identity (s)"
            " s3 = Identity (s) }>"
        ),
    }[read]
    outputs = ", float[b, 3] kept" if read == "Sigmoid" else ", float kept"
    text = _SHARED_ZEROS.format(extra_out=outputs, extra_node=extra)
    model = onnx.parser.parse_model(text)
    reasons = refusal_reasons(rnn_rewrite_rules.rules(FAMILY, target="portable").rules, model)
    assert any(f"the zero state's source is also read by {read}" in r for r in reasons), reasons
    assert _apply(model, "portable")[1] == 0
    after, count = _apply(model, "onnxruntime")
    assert count == 1 and _state_inputs(rnn_nodes(after)[0]) == []
    # without the other reader the shared explicit state replaces it
    alone = onnx.parser.parse_model(_SHARED_ZEROS.format(extra_out="", extra_node=""))
    after, count = _apply(alone, "portable")
    assert count == 1 and "ConstantOfShape" in all_op_counts(after)
    rng = np.random.default_rng(0)
    for seq, batch in ((4, 3), (1, 1)):
        feeds = {
            "x": rng.standard_normal((seq, batch, 2)).astype(np.float32),
            "w": rng.standard_normal((1, 9, 2)).astype(np.float32),
            "r": rng.standard_normal((1, 9, 3)).astype(np.float32),
        }
        np.testing.assert_allclose(runtime.run(after, feeds)[0], runtime.run(alone, feeds)[0])

"""Near misses for the rules' checks: one per refusal reason, each asserting the reason.

Written from mutation testing (docs/mutation.md). Every graph here differs from one the
rule rewrites in the single fact one guard checks, so a check whose guard is removed or
inverted either fires (the node list changes) or refuses for another reason (the
asserted reason is missing).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import initial_state, layer_output, layout, unused_outputs
from tests.reasons import refusal_reasons

H, INPUT, BATCH = 3, 2, 2
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def _weights(directions: int = 1, gates: int = 4) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(0)
    return [
        numpy_helper.from_array(
            rng.standard_normal((directions, gates * H, INPUT)).astype(np.float32), "w"
        ),
        numpy_helper.from_array(
            rng.standard_normal((directions, gates * H, H)).astype(np.float32), "r"
        ),
    ]


def _model(
    nodes: list[onnx.NodeProto],
    *,
    x_shape: list | None = ("seq", "batch", INPUT),  # type: ignore[assignment]
    inputs: tuple[onnx.ValueInfoProto, ...] = (),
    outputs: tuple[str, ...] = ("y",),
    constants: dict[str, np.ndarray] | None = None,
    directions: int = 1,
    gates: int = 4,
) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", FLOAT, None if x_shape is None else list(x_shape))
    graph = helper.make_graph(
        nodes,
        "g",
        [x, *inputs],
        [helper.make_empty_tensor_value_info(name) for name in outputs],
        [
            *_weights(directions, gates),
            *(numpy_helper.from_array(a, n) for n, a in (constants or {}).items()),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _kept(model: onnx.ModelProto) -> list[tuple[str, list[str], list[str]]]:
    """The RNN nodes' inputs and the producers of graph outputs (what the rules replace;
    unused outputs may go), trailing empty names dropped (serialization drops them too)."""
    outputs = {o.name for o in model.graph.output}

    def strip(names: Iterable[str]) -> list[str]:
        names = list(names)
        while names and not names[-1]:
            names.pop()
        return names

    return [
        (n.op_type, strip(n.input), [o for o in n.output if o in outputs])
        for n in model.graph.node
        if n.op_type in ("LSTM", "GRU", "RNN") or outputs & set(n.output)
    ]


def _assert_refused(family, model: onnx.ModelProto, reason: str) -> None:
    after = rnn_rewrite_rules.rewrite(model, [family.name])
    assert _kept(after) == _kept(model)
    reasons = refusal_reasons(family.rules, model)
    assert reason in reasons, reasons  # the whole reason, not a part of it


def _zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


# initial_state -----------------------------------------------------------------------


def _lstm(h0: str = "", c0: str = "") -> onnx.NodeProto:
    return helper.make_node("LSTM", ["x", "w", "r", "", "", h0, c0], ["y"], hidden_size=H)


def test_state_refused_when_the_rank_of_x_is_not_proven() -> None:
    model = _model([_lstm("h0")], x_shape=None, constants={"h0": _zeros(1, BATCH, H)})
    _assert_refused(initial_state.FAMILY, model, "the rank of X is not proven")


def test_state_refused_when_its_shape_is_not_proven() -> None:
    nodes = [helper.make_node("ConstantOfShape", ["dims"], ["h0"]), _lstm("h0")]
    dims = helper.make_tensor_value_info("dims", INT64, None)  # not even its rank
    model = _model(nodes, inputs=(dims,))
    _assert_refused(initial_state.FAMILY, model, "cannot prove the zero state's shape")


def test_state_of_a_frozen_batch_is_refused_with_its_shape() -> None:
    model = _model([_lstm("h0")], constants={"h0": _zeros(1, 1, H)})
    _assert_refused(
        initial_state.FAMILY,
        model,
        "the zero state's shape [1, 1, 3] is not provably [D, batch of X, H] (a frozen axis?)",
    )


def test_every_zero_state_must_have_the_right_shape() -> None:
    """h0 is fine, c0 is frozen: neither is dropped (the check looks at both)."""
    constants = {"h0": _zeros(1, BATCH, H), "c0": _zeros(1, 1, H)}
    model = _model([_lstm("h0", "c0")], x_shape=["seq", BATCH, INPUT], constants=constants)
    _assert_refused(
        initial_state.FAMILY,
        model,
        "the zero state's shape [1, 1, 3] is not provably [D, batch of X, H] (a frozen axis?)",
    )


def test_only_the_zero_states_are_dropped() -> None:
    """h0 is the caller's, c0 zeros: c0 goes, h0 stays (the LSTM's input 6 is a state)."""
    h0 = helper.make_tensor_value_info("h0", FLOAT, [1, BATCH, H])
    model = _model(
        [_lstm("h0", "c0")],
        x_shape=["seq", BATCH, INPUT],
        inputs=(h0,),
        constants={"c0": _zeros(1, BATCH, H)},
    )
    after = rnn_rewrite_rules.rewrite(model, ["initial_state"], target="onnxruntime")
    assert list(after.graph.node[0].input) == ["x", "w", "r", "", "", "h0"]


def test_both_zero_states_are_dropped() -> None:
    constants = {"h0": _zeros(1, BATCH, H), "c0": _zeros(1, BATCH, H)}
    model = _model([_lstm("h0", "c0")], x_shape=["seq", BATCH, INPUT], constants=constants)
    after = rnn_rewrite_rules.rewrite(model, ["initial_state"], target="onnxruntime")
    assert list(after.graph.node[0].input) == ["x", "w", "r"]


def test_layout_one_state_is_batch_first() -> None:
    """layout=1: the state is [batch, D, H]; the time-major shape is refused, and kept."""

    def node(h0: str) -> onnx.NodeProto:
        return helper.make_node("GRU", ["x", "w", "r", "", "", h0], ["y"], hidden_size=H, layout=1)

    x_shape = [BATCH + 1, "seq", INPUT]
    good = _model([node("h0")], x_shape=x_shape, constants={"h0": _zeros(BATCH + 1, 1, H)}, gates=3)
    after = rnn_rewrite_rules.rewrite(good, ["initial_state"], target="onnxruntime")
    assert list(after.graph.node[0].input) == ["x", "w", "r"]
    bad = _model([node("h0")], x_shape=x_shape, constants={"h0": _zeros(1, BATCH + 1, H)}, gates=3)
    _assert_refused(
        initial_state.FAMILY,
        bad,
        "the zero state's shape [1, 3, 3] is not provably [D, batch of X, H] (a frozen axis?)",
    )


# layer_output ------------------------------------------------------------------------


def _reshape_model(
    target_nodes: list[onnx.NodeProto],
    *,
    y: str = "y",
    directions: int = 1,
    constants: dict[str, np.ndarray] | None = None,
    inputs: tuple[onnx.ValueInfoProto, ...] = (),
    layout_attr: int = 0,
    hidden: int = H,
) -> onnx.ModelProto:
    direction = "bidirectional" if directions == 2 else "forward"
    nodes = [
        helper.make_node(
            "LSTM",
            ["x", "w", "r"],
            ["y", "y_h"],
            hidden_size=hidden,
            direction=direction,
            **({"layout": layout_attr} if layout_attr else {}),  # LSTM-14 and later
        ),
        *target_nodes,
        helper.make_node("Transpose", [y], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "target"], ["out"]),
    ]
    return _model(
        nodes, inputs=inputs, outputs=("out",), constants=constants, directions=directions
    )


def _target(values: list[int]) -> dict[str, np.ndarray]:
    return {"target": np.array(values, np.int64)}


def _seq_batch_nodes() -> list[onnx.NodeProto]:
    """``seq`` and ``batch`` read from ``Shape(x)`` as 1-vectors."""
    return [
        helper.make_node("Shape", ["x"], ["sx"]),
        helper.make_node("Slice", ["sx", "i0", "i1"], ["seq"]),
        helper.make_node("Slice", ["sx", "i1", "i2"], ["batch"]),
    ]


_INDICES = {f"i{i}": np.array([i], np.int64) for i in range(3)}


def test_squeeze_fires_on_the_exact_target() -> None:
    """The positive twin of the near misses below."""
    nodes = [
        *_seq_batch_nodes(),
        helper.make_node("Concat", ["seq", "batch", "h"], ["target"], axis=0),
    ]
    model = _reshape_model(nodes, constants={**_INDICES, "h": np.array([H], np.int64)})
    assert "Squeeze" in _ops(rnn_rewrite_rules.rewrite(model, ["layer_output"]))


def test_target_refused_when_not_a_shape_computation() -> None:
    target = helper.make_tensor_value_info("target", INT64, [3])
    model = _reshape_model([], inputs=(target,))
    _assert_refused(
        layer_output.FAMILY, model, "reshape target is not a provable shape computation"
    )


def test_target_refused_with_four_elements() -> None:
    model = _reshape_model([], constants=_target([0, 0, 1, H]))
    _assert_refused(layer_output.FAMILY, model, "reshape target has 4 elements, not 3")


def test_target_refused_when_an_element_is_unknown() -> None:
    """``batch / 2`` is not an exact size: the element is unknown."""
    nodes = [
        *_seq_batch_nodes(),
        helper.make_node("Div", ["batch", "two"], ["half"]),
        helper.make_node("Concat", ["seq", "half", "h"], ["target"], axis=0),
    ]
    constants = {**_INDICES, "h": np.array([H], np.int64), "two": np.array([2], np.int64)}
    model = _reshape_model(nodes, constants=constants)
    _assert_refused(
        layer_output.FAMILY, model, "target's batch element is not a provable shape computation"
    )


def test_target_refused_when_the_minus_one_cannot_be_inferred() -> None:
    model = _reshape_model([], constants=_target([-1, 5, H]))
    _assert_refused(layer_output.FAMILY, model, "cannot prove what the -1 in the target infers")


def test_target_refused_when_an_element_is_another_dimension() -> None:
    nodes = [
        *_seq_batch_nodes(),
        helper.make_node("Concat", ["seq", "seq", "h"], ["target"], axis=0),
    ]
    model = _reshape_model(nodes, constants={**_INDICES, "h": np.array([H], np.int64)})
    _assert_refused(
        layer_output.FAMILY, model, "target's batch element is another dimension, not the input's"
    )


def test_target_refused_when_the_width_is_another_constant() -> None:
    model = _reshape_model([], constants=_target([0, 0, H + 1]))
    _assert_refused(
        layer_output.FAMILY,
        model,
        "target's direction*hidden element is the constant 4, not the input's",
    )


def test_target_refused_with_a_negative_element() -> None:
    model = _reshape_model([], constants=_target([0, -2, H]))
    _assert_refused(layer_output.FAMILY, model, "reshape target: negative target element -2")


def test_reshape_of_y_h_is_not_a_layer_output() -> None:
    model = _reshape_model([], y="y_h", constants=_target([0, 0, H]))
    _assert_refused(layer_output.FAMILY, model, "transposed value is not the RNN's Y output")


def test_layer_output_of_an_rnn_with_unproven_sizes_is_refused() -> None:
    model = _reshape_model([], hidden=H + 1, constants=_target([0, 0, H + 1]))
    _assert_refused(layer_output.FAMILY, model, "hidden_size=4 disagrees with R's hidden size 3")


def test_layer_output_of_a_batch_first_rnn_is_refused() -> None:
    model = _reshape_model([], layout_attr=1, constants=_target([0, 0, H]))
    _assert_refused(layer_output.FAMILY, model, "layout=1 RNN: Y is [batch, seq, D, H]")


def test_bidirectional_minimal_target_is_left_alone() -> None:
    model = _reshape_model([], directions=2, constants=_target([0, 0, 2 * H]))
    _assert_refused(layer_output.FAMILY, model, "target is already the constant [0, 0, D*H]")


def test_bidirectional_other_constant_target_is_rewritten() -> None:
    """[0, -1, 2H] is equivalent but not minimal: it becomes [0, 0, 2H]."""
    model = _reshape_model([], directions=2, constants=_target([0, -1, 2 * H]))
    after = rnn_rewrite_rules.rewrite(model, ["layer_output"])
    targets = [numpy_helper.to_array(i).tolist() for i in after.graph.initializer]
    assert [0, 0, 2 * H] in targets and [0, -1, 2 * H] not in targets


def _squeeze_model(opset: int) -> onnx.ModelProto:
    """A one-direction layer output whose glue becomes a Squeeze; the Reshape carries a
    name, a doc string and metadata."""
    model = _reshape_model([], constants=_target([0, 0, H]))
    reshape = model.graph.node[-1]
    reshape.name, reshape.doc_string = "glue", "layer 1 input"
    reshape.metadata_props.add(key="origin", value="exporter")
    model.opset_import[0].version = opset
    return model


def _run_both(before: onnx.ModelProto, after: onnx.ModelProto, **feeds: np.ndarray) -> None:
    x = np.random.default_rng(1).standard_normal((4, BATCH, INPUT)).astype(np.float32)
    feeds = {"x": x, **feeds}
    expected, actual = runtime.run(before, feeds), runtime.run(after, feeds)
    assert runtime.max_abs_diff(expected, actual) < 1e-6


@pytest.mark.parametrize(("opset", "inputs"), [(12, 1), (13, 2), (14, 2)])
def test_squeeze_takes_its_axes_the_way_the_opset_reads_them(opset: int, inputs: int) -> None:
    """Squeeze's axes are an attribute up to opset 12 and an input from opset 13."""
    model = _squeeze_model(opset)
    after = rnn_rewrite_rules.rewrite(model, ["layer_output"])
    (squeeze,) = [n for n in after.graph.node if n.op_type == "Squeeze"]
    assert len(squeeze.input) == inputs and bool(squeeze.attribute) == (inputs == 1)
    _run_both(model, after)  # ORT refuses the other form at each opset


def test_the_squeeze_keeps_the_reshapes_name_doc_string_and_metadata() -> None:
    after = rnn_rewrite_rules.rewrite(_squeeze_model(18), ["layer_output"])
    (squeeze,) = [n for n in after.graph.node if n.op_type == "Squeeze"]
    assert (squeeze.name, squeeze.doc_string) == ("glue", "layer 1 input")
    assert {p.key: p.value for p in squeeze.metadata_props}["origin"] == "exporter"


def test_a_layer_output_in_a_branch_gets_its_constants_as_nodes() -> None:
    """A subgraph's constants are Constant nodes: a subgraph initializer's name would
    have to be unique across the whole model, which the branch cannot see."""
    inner = _squeeze_model(18).graph
    branch = helper.make_graph(list(inner.node), "then", [], list(inner.output))
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["other"])],
        "else",
        [],
        [helper.make_empty_tensor_value_info("other")],
    )
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    model = _model(
        [helper.make_node("If", ["flag"], ["out"], then_branch=branch, else_branch=other)],
        inputs=(flag,),
        outputs=("out",),
        constants=_target([0, 0, H]),
    )
    after = rnn_rewrite_rules.rewrite(model, ["layer_output"])
    (then,) = [a.g for a in after.graph.node[0].attribute if a.name == "then_branch"]
    assert "Squeeze" in [n.op_type for n in then.node] and not then.initializer
    names = {i.name for i in model.graph.initializer}
    assert {i.name for i in after.graph.initializer} <= names  # none added to the main graph
    _run_both(model, after, flag=np.array(True))


# unused_outputs and layout -----------------------------------------------------------


def _gru(outputs: list[str], **attrs: int) -> onnx.NodeProto:
    return helper.make_node("GRU", ["x", "w", "r"], outputs, hidden_size=H, **attrs)


def test_unused_outputs_refused_when_the_last_output_is_used() -> None:
    model = _model([_gru(["y", "y_h"])], outputs=("y_h",), gates=3)
    _assert_refused(unused_outputs.FAMILY, model, "the last output is used")


def test_unused_outputs_dropped_up_to_the_last_used_one() -> None:
    model = _model(
        [helper.make_node("LSTM", ["x", "w", "r"], ["y", "y_h", "y_c"], hidden_size=H)],
        outputs=("y",),
    )
    after = rnn_rewrite_rules.rewrite(model, ["unused_outputs"])
    assert list(after.graph.node[0].output) == ["y"]


def test_dead_rnn_is_refused_by_both_rules() -> None:
    nodes = [_gru(["y", "y_h"], layout=1), helper.make_node("Identity", ["x"], ["out"])]
    model = _model(nodes, x_shape=[BATCH, "seq", INPUT], outputs=("out",), gates=3)
    reason = "no output is used: the node is dead code"
    assert reason in refusal_reasons(unused_outputs.FAMILY.rules, model)
    assert reason in refusal_reasons(layout.FAMILY.rules, model)


def test_layout_zero_is_refused() -> None:
    model = _model([_gru(["y"], layout=0)], gates=3)
    _assert_refused(layout.FAMILY, model, "layout is already 0")


def test_layout_of_an_op_without_the_attribute_is_refused() -> None:
    node = helper.make_node(
        "DynamicQuantizeLSTM", ["x", "w", "r"], ["y"], hidden_size=H, domain="com.microsoft"
    )
    model = _model([node])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    reasons = refusal_reasons(layout.FAMILY.rules, model)
    assert any("DynamicQuantizeLSTM has no layout attribute" in r for r in reasons), reasons


def test_layout_absent_is_layout_zero() -> None:
    """No ``layout`` attribute is layout 0: refused (reasons first: a check reading it as 1
    would make the full rewrite loop)."""
    model = _model([_gru(["y"])], gates=3)
    assert "layout is already 0" in refusal_reasons(layout.FAMILY.rules, model)
    _assert_refused(layout.FAMILY, model, "layout is already 0")


def test_layout_refused_when_the_weights_disagree_with_the_direction() -> None:
    model = _model([_gru(["y"], layout=1)], x_shape=[BATCH, "seq", INPUT], directions=2, gates=3)
    _assert_refused(
        layout.FAMILY, model, "direction 'forward' disagrees with a weight of 2 directions"
    )


def test_layout_rewrite_keeps_the_node_name() -> None:
    node = _gru(["y"], layout=1)
    node.name = "encoder_gru"
    model = _model([node], x_shape=[BATCH, "seq", INPUT], gates=3)
    after = rnn_rewrite_rules.rewrite(model, ["layout"])
    (gru,) = [n for n in after.graph.node if n.op_type == "GRU"]
    assert gru.name == "encoder_gru"
    assert all(a.name != "layout" for a in gru.attribute)


# rule names --------------------------------------------------------------------------


def test_every_rule_is_selected_by_its_own_name() -> None:
    """Names are what ``--rules`` and the reports use: one per rule, saying its op."""
    from rnn_rewrite_rules.rules import FAMILIES, select_rules

    rules = [rule for family in FAMILIES for rule in family.all_rules]
    for rule in rules:
        assert [r.name for r in select_rules([rule.name])] == [rule.name], rule.name
    names = {rule.name for rule in rules}
    expected = {
        "DropZeroInitialState[GRU/2]",
        "ShareZeroInitialState[DynamicQuantizeLSTM/1]",
        "FoldRnnWeights[RNN/1]",
        "CollapseRnnGlue[Transpose]",
        "RerollCell[GRU]",
        "RerollRnn[Relu]",
        "FoldProvenIf[3]",
        "MergeForwardReverseY[RNN/2]",
    }
    assert expected <= names, expected - names

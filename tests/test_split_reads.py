"""Sibling Slices read as one Split: TorchScript's per-layer initial states
(``layer_glue/SplitLayerStates``) and keras' per-direction reads before a ``sum``/
``mul``/``ave`` merge (``layer_output/SplitDirections``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import initial_state, layer_glue, layer_output
from rnn_rewrite_rules.rules.layer_glue import SplitLayerStates
from rnn_rewrite_rules.rules.layer_output import ConcatDirections, SplitDirections
from tests.reasons import refusal_reasons
from tests.support import apply, op_counts

H, INPUT = 3, 4
STATES = [SplitLayerStates.rule()]
DIRECTIONS = [SplitDirections.rule()]


def _ints(**values: list[int]) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in values.items()]


def _weights(name: str, gates: int, input_size: int, directions: int = 1) -> list:
    rng = np.random.default_rng(len(name) + gates)
    shapes = {
        "w": (directions, gates * H, input_size),
        "r": (directions, gates * H, H),
        "b": (directions, 2 * gates * H),
    }
    return [
        numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), f"{name}_{k}")
        for k, s in shapes.items()
    ]


def _model(
    nodes: list, inputs: list, outputs: dict[str, int], inits: list, opset: int = 17
) -> onnx.ModelProto:
    """``outputs``: name -> rank."""
    declared = [
        helper.make_tensor_value_info(o, TensorProto.FLOAT, [None] * rank)
        for o, rank in outputs.items()
    ]
    graph = helper.make_graph(nodes, "g", inputs, declared, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _stacked(
    op: str = "GRU",
    layers: int = 2,
    stacked: int | str = 2,
    ranges: tuple[tuple[int, int], ...] | None = None,
    *,
    step: int | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    """TorchScript's stacked RNN: ``h0 [stacked, batch, H]`` (and ``c0`` for an LSTM),
    layer ``l`` reading ``Slice(h0, [l], [l + 1], [0])`` (or ``ranges[l]``)."""
    gates = {"GRU": 3, "LSTM": 4, "RNN": 1}[op]
    ranges = ranges or tuple((layer, layer + 1) for layer in range(layers))
    states = ["h0", "c0"] if op == "LSTM" else ["h0"]
    nodes, inits = [], _ints(axes0=[0], axes1=[1], step=[step or 1])
    source, size = "x", INPUT
    for layer, (start, end) in enumerate(ranges):
        inits += _ints(**{f"s{layer}": [start], f"e{layer}": [end]})
        sliced = []
        for state in states:
            extra = ["step"] if step is not None else []
            out = f"{state}_{layer}"
            nodes.append(
                helper.make_node("Slice", [state, f"s{layer}", f"e{layer}", "axes0", *extra], [out])
            )
            sliced.append(out)
        inits += _weights(f"l{layer}", gates, size)
        nodes.append(
            helper.make_node(
                op,
                [source, f"l{layer}_w", f"l{layer}_r", f"l{layer}_b", "", *sliced],
                [f"y{layer}", f"yh{layer}"],
                hidden_size=H,
                name=f"rnn{layer}",
            )
        )
        if opset < 13:
            squeeze = helper.make_node("Squeeze", [f"y{layer}"], [f"seq{layer}"], axes=[1])
        else:
            squeeze = helper.make_node("Squeeze", [f"y{layer}", "axes1"], [f"seq{layer}"])
        nodes.append(squeeze)
        source, size = f"seq{layer}", H
    nodes.append(helper.make_node("Concat", [f"yh{i}" for i in range(layers)], ["h_n"], axis=0))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", INPUT])]
    inputs += [
        helper.make_tensor_value_info(s, TensorProto.FLOAT, [stacked, "batch", H]) for s in states
    ]
    return _model(nodes, inputs, {source: 3, "h_n": 3}, inits, opset)


def _feeds(model: onnx.ModelProto, batch: int, seq: int, stacked: int = 2) -> dict:
    rng = np.random.default_rng(batch * 10 + seq)
    feeds = {"x": rng.standard_normal((seq, batch, INPUT)).astype(np.float32)}
    for value in model.graph.input[1:]:
        feeds[value.name] = rng.standard_normal((stacked, batch, H)).astype(np.float32)
    return feeds


def _assert_equal(before: onnx.ModelProto, after: onnx.ModelProto, stacked: int = 2) -> None:
    """Bit-equal in ORT at several sizes; at batch 0 in onnx.reference (ORT aborts the
    process on LSTM/GRU with batch 0)."""
    for batch, seq in ((1, 1), (3, 5), (2, 7)):
        feeds = _feeds(before, batch, seq, stacked)
        assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) == 0
    feeds = _feeds(before, 0, 2, stacked)
    expected = ReferenceEvaluator(before).run(None, feeds)
    actual = ReferenceEvaluator(after).run(None, feeds)
    assert [np.shape(a) for a in actual] == [np.shape(e) for e in expected]


# ------------------------------------------------------------------ per-layer states


@pytest.mark.parametrize("op", ["GRU", "LSTM", "RNN"])
def test_per_layer_state_slices_become_one_split(op: str) -> None:
    before = _stacked(op, layers=3, stacked=3)
    after, count = apply(STATES, before)
    states = 2 if op == "LSTM" else 1
    assert count == 3 * states
    counts = op_counts(after)
    assert counts["Slice"] == 0 and counts["Split"] == states, counts
    _assert_equal(before, after, stacked=3)
    assert apply(STATES, after)[1] == 0  # twice equals once


def test_split_before_opset_13_has_the_sizes_as_attribute() -> None:
    before = _stacked("GRU", opset=11)
    after, count = apply(STATES, before)
    assert count == 2
    (split,) = [n for n in after.graph.node if n.op_type == "Split"]
    assert [a.name for a in split.attribute] == ["axis", "split"] or {
        a.name for a in split.attribute
    } == {"axis", "split"}
    _assert_equal(before, after)


def test_the_default_rules_split_torchscript_char_rnn_states() -> None:
    """The committed TorchScript char-RNN exports: the per-layer ``Slice`` of ``h0``/``c0``
    and their ``Constant`` bounds go (GRU 20 -> 13 nodes, LSTM 29 -> 15)."""
    import rnn_rewrite_rules

    for name, states in (("char_rnn_gru", 1), ("char_rnn_lstm", 2)):
        before = onnx.load(f"tests/data/exporters/torch_script/{name}.onnx")
        after = rnn_rewrite_rules.rewrite(before)
        counts = op_counts(after)
        assert counts["Slice"] == 0 and counts["Split"] == states, counts
        assert len(after.graph.node) < len(before.graph.node)
        for batch, seq in ((1, 1), (3, 4)):
            rng = np.random.default_rng(seq)
            feeds = {"tokens": rng.integers(0, 20, (batch, seq)).astype(np.int64)}
            for value in before.graph.input[1:]:
                feeds[value.name] = rng.standard_normal((2, batch, 8)).astype(np.float32)
            assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) == 0


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        pytest.param({"stacked": 3}, "do not cover axis 0", id="a-layer-of-the-input-unread"),
        pytest.param(
            {"ranges": ((0, 2), (1, 2)), "stacked": 2}, "do not partition", id="overlapping"
        ),
        pytest.param({"stacked": "L"}, "not a constant size", id="symbolic-stack-axis"),
        pytest.param({"step": 2, "stacked": 4, "ranges": ((0, 2), (2, 4))}, "step 2", id="step"),
        pytest.param({"layers": 1, "stacked": 1}, "only one Slice", id="one-layer"),
    ],
)
def test_state_near_misses_refuse(kwargs: dict, reason: str) -> None:
    before = _stacked("GRU", **kwargs)
    assert apply(STATES, before)[1] == 0
    reasons = refusal_reasons(STATES, before)
    assert any(reason in r for r in reasons), reasons


def test_a_state_slice_read_by_another_node_refuses() -> None:
    before = _stacked("GRU")
    before.graph.node.append(helper.make_node("Relu", ["h0_0"], ["h0_relu"]))
    before.graph.output.append(
        helper.make_tensor_value_info("h0_relu", TensorProto.FLOAT, [None] * 3)
    )
    assert apply(STATES, before)[1] == 0
    reasons = refusal_reasons(STATES, before)
    assert any("read other than as an initial state" in r for r in reasons), reasons


# ------------------------------------------------------------------ per-direction reads


def _bidirectional(merge: str, *, state: bool = False, axis: int | None = None) -> onnx.ModelProto:
    """tf2onnx's keras ``Bidirectional(LSTM, merge_mode=merge)``: Y's two directions
    sliced, squeezed and merged (``state``: of Y_h instead)."""
    source, direction_axis = ("y_h", 0) if state else ("y", 1)
    cut = direction_axis if axis is None else axis
    inits = _ints(d0=[0], d1=[1], d2=[2], cut=[cut]) + _weights("l", 4, INPUT, 2)
    inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    nodes = [
        helper.make_node(
            "LSTM",
            ["x", "l_w", "l_r", "l_b"],
            ["y", "y_h"],
            hidden_size=H,
            direction="bidirectional",
        ),
        helper.make_node("Slice", [source, "d1", "d2", "cut"], ["bwd"]),
        helper.make_node("Squeeze", ["bwd", "cut"], ["bwd_sq"]),
        helper.make_node("Slice", [source, "d0", "d1", "cut"], ["fwd"]),
        helper.make_node("Squeeze", ["fwd", "cut"], ["fwd_sq"]),
    ]
    merged = {"sum": "Add", "mul": "Mul", "ave": "Add", "concat": "Concat"}[merge]
    attrs = {"axis": -1} if merge == "concat" else {}
    nodes.append(helper.make_node(merged, ["fwd_sq", "bwd_sq"], ["merged"], **attrs))
    if merge == "ave":
        nodes.append(helper.make_node("Mul", ["merged", "half"], ["out"]))
    else:
        nodes.append(helper.make_node("Identity", ["merged"], ["out"]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", INPUT])]
    return _model(nodes, inputs, {"out": 2 if state else 3}, inits)


def _assert_equal_merge(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    for batch, seq in ((1, 1), (3, 5), (0, 2)):
        feeds = {"x": np.random.default_rng(seq).standard_normal((seq, batch, INPUT))}
        feeds["x"] = feeds["x"].astype(np.float32)
        if batch == 0:  # ORT aborts the process on an LSTM at batch 0: onnx.reference
            expected = ReferenceEvaluator(before).run(None, feeds)
            actual = ReferenceEvaluator(after).run(None, feeds)
            assert [np.shape(a) for a in actual] == [np.shape(e) for e in expected]
            continue
        assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) == 0


@pytest.mark.parametrize("merge", ["sum", "mul", "ave"])
@pytest.mark.parametrize("state", [False, True], ids=["Y", "Y_h"])
def test_merged_directions_are_one_split(merge: str, state: bool) -> None:
    before = _bidirectional(merge, state=state)
    after, count = apply(DIRECTIONS, before)
    assert count == 2
    counts = op_counts(after)
    assert counts["Slice"] == 0 and counts["Split"] == 1, counts
    _assert_equal_merge(before, after)
    assert apply(DIRECTIONS, after)[1] == 0


def test_concatenated_directions_are_left_to_concat_directions() -> None:
    before = _bidirectional("concat")
    assert apply(DIRECTIONS, before)[1] == 0
    reasons = refusal_reasons(DIRECTIONS, before)
    assert any("ConcatDirections' form" in r for r in reasons), reasons
    after, count = apply([*DIRECTIONS, ConcatDirections.rule()], before)
    assert count == 1 and op_counts(after)["Slice"] == 0
    _assert_equal_merge(before, after)


def test_slices_of_the_batch_axis_refuse() -> None:
    """Y_h cut on its batch axis (1): a symbolic size, no partition to prove."""
    before = _bidirectional("sum", state=True, axis=1)
    reasons = refusal_reasons(DIRECTIONS, before)
    assert any("axis 1 of the sliced value is not a constant size" in r for r in reasons)


def test_slices_of_a_value_that_is_no_rnn_output_refuse() -> None:
    before = _bidirectional("sum")
    for node in before.graph.node:
        if node.op_type == "Slice":
            node.input[0] = "y_copy"
    before.graph.node.insert(1, helper.make_node("Relu", ["y"], ["y_copy"]))
    reasons = refusal_reasons(DIRECTIONS, before)
    assert any("the sliced value is not an RNN output" in r for r in reasons), reasons


def test_families_hold_the_rules() -> None:
    for target in ("portable", "onnxruntime"):
        assert "SplitLayerStates" in [r.name for r in layer_glue.FAMILY.rules_for(target)]
        assert "SplitLayerStates" not in [r.name for r in initial_state.FAMILY.rules_for(target)]
    assert "SplitDirections" in [r.name for r in layer_output.FAMILY.rules_for("portable")]


def test_stacked_zero_states_are_left_to_the_zero_state_rules() -> None:
    """torchlib's ``Slice(Expand(0, [L, batch, H]), [l], [l+1])`` per layer: the zero-state
    rules remove the Slices altogether, so the Split rule leaves them."""
    from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model

    before = build_torchlib_model(RnnConfig(num_layers=2))
    reasons = refusal_reasons(STATES, before)
    assert any("the stacked states are zeros" in r for r in reasons), reasons
    rules = [*initial_state.FAMILY.rules_for("portable"), *layer_glue.FAMILY.rules_for("portable")]
    after, _ = apply(rules, before)
    counts = op_counts(after)
    assert counts["Split"] == 0 and counts["Expand"] == 0, counts

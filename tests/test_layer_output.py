"""layer_output: the RNN output reshape chain -> Squeeze / constant Reshape, and its near misses."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model, random_inputs
from tests.support import apply, assert_equivalent, op_counts

RULES = rnn_rewrite_rules.rules(["layer_output"])


def _chain_nodes(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """The first layer's chain nodes by op type (the model's first RNN output chain)."""
    graph = model.graph
    transpose = next(
        n
        for n in graph.node
        if n.op_type == "Transpose" and list(n.attribute[0].ints) == [0, 2, 1, 3]
    )
    chain: dict[str, list[onnx.NodeProto]] = {"Transpose": [transpose]}
    frontier = set(transpose.output)
    for node in graph.node:
        if set(node.input) & frontier and node.op_type not in ("LSTM", "GRU"):
            chain.setdefault(node.op_type, []).append(node)
            if node.op_type != "Reshape" or node.input[0] not in set(transpose.output):
                frontier |= set(node.output)
    return chain


def _constant(model: onnx.ModelProto, name: str, values: list[int]) -> str:
    model.graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), name))
    return name


def _final_reshape(model: onnx.ModelProto) -> onnx.NodeProto:
    """The chain's last Reshape (one-layer, sequence-first models: it writes ``output``)."""
    return next(n for n in model.graph.node if n.output[0] == "output")


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize("opset", [12, 14, 18, 21])
def test_unidirectional_becomes_squeeze(op_type: str, opset: int) -> None:
    cfg = RnnConfig(op_type=op_type, num_layers=2, initial_states=True, opset=opset)
    model = build_torchlib_model(cfg)
    after, count = apply(RULES, model)
    assert count == 2
    counts = op_counts(after)
    assert counts["Shape"] == counts["Mul"] == counts["Reshape"] == 0
    assert counts["Squeeze"] == 2
    squeezes = [n for n in after.graph.node if n.op_type == "Squeeze"]
    assert all((len(n.input) == 2) == (opset >= 13) for n in squeezes)
    assert_equivalent(model, after, cfg)


def test_bidirectional_becomes_constant_reshape() -> None:
    cfg = RnnConfig(
        op_type="GRU", hidden_size=5, num_layers=3, bidirectional=True, initial_states=True
    )
    model = build_torchlib_model(cfg)
    after, count = apply(RULES, model)
    assert count == 3
    counts = op_counts(after)
    assert counts["Shape"] == counts["Mul"] == counts["Concat"] - 1 == 0  # Concat of h_n stays
    targets = {
        tuple(numpy_helper.to_array(i).tolist())
        for i in after.graph.initializer
        if i.name.startswith("rnn_rewrite_rules_")
    }
    assert targets == {(0, 0, 10)}
    assert_equivalent(model, after, cfg)


def test_shape_with_start_end_and_gather_variants() -> None:
    """What ORT's offline optimizer leaves: Gather on Shape(Y)."""
    cfg = RnnConfig(hidden_size=6, num_layers=2, bidirectional=True, initial_states=True)
    model = build_torchlib_model(cfg)
    y_shape_nodes = []
    chain = _chain_nodes(model)
    y = chain["Transpose"][0].input[0]
    shape = chain["Shape"][0]
    shape.input[0] = y  # Shape(Y): dims [seq, D, batch, H]
    del shape.attribute[:]
    gathers = {0: 0, 1: 2, 2: 1, 3: 3}  # transposed axis -> Y axis
    for index, node in enumerate(chain["Slice"]):
        node.op_type = "Gather"
        node.input[:] = [shape.output[0], _constant(model, f"gather_{index}", [gathers[index]])]
        y_shape_nodes.append(node)
    after, count = apply(RULES, model)
    assert count == 2
    assert op_counts(after)["Shape"] == 0
    assert_equivalent(model, after, cfg)


@pytest.mark.parametrize(
    ("target", "allowzero"), [([0, 0, -1], 0), ([0, 0, 8], 0), ([0, -1, 8], 0)]
)
def test_constant_targets_that_copy_dims(target: list[int], allowzero: int) -> None:
    cfg = RnnConfig(hidden_size=8, initial_states=True)
    model = build_torchlib_model(cfg)
    reshape = _final_reshape(model)
    reshape.input[1] = _constant(model, "target", target)
    reshape.attribute[0].i = allowzero
    after, count = apply(RULES, model)
    assert count == 1
    assert op_counts(after)["Squeeze"] == 1
    assert_equivalent(model, after, cfg)


def test_already_minimal_target_is_not_rewritten_again() -> None:
    cfg = RnnConfig(bidirectional=True, initial_states=True)
    once = rnn_rewrite_rules.rewrite(build_torchlib_model(cfg), ["layer_output"])
    twice, count = apply(RULES, once)
    assert count == 0
    assert op_counts(twice) == op_counts(once)


# ---------------------------------------------------------------- near misses: must not fire


def _mutated(mutation: str) -> tuple[RnnConfig, onnx.ModelProto]:
    cfg = RnnConfig(hidden_size=4, num_layers=1, initial_states=True)
    model = build_torchlib_model(cfg)
    chain = _chain_nodes(model)
    slices, concat, reshape = chain["Slice"], chain["Concat"][0], _final_reshape(model)
    if mutation == "perm":
        chain["Transpose"][0].attribute[0].ints[:] = [0, 1, 2, 3]
    elif mutation == "slice_bounds":
        slices[0].input[1:3] = slices[1].input[1:3]
    elif mutation == "concat_order":
        concat.input[0], concat.input[1] = concat.input[1], concat.input[0]
    elif mutation == "mul_to_add":
        chain["Mul"][0].op_type = "Add"
    elif mutation == "frozen_seq":  # what torch writes when it specialises the sequence axis
        reshape.input[1] = _constant(model, "frozen", [3, -1, 4])
    elif mutation == "frozen_batch":
        reshape.input[1] = _constant(model, "frozen", [-1, 2, 4])
    elif mutation == "allowzero_literal_zero":
        reshape.input[1] = _constant(model, "zeros", [0, 0, -1])
        reshape.attribute[0].i = 1
    elif mutation == "wrong_width":
        reshape.input[1] = _constant(model, "wide", [0, 0, -1, 1])
    elif mutation == "y_h_instead_of_y":
        rnn = next(n for n in model.graph.node if n.op_type == "LSTM")
        chain["Transpose"][0].input[0] = rnn.output[1]
    elif mutation == "layout_1":
        rnn = next(n for n in model.graph.node if n.op_type == "LSTM")
        next(a for a in rnn.attribute if a.name == "layout").i = 1
    elif mutation == "unknown_hidden_size":
        rnn = next(n for n in model.graph.node if n.op_type == "LSTM")
        rnn.attribute.remove(next(a for a in rnn.attribute if a.name == "hidden_size"))
        r_name = rnn.input[2]
        init = next(i for i in model.graph.initializer if i.name == r_name)
        model.graph.initializer.remove(init)
        model.graph.input.append(
            helper.make_tensor_value_info(r_name, onnx.TensorProto.FLOAT, None)
        )
    elif mutation == "target_overridable_initializer":  # a constant the caller can replace
        reshape.input[1] = _constant(model, "dims", [0, 0, -1])
        model.graph.input.append(helper.make_tensor_value_info("dims", onnx.TensorProto.INT64, [3]))
    elif mutation == "target_from_graph_input":
        model.graph.input.append(helper.make_tensor_value_info("dims", onnx.TensorProto.INT64, [3]))
        reshape.input[1] = "dims"
    else:
        raise AssertionError(mutation)
    return cfg, model


NEAR_MISSES = [
    "perm",
    "slice_bounds",
    "concat_order",
    "mul_to_add",
    "frozen_seq",
    "frozen_batch",
    "allowzero_literal_zero",
    "wrong_width",
    "y_h_instead_of_y",
    "layout_1",
    "unknown_hidden_size",
    "target_from_graph_input",
    "target_overridable_initializer",
]


@pytest.mark.parametrize("mutation", NEAR_MISSES)
def test_near_miss_is_left_alone(mutation: str) -> None:
    _, model = _mutated(mutation)
    reshape = _final_reshape(model)
    after, count = apply(RULES, model, check=False)
    assert count == 0
    kept = next(n for n in after.graph.node if n.output[0] == reshape.output[0])
    assert (kept.op_type, list(kept.input)) == ("Reshape", list(reshape.input))


def test_shape_used_elsewhere_keeps_graph_correct() -> None:
    """The Shape also feeds a graph output: rewrite Y's reshape, keep the Shape for its user."""
    cfg = RnnConfig(hidden_size=4, bidirectional=True, initial_states=True)
    model = build_torchlib_model(cfg)
    shape = _chain_nodes(model)["Shape"][0]
    model.graph.output.append(
        helper.make_tensor_value_info(shape.output[0], onnx.TensorProto.INT64, [4])
    )
    after, count = apply(RULES, model)
    assert count == 1
    assert op_counts(after)["Shape"] == 1
    for batch, seq in [(2, 3), (5, 1)]:
        feeds = random_inputs(cfg, batch, seq, rng=batch)
        expected, actual = runtime.run(model, feeds), runtime.run(after, feeds)
        assert runtime.max_abs_diff(expected, actual) <= 1e-6
        np.testing.assert_array_equal(actual[-1], [seq, batch, 2, 4])


def test_failure_reason_is_reported() -> None:
    """The condition says why it did not fire (what `rnn-rewrite` shows users)."""
    from onnxscript.rewriter import MatchingTracer, MatchStatus

    _, model = _mutated("frozen_seq")
    ir_model = ir.serde.deserialize_model(model)
    tracer = MatchingTracer()
    RULES.apply_to_model(ir_model, tracer=tracer)
    reasons = [
        match.match_result.reason
        for matches in tracer.best_matches_map.values()
        for match in matches
        if match.status == MatchStatus.CONDITION_FAILED
    ]
    assert any("sequence element is the constant 3" in r for r in reasons), reasons

"""reroll: unrolled LSTMCell / GRUCell loops become one ONNX LSTM / GRU node."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import reroll_cells
from rnn_rewrite_rules.testing.unrolled import (
    CELL_MUTATIONS,
    UnrolledCellConfig,
    build_unrolled_cell,
    cell_inputs,
    cell_reference,
)
from tests.reasons import refusal_reasons
from tests.support import as_function, op_counts, without_output

POSITIVE = [
    UnrolledCellConfig(),
    UnrolledCellConfig(op_type="GRU"),
    UnrolledCellConfig(reverse=True, gemm=False, read="slice", bias=False, seq=5),
    UnrolledCellConfig(op_type="GRU", reverse=True, gemm=False, read="slice", bias=False),
    UnrolledCellConfig(initial_state="constant_of_shape", opset=13),
    UnrolledCellConfig(op_type="GRU", initial_state="constant_of_shape", seq=2),
    UnrolledCellConfig(initial_state="folded", batch=2),
    UnrolledCellConfig(op_type="GRU", initial_state="folded", batch=1, bias=False),
]


def _batches(cfg: UnrolledCellConfig) -> list[int]:
    return [cfg.batch] if cfg.batch is not None else [1, 3, 7]


@pytest.mark.parametrize("cfg", POSITIVE, ids=str)
def test_loop_becomes_one_node_with_the_same_outputs(cfg: UnrolledCellConfig) -> None:
    model = build_unrolled_cell(cfg)
    result = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(result, full_check=True)
    counts = op_counts(result)
    assert counts[cfg.op_type] == 1
    assert counts["Sigmoid"] == counts["Gemm"] == counts["MatMul"] == counts["Split"] == 0
    (node,) = [n for n in result.graph.node if n.op_type == cfg.op_type]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attributes["direction"] == (b"reverse" if cfg.reverse else b"forward")
    if cfg.op_type == "GRU":
        assert attributes["linear_before_reset"] == 1
    for seed, batch in enumerate(_batches(cfg)):
        feeds = cell_inputs(cfg, batch, rng=seed)
        expected = cell_reference(cfg, feeds["x"])
        for optimize in (True, False):
            actual = runtime.run(result, feeds, optimize=optimize)
            assert runtime.max_abs_diff(expected, actual) <= 1e-5
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(result, feeds)) <= 1e-5


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_batch_zero_in_the_reference_evaluator(op_type: str) -> None:
    """ORT aborts the process on LSTM/GRU with batch 0: the reference evaluator runs it."""
    cfg = UnrolledCellConfig(op_type=op_type)
    model = build_unrolled_cell(cfg)
    result = rnn_rewrite_rules.rewrite(model)
    feeds = cell_inputs(cfg, 0)
    expected = ReferenceEvaluator(model).run(None, feeds)
    actual = ReferenceEvaluator(result).run(None, feeds)
    assert [a.shape for a in actual] == [e.shape for e in expected]


def test_longer_input_reads_the_first_steps_like_the_original() -> None:
    cfg = UnrolledCellConfig(seq=3)
    model = build_unrolled_cell(cfg)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].ClearField("dim_value")
    dims[0].dim_param = "seq"
    result = rnn_rewrite_rules.rewrite(model)
    assert op_counts(result)["Slice"] == 1
    feeds = cell_inputs(cfg, 2, seq=6)
    assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(result, feeds)) <= 1e-5


def _root(model: onnx.ModelProto) -> ir.Node:
    graph = ir.serde.deserialize_model(model).graph
    (node,) = [n for n in graph if any(u.name == "output_h_n" for u, _ in n.outputs[0].uses())]
    return node


REASONS = {
    "weights_at_step": "step 1 uses other weights",
    "broken_chain": "the steps read indices [0, 1, 3], not 0..2 in order or reversed",
    "step_read_twice": "the steps read indices [0, 1, 2, 2], not 0..3 in order or reversed",
    "extra_reader": "a value of step 0 (h_",
    "nonconstant_weights": "a gate weight is not a constant matrix",
}
GATE_REASONS = {
    ("LSTM", "gate_order"): "gate i is not part 0 of the Split (PyTorch order i, f, g, o)",
    ("GRU", "gate_order"): "gate r is not sigmoid(part 0 of both Splits) (order r, z, n)",
    ("LSTM", "wrong_activation"): "h_t is not sigmoid(o) * tanh(c_t)",
    ("GRU", "wrong_activation"): "h_t is not (h_{t-1} - n) * z + n",
}


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize("mutation", sorted(CELL_MUTATIONS))
def test_near_misses_are_refused_with_the_reason(op_type: str, mutation: str) -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type=op_type, seq=4, mutation=mutation))
    reason = reroll_cells.plan_cell_chain(_root(model), op_type)
    assert isinstance(reason, str)
    assert REASONS.get(mutation) or GATE_REASONS[op_type, mutation] in reason
    assert (REASONS.get(mutation) or GATE_REASONS[op_type, mutation]) in reason
    assert op_counts(rnn_rewrite_rules.rewrite(model))[op_type] == 0


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_a_single_step_is_left_alone(op_type: str) -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type=op_type, seq=1))
    assert reroll_cells.plan_cell_chain(_root(model), op_type) == (
        "a single cell step is not a loop (left alone)"
    )
    assert op_counts(rnn_rewrite_rules.rewrite(model))[op_type] == 0


def test_zero_state_of_another_batch_is_refused() -> None:
    cfg = UnrolledCellConfig(initial_state="folded", batch=2)
    model = build_unrolled_cell(cfg)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[1].ClearField("dim_value")
    dims[1].dim_param = "batch"
    reason = reroll_cells.plan_cell_chain(_root(model), "LSTM")
    assert reason == "the folded first step fixes a batch X does not provably have"


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_a_folded_batch_1_first_step_serves_every_batch(op_type: str) -> None:
    """Exported at batch 1 with X's batch left dynamic: the folded first step and the zero
    ``c_0`` are [1, ...] and broadcast, so the loop runs at any batch; so must the node
    (its states are its own zeros, not the batch-1 constants)."""
    cfg = UnrolledCellConfig(op_type=op_type, initial_state="folded", batch=1)
    model = build_unrolled_cell(cfg)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[1].dim_param = "batch"  # replaces the static 1
    after = rnn_rewrite_rules.rewrite(model)
    assert op_counts(after)[op_type] == 1
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        x = rng.standard_normal((dims[0].dim_value, batch, dims[2].dim_value)).astype(np.float32)
        diff = runtime.max_abs_diff(runtime.run(model, {"x": x}), runtime.run(after, {"x": x}))
        assert diff <= 1e-5, (batch, diff)


def test_gate_order_of_the_weights_is_onnx_order() -> None:
    cfg = UnrolledCellConfig(input_size=2, hidden_size=1)
    result = rnn_rewrite_rules.rewrite(build_unrolled_cell(cfg))
    (node,) = [n for n in result.graph.node if n.op_type == "LSTM"]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in result.graph.initializer}
    source = build_unrolled_cell(cfg)
    pytorch = {t.name: onnx.numpy_helper.to_array(t) for t in source.graph.initializer}
    i, f, g, o = pytorch["cell.weight_ih"]
    np.testing.assert_array_equal(inits[node.input[1]][0], np.stack([i, o, f, g]))


def test_rewriting_twice_equals_once_and_keeps_names() -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type="GRU", reverse=True))
    once = rnn_rewrite_rules.rewrite(model)
    twice = rnn_rewrite_rules.rewrite(once)
    assert once.SerializeToString() == twice.SerializeToString()
    assert [o.name for o in once.graph.output] == [o.name for o in model.graph.output]
    kept = {n.name for n in model.graph.node} & {n.name for n in once.graph.node}
    assert all(n.name in kept for n in once.graph.node if n.name.startswith("node_val"))


@settings(max_examples=20, deadline=None)
@given(
    op_type=st.sampled_from(["LSTM", "GRU"]),
    hidden=st.integers(1, 5),
    inputs=st.integers(1, 4),
    seq=st.integers(2, 5),
    reverse=st.booleans(),
    bias=st.booleans(),
    gemm=st.booleans(),
    read=st.sampled_from(["gather", "slice"]),
    state=st.sampled_from(["zeros", "constant_of_shape"]),
    batch=st.integers(1, 4),
)
def test_property_builder_loops_match_the_numpy_cell(
    op_type, hidden, inputs, seq, reverse, bias, gemm, read, state, batch
) -> None:
    cfg = UnrolledCellConfig(op_type, inputs, hidden, seq, reverse, bias, gemm, read, state)
    result = rnn_rewrite_rules.rewrite(build_unrolled_cell(cfg))
    assert op_counts(result)[op_type] == 1
    feeds = cell_inputs(cfg, batch)
    assert runtime.max_abs_diff(cell_reference(cfg, feeds["x"]), runtime.run(result, feeds)) <= 1e-5


def _rules(op_type: str) -> list:
    return [reroll_cells.RerollCell.rule(op_type)]


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_a_step_whose_h_feeds_the_next_is_not_the_end(op_type: str) -> None:
    cfg = UnrolledCellConfig(op_type=op_type, seq=3)
    model = without_output("y", build_unrolled_cell(cfg))
    found = refusal_reasons(_rules(op_type), model)
    assert "h_T feeds another step: not the last step" in found, found
    result = rnn_rewrite_rules.rewrite(model, ["reroll"])
    assert op_counts(result)[op_type] == 1
    for seed, batch in enumerate(_batches(cfg)):
        feeds = cell_inputs(cfg, batch, rng=seed)
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(result, feeds)) <= 1e-5


def test_a_reader_of_c_t_before_h_t_is_refused() -> None:
    """The merged node takes the place of ``h_T``'s Mul: a reader of ``c_T`` placed before
    it would read a value computed after it."""
    model = build_unrolled_cell(UnrolledCellConfig(seq=3))
    nodes = list(model.graph.node)
    (reader,) = [n for n in nodes if list(n.output) == ["c_n"]]
    (producer,) = [n for n in nodes if reader.input[0] in n.output]
    nodes.remove(reader)
    nodes.insert(nodes.index(producer) + 1, reader)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.checker.check_model(model)
    found = refusal_reasons(_rules("LSTM"), model)
    assert "a reader of c_T comes before h_T" in found, found
    assert op_counts(rnn_rewrite_rules.rewrite(model))["LSTM"] == 0


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize("mutation", sorted(CELL_MUTATIONS))
def test_near_misses_are_refused_by_the_rule(op_type: str, mutation: str) -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type=op_type, seq=4, mutation=mutation))
    expected = REASONS.get(mutation) or GATE_REASONS[op_type, mutation]
    found = refusal_reasons(_rules(op_type), model)
    assert any(expected in reason for reason in found), found


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_a_function_importing_another_opset_is_left_alone(op_type: str) -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type=op_type, seq=2))
    version = model.opset_import[0].version
    found = refusal_reasons(_rules(op_type), as_function(model, version - 1, ranked=True))
    reason = (
        f"function 'layer' imports opset {version - 1} of 'ai.onnx' but the model "
        f"{version}: an emitted op would be invalid in one of them"
    )
    assert reason in found, found

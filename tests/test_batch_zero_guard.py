"""``passes.BatchZeroGuardPass``: an LSTM/GRU node a rule built in place of ops that run at
batch 0 (re-rolled steps, a Loop of a constant trip count) sits in ``If(Size(X) == 0)``
where its batch is not proven >= 1: ONNX Runtime 1.32 aborts the process on an LSTM or
GRU node at batch 0, where those ops run.

Each batch-0 model runs in a child process: an abort ends only the child.
"""

from __future__ import annotations

import onnx
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import costs
from rnn_rewrite_rules.passes.batch_zero_guard import guarded_branch
from rnn_rewrite_rules.rules import one_step
from rnn_rewrite_rules.rules.reroll.cells import RerollCell
from rnn_rewrite_rules.testing.loops import LoopSpec, build_loop_model, loop_inputs
from rnn_rewrite_rules.testing.one_step import StepConfig, build_step, step_feeds
from rnn_rewrite_rules.testing.unrolled import (
    UnrolledCellConfig,
    UnrolledRnnConfig,
    build_unrolled_cell,
    build_unrolled_rnn,
    cell_inputs,
)
from tests.reasons import refusal_reasons
from tests.support import assert_agree, onnxruntime_in_child, op_counts


def _rewrite(model: onnx.ModelProto, target: str = "onnxruntime") -> onnx.ModelProto:
    return rnn_rewrite_rules.rewrite(model, target=target, context=costs.Context(ignore=True))


def _guards(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The main graph's batch-0 guards."""
    return [node for node in model.graph.node if guarded_branch(node) is not None]


@pytest.mark.parametrize("op_type", ["GRU", "LSTM"])
@pytest.mark.parametrize("initial_state", ["zeros", "inputs"])
def test_a_rerolled_node_runs_at_batch_0_where_the_steps_do(op_type: str, initial_state: str):
    cfg = UnrolledCellConfig(op_type=op_type, hidden_size=8, seq=4, initial_state=initial_state)
    model = build_unrolled_cell(cfg)
    after = _rewrite(model)
    assert len(_guards(after)) == 1 and op_counts(after)[op_type] == 1
    onnx.checker.check_model(after, full_check=True)
    for batch in (0, 1, 3):
        feeds = cell_inputs(cfg, batch, rng=batch)
        assert_agree(onnxruntime_in_child(model, feeds), onnxruntime_in_child(after, feeds))


@pytest.mark.parametrize("op_type", ["GRU", "LSTM"])
@pytest.mark.parametrize("initial_state", ["zeros", "inputs"])
def test_before_opset_9_the_guard_tiles_its_zeros(op_type: str, initial_state: str) -> None:
    """Opset 8 has no ``ConstantOfShape`` and its ``Constant`` holds no int64: ``Y``'s zeros
    are a ``Tile`` of a zero whose int64 operands are the main graph's initializers (the
    node was left unguarded there, and ONNX Runtime aborted at batch 0)."""
    cfg = UnrolledCellConfig(
        op_type=op_type, hidden_size=8, seq=4, initial_state=initial_state, opset=8
    )
    model = build_unrolled_cell(cfg)
    after = _rewrite(model)
    (guard,) = _guards(after)
    then = next(a.g for a in guard.attribute if a.name == "then_branch")
    assert "Tile" in [n.op_type for n in then.node]
    onnx.checker.check_model(after, full_check=True)
    for batch in (0, 1, 3):
        feeds = cell_inputs(cfg, batch, rng=batch)
        assert_agree(onnxruntime_in_child(model, feeds), onnxruntime_in_child(after, feeds))


def test_a_static_batch_of_at_least_1_needs_no_guard() -> None:
    """The batch is declared 2: the node never sees batch 0."""
    cfg = UnrolledCellConfig(op_type="GRU", hidden_size=8, seq=4, batch=2)
    after = _rewrite(build_unrolled_cell(cfg))
    assert op_counts(after)["GRU"] == 1 and not _guards(after)


def test_an_rnn_node_needs_no_guard() -> None:
    """ONNX Runtime's RNN runs at batch 0."""
    model = build_unrolled_rnn(UnrolledRnnConfig(input_size=4, hidden_size=8, seq=4))
    after = _rewrite(model)
    assert op_counts(after)["RNN"] == 1 and not _guards(after)


@pytest.mark.parametrize("cell", ["GRU", "LSTM"])
def test_a_constant_trip_loop_node_runs_at_batch_0_where_the_loop_does(cell: str) -> None:
    spec = LoopSpec(cell=cell, form="torch", trip_count="constant", outputs=("y", "h"))
    model = build_loop_model(spec)
    after = _rewrite(model)
    assert len(_guards(after)) == 1 and op_counts(after)[cell] == 1
    for batch in (0, 2):
        feeds = loop_inputs(spec, batch=batch)
        assert_agree(onnxruntime_in_child(model, feeds), onnxruntime_in_child(after, feeds))


def test_rewriting_twice_equals_once() -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type="LSTM", hidden_size=8, seq=3))
    once = _rewrite(model)
    assert _rewrite(once).SerializeToString() == once.SerializeToString()


def test_the_guard_keeps_output_names_and_a_graph_output_stays_one() -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type="GRU", hidden_size=8, seq=3))
    after = _rewrite(model)
    assert [o.name for o in after.graph.output] == [o.name for o in model.graph.output]


def test_a_streaming_step_of_a_symbolic_batch_runs_at_batch_0() -> None:
    """one_step's node of a symbolic batch (the GRU step with MatMul + Add projections,
    which the node, its broadcast and the guard do not outgrow) sits in the guard."""
    model = build_step(StepConfig(op_type="GRU", input_size=16, hidden_size=16, gemm=False))
    after = _rewrite(model)
    assert op_counts(after)["GRU"] == 1 and len(_guards(after)) == 1
    for batch in (0, 1, 3):
        feeds = step_feeds(model, batch, seed=batch)
        assert_agree(onnxruntime_in_child(model, feeds), onnxruntime_in_child(after, feeds))


def test_a_streaming_step_of_a_static_batch_is_not_guarded() -> None:
    model = build_step(StepConfig(op_type="LSTM", input_size=16, hidden_size=16, batch=2))
    after = _rewrite(model)
    assert op_counts(after)["LSTM"] == 1 and not _guards(after)


def test_a_streaming_step_counts_its_guard_against_the_step() -> None:
    """The builder's GRU step with Gemm projections is 14 nodes: the node, the broadcast of
    its symbolic batches and the guard are 16."""
    model = build_step(StepConfig(op_type="GRU"))
    found = refusal_reasons(one_step.make_rules("onnxruntime"), model, costs.Context(ignore=True))
    assert any("batch-0 guard" in r and "16 nodes, the step 14" in r for r in found), found
    assert op_counts(_rewrite(model))["GRU"] == 0


@pytest.mark.parametrize("op_type", ["GRU", "LSTM"])
def test_a_cell_reading_no_input_is_not_rerolled(op_type: str) -> None:
    """Input size 0: ``X`` is empty at every size, so a size test would skip every step,
    and ONNX Runtime aborts on such a GRU node at every batch."""
    cfg = UnrolledCellConfig(op_type=op_type, input_size=0, hidden_size=8, seq=3)
    model = build_unrolled_cell(cfg)
    found = refusal_reasons([RerollCell.rule(op_type, "onnxruntime")], model)
    assert any("input size is 0" in reason for reason in found), found
    assert op_counts(_rewrite(model))[op_type] == 0

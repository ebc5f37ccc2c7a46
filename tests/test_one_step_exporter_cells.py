"""jax2onnx and paddle2onnx one-step cells are recognised: on the default target each is
kept for a stated cost or size, never as "no recurrence"; at a static batch with the cost
model ignored each becomes one node with equal outputs."""

from __future__ import annotations

import pathlib

import onnx
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules._streaming import frame_feeds
from rnn_rewrite_rules.normalize import normalize
from rnn_rewrite_rules.rules import one_step
from tests.reasons import refusal_reasons
from tests.support import op_counts

DATA = pathlib.Path(__file__).parent / "data" / "exporters"

#: file -> the op of its one step
STEP_FILES = {
    "jax2onnx/hand_gru_step.onnx": "GRU",
    "jax2onnx/hand_lstm_step.onnx": "LSTM",
    "jax2onnx/nnx_gru_step.onnx": "GRU",
    "jax2onnx/nnx_lstm_step.onnx": "LSTM",
    "paddle2onnx/gru_cell_step.onnx": "GRU",
    "paddle2onnx/lstm_cell_step.onnx": "LSTM",  # c_t read through Identity(fetch_name_1)
}


@pytest.mark.parametrize("name", list(STEP_FILES))
def test_the_step_is_recognised_and_kept_for_a_stated_reason(name: str) -> None:
    before = onnx.load(DATA / name)
    context = costs.Context()
    after = rnn_rewrite_rules.rewrite(before, context=context)
    op = STEP_FILES[name]
    assert op_counts(after)[op] == 0
    reasons = [d.reason for d in context.declined if d.rule == f"OneStepCell[{op}]"]
    assert len(reasons) == 1, context.declined
    assert reasons[0].startswith("one step kept as plain ops: "), reasons
    assert "slower" in reasons[0] or "nodes, the step" in reasons[0], reasons


def _static_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    result = onnx.ModelProto()
    result.CopyFrom(model)
    for value in [*result.graph.input, *result.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].dim_param:
            dims[0].dim_value = batch
    return result


@pytest.mark.parametrize("name", list(STEP_FILES))
def test_at_a_static_batch_the_step_is_one_node(name: str) -> None:
    before = _static_batch(onnx.load(DATA / name), 2)
    after = rnn_rewrite_rules.rewrite(
        before, target="onnxruntime", context=costs.Context(ignore=True)
    )
    onnx.checker.check_model(after, full_check=True)
    assert op_counts(after)[STEP_FILES[name]] == 1
    assert len(after.graph.node) < len(before.graph.node)
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]
    for seed in (0, 1):
        feeds = frame_feeds(before, {}, seed=seed)
        diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
        assert diff <= 1e-5, f"{name}: {diff}"
    zero = _static_batch(onnx.load(DATA / name), 0)
    rewritten = rnn_rewrite_rules.rewrite(
        zero, target="onnxruntime", context=costs.Context(ignore=True)
    )
    feeds = frame_feeds(zero, {})
    expected = ReferenceEvaluator(zero).run(None, feeds)
    actual = ReferenceEvaluator(rewritten).run(None, feeds)
    assert [a.shape for a in actual] == [e.shape for e in expected]


def test_an_lstm_gate_is_not_an_rnn_step() -> None:
    """``tanh(x W + h R + b)`` inside jax2onnx's LSTM step reads like an RNN step: the RNN
    rule refuses it as a gate of the proven LSTM step (else four RNN nodes would take the
    gates and the LSTM would never be one node)."""
    ir_model = ir.serde.deserialize_model(
        _static_batch(onnx.load(DATA / "jax2onnx/nnx_lstm_step.onnx"), 2)
    )
    normalize(ir_model)  # jax2onnx's product Gemms, as rewrite() runs the rules on them
    model = ir.serde.serialize_model(ir_model)
    rules = one_step.make_rules("onnxruntime")
    found = refusal_reasons(rules, model, costs.Context(ignore=True))
    gates = [r for r in found if "is a gate of an LSTM step, not an RNN step" in r]
    assert len(gates) == 4, found

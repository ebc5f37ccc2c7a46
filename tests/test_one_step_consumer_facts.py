"""``one_step``: batches the step's own nodes prove equal (a ``Concat(x, h)`` runs only when
``x``'s batch is ``h``'s), and the near misses that prove nothing."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules.rules import one_step
from rnn_rewrite_rules.testing.one_step import StepConfig, build_step
from tests.reasons import refusal_reasons
from tests.support import op_counts

IGNORE = costs.Context(ignore=True)
INPUT, HIDDEN = 6, 8
_ONE_NODE_BROADCAST = "(not proven equal) is 12 nodes, the step 4"
_C_ONLY = "c_(t-1)'s batch to x_t's (not proven equal; h_(t-1)'s is)"


def _info(name: str, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _model(nodes, inputs, outputs, weights, opset: int = 20) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.uniform(-0.4, 0.4, shape).astype(np.float32), name)
        for name, shape in weights.items()
    ]
    graph = helper.make_graph(nodes, "step", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def concat_lstm_step(opset: int = 20, static_batch: int | None = None) -> onnx.ModelProto:
    """The VAD decoder's step: ``Gemm(Concat(x, h))``, each input its own batch name (or
    all of ``static_batch``)."""
    n = helper.make_node
    nodes = [
        n("Concat", ["x", "h"], ["cat"], axis=-1, name="cat"),
        n("Gemm", ["cat", "W", "b"], ["gates"], transB=1, name="gemm"),
        n("Split", ["gates"], ["i", "f", "g", "o"], axis=1, num_outputs=4, name="split")
        if opset >= 18
        else n("Split", ["gates"], ["i", "f", "g", "o"], axis=1, name="split"),
        n("Sigmoid", ["i"], ["si"], name="si"),
        n("Sigmoid", ["f"], ["sf"], name="sf"),
        n("Tanh", ["g"], ["tg"], name="tg"),
        n("Sigmoid", ["o"], ["so"], name="so"),
        n("Mul", ["sf", "c"], ["fc"], name="fc"),
        n("Mul", ["si", "tg"], ["ig"], name="ig"),
        n("Add", ["fc", "ig"], ["c_out"], name="c_add"),
        n("Tanh", ["c_out"], ["tc"], name="tc"),
        n("Mul", ["so", "tc"], ["h_out"], name="h_mul"),
    ]
    batches = ("bx", "bh", "bc") if static_batch is None else (static_batch,) * 3
    widths = (INPUT, HIDDEN, HIDDEN)
    inputs = [_info(v, [b, w]) for v, b, w in zip("xhc", batches, widths, strict=True)]
    outputs = [_info("h_out", [None, HIDDEN]), _info("c_out", [None, HIDDEN])]
    weights = {"W": (4 * HIDDEN, INPUT + HIDDEN), "b": (4 * HIDDEN,)}
    return _model(nodes, inputs, outputs, weights, opset)


def rnn_step(concat: bool, extra: Sequence[onnx.NodeProto] = ()) -> onnx.ModelProto:
    """``h_out = Tanh(Concat(x, h) @ W + b)``, or the same with one Gemm per input."""
    n = helper.make_node
    if concat:
        nodes = [
            n("Concat", ["x", "h"], ["cat"], axis=1, name="cat"),
            n("MatMul", ["cat", "W"], ["mm"], name="matmul"),
            n("Add", ["mm", "b"], ["pre"], name="bias"),
        ]
        weights = {"W": (INPUT + HIDDEN, HIDDEN), "b": (HIDDEN,)}
    else:
        nodes = [
            n("Gemm", ["x", "Wx", "b"], ["px"], transB=1, name="gemm_x"),
            n("Gemm", ["h", "Wh", "bh_"], ["ph"], transB=1, name="gemm_h"),
            n("Add", ["px", "ph"], ["pre"], name="add"),
        ]
        weights = {"Wx": (HIDDEN, INPUT), "Wh": (HIDDEN, HIDDEN), "b": (HIDDEN,), "bh_": (HIDDEN,)}
    nodes = [*nodes, n("Tanh", ["pre"], ["h_out"], name="act"), *extra]
    inputs = [_info("x", ["bx", INPUT]), _info("h", ["bh", HIDDEN])]
    outputs = [_info("h_out", [None, HIDDEN])] + [_info(o, None) for e in extra for o in e.output]
    return _model(nodes, inputs, outputs, weights)


def _rewrite(model: onnx.ModelProto) -> onnx.ModelProto:
    return rnn_rewrite_rules.rewrite(model, context=IGNORE, target="onnxruntime")


def _feeds(model: onnx.ModelProto, batches: dict[str, int], seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dims = [batches.get(d.dim_param, d.dim_value) for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def test_a_concat_of_x_and_h_leaves_only_c_to_broadcast() -> None:
    """Only ``c``'s batch is left to broadcast; with the batch-0 guard of the symbolic batch
    the replacement (17 nodes) outgrows the step (12), so it stays (an LSTM step whose
    ``c`` is broadcast is rewritten only from 17 nodes)."""
    before = concat_lstm_step()
    reasons = refusal_reasons(one_step.make_rules("onnxruntime"), before, IGNORE)
    assert any(_C_ONLY in r and "batch-0 guard" in r and "17 nodes, the step 12" in r
               for r in reasons), reasons  # fmt: skip
    assert op_counts(_rewrite(before))["LSTM"] == 0


def test_without_c_a_concat_proves_every_batch() -> None:
    """An RNN step reading ``Concat(x, h)``: the node alone, no Expand."""
    before = rnn_step(concat=True)
    after = _rewrite(before)
    counts = op_counts(after)
    assert counts["RNN"] == 1 and counts["Expand"] == 0
    for batch in (1, 3):
        feeds = _feeds(before, {"bx": batch, "bh": batch}, seed=batch)
        assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) <= 1e-5
    feeds = _feeds(before, {"bx": 0, "bh": 0})
    actual = ReferenceEvaluator(after).run(None, feeds)
    assert [a.shape for a in actual] == [(0, HIDDEN)]
    assert _rewrite(after).graph.SerializeToString() == after.graph.SerializeToString()


def test_the_concat_step_is_then_the_cost_tables_to_decide() -> None:
    """With the checked-in tables the reason is the measured cost, not the node count."""
    model = concat_lstm_step(static_batch=1)
    reasons = refusal_reasons(one_step.make_rules("onnxruntime"), model)
    assert any("LSTM kernel is slower" in r for r in reasons), reasons
    assert not any(" nodes, the step " in r for r in reasons), reasons


def test_before_opset_15_the_state_broadcast_outgrows_the_step() -> None:
    """``Shape`` takes no ``start``/``end`` before opset 15: one more node (a Slice)."""
    model = concat_lstm_step(14)
    reasons = refusal_reasons(one_step.make_rules("onnxruntime"), model, IGNORE)
    assert any(_C_ONLY in r and "18 nodes, the step 12" in r for r in reasons), reasons


def test_a_concat_on_the_batch_axis_proves_nothing() -> None:
    """``Concat(x, h, axis=0)`` stacks any two batches (I == H here, so it runs)."""
    extra = [helper.make_node("Concat", ["x", "h"], ["rows"], axis=0, name="rows")]
    model = rnn_step(concat=False, extra=extra)
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_value = HIDDEN
    reasons = refusal_reasons(one_step.make_rules("onnxruntime"), model, IGNORE)
    assert any(_ONE_NODE_BROADCAST in r for r in reasons), reasons


def _if_concat() -> onnx.NodeProto:
    """``If(flag)`` whose then-branch concatenates ``x`` and ``h`` (else: ``x``)."""
    then = helper.make_graph(
        [helper.make_node("Concat", ["x", "h"], ["t"], axis=1)], "then", [], [_info("t", None)]
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])], "else", [], [_info("e", None)]
    )
    return helper.make_node(
        "If", ["flag"], ["branch"], then_branch=then, else_branch=other, name="if"
    )


@pytest.mark.parametrize("where", ["if_branch", "outside_the_step"])
def test_a_concat_the_step_is_not_computed_from_proves_nothing(where) -> None:
    """A Concat in an If branch runs only when taken; one outside the step need not run
    for ``h_t`` to be computed (the proof is the step's own nodes)."""
    if where == "if_branch":
        model = rnn_step(concat=False, extra=[_if_concat()])
        model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    else:
        extra = [helper.make_node("Concat", ["x", "h"], ["side"], axis=1, name="side")]
        model = rnn_step(concat=False, extra=extra)
    reasons = refusal_reasons(one_step.make_rules("onnxruntime"), model, IGNORE)
    assert any(_ONE_NODE_BROADCAST in r for r in reasons), reasons
    assert op_counts(_rewrite(model))["RNN"] == 0


def test_a_broadcasting_add_proves_nothing() -> None:
    """``Gemm(h) + Gemm(x)`` runs with a batch of 1 against any other: still broadcast."""
    model = build_step(StepConfig(op_type="LSTM"))
    reasons = refusal_reasons(one_step.make_rules("onnxruntime"), model, IGNORE)
    assert any("the states (not proven equal) and its batch-0 guard" in r for r in reasons)


def test_the_original_fails_where_x_and_h_differ_in_batch() -> None:
    """By ONNX's Concat (``onnx.reference``), also with one batch 0: ONNX Runtime's Concat
    then skips the empty input and leaves those columns uninitialised, no defined output."""
    model = concat_lstm_step()
    feeds = _feeds(model, {"bx": 0, "bh": 3, "bc": 3})
    with pytest.raises(ValueError, match="concatenation axis must match"):
        ReferenceEvaluator(model).run(None, feeds)

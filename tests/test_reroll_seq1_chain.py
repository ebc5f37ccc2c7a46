"""reroll's MergeSeq1Chain: a layer called once per step (a chain of one-step GRU / RNN /
LSTM nodes) becomes one node over the steps; near misses keep their nodes, with reasons."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules.rules.reroll import plan_seq1_chain, seq1_chain
from rnn_rewrite_rules.testing.seq1_chain import (
    Seq1ChainConfig,
    build_seq1_chain,
    seq1_chain_feeds,
)
from tests.exporter_files import DATA
from tests.reasons import refusal_reasons

EXPORTS = ["torch_dynamo", "torch_script"]


def _ignoring_costs() -> costs.Context:
    """The structure at any size; the table's decision is tested at the end."""
    return costs.Context(ignore=True)


def _ops(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in model.graph.node)


def _run(model: onnx.ModelProto, feeds: dict, batch: int) -> list[np.ndarray]:
    """ONNX Runtime, or ``onnx.reference`` at batch 0 (ORT aborts the process on LSTM and
    GRU there)."""
    if batch == 0:
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]
    return runtime.run(model, feeds)


def _assert_same_outputs(original, rewritten, sizes) -> None:
    for seed, (batch, seq) in enumerate(sizes):
        feeds = seq1_chain_feeds(original, batch, seq, seed)
        expected, actual = _run(original, feeds, batch), _run(rewritten, feeds, batch)
        assert len(expected) == len(actual)
        for e, a in zip(expected, actual, strict=True):
            assert e.shape == a.shape, (batch, seq)
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


POSITIVE = [
    Seq1ChainConfig(),
    Seq1ChainConfig(op_type="RNN", steps=2),
    Seq1ChainConfig(op_type="LSTM", steps=5),
    Seq1ChainConfig(initial_state="none", steps=3),
    Seq1ChainConfig(op_type="LSTM", initial_state="none"),
    Seq1ChainConfig(mutation="shuffled", steps=5),  # rows 0, 2, 1, 3, 4: X is their Concat
    Seq1ChainConfig(opset=12),  # Slice/Squeeze in their opset-12 form
    Seq1ChainConfig(seq=4),  # x's sequence axis fixed to the steps
]


@pytest.mark.parametrize("cfg", POSITIVE, ids=str)
def test_a_chain_becomes_one_node_with_equal_outputs(cfg: Seq1ChainConfig) -> None:
    original = build_seq1_chain(cfg)
    rewritten = rnn_rewrite_rules.rewrite(original, target="onnxruntime", context=_ignoring_costs())
    onnx.checker.check_model(rewritten, full_check=True)
    assert _ops(rewritten)[cfg.op_type] == 1
    assert len(rewritten.graph.node) < len(original.graph.node)
    longer = [cfg.seq] if cfg.seq is not None else [cfg.steps, cfg.steps + 3]
    _assert_same_outputs(original, rewritten, [(b, s) for b in (0, 1, 3) for s in longer])


@pytest.mark.parametrize("exporter", EXPORTS)
def test_the_committed_seq2seq_encoders_become_one_gru(exporter: str) -> None:
    """torch 2.13 (dynamo: 79 nodes, TorchScript: 72) exports of ``nn.GRU`` called once per
    step of ``x[:, t:t+1]``: one GRU over ``x[:, :5]``, equal outputs (the traced length
    stays: at seq 7 both read 5 steps)."""
    path = DATA / exporter / "gru_seq2seq_encoder_steps.onnx"
    original = onnx.load(path)
    rewritten = rnn_rewrite_rules.rewrite(original, context=_ignoring_costs())
    onnx.checker.check_model(rewritten, full_check=True)
    assert _ops(rewritten)["GRU"] == 1 and len(rewritten.graph.node) <= 8
    _assert_same_outputs(original, rewritten, [(2, 5), (0, 5), (1, 5), (7, 5), (3, 7)])


def test_rewriting_twice_equals_once() -> None:
    once = rnn_rewrite_rules.rewrite(build_seq1_chain(Seq1ChainConfig()), context=_ignoring_costs())
    twice = rnn_rewrite_rules.rewrite(once, context=_ignoring_costs())
    assert twice.SerializeToString() == once.SerializeToString()


def _last_step(model: onnx.ModelProto, op_type: str = "GRU") -> ir.Node:
    return [n for n in ir.serde.deserialize_model(model).graph if n.op_type == op_type][-1]


NEAR_MISSES = {
    "weights": "'step0' and 'step1' read other weights (input 1)",
    "depends": "a later step's X depends on an output of 'step0'",
    "state": (
        "the initial state of 'step1' is Add of 'step0''s final state, not that state: "
        "the state changes between the steps"
    ),
    "reverse": "GRU 'step1' is not forward",
}


@pytest.mark.parametrize("mutation", sorted(NEAR_MISSES))
def test_near_misses_keep_both_steps_with_the_reason(mutation: str) -> None:
    cfg = Seq1ChainConfig(steps=2, mutation=mutation, input_size=8)
    model = build_seq1_chain(cfg)
    assert plan_seq1_chain(_last_step(model)) == NEAR_MISSES[mutation]
    rewritten = rnn_rewrite_rules.rewrite(model, target="onnxruntime", context=_ignoring_costs())
    assert _ops(rewritten)["GRU"] == 2
    _assert_same_outputs(model, rewritten, [(2, 2), (1, 3)])


def test_a_reader_before_the_last_step_is_refused() -> None:
    """The merged node is put where the last step was: a node reading an earlier step's Y
    before that would read it before it exists."""
    model = build_seq1_chain(Seq1ChainConfig(steps=3, mutation="late_reader"))
    reasons = refusal_reasons(seq1_chain.make_rules("onnxruntime"), model, _ignoring_costs())
    assert "a reader of step 0's output comes before the last step" in reasons
    rewritten = rnn_rewrite_rules.rewrite(model, target="onnxruntime", context=_ignoring_costs())
    assert _ops(rewritten)["GRU"] == 3


def test_a_partial_chain_merges_and_keeps_the_stack() -> None:
    """Steps 0-2 share weights, step 3 does not: 0-2 merge, the Concat of all four steps'
    outputs reads the merged three as one input."""
    model = build_seq1_chain(Seq1ChainConfig(mutation="weights"))
    rewritten = rnn_rewrite_rules.rewrite(model, target="onnxruntime", context=_ignoring_costs())
    assert _ops(rewritten)["GRU"] == 2
    _assert_same_outputs(model, rewritten, [(2, 4), (0, 4), (3, 6)])


@pytest.mark.parametrize("exporter", EXPORTS)
@pytest.mark.parametrize("target", ["portable", "onnxruntime"])
def test_the_cost_table_decides(exporter: str, target: str) -> None:
    """With the checked-in tables the chain merges exactly where ``seq1_chain.json`` says
    the merged GRU is no slower (hidden 8, 5 steps, symbolic batch), else the reason is
    recorded."""
    decision = costs.no_slower(target, "GRU", 8, 5, None, "forward", seq1_chain.FORM)
    context = costs.Context()
    model = onnx.load(DATA / exporter / "gru_seq2seq_encoder_steps.onnx")
    rewritten = rnn_rewrite_rules.rewrite(model, target=target, context=context)
    assert (_ops(rewritten)["GRU"] == 1) == decision.fires
    reasons = [d.reason for d in context.declined]
    if decision.fires:
        assert not any("one-step nodes" in r for r in reasons)
    else:
        assert any("a chain of one-step nodes merged: " in r for r in reasons), reasons

"""``SequenceScanPass``: a sequence a Loop collects with ``SequenceInsert`` for one
``ConcatFromSequence`` is a scan output; TorchScript's scripted cell loops become one node.

The original fails at zero steps (``ConcatFromSequence`` of an empty sequence); there
the rewrite may run, and does.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.normalize import Journal, SequenceScanPass
from rnn_rewrite_rules.rules import loop_scan
from tests.reasons import refusal_reasons
from tests.support import op_counts

TORCH_SCRIPT = Path(__file__).parent / "data" / "exporters" / "torch_script"
RECURRENT = ("LSTM", "GRU", "RNN", "Loop", "Scan", "SequenceInsert", "ConcatFromSequence")

COLLECTED = """<ir_version: 8, opset_import: ["" : 17]>
agraph (float[T, N, 3] x, float[N, 3] h0) => (float[T, N, 3] ys, float[N, 3] h) {
    zero = Constant<value = int64 {0}>()
    shape = Shape(x)
    trips = Gather<axis = 0>(shape, zero)
    cond = Constant<value = bool {1}>()
    s0 = SequenceEmpty<dtype = 1>()
    h, s = Loop(trips, cond, h0, s0) <body = loop_body (int64 i, bool c_in,
        float[N, 3] h_in, seq(float) s_in) => (bool c_out, float[N, 3] h_out,
        seq(float) s_out) {
        c_out = Identity(c_in)
        x_t = Gather<axis = 0>(x, i)
        a = Add(x_t, h_in)
        h_out = Tanh(a)
        APPEND
    }>
    ys = CONCAT(s)
}
"""
APPEND = "s_out = SequenceInsert(s_in, h_out)"
STACK = "ConcatFromSequence<axis = 0, new_axis = 1>"
#: each step's value Unsqueezed on axis 0, concatenated on axis 0 (no new axis)
UNSQUEEZED = (
    "axes = Constant<value = int64[1] {0}>()\n"
    "        u = Unsqueeze(h_out, axes)\n"
    "        s_out = SequenceInsert(s_in, u)"
)
#: the body reads the sequence (its length scales the state)
READ = (
    "n = SequenceLength(s_in)\n        f = Cast<to = 1>(n)\n        g = Mul(h_out, f)\n"
    "        s_out = SequenceInsert(s_in, g)"
)
AT_POSITION = (
    "pos = Constant<value = int64 {0}>()\n        s_out = SequenceInsert(s_in, h_out, pos)"
)


def _text(append: str = APPEND, concat: str = STACK, start: str = "") -> str:
    text = COLLECTED.replace("APPEND", append).replace("CONCAT", concat)
    return text.replace("SequenceEmpty<dtype = 1>()", start) if start else text


def _run(model: ir.Model | onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    proto = ir.serde.serialize_model(model) if isinstance(model, ir.Model) else model
    onnx.checker.check_model(proto, full_check=True)
    return runtime.session(proto, log_level=4).run(None, feeds)


def _feeds(steps: int, batch: int, width: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((steps, batch, width)).astype(np.float32)}
    if width == 3:
        feeds["h0"] = rng.standard_normal((batch, 3)).astype(np.float32)
    return feeds


def _printed(model: ir.Model) -> str:
    """The model as text; a Constant's tensor printed without the name onnx-ir gives it
    when its value is read (``get_const_tensor``)."""
    return onnx.printer.to_text(ir.serde.serialize_model(model)).replace(" axes {", " {")


@pytest.mark.parametrize("append", [APPEND, UNSQUEEZED], ids=["new axis", "unsqueezed"])
def test_a_collected_sequence_becomes_a_scan_output(append: str) -> None:
    concat = STACK if append == APPEND else "ConcatFromSequence<axis = 0>"
    text = _text(append, concat)
    before, after = ir.from_onnx_text(text), ir.from_onnx_text(text)
    journal = Journal()
    scan = SequenceScanPass(journal)
    assert scan(after).modified and not scan.refusals
    ops = op_counts(after)
    assert ops["SequenceEmpty"] == 1 and ops["ConcatFromSequence"] == 0  # the start is dead
    loop = next(n for n in after.graph if n.op_type == "Loop")
    assert [v.name for v in loop.outputs] == ["h", "ys"]
    for steps, batch in ((1, 1), (3, 2), (7, 1)):
        feeds = _feeds(steps, batch)
        for want, got in zip(_run(before, feeds), _run(after, feeds), strict=True):
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want)
    zero = _feeds(0, 2)
    with pytest.raises(Exception, match="1 or more inputs"):
        _run(before, zero)
    assert _run(after, zero)[0].shape[0] == 0  # where the original fails, the rewrite runs
    assert journal.restore() == 1 and _printed(after) == _printed(ir.from_onnx_text(text))


@pytest.mark.parametrize(
    ("append", "concat", "reason"),
    [
        (READ, STACK, "the body reads the sequence s_in that SequenceInsert appends to"),
        (AT_POSITION, STACK, "SequenceInsert inserts at a position"),
        (
            APPEND,
            "ConcatFromSequence<axis = 1>",
            "ConcatFromSequence concatenates on axis 1 (new_axis=0): not a stack",
        ),
        (
            APPEND,
            "ConcatFromSequence<axis = 0>",
            "ConcatFromSequence concatenates on axis 0 without new_axis and the collected"
            " h_out is not Unsqueeze(z, [0])",
        ),
    ],
    ids=["read in the body", "at a position", "another axis", "no new axis"],
)
def test_near_misses_stay_with_the_reason(append: str, concat: str, reason: str) -> None:
    _assert_left(_text(append, concat), reason, runs=append != READ)


def test_a_sequence_that_does_not_start_empty_stays_with_the_reason() -> None:
    """``SequenceConstruct(h0)``: the stack holds ``h0`` before the steps."""
    text = _text(start="SequenceConstruct(h0)")
    _assert_left(text, "the sequence SequenceInsert appends to does not start empty", runs=True)


def _assert_left(text: str, reason: str, *, runs: bool) -> None:
    model = ir.from_onnx_text(text)
    printed = _printed(model)
    scan = SequenceScanPass()
    assert not scan(model).modified
    assert [name for name, _ in scan.refusals] == [""]
    assert reason in scan.refusals[0][1]
    assert _printed(model) == printed
    if runs:  # the original runs: the twin is real
        _run(model, _feeds(3, 2))


def _all_ops(model: onnx.ModelProto) -> collections.Counter[str]:
    """Op counts of the graph and every subgraph in it."""
    graph = ir.serde.deserialize_model(model).graph
    return collections.Counter(n.op_type for n in ir.traversal.RecursiveGraphIterator(graph))


@pytest.mark.parametrize(
    ("name", "nodes", "recurrent"),
    [
        # the LSTM needs no zero-step guard (the original fails at 0 steps) but is kept
        # from batch 0 (passes.BatchZeroGuardPass: ONNX Runtime aborts on it there)
        ("lstmcell_scripted_loop", (93, 16), {"LSTM": 1}),
        # the GRU keeps its zero-step guard, ONNX Runtime's GRU aborting the process on
        # 0 steps: an If whose no-step branch is a Loop of no step and no cell, which
        # reads the exporter's zeros (so they are not made an explicit state as well)
        ("grucell_plain_scripted_loop", (67, 26), {"GRU": 1, "Loop": 1}),
    ],
)
def test_scripted_cell_loops_become_one_node(
    name: str, nodes: tuple[int, int], recurrent: dict[str, int]
) -> None:
    original = onnx.load(TORCH_SCRIPT / f"{name}.onnx")
    rewritten = rnn_rewrite_rules.rewrite(original)
    onnx.checker.check_model(rewritten, full_check=True)
    before, after = _all_ops(original), _all_ops(rewritten)
    assert (before.total(), after.total()) == nodes
    assert {op: after[op] for op in RECURRENT if after[op]} == recurrent
    assert [o.name for o in rewritten.graph.output] == [o.name for o in original.graph.output]
    for steps in (1, 3, 7):
        for batch in (1, 2):
            feeds = _feeds(steps, batch, width=6, seed=steps)
            for want, got in zip(_run(original, feeds), _run(rewritten, feeds), strict=True):
                assert got.shape == want.shape
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    zero = _feeds(0, 2, width=6)
    with pytest.raises(Exception, match="1 or more inputs"):
        _run(original, zero)
    assert _run(rewritten, zero)[0].shape[0] == 0  # the original fails: the rewrite may run


def _normalised_lstm_file() -> ir.Model:
    model = ir.load(TORCH_SCRIPT / "lstmcell_scripted_loop.onnx")
    assert SequenceScanPass()(model).modified
    return model


def _inner_lstm(model: ir.Model) -> ir.Node:
    loop = next(n for n in model.graph if n.op_type == "Loop")
    return next(n for n in loop.attributes["body"].as_graph() if n.op_type == "LSTM")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("clip", "LSTM '/cell/LSTM' clips or parameterises its activations"),
        ("reverse", "LSTM '/cell/LSTM' is not forward over [seq, batch, I]"),
        ("c0", "LSTM '/cell/LSTM''s initial c is not the carried c_(t-1)"),
    ],
)
def test_a_step_node_that_is_not_one_cell_step_is_refused(change: str, reason: str) -> None:
    model = _normalised_lstm_file()
    lstm = _inner_lstm(model)
    if change == "clip":
        lstm.attributes["clip"] = ir.AttrFloat32("clip", 0.5)
    elif change == "reverse":
        lstm.attributes["direction"] = ir.AttrString("direction", "reverse")
    else:
        lstm.replace_input_with(6, lstm.inputs[5])  # initial_c := initial_h
    proto = ir.serde.serialize_model(model)
    reasons = refusal_reasons(loop_scan.make_rules("onnxruntime"), proto)
    assert any(reason in r for r in reasons), reasons


TWO = """<ir_version: 8, opset_import: ["" : 17]>
agraph (float[T, N, 3] x, float[N, 3] h0) => (float[T, N, 3] ys, float[N, 3] h,
                                             float[T, N, 3] zs) {
    zero = Constant<value = int64 {0}>()
    shape = Shape(x)
    trips = Gather<axis = 0>(shape, zero)
    cond = Constant<value = bool {1}>()
    s0 = SequenceEmpty<dtype = 1>()
    r0 = SequenceEmpty<dtype = 1>()
    s, h, r = Loop(trips, cond, s0, h0, r0) <body = loop_body (int64 i, bool c_in,
        seq(float) s_in, float[N, 3] h_in, seq(float) r_in) => (bool c_out,
        seq(float) s_out, float[N, 3] h_out, seq(float) r_out) {
        c_out = Identity(c_in)
        x_t = Gather<axis = 0>(x, i)
        a = Add(x_t, h_in)
        h_out = Tanh(a)
        s_out = SequenceInsert(s_in, h_out)
        r_out = SequenceInsert(r_in, a)
    }>
    ys = ConcatFromSequence<axis = 0, new_axis = 1>(s)
    zs = ConcatFromSequence<axis = 0, new_axis = 1>(r)
}
"""


def test_two_collected_sequences_around_a_state_are_two_scan_outputs() -> None:
    before, after = ir.from_onnx_text(TWO), ir.from_onnx_text(TWO)
    journal = Journal()
    assert SequenceScanPass(journal)(after).modified
    loop = next(n for n in after.graph if n.op_type == "Loop")
    assert [v.name for v in loop.outputs] == ["h", "ys", "zs"]
    assert op_counts(after)["ConcatFromSequence"] == 0
    for steps, batch in ((1, 2), (4, 3)):
        feeds = _feeds(steps, batch)
        for want, got in zip(_run(before, feeds), _run(after, feeds), strict=True):
            np.testing.assert_array_equal(got, want)
    assert journal.restore() == 2 and _printed(after) == _printed(ir.from_onnx_text(TWO))


def test_where_no_rule_uses_the_scan_output_the_sequence_comes_back() -> None:
    original = onnx.load(TORCH_SCRIPT / "lstmcell_scripted_loop.onnx")
    kept = rnn_rewrite_rules.rewrite(original, exclude="loop_scan")
    ops = _all_ops(kept)
    assert ops["Loop"] == ops["SequenceInsert"] == ops["ConcatFromSequence"] == 1
    assert ops["SequenceEmpty"] == 1
    feeds = _feeds(3, 2, width=6)
    for want, got in zip(_run(original, feeds), _run(kept, feeds), strict=True):
        np.testing.assert_array_equal(got, want)

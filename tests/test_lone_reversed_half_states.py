"""A lone hand-built reversed half whose new states are read (a streaming model's
per-call state out): one ``direction="reverse"`` node, the states read from its ``Y_h``
(``Y_c``)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import rules as select_rules
from tests.hand_built_stacks import assert_same, feeds, lone_reversed_half, rewrite_checked, run
from tests.reasons import refusal_reasons
from tests.support import direction, recurrent_nodes

#: ``portable`` emits no reverse node (tract runs it forward).
TARGET = "onnxruntime"


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("state_out", ["squeezed", "raw"])
def test_lone_half_is_one_reverse_node_with_its_states(op_type: str, state_out: str) -> None:
    before = lone_reversed_half(op_type, state_out=state_out)
    after = rewrite_checked(before, TARGET)
    (node,) = recurrent_nodes(after)
    assert direction(node) == b"reverse" and node.name == f"b_{op_type.lower()}"
    assert node.input[0] == "x3"  # the unreversed input
    counts = collections.Counter(n.op_type for n in after.graph.node)
    assert counts["Slice"] == 0 and counts["Split"] == 0
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]
    assert [o.type for o in after.graph.output] == [o.type for o in before.graph.output]
    assert len(after.graph.node) == len(before.graph.node) - 2
    assert_same(before, after, op_type)


def test_lone_half_keeps_its_peepholes() -> None:
    before = lone_reversed_half("LSTM")
    after = rewrite_checked(before, TARGET)
    (node,) = recurrent_nodes(after)
    assert node.input[7] == "P"
    assert_same(before, after, "LSTM")


def test_unread_states_still_merge() -> None:
    before = lone_reversed_half("GRU", state_out="none")
    after = rewrite_checked(before, TARGET)
    assert [direction(n) for n in recurrent_nodes(after)] == [b"reverse"]
    assert_same(before, after, "GRU")


@pytest.mark.parametrize(
    ("near_miss", "reason"),
    [
        ("short_slice", "the Slice starts at -2, not at the last element"),
        ("sequence_lens", "sequence_lens is present: the Slice reverses the padding too"),
        ("concatenated", "Y_h or Y_c is read and the reversed Y is concatenated"),
    ],
)
def test_near_misses_stay_forward(near_miss: str, reason: str) -> None:
    before = lone_reversed_half("LSTM", near_miss=near_miss)
    found = refusal_reasons(select_rules(["bidirectional"], target="onnxruntime").rules, before)
    assert any(reason in r for r in found), found
    after = rewrite_checked(before, TARGET)
    assert [direction(n) for n in recurrent_nodes(after)] == [b"forward"]
    if near_miss != "sequence_lens":  # seq 0 with sequence_lens: ORT refuses a length 0
        assert_same(before, after, "LSTM")


def test_portable_keeps_the_half_tract_runs_reverse_nodes_forward() -> None:
    """tract 0.23.9 runs ``direction="reverse"`` as forward; it runs the half right at a
    static length, so target ``portable`` keeps it and says why."""
    before = lone_reversed_half("GRU")
    found = refusal_reasons(select_rules(["bidirectional"]).rules, before)
    assert "tract runs direction='reverse' as 'forward' (target 'portable')" in found, found
    after = rnn_rewrite_rules.rewrite(before)
    assert [direction(n) for n in recurrent_nodes(after)] == [b"forward"]


def test_tract_runs_a_reverse_node_forward_and_the_half_right() -> None:
    """The fact behind ``rules._kernels.WRONG_DIRECTIONS`` (fails once tract fixes it): at a
    static length tract runs the hand-built half as ONNX Runtime does, and the reverse node
    as if it were forward."""
    pytest.importorskip("tract", reason="tract (the test extra) is not installed")
    from tests.support import in_tract

    before = lone_reversed_half("GRU")
    for value in [*before.graph.input, *before.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "T":
                dim.dim_value = 3
    after = rnn_rewrite_rules.rewrite(before, target="onnxruntime")
    forward = onnx.ModelProto()
    forward.CopyFrom(after)
    (node,) = recurrent_nodes(forward)
    next(a for a in node.attribute if a.name == "direction").s = b"forward"
    inputs = feeds(before, 3, 1)
    half, node_run = in_tract([before, after], [inputs])
    for actual, expected in zip(half.outputs[0], run(before, inputs), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    for actual, expected in zip(node_run.outputs[0], run(forward, inputs), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(node_run.outputs[0][0], run(after, inputs)[0], atol=1e-3)

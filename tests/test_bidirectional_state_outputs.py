"""Hand-built bidirectional stacks whose states go in and out per direction (a streaming
model's call): the halves merge, each direction's new state a half of ``Split(Y_h)``."""

from __future__ import annotations

import collections

import onnx
import onnx_ir as ir
import pytest

from rnn_rewrite_rules import costs
from rnn_rewrite_rules import rules as select_rules
from rnn_rewrite_rules._api import _RefusalTracer
from tests.hand_built_stacks import assert_same, hand_built_stack, rewrite_checked
from tests.reasons import refusal_reasons
from tests.support import direction, recurrent_nodes


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("y_form", ["squeeze", "batch_free"])
@pytest.mark.parametrize("state_out", ["squeezed", "raw"])
def test_stack_is_one_bidirectional_node_per_layer(op_type, y_form, state_out) -> None:
    before = hand_built_stack(op_type, y_form=y_form, state_out=state_out)
    after = rewrite_checked(before)
    nodes = recurrent_nodes(after)
    assert [direction(n) for n in nodes] == [b"bidirectional"] * 3
    assert [n.name for n in nodes] == [f"l{i}_f_{op_type.lower()}" for i in range(3)]
    counts = collections.Counter(n.op_type for n in after.graph.node)
    assert counts["Slice"] == 0 and counts["Split"] == 3 * (2 if op_type == "LSTM" else 1)
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]
    assert [o.type for o in after.graph.output] == [o.type for o in before.graph.output]
    assert len(after.graph.node) < len(before.graph.node)
    assert_same(before, after, op_type)


def test_peepholes_are_stacked_per_direction() -> None:
    before = hand_built_stack("LSTM")
    after = rewrite_checked(before)
    initializers = {t.name: t for t in after.graph.initializer}
    for node in recurrent_nodes(after):
        p = onnx.numpy_helper.to_array(initializers[node.input[7]])
        assert p.shape == (2, 9)
    assert_same(before, after, "LSTM")


def test_unread_states_need_no_split() -> None:
    before = hand_built_stack("LSTM", state_out="none")
    after = rewrite_checked(before)
    counts = collections.Counter(n.op_type for n in after.graph.node)
    assert counts["LSTM"] == 3 and counts["Split"] == 0
    assert_same(before, after, "LSTM")


@pytest.mark.parametrize(
    ("near_miss", "reason"),
    [
        ("cycle", "an input of a half is computed from a half's output"),
        ("one_peephole", "only one half has an initial state or peepholes"),
        ("y_read", "has another reader"),
    ],
)
def test_near_misses_keep_layer_0(near_miss: str, reason: str) -> None:
    before = hand_built_stack("LSTM", near_miss=near_miss)
    found = refusal_reasons(select_rules(["bidirectional"]).rules, before)
    assert any(reason in r for r in found), found
    after = rewrite_checked(before)
    directions = [direction(n) for n in recurrent_nodes(after)]
    # layer 0 stays two forward halves; layers 1 and 2 merge
    assert directions == [b"forward", b"forward", b"bidirectional", b"bidirectional"]
    assert_same(before, after, "LSTM")


def test_a_dry_run_changes_nothing() -> None:
    """A tracer's run calls the rewrite without applying it: no state reader is moved."""
    before = hand_built_stack("GRU")
    model = ir.serde.deserialize_model(before)
    rule_set = select_rules(["bidirectional"])
    with costs.attached(model, costs.Context()):
        rule_set.apply_to_model(model, tracer=_RefusalTracer())
    after = ir.serde.serialize_model(model).graph
    assert list(after.node) == list(before.graph.node)
    assert list(after.output) == list(before.graph.output)

"""layout: layout=1 RNNs -> layout=0 + Transposes; checked against the ONNX reference evaluator."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import families, layout, select_rules
from rnn_rewrite_rules.testing.exporters import (
    ExporterSpec,
    build_exporter_model,
    exporter_inputs,
    exporter_specs,
    quantized_lstm_model,
)
from tests.exporter_support import (
    apply_family,
    assert_spec_equivalent,
    has_layout1,
    rnn_nodes,
    run,
)
from tests.near_misses import BATCH, INPUT, H, assert_refused, gru_node, rnn_model
from tests.reasons import refusal_reasons
from tests.support import apply

FAMILY = ["layout"]


def _layout1(**fields) -> ExporterSpec:
    return ExporterSpec(style="plain", layout=1, opset=fields.pop("opset", 14), **fields)


def test_ort_rejects_layout1_and_runs_the_rewrite() -> None:
    """The reason for the rule, asserted so that a future ORT that runs layout=1 shows up."""
    spec = _layout1(op_type="LSTM", batch_first=True)
    before = build_exporter_model(spec)
    with pytest.raises(Exception, match="layout"):
        runtime.run(before, exporter_inputs(spec, 2, 3))
    after, count = apply_family(FAMILY, before)
    assert count == 1 and not has_layout1(after)
    assert_spec_equivalent(before, after, spec)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("initial_state", ["absent", "input"])
def test_each_op_direction_and_state(op_type, direction, initial_state) -> None:
    outputs = ("y", "h", "c") if op_type == "LSTM" else ("y", "h")
    spec = _layout1(
        op_type=op_type, direction=direction, initial_state=initial_state, outputs=outputs
    )
    before = build_exporter_model(spec)
    after, count = apply_family(FAMILY, before)
    assert count == 1
    (node,) = rnn_nodes(after)
    assert all(a.name != "layout" or a.i == 0 for a in node.attribute)
    # X and each state transposed in, each used output transposed out
    n_states = (2 if op_type == "LSTM" else 1) if initial_state == "input" else 0
    transposes = sum(n.op_type == "Transpose" for n in after.graph.node)
    before_transposes = sum(n.op_type == "Transpose" for n in before.graph.node)
    assert transposes - before_transposes == 1 + n_states + len(outputs)
    assert_spec_equivalent(before, after, spec)
    # the rewritten model also agrees with itself in the reference evaluator
    assert_spec_equivalent(before, after, spec, after_engine="reference")


@pytest.mark.parametrize("outputs", [("y",), ("h",), ("c",), ("y", "c")])
def test_only_used_outputs_get_transposes(outputs) -> None:
    spec = _layout1(op_type="LSTM", outputs=outputs)
    before = build_exporter_model(spec)
    after, count = apply_family(FAMILY, before)
    assert count == 1
    (node,) = rnn_nodes(after)
    used = {{"y": 0, "h": 1, "c": 2}[o] for o in outputs}
    assert len(node.output) == max(used) + 1
    readers = {i for n in after.graph.node for i in n.input}
    assert {i for i, name in enumerate(node.output) if name in readers} == used
    assert_spec_equivalent(before, after, spec)


def test_sequence_lens_and_weights_pass_through() -> None:
    model = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 14]>
        g (float[b, s, 2] x, float[1, 9, 2] w, float[1, 9, 3] r, int32[b] lens)
            => (float[b, s, 1, 3] y) {
            y = GRU <hidden_size: int = 3, layout: int = 1> (x, w, r, "", lens)
        }
        """
    )
    after, count = apply_family(FAMILY, model)
    assert count == 1
    (node,) = rnn_nodes(after)
    assert list(node.input[1:5]) == ["w", "r", "", "lens"]
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((3, 4, 2)).astype(np.float32),
        "w": rng.standard_normal((1, 9, 2)).astype(np.float32),
        "r": rng.standard_normal((1, 9, 3)).astype(np.float32),
        "lens": np.array([4, 4, 4], dtype=np.int32),
    }
    expected = run(model, feeds, "reference")
    assert runtime.max_abs_diff(expected, run(after, feeds, "ort")) < 1e-4


def test_layout0_and_quantized_lstm_are_left_alone() -> None:
    spec = ExporterSpec(style="plain", op_type="GRU", opset=14)
    _, count = apply_family(FAMILY, build_exporter_model(spec))
    assert count == 0
    _, count = apply_family(FAMILY, quantized_lstm_model())
    assert count == 0


def test_not_installed_by_default() -> None:
    assert families()["layout"].install_by_default is False
    layout_rules = {rule.name for rule in families()["layout"].rules}
    assert not layout_rules & {rule.name for rule in select_rules(installed_only=True)}
    assert layout_rules <= {rule.name for rule in select_rules()}  # rules() / the CLI include it


def test_idempotent() -> None:
    spec = _layout1(op_type="LSTM", num_layers=2, direction="bidirectional")
    once, count = apply_family(FAMILY, build_exporter_model(spec))
    assert count == 2
    twice, count = apply(rnn_rewrite_rules.rules(FAMILY), once)
    assert count == 0 and twice.graph == once.graph


@given(
    spec=exporter_specs(
        style="plain",
        layout=1,
        opset=st.integers(14, 21),
        initial_state=st.sampled_from(["absent", "input", "constant_of_shape", "keras"]),
        wrap=st.sampled_from([None, "if"]),
        num_layers=st.integers(1, 2),
    )
)
def test_property_all_families_make_layout1_models_run_on_ort(spec: ExporterSpec) -> None:
    before = build_exporter_model(spec)
    after = rnn_rewrite_rules.rewrite(before)  # every family, as the CLI does
    onnx.checker.check_model(after, full_check=True)
    assert not has_layout1(after)
    assert_spec_equivalent(before, after, spec, sizes=((2, 3), (1, 1), (4, 2)))


# near misses -----------------------------------------------------------------------


def test_layout_zero_is_refused() -> None:
    model = rnn_model([gru_node(["y"], layout=0)], gates=3)
    assert_refused(layout.FAMILY, model, "layout is already 0")


def test_layout_of_an_op_without_the_attribute_is_refused() -> None:
    node = helper.make_node(
        "DynamicQuantizeLSTM", ["x", "w", "r"], ["y"], hidden_size=H, domain="com.microsoft"
    )
    model = rnn_model([node])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    reasons = refusal_reasons(layout.FAMILY.rules, model)
    assert any("DynamicQuantizeLSTM has no layout attribute" in r for r in reasons), reasons


def test_layout_absent_is_layout_zero() -> None:
    """No ``layout`` attribute is layout 0: refused (reasons first: a check reading it as 1
    would make the full rewrite loop)."""
    model = rnn_model([gru_node(["y"])], gates=3)
    assert "layout is already 0" in refusal_reasons(layout.FAMILY.rules, model)
    assert_refused(layout.FAMILY, model, "layout is already 0")


def test_layout_refused_when_the_weights_disagree_with_the_direction() -> None:
    model = rnn_model(
        [gru_node(["y"], layout=1)], x_shape=[BATCH, "seq", INPUT], directions=2, gates=3
    )
    assert_refused(
        layout.FAMILY, model, "direction 'forward' disagrees with a weight of 2 directions"
    )


def test_layout_rewrite_keeps_the_node_name() -> None:
    node = gru_node(["y"], layout=1)
    node.name = "encoder_gru"
    model = rnn_model([node], x_shape=[BATCH, "seq", INPUT], gates=3)
    after = rnn_rewrite_rules.rewrite(model, ["layout"])
    (gru,) = [n for n in after.graph.node if n.op_type == "GRU"]
    assert gru.name == "encoder_gru"
    assert all(a.name != "layout" for a in gru.attribute)

"""unused_outputs: RNN outputs nobody reads are dropped (trailing) or emptied (interior)."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import rnn_rewrite_rules
from rnn_rewrite_rules import _compat
from rnn_rewrite_rules.passes import empty_unused_rnn_outputs
from rnn_rewrite_rules.rules import layout, unused_outputs
from rnn_rewrite_rules.testing.exporters import (
    ExporterSpec,
    build_exporter_model,
    exporter_specs,
    quantized_lstm_model,
)
from tests.exporter_support import apply_family, assert_spec_equivalent, rnn_nodes
from tests.near_misses import BATCH, INPUT, H, assert_refused, gru_node, rnn_model
from tests.reasons import refusal_reasons
from tests.support import apply

FAMILY = ["unused_outputs"]
_OUTPUT_INDEX = {"y": 0, "h": 1, "c": 2}


def _used(spec: ExporterSpec, layer: int) -> set[int]:
    """Indices of the outputs of ``layer``'s node that something reads."""
    used = {_OUTPUT_INDEX[o] for o in spec.outputs if o != "y"}  # states of every layer
    if layer < spec.num_layers - 1 or "y" in spec.outputs:
        used.add(0)  # Y feeds the next layer or the graph's y
    return used


def _expected_outputs(spec: ExporterSpec, layer: int) -> int:
    """How many outputs the rewritten node of ``layer`` keeps (1 + last used index)."""
    return max(_used(spec, layer)) + 1


_CASES = [
    (op_type, outputs)
    for op_type in ("LSTM", "GRU", "RNN")
    for outputs in [("y",), ("h",), ("y", "h"), ("c",), ("y", "c"), ("h", "c")]
    if op_type == "LSTM" or "c" not in outputs
]


@pytest.mark.parametrize(("op_type", "outputs"), _CASES)
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_trailing_unused_outputs_are_dropped(op_type, direction, outputs) -> None:
    spec = ExporterSpec(op_type=op_type, direction=direction, outputs=outputs, style="plain")
    before = build_exporter_model(spec)
    after, count = apply_family(FAMILY, before)
    (node,) = rnn_nodes(after)
    assert len(node.output) == _expected_outputs(spec, 0)
    n_before = len(rnn_nodes(before)[0].output)
    assert count == (1 if len(node.output) < n_before else 0)
    assert_spec_equivalent(before, after, spec)


def test_interior_unused_output_is_emptied_by_rewrite() -> None:
    """Only Y_h is read: Y_c is dropped and Y becomes the empty name ""."""
    spec = ExporterSpec(op_type="LSTM", outputs=("h",), style="plain")
    before = build_exporter_model(spec)
    after = rnn_rewrite_rules.rewrite(before)
    onnx.checker.check_model(after, full_check=True)
    (node,) = rnn_nodes(after)
    assert node.output[0] == "" and node.output[1] and len(node.output) == 2
    assert_spec_equivalent(before, after, spec)


def test_namefixpass_names_empty_outputs_again() -> None:
    """The pitfall the post-pass exists for: the rewriter alone re-names an emptied Y."""
    spec = ExporterSpec(op_type="GRU", outputs=("h",), style="plain")
    model = ir.serde.deserialize_model(build_exporter_model(spec))
    assert empty_unused_rnn_outputs(model.graph) == 1
    proto = ir.serde.serialize_model(model)
    assert rnn_nodes(proto)[0].output[0] == ""
    # any rule firing makes apply_to_model run NameFixPass, which names "" outputs
    model = ir.serde.deserialize_model(
        build_exporter_model(ExporterSpec(op_type="LSTM", outputs=("h",), style="plain"))
    )
    (node,) = (n for n in model.graph if n.op_type == "LSTM")
    node.outputs[0].name = ""
    assert rnn_rewrite_rules.rules(FAMILY).apply_to_model(model) == 1  # drops Y_c
    (node,) = (n for n in model.graph if n.op_type == "LSTM")
    renamed = bool(node.outputs[0].name)  # named again by NameFixPass (onnxscript >= 0.7.1)
    assert renamed == _compat.REWRITE_NAMES_EMPTY_OUTPUTS
    assert empty_unused_rnn_outputs(model.graph) == int(renamed)
    assert node.outputs[0].name == ""


def test_graph_output_is_kept() -> None:
    model = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 14]>
        g (float[s, b, 2] x, float[1, 12, 2] w, float[1, 12, 3] r) => (float[1, b, 3] yh) {
            y, yh = GRU <hidden_size: int = 3> (x, w, r)
        }
        """
    )
    after, count = apply_family(FAMILY, model)
    assert count == 0
    assert list(rnn_nodes(after)[0].output)[1:] == ["yh"]  # the trailing graph output stays


def test_output_read_inside_a_subgraph_is_kept() -> None:
    """Y_c read only by an If branch (outer-scope reference) is a use."""
    model = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 14]>
        g (float[s, b, 2] x, float[1, 12, 2] w, float[1, 12, 3] r, bool cond)
            => (float[1, b, 3] out) {
            y, yh, yc = LSTM <hidden_size: int = 3> (x, w, r)
            out = If (cond) <
                then_branch = then_g () => (float[1, b, 3] t) { t = Identity (yc) },
                else_branch = else_g () => (float[1, b, 3] e) { e = Identity (yh) }
            >
        }
        """
    )
    after, count = apply_family(FAMILY, model)
    assert count == 0
    assert len(rnn_nodes(after)[0].output) == 3
    # Y_h and Y_c unused in the branch would have gone: check the rule can fire here
    edited = onnx.ModelProto()
    edited.CopyFrom(model)
    for attr in edited.graph.node[-1].attribute:
        attr.g.node[0].input[0] = "yh"
    after, count = apply_family(FAMILY, edited)
    assert count == 1 and len(rnn_nodes(after)[0].output) == 2


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("outputs", [("y",), ("h",), ("y", "h")])
def test_dynamic_quantize_lstm(direction, outputs) -> None:
    """ORT's quantized LSTM: same optional outputs, runs in ORT, so numerically checked."""
    before = quantized_lstm_model(direction=direction, outputs=outputs, zero_states=False)
    after = rnn_rewrite_rules.rewrite(before, FAMILY)
    onnx.checker.check_model(after)
    (node,) = rnn_nodes(after)
    expected = ["y" in outputs, "h" in outputs]
    assert [bool(name) for name in node.output] == expected[: len(node.output)]
    assert len(node.output) == (2 if "h" in outputs else 1)
    spec = ExporterSpec(input_size=4, hidden_size=5, direction=direction, outputs=outputs)
    assert_spec_equivalent(before, after, spec, atol=1e-6)


def test_idempotent_and_nothing_left_to_do() -> None:
    spec = ExporterSpec(op_type="LSTM", num_layers=3, outputs=("y",), style="torchscript")
    once, count = apply_family(FAMILY, build_exporter_model(spec))
    assert count == 3
    twice, count = apply(rnn_rewrite_rules.rules(FAMILY), once)
    assert count == 0 and twice.graph == once.graph


@given(
    spec=exporter_specs(
        style=st.sampled_from(["torchscript", "tf2onnx", "plain"]),
        initial_state=st.sampled_from(["absent", "input", "constant_of_shape"]),
        wrap=st.sampled_from([None, "if"]),
        layout=0,
    )
)
def test_property_outputs_dropped_and_equivalent(spec: ExporterSpec) -> None:
    before = build_exporter_model(spec)
    after = rnn_rewrite_rules.rewrite(before, FAMILY)
    onnx.checker.check_model(after, full_check=True)
    nodes = rnn_nodes(after)
    per_stack = len(nodes) // (2 if spec.wrap == "if" else 1)
    for index, node in enumerate(nodes):
        layer = index % per_stack
        assert len(node.output) == _expected_outputs(spec, layer), (layer, node.output)
        named = {i for i, name in enumerate(node.output) if name}
        assert named == _used(spec, layer), node.output  # unused interior outputs emptied
    assert_spec_equivalent(before, after, spec, sizes=((2, 3), (1, 4)))


# near misses -----------------------------------------------------------------------


def test_unused_outputs_refused_when_the_last_output_is_used() -> None:
    model = rnn_model([gru_node(["y", "y_h"])], outputs=("y_h",), gates=3)
    assert_refused(unused_outputs.FAMILY, model, "the last output is used")


def test_unused_outputs_dropped_up_to_the_last_used_one() -> None:
    model = rnn_model(
        [helper.make_node("LSTM", ["x", "w", "r"], ["y", "y_h", "y_c"], hidden_size=H)],
        outputs=("y",),
    )
    after = rnn_rewrite_rules.rewrite(model, ["unused_outputs"])
    assert list(after.graph.node[0].output) == ["y"]


def test_dead_rnn_is_refused_by_both_rules() -> None:
    nodes = [gru_node(["y", "y_h"], layout=1), helper.make_node("Identity", ["x"], ["out"])]
    model = rnn_model(nodes, x_shape=[BATCH, "seq", INPUT], outputs=("out",), gates=3)
    reason = "no output is used: the node is dead code"
    assert reason in refusal_reasons(unused_outputs.FAMILY.rules, model)
    assert reason in refusal_reasons(layout.FAMILY.rules, model)

"""``--check``'s hazards: frozen axes are found by the shape prover, never from value_info."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules import diagnostics
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model

CFG = RnnConfig(input_size=8, hidden_size=16, num_layers=2, batch_first=True)


def _frozen(model: onnx.ModelProto) -> list[str]:
    hazards = diagnostics.find_hazards(ir.serde.deserialize_model(model))
    return [h.message for h in hazards if h.kind == "frozen-axis"]


def _output_reshape(model: onnx.ModelProto) -> onnx.NodeProto:
    producers = {out: node for node in model.graph.node for out in node.output}
    return next(
        node
        for node in model.graph.node
        if node.op_type == "Reshape" and producers[node.input[0]].op_type == "Transpose"
    )


def _set_target(model: onnx.ModelProto, values: list[int]) -> onnx.ModelProto:
    target = np.array(values, dtype=np.int64)
    model.graph.initializer.append(numpy_helper.from_array(target, "frozen_target"))
    _output_reshape(model).input[1] = "frozen_target"
    return model


def test_dynamic_model_has_no_frozen_axis() -> None:
    assert _frozen(build_torchlib_model(CFG)) == []


def test_frozen_sequence_axis_is_named() -> None:
    messages = _frozen(_set_target(build_torchlib_model(CFG), [3, -1, CFG.hidden_size]))
    assert len(messages) == 1
    assert "freezes 'seq' to 3" in messages[0], messages
    assert "'seq' is axis 1 of input 'input'" in messages[0]


def test_frozen_axis_with_inferred_rest_gives_wrong_shapes() -> None:
    """[seq, batch, D*H] reshaped to [D*H, -1]: runs for every size, with a fixed first
    axis where seq was."""
    model = _set_target(build_torchlib_model(CFG), [0, 0, CFG.hidden_size])
    reshape = _output_reshape(model)
    flat = np.array([CFG.hidden_size, -1], dtype=np.int64)
    model.graph.initializer.append(numpy_helper.from_array(flat, "flat_target"))
    model.graph.node.append(helper.make_node("Reshape", [reshape.output[0], "flat_target"], ["f"]))
    model.graph.output.append(helper.make_tensor_value_info("f", TensorProto.FLOAT, None))
    messages = _frozen(model)
    assert len(messages) == 1 and "other sizes give wrong shapes" in messages[0], messages
    assert f"freezes 'seq' to {CFG.hidden_size}" in messages[0]


def test_constant_target_fixing_the_element_count() -> None:
    messages = _frozen(_set_target(build_torchlib_model(CFG), [3, 5, CFG.hidden_size]))
    assert len(messages) == 1 and "other sizes fail" in messages[0], messages


def test_copying_target_is_not_frozen() -> None:
    assert _frozen(_set_target(build_torchlib_model(CFG), [0, 0, CFG.hidden_size])) == []


def test_value_info_neither_creates_nor_hides_a_hazard() -> None:
    """Annotations that claim static sizes (as an exporter writes for its traced size)."""
    model = _set_target(build_torchlib_model(CFG), [0, 0, CFG.hidden_size])
    reshape = _output_reshape(model)
    for name in (reshape.input[0], reshape.output[0]):
        info = helper.make_tensor_value_info(name, TensorProto.FLOAT, [3, 5, 1, CFG.hidden_size])
        model.graph.value_info.append(info)
    assert _frozen(model) == []
    frozen = _set_target(build_torchlib_model(CFG), [3, -1, CFG.hidden_size])
    frozen.graph.value_info.append(
        helper.make_tensor_value_info(_output_reshape(frozen).input[0], TensorProto.FLOAT, None)
    )
    assert len(_frozen(frozen)) == 1


def test_constant_initial_state_freezes_the_batch() -> None:
    model = build_torchlib_model(CFG)
    lstm = next(node for node in model.graph.node if node.op_type == "LSTM")
    zeros = np.zeros((1, 2, CFG.hidden_size), np.float32)
    model.graph.initializer.append(numpy_helper.from_array(zeros, "h0_frozen"))
    lstm.input[5] = "h0_frozen"
    messages = _frozen(model)
    assert any("initial_h has constant batch 2" in m for m in messages), messages


# ---------------------------------------------------------------- exporter bugs

#: A GRU as onnxscript 0.5.7 to 0.7.0 export nn.GRU (onnxscript #2852), with weights over
#: the exporter's constant-folding limit, so that torchlib's gate reordering stays.
BUGGY_GRU = RnnConfig(op_type="GRU", input_size=64, hidden_size=64, linear_before_reset=0)


def _exporter_bugs(model: onnx.ModelProto) -> list[diagnostics.Hazard]:
    hazards = diagnostics.find_hazards(ir.serde.deserialize_model(model))
    return [h for h in hazards if h.kind == "exporter-bug"]


def test_a_gru_exported_by_a_buggy_onnxscript_is_named() -> None:
    for bidirectional in (False, True):
        cfg = dataclasses.replace(BUGGY_GRU, bidirectional=bidirectional, num_layers=2)
        hazards = _exporter_bugs(build_torchlib_model(cfg))
        assert len(hazards) == 2, hazards  # one per layer
        assert all("onnxscript >= 0.7.1" in h.message for h in hazards)


def test_a_right_gru_or_an_lstm_is_not_named() -> None:
    right = dataclasses.replace(BUGGY_GRU, linear_before_reset=1)
    assert _exporter_bugs(build_torchlib_model(right)) == []
    lstm = dataclasses.replace(BUGGY_GRU, op_type="LSTM")
    assert _exporter_bugs(build_torchlib_model(lstm)) == []
    # the same GRU with its weights folded by the exporter: nothing tells who wrote it
    folded = dataclasses.replace(BUGGY_GRU, fold_limit=10**9)
    assert _exporter_bugs(build_torchlib_model(folded)) == []


def test_gate_blocks_in_another_order_are_not_torchlib_s_reordering() -> None:
    model = build_torchlib_model(BUGGY_GRU)
    reorders = [n for n in model.graph.node if n.op_type == "Concat" and len(n.input) == 3]
    assert reorders and _exporter_bugs(model)
    for node in reorders:  # PyTorch's own order (r, z, n): no reordering at all
        node.input[0], node.input[1] = node.input[1], node.input[0]
    assert _exporter_bugs(model) == []

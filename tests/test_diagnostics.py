"""``--check``'s hazards: frozen axes are found by the shape prover, never from value_info."""

from __future__ import annotations

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

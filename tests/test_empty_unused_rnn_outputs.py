"""``EmptyUnusedRnnOutputsPass``: the unused outputs of every RNN op, those outside the
ONNX domain included, which onnx-ir's ``RemoveUnusedNodesPass`` (run first by the cleanup)
skips."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnx import TensorProto, helper

import rnn_rewrite_rules
from rnn_rewrite_rules.passes import EmptyUnusedRnnOutputsPass


def _quantized_lstm(read: str, op: str = "DynamicQuantizeLSTM") -> ir.Model:
    """One ``com.microsoft`` ``DynamicQuantizeLSTM`` (or an ONNX ``LSTM``) whose output
    ``read`` alone is a graph output (structure only: nothing runs it)."""
    domain = "com.microsoft" if op == "DynamicQuantizeLSTM" else ""
    inputs = ["x", "w", "r"]
    if domain:
        inputs += ["", "", "", "", "", "ws", "wz", "rs", "rz"]
    node = helper.make_node(
        op, inputs, ["y", "y_h", "y_c"], hidden_size=2, domain=domain, name="lstm"
    )
    graph_inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1, 4]),
        helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, 4, 8]),
        helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 2, 8]),
    ]
    if domain:
        graph_inputs += [
            helper.make_tensor_value_info("ws", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("wz", TensorProto.INT8, [1]),
            helper.make_tensor_value_info("rs", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("rz", TensorProto.INT8, [1]),
        ]
    out = helper.make_tensor_value_info(read, TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "g", graph_inputs, [out])
    opsets = [helper.make_opsetid("", 14), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return ir.serde.deserialize_model(model)


def _outputs(model: ir.Model) -> list[str]:
    (node,) = model.graph
    return [v.name or "" for v in node.outputs]


def test_onnx_ir_leaves_a_contrib_lstms_unused_outputs() -> None:
    """Why the pass exists: onnx-ir's pass reads output optionality from ONNX schemas."""
    model = _quantized_lstm("y_h")
    common_passes.RemoveUnusedNodesPass()(model)
    assert _outputs(model) == ["y", "y_h", "y_c"]


def test_onnx_ir_empties_an_onnx_lstms_unused_outputs() -> None:
    """onnx-ir's pass, run first, does it for the ONNX domain in the main graph (not in an
    If branch on onnx-ir 0.1.15): the pass then finds nothing left to do."""
    model = _quantized_lstm("y_h", op="LSTM")
    common_passes.RemoveUnusedNodesPass()(model)
    assert _outputs(model) == ["", "y_h"]
    assert not EmptyUnusedRnnOutputsPass()(model).modified


def test_a_contrib_lstms_unused_outputs_are_emptied_and_trailing_ones_dropped() -> None:
    model = _quantized_lstm("y_h")
    assert EmptyUnusedRnnOutputsPass()(model).modified
    assert _outputs(model) == ["", "y_h"]
    assert not EmptyUnusedRnnOutputsPass()(model).modified  # idempotent


def test_rewrite_empties_a_contrib_lstms_unused_outputs() -> None:
    """Through the public API: the cleanup after the rules runs the pass."""
    model = _quantized_lstm("y")
    result = rnn_rewrite_rules.rewrite(ir.serde.serialize_model(model))
    (node,) = result.graph.node
    assert list(node.output) == ["y"]

"""int8 through ONNX Runtime's quantizer: what the rewrite makes quantizable, and the error."""

from __future__ import annotations

import onnx
import pytest
from onnx import numpy_helper

import rnn_rewrite_rules
from rnn_rewrite_rules import _report
from rnn_rewrite_rules.quantize import INT8_TOLERANCE, quantization_error, quantize_int8
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model
from rnn_rewrite_rules.testing.unrolled import UnrolledCellConfig, build_unrolled_cell, cell_inputs
from tests.support import assert_agree, onnxruntime_in_child, running_nodes

pytest.importorskip("onnxruntime.quantization")

#: big enough that the torchlib export keeps its weight preparation (above the folding limit)
LSTM = RnnConfig(num_layers=2, hidden_size=64, input_size=32)


def test_the_raw_export_gets_no_quantized_lstm_and_says_why() -> None:
    result = quantize_int8(build_torchlib_model(LSTM))
    assert "DynamicQuantizeLSTM" not in result.quantized
    count, why = result.left_float["LSTM"]
    assert count == 2 and "not a constant 3-D initializer" in why


def test_after_the_rewrite_every_lstm_is_quantized_within_the_tolerance() -> None:
    original = build_torchlib_model(LSTM)
    rewritten = rnn_rewrite_rules.rewrite(original)
    result = quantize_int8(rewritten)
    assert result.quantized["DynamicQuantizeLSTM"] == 2
    assert "LSTM" not in result.left_float
    assert result.bytes_after < result.bytes_before / 2
    assert not any(n.op_type == "LSTM" for n in result.model.graph.node)
    check = quantization_error(original, result.model)
    assert check.ok, _report.verify_lines(check)
    assert check.tolerance == INT8_TOLERANCE
    assert check.worst > 0  # int8 weights change the outputs: the check is not vacuous
    assert not quantization_error(original, result.model, tolerance=check.worst / 2).ok
    assert "2 DynamicQuantizeLSTM" in _report.quantize_lines(result)[0]


def test_the_int8_weights_are_7_bit_so_no_cpu_overflows_its_int16_pairs() -> None:
    """x86 without VNNI adds two u8 x s8 products into a saturating int16: weights in
    -64..64 (``reduce_range``) keep 255 * 64 * 2 below 32767 (quantize module doc)."""
    result = quantize_int8(rnn_rewrite_rules.rewrite(build_torchlib_model(LSTM)))
    weights = [
        numpy_helper.to_array(t)
        for t in result.model.graph.initializer
        if t.data_type == onnx.TensorProto.INT8 and t.name.endswith("_quantized")
    ]
    assert len(weights) == 4  # W and R of 2 DynamicQuantizeLSTM
    assert all(w.min() >= -64 and w.max() <= 64 for w in weights)
    assert max(int(abs(w).max()) for w in weights) == 64  # the whole reduced range is used


def test_gru_stays_float_and_the_summary_says_so() -> None:
    cfg = RnnConfig(op_type="GRU", num_layers=1, hidden_size=64, input_size=32)
    result = quantize_int8(rnn_rewrite_rules.rewrite(build_torchlib_model(cfg)))
    assert [n.op_type for n in result.model.graph.node if n.op_type == "GRU"] == ["GRU"]
    assert result.left_float["GRU"] == (1, "ONNX Runtime has no quantized GRU")
    assert any("1 GRU stay float" in line for line in _report.quantize_lines(result))


def test_a_guarded_rerolled_lstm_is_quantized_and_stays_guarded() -> None:
    """A re-rolled LSTM of a symbolic batch sits in its batch-0 guard
    (``passes.BatchZeroGuardPass``); ONNX Runtime's quantizer does not reach a node in an
    ``If`` branch, so the guard is lifted for it and put back around its
    ``DynamicQuantizeLSTM``, which ONNX Runtime aborts on at batch 0 too (child process)."""
    cfg = UnrolledCellConfig(op_type="LSTM", input_size=16, hidden_size=16, seq=4)
    model = build_unrolled_cell(cfg)
    rewritten = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
    result = quantize_int8(rewritten)
    assert result.quantized == {"DynamicQuantizeLSTM": 1}
    assert result.model is not None
    onnx.checker.check_model(result.model, full_check=True)
    assert [n.op_type for n in running_nodes(result.model)].count("DynamicQuantizeLSTM") == 1
    assert [n.op_type for n in result.model.graph.node].count("If") == 1
    check = quantization_error(rewritten, result.model)
    assert check.ok, _report.verify_lines(check)
    feeds = cell_inputs(cfg, 0)
    assert_agree(onnxruntime_in_child(model, feeds), onnxruntime_in_child(result.model, feeds))

"""``Gemm(x_t, W, Squeeze(h @ R))``, tf2onnx's LSTM step at a fixed batch 1, is read as
``x_t @ W + h @ R`` (``rules/cell``).

At batch 1 the Squeeze drops the batch axis of ``h @ R`` (``[1, 4H]`` to ``[4H]``) and
Gemm broadcasts it back to the same row; at a larger batch a Squeeze without axes keeps
``[B, 4H]`` and one of axis 0 fails. The Loop becomes one LSTM with the original's
outputs wherever the original runs, 0 steps included. A Squeeze of axis 1 would drop the
gates' axis: refused, named.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import loop_scan
from rnn_rewrite_rules.testing.loops import LoopSpec, build_loop_model, loop_inputs
from tests.reasons import refusal_reasons
from tests.test_cell_update_spellings import op_counts


def _spec(opset: int) -> LoopSpec:
    return LoopSpec(cell="LSTM", form="torch", trip_count="length", outputs=("y", "h"), opset=opset)


def _squeezed(axes: list[int] | None, opset: int = 13, squeeze: bool = True) -> onnx.ModelProto:
    """The LSTM Loop with its projections as ``Gemm(x_t, W, Squeeze(MatMul(h, R)))``
    (``Gemm(x_t, W, MatMul(h, R))`` without ``squeeze``)."""
    model = build_loop_model(_spec(opset))
    body = next(n for n in model.graph.node if n.op_type == "Loop").attribute[0].g
    nodes = list(body.node)
    recurrent = next(n for n in nodes if n.op_type == "MatMul" and n.input[0] == "h_in")
    projection = next(n for n in nodes if n.op_type == "MatMul" and n is not recurrent)
    total = next(n for n in nodes if n.op_type == "Add" and recurrent.output[0] in n.input)
    squeeze_inputs, attrs = [recurrent.output[0]], {}
    added = []
    if axes is not None and opset >= 13:
        array = onnx.numpy_helper.from_array(np.array(axes, np.int64))
        added.append(helper.make_node("Constant", [], ["squeeze_axes"], value=array))
        squeeze_inputs.append("squeeze_axes")
    elif axes is not None:
        attrs["axes"] = axes
    squeeze = helper.make_node("Squeeze", squeeze_inputs, ["h_product"], **attrs)
    product = "h_product" if squeeze else recurrent.output[0]
    gemm = helper.make_node(
        "Gemm", [projection.input[0], projection.input[1], product], projection.output
    )
    biased = next(n for n in nodes if total.input[0] in n.output)
    biased.output[0] = total.output[0]  # x_t @ W + h @ R + b, the Gemm's sum plus b
    rest = [n for n in nodes if n is not recurrent and n is not total]
    at = rest.index(projection)
    rest[at : at + 1] = [recurrent, *added, squeeze, gemm] if squeeze else [recurrent, gemm]
    del body.node[:]
    body.node.extend(rest)
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize(
    ("axes", "opset", "squeeze"),
    [(None, 13, True), ([0], 13, True), ([0], 11, True), ([-2], 13, True), (None, 13, False)],
)
def test_a_squeezed_recurrent_product_as_gemm_bias_is_read(
    axes: list[int] | None, opset: int, squeeze: bool
) -> None:
    model = _squeezed(axes, opset, squeeze)
    result = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
    onnx.checker.check_model(result, full_check=True)
    assert op_counts(result)["LSTM"] == 1
    batches = (1, 3) if axes is None else (1,)  # with axes the original fails at batch 3
    ran = 0
    for batch in batches:
        for seq in (1, 5, 0):
            feeds = loop_inputs(_spec(opset), batch, seq, seed=seq)
            want, got = runtime.run(model, feeds), runtime.run(result, feeds)
            for a, b in zip(want, got, strict=True):
                assert a.shape == b.shape, (batch, seq)
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
            ran += 1
    assert ran == 3 * len(batches)


def test_the_original_with_axes_fails_beyond_batch_1() -> None:
    """The premise of running ``axes`` cases at batch 1 only."""
    model = _squeezed([0])
    with pytest.raises(Exception, match="Dimension of input 0 must be 1"):
        runtime.run(model, loop_inputs(_spec(13), 3, 2, seed=0))


def test_a_squeeze_of_the_gates_axis_is_refused() -> None:
    model = _squeezed([1])
    assert op_counts(rnn_rewrite_rules.rewrite(model, target="onnxruntime"))["LSTM"] == 0
    reasons = refusal_reasons(loop_scan.make_rules("onnxruntime"), model)
    want = "h_product is computed by Squeeze, not a MatMul, Gemm, Add or bias"
    assert any(want in r for r in reasons), reasons

"""A bias broadcast by ``Expand`` before it is added (jax2onnx's scan bodies:
``Expand(Reshape(b, [1, 3H]), [1, 3H])``) is read as the bias it expands (``rules/cell``).

``Expand`` to ``[1, 3H]`` adds the same row to every batch: the Loop becomes one GRU with
the original's outputs at several lengths and batches, 0 steps included. Expanded to
``[2, 3H]`` it would make a batch of 1 into 2 rows: refused with the shape.
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

SPEC = LoopSpec(cell="GRU", form="torch", trip_count="length", hidden_size=4, outputs=("y", "h"))
_WIDTH = 3 * SPEC.hidden_size


def _expanded(shape: list[int], *, reshaped: bool = True) -> onnx.ModelProto:
    """The GRU Loop with its input bias ``Expand(Reshape(bias, [1, 3H]), shape)`` (or
    ``Expand(bias, shape)``) in the body."""
    model = build_loop_model(SPEC)
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    body = loop.attribute[0].g
    add = next(n for n in body.node if n.op_type == "Add" and n.input[1] == "bias")
    nodes = []

    def const(name: str, values: list[int]) -> str:
        array = np.array(values, np.int64)
        nodes.append(
            helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(array))
        )
        return name

    source = "bias"
    if reshaped:
        target = const("row_shape", [1, _WIDTH])
        nodes.append(helper.make_node("Reshape", [source, target], ["bias_row"]))
        source = "bias_row"
    nodes.append(helper.make_node("Expand", [source, const("to", shape)], ["bias_expanded"]))
    add.input[1] = "bias_expanded"
    at = list(body.node).index(add)
    for offset, node in enumerate(nodes):
        body.node.insert(at + offset, node)
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize(
    ("shape", "reshaped"), [([1, _WIDTH], True), ([1, _WIDTH], False), ([1, 1], True), ([1], False)]
)
def test_an_expanded_bias_row_is_the_bias(shape: list[int], reshaped: bool) -> None:
    model = _expanded(shape, reshaped=reshaped)
    result = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
    onnx.checker.check_model(result, full_check=True)
    assert op_counts(result)["GRU"] == 1
    for batch, seq in ((1, 1), (3, 5), (2, 0)):
        feeds = loop_inputs(SPEC, batch, seq, seed=seq)
        for want, got in zip(runtime.run(model, feeds), runtime.run(result, feeds), strict=True):
            assert want.shape == got.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_bias_expanded_to_more_rows_is_refused() -> None:
    model = _expanded([2, _WIDTH])
    assert op_counts(rnn_rewrite_rules.rewrite(model, target="onnxruntime"))["GRU"] == 0
    reason = f"gate z: a bias term has shape [2, {_WIDTH}], not [width] or [1, width]"
    reasons = refusal_reasons(loop_scan.make_rules("onnxruntime"), model)
    assert reason in reasons, reasons

"""``reroll``: an unrolled chain whose first step reads ``Concat(x_0, h_0)`` proves ``h_0``'s
batch ``X``'s (the Concat runs only then), so the node reads ``h_0`` without the broadcast;
a chain adding ``x_t W`` and ``h_(t-1) R`` proves nothing (a batch of 1 broadcasts)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from tests.support import op_counts

INPUT, HIDDEN, STEPS = 6, 8, 3


def _weights() -> list[onnx.TensorProto]:
    rng = np.random.default_rng(0)
    shapes = {"W": (INPUT + HIDDEN, HIDDEN), "Wx": (INPUT, HIDDEN), "Wh": (HIDDEN, HIDDEN)}
    shapes["b"] = (HIDDEN,)
    arrays = {k: rng.uniform(-0.4, 0.4, s).astype(np.float32) for k, s in shapes.items()}
    steps = {f"t{t}": np.array(t, np.int64) for t in range(STEPS)}
    return [numpy_helper.from_array(v, k) for k, v in {**arrays, **steps}.items()]


def rnn_chain(concat: bool) -> onnx.ModelProto:
    """``h_t = Tanh(Concat(x_t, h_(t-1)) @ W + b)`` unrolled, or with ``x_t Wx + h Wh``."""
    n = helper.make_node
    nodes, h = [], "h0"
    for t in range(STEPS):
        nodes.append(n("Gather", ["X", f"t{t}"], [f"x{t}"], axis=0, name=f"x{t}"))
        if concat:
            nodes.append(n("Concat", [f"x{t}", h], [f"cat{t}"], axis=1, name=f"cat{t}"))
            nodes.append(n("MatMul", [f"cat{t}", "W"], [f"mm{t}"], name=f"mm{t}"))
        else:
            nodes.append(n("MatMul", [f"x{t}", "Wx"], [f"mx{t}"], name=f"mx{t}"))
            nodes.append(n("MatMul", [h, "Wh"], [f"mh{t}"], name=f"mh{t}"))
            nodes.append(n("Add", [f"mx{t}", f"mh{t}"], [f"mm{t}"], name=f"sum{t}"))
        nodes.append(n("Add", [f"mm{t}", "b"], [f"pre{t}"], name=f"pre{t}"))
        nodes.append(n("Tanh", [f"pre{t}"], [f"h{t + 1}"], name=f"act{t}"))
        h = f"h{t + 1}"
    inputs = [
        helper.make_tensor_value_info("X", TensorProto.FLOAT, [STEPS, "bx", INPUT]),
        helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["bh", HIDDEN]),
    ]
    outputs = [helper.make_tensor_value_info(h, TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "chain", inputs, outputs, _weights())
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    return model


def _rewrite(model: onnx.ModelProto) -> onnx.ModelProto:
    return rnn_rewrite_rules.rewrite(
        model, context=costs.Context(ignore=True), target="onnxruntime"
    )


def _feeds(batch: int, h_batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "X": rng.standard_normal((STEPS, batch, INPUT)).astype(np.float32),
        "h0": rng.standard_normal((h_batch, HIDDEN)).astype(np.float32),
    }


def test_a_concat_of_x_and_h0_proves_the_batch() -> None:
    """The node alone (no Expand), equal in ONNX Runtime at batch 1 and 3, and at 0 in
    ``onnx.reference``."""
    before = rnn_chain(concat=True)
    after = _rewrite(before)
    counts = op_counts(after)
    assert counts["RNN"] == 1 and counts["Expand"] == 0 and counts["Concat"] == 0
    for batch in (1, 3):
        feeds = _feeds(batch, batch, seed=batch)
        assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) <= 1e-5
    feeds = _feeds(0, 0)
    expected = ReferenceEvaluator(before).run(None, feeds)
    actual = ReferenceEvaluator(after).run(None, feeds)
    assert [a.shape for a in actual] == [e.shape for e in expected] == [(0, HIDDEN)]


@pytest.mark.parametrize(("batch", "h_batch"), [(3, 3), (3, 1), (1, 3)])
def test_a_broadcasting_add_keeps_the_broadcast(batch, h_batch) -> None:
    """``x_t Wx + h Wh`` runs with ``h_0`` of batch 1 against X's 3: the Expands stay."""
    before = rnn_chain(concat=False)
    after = _rewrite(before)
    assert op_counts(after)["RNN"] == 1 and op_counts(after)["Expand"] > 0
    feeds = _feeds(batch, h_batch, seed=batch)
    expected, actual = runtime.run(before, feeds), runtime.run(after, feeds)
    assert [a.shape for a in actual] == [e.shape for e in expected]
    assert runtime.max_abs_diff(expected, actual) <= 1e-5

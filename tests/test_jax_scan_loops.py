"""jax2onnx's ``lax.scan`` Loops (``tests/data/exporters/jax2onnx``), read through the
normalisation passes (the weights and X carried around the Loop through ``Identity``:
``LoopInvariantPass``; float-to-float Casts; ``Gemm(beta=0)``) and the cell proof.

A Loop over a constant number of steps becomes one node. A Loop over X's length that
carries X around gets the exact zero-step guard, the Loop kept as written where the
length is 0 (``tests/test_loop_exact_zero_step.py``); each Loop left says why; near
misses (X changed in the body, a trip count other than X's length) are refused naming
why. The outputs themselves are compared at every size by ``test_exporter_files``.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import RewriteOptions
from tests.exporter_files import DATA
from tests.support import op_counts

FOLDER = DATA / "jax2onnx"
MODELS = {m["file"]: m for m in json.loads((FOLDER / "manifest.json").read_text())["models"]}
LOOPS = sorted(f for f, m in MODELS.items() if not m["config"].get("step"))
#: What a kept Loop's reason must say: it is the exact zero-step branch of its guard; an
#: RNN cell on ``portable`` (rten has no RNN op); initial states whose batch is not proven
#: X's; a stacked layer reading the first one's output, whose length is not proven; or,
#: for such a layer traced after the first was rewritten (the journal puts back the
#: exporter's Casts no rule used), the cell proof's words on them.
KEPT = (
    "exact zero-step branch:",
    "rten has no RNN op",
    "the initial states' batch is not proven X's",
    "neither a constant nor X's length",
    "h_t is",
)


def test_a_scan_over_a_constant_number_of_steps_becomes_one_lstm(tmp_path) -> None:
    out = tmp_path / "out.onnx"
    report = rnn_rewrite_rules.rewrite_file(FOLDER / "hand_lstm_fixed_shapes.onnx", out)
    model = onnx.load(out)
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("LSTM") == 1 and "Loop" not in ops
    assert report.after.nodes < report.before.nodes


@pytest.mark.parametrize("name", LOOPS)
def test_each_scan_loop_is_rewritten_or_kept_with_its_cell_named(name: str) -> None:
    report = rnn_rewrite_rules.rewrite_file(FOLDER / name, None, RewriteOptions(hazards=True))
    kept = report.after.op_counts["Loop"]
    reasons = [reason for item in report.unimproved for reason in item.reasons]
    loops = [item.node for item in report.unimproved if item.reasons]
    assert len(loops) == kept, (loops, reasons)
    for reason in reasons:
        assert any(part in reason for part in KEPT), reason
    assert all(name.startswith("Loop '") for name in loops), loops


#: jax2onnx's GRU scan over X's length (X and 3 weights carried around unchanged).
CARRIES_X = "nnx_gru_batch_major.onnx"


def _loop_body(model: onnx.ModelProto) -> onnx.GraphProto:
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    return loop.attribute[0].g


def _reasons(model: onnx.ModelProto, tmp_path) -> list[str]:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    report = rnn_rewrite_rules.rewrite_file(path, None, RewriteOptions(hazards=True))
    return [reason for item in report.unimproved for reason in item.reasons]


def _kept(model: onnx.ModelProto) -> bool:
    after = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
    return op_counts(after) == op_counts(model)


def test_a_scan_that_changes_the_x_it_carries_is_refused_naming_the_value(tmp_path) -> None:
    """Near miss: X carried around, but the body passes ``Neg(X)`` on instead of X, so
    step t reads a sequence the earlier steps negated (not one node's steps)."""
    model = onnx.load(FOLDER / CARRIES_X)
    body = _loop_body(model)
    (identity,) = [n for n in body.node if n.op_type == "Identity" and "seq_state" in n.input[0]]
    identity.op_type = "Neg"
    reasons = _reasons(model, tmp_path)
    assert any(
        "reads its step from carried value 4 (scan_loop_0/scan_seq_state_0) and changes that"
        in reason
        for reason in reasons
    ), reasons
    assert _kept(model)


def test_a_scan_that_carries_x_over_another_length_is_refused(tmp_path) -> None:
    """Near miss: X carried unchanged, but the trip count is X's batch, not its length."""
    model = onnx.load(FOLDER / CARRIES_X)
    (index,) = [i for i in model.graph.initializer if i.name == "scan_trip_dynamic_idx_0"]
    index.CopyFrom(onnx.numpy_helper.from_array(np.array([1], np.int64), index.name))
    reasons = _reasons(model, tmp_path)
    assert any(r.endswith("the trip count is neither a constant nor X's length") for r in reasons)
    assert _kept(model)

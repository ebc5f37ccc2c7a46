"""jax2onnx's ``lax.scan`` Loops (``tests/data/exporters/jax2onnx``), read through the
normalisation passes (the weights and X carried around the Loop through ``Identity``:
``LoopInvariantPass``; float-to-float Casts; ``Gemm(beta=0)``) and the cell proof.

A Loop over a constant number of steps becomes one node. A Loop over X's length that
carries X around needs the zero-step guard, and at length 0 ONNX Runtime shapes such a
Loop's stack of no step by its own inference of the body, which its optimisation level
changes (the premise is tested here): each such Loop is kept, and the report says which
cell it runs and why (see ``loop_scan.loop.GUARD_INVARIANTS_REASON``); near misses (X
changed in the body, a trip count other than X's length) are refused naming why. The
outputs themselves are compared at every size by ``test_exporter_files``.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import RewriteOptions, runtime
from rnn_rewrite_rules.rules.loop_scan.loop import GUARD_INVARIANTS_REASON
from tests.exporter_files import DATA
from tests.support import op_counts

FOLDER = DATA / "jax2onnx"
MODELS = {m["file"]: m for m in json.loads((FOLDER / "manifest.json").read_text())["models"]}
LOOPS = sorted(f for f, m in MODELS.items() if not m["config"].get("step"))
#: What a kept Loop's reason must say: the cell it runs, or (a stacked layer reading the
#: first Loop's output, whose length is not proven) that the trip count is not X's length.
KEPT = ("the Loop runs a", "the Loop runs an", "neither a constant nor X's length")


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


def test_onnxruntime_shapes_a_scan_of_no_step_by_its_optimisation_level() -> None:
    """The premise of ``GUARD_INVARIANTS_REASON``: at X's length 0 the original Loop's
    stack is ``(0, 0, 0)`` with ONNX Runtime's graph optimisations off and ``(0, 0, 8)``
    on, so no form without the body itself gives the Loop's shape at every level."""
    model = onnx.load(FOLDER / "hand_lstm_time_major.onnx")
    feeds = {"x": np.zeros((0, 2, 6), np.float32)}
    shapes = {opt: runtime.run(model, feeds, optimize=opt)[0].shape for opt in (False, True)}
    assert shapes == {False: (0, 0, 0), True: (0, 0, 8)}


def test_a_scan_that_carries_x_over_its_length_is_kept_with_the_measured_reason(
    tmp_path,
) -> None:
    model = onnx.load(FOLDER / CARRIES_X)
    expected = GUARD_INVARIANTS_REASON.format(cell="a GRU", count=4)
    assert any(reason.endswith(expected) for reason in _reasons(model, tmp_path))
    assert _kept(model)


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

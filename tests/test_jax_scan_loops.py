"""jax2onnx's ``lax.scan`` Loops (``tests/data/exporters/jax2onnx``), read through the
normalisation passes (the weights and X carried around the Loop through ``Identity``:
``LoopInvariantPass``; float-to-float Casts; ``Gemm(beta=0)``) and the cell proof.

A Loop over a constant number of steps becomes one node. A Loop over X's length that
carries X around needs the zero-step guard, whose stack of no step is not proven the
Loop's at length 0: each such Loop is kept, and the report says which cell it runs and
why (see ``loop_scan.loop.GUARD_INVARIANTS_REASON``). The outputs themselves are compared at every
size by ``test_exporter_files``.
"""

from __future__ import annotations

import json

import onnx
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import RewriteOptions
from tests.exporter_files import DATA

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

"""The lean zero-step guard at batch 0: it tests ``Size(X) == 0``, so the GRU/LSTM node
never runs on an empty ``X`` (ONNX Runtime 1.32 aborts the process on an LSTM or GRU node
at batch 0, where the Loop it replaces runs), and its pass-through Loop stacks the empty
initial state over ``X``'s length, ``[T, 0, H]`` as the Loop's steps do.

Each model runs in a child process: an abort ends only the child.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import RewriteOptions
from rnn_rewrite_rules.rules.loop_scan.zero_step import is_zero_step_loop
from rnn_rewrite_rules.testing.loops import LoopSpec, build_loop_model
from tests.exporter_files import ExporterFile, exporter_files, make_feeds
from tests.support import assert_agree, onnxruntime_in_child


def _lean_guards(model: onnx.ModelProto) -> list[ir.Node]:
    """The ``If`` nodes whose ``then`` branch holds a lean guard's pass-through Loop."""
    found = []
    for node in ir.serde.deserialize_model(model).graph.all_nodes():
        if node.op_type == "If":
            then = node.attributes["then_branch"].as_graph()
            if any(is_zero_step_loop(inner) for inner in then):
                found.append(node)
    return found


def _condition_op(guard: ir.Node) -> str:
    """What the guard's ``Equal(_, 0)`` compares: ``Size`` or the length (``Shape``...)."""
    test = guard.inputs[0]
    assert test is not None
    equal = test.producer()
    assert equal is not None and equal.op_type == "Equal"
    source = equal.inputs[0]
    assert source is not None and source.producer() is not None
    return source.producer().op_type  # type: ignore[union-attr]


@pytest.mark.parametrize("cell", ["GRU", "LSTM"])
def test_the_guard_tests_size_and_the_rewrite_runs_at_batch_0(cell: str) -> None:
    model = build_loop_model(
        LoopSpec(cell=cell, form="torch", trip_count="length", outputs=("y", "h"))
    )
    after = rnn_rewrite_rules.rewrite(model)
    guards = _lean_guards(after)
    assert len(guards) == 1 and _condition_op(guards[0]) == "Size"
    rng = np.random.default_rng(0)
    for seq, batch in ((3, 0), (0, 2), (0, 0), (4, 2)):
        x = rng.standard_normal((seq, batch, 5)).astype(np.float32)
        assert_agree(onnxruntime_in_child(model, {"x": x}), onnxruntime_in_child(after, {"x": x}))


@pytest.mark.parametrize("cell", ["GRU", "LSTM"])
def test_a_gru_or_lstm_cell_reading_no_input_stays_a_loop(cell: str, tmp_path: Path) -> None:
    """Input size 0: ``X`` is empty at every size; ONNX Runtime aborts on such a GRU node
    and on an LSTM at batch 0, where the Loop runs."""
    model = build_loop_model(
        LoopSpec(cell=cell, form="torch", trip_count="length", input_size=0, outputs=("y", "h"))
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    report = rnn_rewrite_rules.rewrite_file(path, None, RewriteOptions(hazards=True))
    reasons = [reason for item in report.unimproved for reason in item.reasons]
    assert report.after.op_counts[cell] == 0
    assert any("input size is 0" in reason for reason in reasons), reasons


def test_an_rnn_cell_reading_no_input_keeps_the_length_test() -> None:
    """Input size 0: ``X`` is empty at every size while the Loop computes ``h_t`` from
    ``R`` and the bias, so an emptiness test would skip the steps: the guard tests the
    length, and the RNN node (which ONNX Runtime runs on an empty input) runs at every
    length but 0."""
    model = build_loop_model(
        LoopSpec(cell="RNN", form="torch", trip_count="length", input_size=0, outputs=("y", "h"))
    )
    after = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
    guards = _lean_guards(after)
    assert len(guards) == 1 and _condition_op(guards[0]) != "Size"
    for seq, batch in ((0, 2), (3, 2), (3, 0)):
        x = np.zeros((seq, batch, 0), np.float32)
        assert_agree(onnxruntime_in_child(model, {"x": x}), onnxruntime_in_child(after, {"x": x}))


@functools.cache
def _rewritten(path: Path) -> onnx.ModelProto:
    """The default rewrite of a committed file (made once: collection reads it too)."""
    return rnn_rewrite_rules.rewrite(onnx.load(path))


def _guarded_files() -> list[ExporterFile]:
    """Committed exporter files whose default rewrite holds a lean guard, at a batch
    that is not frozen."""
    found = []
    for file in exporter_files():
        if file.entry.get("expect") == "invalid" or "batch" in file.frozen:
            continue
        if "batch" not in file.roles():
            continue
        if _lean_guards(_rewritten(file.path)):
            found.append(file)
    return found


GUARDED = _guarded_files()


def test_the_exporter_files_hold_lean_guards() -> None:
    """The premise of the next test: Keras GRUs (tf2onnx) and TorchScript's GRU cell loops."""
    exporters = {file.exporter for file in GUARDED}
    assert len(GUARDED) >= 10 and {"tf2onnx", "torch_script"} <= exporters


@pytest.mark.parametrize("file", GUARDED, ids=[file.id for file in GUARDED])
def test_an_exporter_file_runs_at_batch_0_where_its_original_does(file: ExporterFile) -> None:
    original = onnx.load(file.path)
    after = _rewritten(file.path)
    dtypes = {
        i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        for i in original.graph.input
    }
    feeds = make_feeds(file, {**file.export_sizes, "batch": 0}, dtypes, np.random.default_rng(0))
    expected = onnxruntime_in_child(original, feeds)
    if isinstance(expected, str):
        pytest.skip(f"the original does not run at batch 0 either: {expected}")
    assert_agree(expected, onnxruntime_in_child(after, feeds))

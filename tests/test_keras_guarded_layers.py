"""tf2onnx's Keras GRU Loops behind loop_scan's zero-step guards: a second layer reads the
first's guarded output (an ``If`` whose branches are a pass-through ``Loop`` and the GRU),
and the reports name the guard's ``Loop`` and each Loop's real refusal.

The stacked layer's ``X`` is ``Transpose(Transpose(If(...)))``: no rank is proven for it
for every run (the guard's pass-through ``Loop`` proves none, and ONNX Runtime cancels the
two ``Transpose``s unchecked, so their ``perm`` proves none:
``tests/test_hostile_shape_proofs.py``). But its node runs only where that ``X`` is not
empty, where the first guard ran its ``else`` branch (``loop_scan.guarded_input``, read
through the ``Transpose``s, which keep the number of elements): both layers become GRUs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from tools.exporters.survey import survey_file

import rnn_rewrite_rules
from rnn_rewrite_rules import RewriteOptions, diagnostics, runtime
from rnn_rewrite_rules._report import format_report
from rnn_rewrite_rules.rules.loop_scan._common import BROADCAST_BRANCH_REASON
from rnn_rewrite_rules.rules.loop_scan.zero_step import is_zero_step_loop
from tests.exporter_files import DATA, exporter_files

TF2ONNX = DATA / "tf2onnx"
#: file -> (the op each layer becomes, its layers, the batches it runs at)
STACKED = {
    "stack_gru_gru.onnx": ("GRU", 2, (2, 3)),
    # the third layer reads the second's guard output through a Slice of its steps
    "stack_gru_gru_gru_last.onnx": ("GRU", 3, (2, 3)),
    # at batch 1 tf2onnx writes Reshape([-1, 1, H]) for the Transposes between layers
    "stack_lstm_lstm_batch1.onnx": ("LSTM", 2, (1,)),
}
LENGTHS = [0, 1, 3, 7]


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in _all_nodes(model.graph)]


def _recurrent_loops(model: onnx.ModelProto) -> int:
    ir_model = ir.serde.deserialize_model(model)
    return sum(diagnostics.is_recurrent_loop(n) for n in ir_model.graph.all_nodes())


def _feeds(model: onnx.ModelProto, batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    (x,) = model.graph.input
    return {x.name: rng.standard_normal((batch, seq, 6)).astype(np.float32)}


@pytest.mark.parametrize("name", STACKED)
def test_a_stacked_keras_layer_rewrites_every_layer(name: str) -> None:
    """Each layer becomes a node behind its guard (each reads the one before through
    tf2onnx's Transposes, see the module docstring); outputs equal at every length, 0
    included where the original runs, at both optimisation levels."""
    op, layers, batches = STACKED[name]
    original = onnx.load(TF2ONNX / name)
    rewritten = rnn_rewrite_rules.rewrite(original)
    onnx.checker.check_model(rewritten, full_check=True)
    assert _ops(rewritten).count(op) == layers and _recurrent_loops(rewritten) == 0
    guards = [
        n for n in ir.serde.deserialize_model(rewritten).graph.all_nodes() if n.op_type == "Loop"
    ]
    assert sum(is_zero_step_loop(n) for n in guards) == layers
    assert _reasons(TF2ONNX / name) == []
    assert len(_ops(rewritten)) < len(_ops(original))
    ran = 0
    for seed, (batch, seq) in enumerate((b, s) for b in batches for s in LENGTHS):  # 0 too
        feeds = _feeds(original, batch, seq, seed)
        for optimize in (True, False):
            try:
                want = runtime.run(original, feeds, optimize=optimize)
            except Exception:  # Keras' last step of no step: the rewrite may run
                assert seq == 0, (batch, seq, optimize)
                continue
            ran += 1
            got = runtime.run(rewritten, feeds, optimize=optimize)
            assert [g.shape for g in got] == [w.shape for w in want], (batch, seq, optimize)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    assert ran >= 2 * len(batches) * (len(LENGTHS) - 1)


def test_a_stacked_layer_whose_stack_declares_no_batch_is_refused(tmp_path: Path) -> None:
    """At batch 1 inference knows the second layer's batch as 1 (the Reshape between the
    layers); with the body's stack declared without a batch number, ONNX Runtime may
    shape the Loop's stack of no step as ``(0, 1, H)`` where the guard's pass-through
    gives the declaration's: the second layer is kept, with that reason."""
    model = onnx.load(TF2ONNX / "stack_lstm_lstm_batch1.onnx")
    second = [n for n in model.graph.node if n.op_type == "Loop"][1]
    stack = second.attribute[0].g.output[-1].type.tensor_type.shape.dim[0]
    assert stack.dim_value == 1
    stack.dim_param = "unknown_batch"
    rewritten = rnn_rewrite_rules.rewrite(model)
    assert _ops(rewritten).count("LSTM") == 1 and _recurrent_loops(rewritten) == 1
    onnx.save(model, tmp_path / "undeclared.onnx")
    reasons = _reasons(tmp_path / "undeclared.onnx")
    want = "leaves it open: X's batch is the number 1, which inference fills in"
    assert any(want in r for r in reasons), reasons


def _reasons(path: Path) -> list[str]:
    report = rnn_rewrite_rules.rewrite_file(path, None, RewriteOptions(hazards=True))
    return [reason for item in report.unimproved for reason in item.reasons]


def test_a_loop_kept_for_its_cell_reports_that_not_its_condition() -> None:
    """The rules read the normalised round (the condition made constant true); the journal
    then puts the exporter's condition back, and the report says why the normalised Loop
    was kept: here the decoder's states come from another input's batch."""
    reasons = _reasons(TF2ONNX / "encoder_decoder_gru.onnx")
    assert any(BROADCAST_BRANCH_REASON in r for r in reasons), reasons
    assert not any("first condition is not a constant true" in r for r in reasons), reasons


def test_the_survey_names_the_zero_step_guards_loops() -> None:
    """A file whose only Loop left is its guard's says so, not "left as written"."""
    (file,) = [f for f in exporter_files() if f.id == "tf2onnx/gru_sequences"]
    row = survey_file(file)
    assert row.recurrent[1] == {"GRU": 1, "Loop": 1}
    assert row.reasons == [
        "Loop 1 of zero-step guards (in the If branch taken where X is empty): holds no cell,"
        " passes the initial state through"
    ]
    report = rnn_rewrite_rules.rewrite_file(file.path, None, RewriteOptions(hazards=True))
    assert report.after.zero_step_loops == 1 and report.before.zero_step_loops == 0
    lines = format_report(
        report.before, report.after, report.fired, report.unimproved, rules_used=1
    )
    assert (
        "zero-step guards: 1 Loop (in the If branch taken where X is empty: holds no cell,"
        " passes the initial state through)"
    ) in lines

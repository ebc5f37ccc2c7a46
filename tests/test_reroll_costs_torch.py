"""The checked-in cost table on torch's own exports (issue 41): a 2-layer batch-first
``nn.RNN`` at hidden 512 exported by ``torch.onnx.export(dynamo=True)`` measured slower
re-rolled on ONNX Runtime (1.09x at seq 16, 1.13x at seq 1, batch 1), so it stays unrolled
on target ``onnxruntime``, and the reason names its sizes and the measured cells."""

from __future__ import annotations

import pytest
from benchmarks import export_costs

import rnn_rewrite_rules
from rnn_rewrite_rules import costs
from rnn_rewrite_rules.rules import reroll
from tests.reasons import refusal_reasons
from tests.support import op_counts

pytest.importorskip("torch", reason="torch==2.13.0 is a test dependency")

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("seq", [16, 1])
def test_the_issues_2_layer_batch_first_export_at_hidden_512_stays_unrolled(seq: int) -> None:
    model = export_costs.export_rnn(512, seq, layers=2, batch_first=True)
    assert op_counts(model)["MatMul"] >= 2 * seq  # unrolled by the exporter
    result = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
    assert op_counts(result)["RNN"] == 0
    reasons = refusal_reasons(reroll.FAMILY.rules_for("onnxruntime"), model)
    kept = [r for r in reasons if r.startswith("re-roll kept unrolled: ")]
    assert len(kept) == 2, reasons  # one per layer
    for reason in kept:
        assert reason.startswith(
            f"re-roll kept unrolled: hidden 512, seq {seq}, batch symbolic: ONNX Runtime"
        ), reason
        assert " kernel is slower at hidden 512, seq " in reason, reason
        assert reason.endswith(f"(measured hidden 512, seq {seq}, batch 1/5)"), reason


def test_a_quick_export_grid_writes_points_the_model_reads(tmp_path) -> None:
    table, docs = tmp_path / "t.json", tmp_path / "c.md"
    assert export_costs.main(["--quick", "--table", str(table), "--docs", str(docs)]) == 0
    loaded = costs.load(str(table))
    assert {p.model for p in loaded.points} == {"torch_dynamo 2L bf"}
    assert all(len(p.repeats) == 3 and p.original_us > 0 for p in loaded.points)
    assert "## RNN (forward): `torch_dynamo 2L bf`" in docs.read_text()

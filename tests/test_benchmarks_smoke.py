"""The benchmark harness runs end to end in its quick mode (no timing is asserted)."""

from __future__ import annotations

import json

import pytest
from benchmarks import run


def test_quick_benchmark_writes_the_report(tmp_path) -> None:
    pytest.importorskip("onnxruntime", reason="the benchmark measures in ONNX Runtime")
    argv = ["--quick", "--models", "tiny-lstm2", "--source", "builder", "--out-dir", str(tmp_path)]
    assert run.main(argv) == 0

    results = json.loads((tmp_path / "benchmarks.json").read_text())
    (model,) = results["models"]
    rows = {row["variant"]: row for row in model["variants"] if not row.get("whatif")}
    assert set(rows) == set(results["variants"])
    for name in ("original", "ours"):
        row = rows[name]
        assert row["nodes"] > 0
        assert row["max_abs_diff"] is not None and row["max_abs_diff"] <= 1e-4
        assert all(row["axes_kept"].values())
        assert row["ort_opt_s"] > 0 and row["ort_noopt_s"] > 0
        assert row["session_opt_s"] > 0 and row["session_noopt_s"] > 0
    assert rows["ours"]["nodes"] < rows["original"]["nodes"]
    assert not rows["ours"]["shape_chain"]
    assert results["overhead"]["nodes"] >= 300

    markdown = (tmp_path / "benchmarks.md").read_text()
    for heading in ("## Machine and versions", "## Target check", "## Every model"):
        assert heading in markdown
    assert "| ours |" in markdown
    pytest.importorskip("matplotlib")
    assert (tmp_path / "benchmarks.png").stat().st_size > 0

    # the report re-renders from the JSON alone
    (tmp_path / "benchmarks.md").unlink()
    json_path = tmp_path / "benchmarks.json"
    assert run.main(["--from-json", str(json_path), "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "benchmarks.md").read_text() == markdown

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
    rows = {row["variant"]: row for row in model["variants"]}
    assert set(rows) == set(results["variants"])
    assert {"ours", "ours-onnxruntime"} <= set(rows) and "ours-portable" not in rows
    for name in ("original", "ours"):
        row = rows[name]
        assert row["nodes"] > 0
        assert row["max_abs_diff"] is not None and row["max_abs_diff"] <= 1e-4
        assert all(row["axes_kept"].values())
        assert row["ort_opt_s"] > 0 and row["ort_noopt_s"] > 0
        assert row["session_opt_s"] > 0 and row["session_noopt_s"] > 0
    # the default (portable) form keeps one shared zero state that target onnxruntime drops
    assert rows["ours-onnxruntime"]["nodes"] < rows["ours"]["nodes"] < rows["original"]["nodes"]
    assert not rows["ours"]["shape_chain"]
    assert results["overhead"]["nodes"] >= 300

    if results["openvino"]:  # every variant ran in OpenVINO, right, and was timed
        for name, row in rows.items():
            assert row["ov_error"] == "" and row["ov_diff"] <= 1e-4, name
            assert row["ov_compile_s"] > 0 and row["ov_s"] > 0 and row["ov_spread"] >= 0, name
    for name in ("original", "ours", "ours-onnxruntime"):
        assert rows[name]["reference_diff"] <= 1e-4, name

    markdown = (tmp_path / "benchmarks.md").read_text()
    for heading in (
        "## Machine and versions",
        "## Target check",
        "## Portability",
        "## Targets: portable (ours) vs onnxruntime (ours-onnxruntime)",
        "## Every model",
    ):
        assert heading in markdown
    assert "| ours |" in markdown
    portability = markdown.split("## Portability")[1].split("\n## ")[0]
    header = "| variant | onnxruntime | tract | openvino | onnx.reference | tool failed |"
    assert header.replace(" tract |", "") in portability or header in portability
    assert "| ours | 1/1 run | " in portability  # one model: counted over the models
    assert "**onnxruntime**, variant ours-onnxruntime: " in portability
    if results["openvino"]:
        assert "OpenVINO latency (ratio)" in markdown
    pytest.importorskip("matplotlib")
    assert (tmp_path / "benchmarks.png").stat().st_size > 0

    # the report re-renders from the JSON alone
    (tmp_path / "benchmarks.md").unlink()
    json_path = tmp_path / "benchmarks.json"
    assert run.main(["--from-json", str(json_path), "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "benchmarks.md").read_text() == markdown

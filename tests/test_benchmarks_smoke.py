"""The benchmark harness runs end to end in its quick mode (no timing is asserted)."""

from __future__ import annotations

import importlib
import importlib.util
import json

import pytest
from benchmarks import run


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The directory a quick benchmark of one small model wrote."""
    pytest.importorskip("onnxruntime", reason="the benchmark measures in ONNX Runtime")
    out = tmp_path_factory.mktemp("bench")
    argv = ["--quick", "--models", "tiny-lstm2", "--source", "builder", "--out-dir", str(out)]
    assert run.main(argv) == 0
    return out


def test_quick_benchmark_writes_the_report(quick_run) -> None:
    tmp_path = quick_run
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

    # a tool that is not installed (onnxsim, onnxslim: the bench extra) is reported as such
    missing = {name for name, row in rows.items() if row.get("missing")}
    for name in missing:
        assert rows[name]["error"].startswith("not installed"), rows[name]
        assert importlib.util.find_spec(name) is None, name
    ran = {name: row for name, row in rows.items() if name not in missing}
    assert {"original", "ours", "ours-onnxruntime", "onnxscript", "ort-offline"} <= set(ran)
    if results["openvino"]:  # every variant that ran, ran in OpenVINO, right, and was timed
        for name, row in ran.items():
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
    header = "| variant | onnxruntime | tract | openvino | onnx.reference | rten | tool failed |"
    if not results["rten"]:
        header = header.replace(" rten |", "")
    assert header.replace(" tract |", "") in portability or header in portability
    assert "| ours | 1/1 run | " in portability  # one model: counted over the models
    assert "**onnxruntime**, variant ours-onnxruntime: " in portability
    for name in missing:
        assert f"| {name} | not installed |" in portability
    if results["openvino"]:
        assert "OpenVINO latency (ratio)" in markdown
    # the int8 path: ORT's quantizer on the original and on ours, within its tolerance
    (model,) = results["models"]
    int8 = model["int8"]
    assert int8["ours"]["quantized"]["DynamicQuantizeLSTM"] == 2
    assert int8["ours"]["max_abs_diff"] <= int8["tolerance"]
    assert "## int8 (`rnn-rewrite --quantize int8`)" in markdown
    assert "| tiny-lstm2 | ours + int8 | 2 DynamicQuantizeLSTM |" in markdown

    # the report re-renders from the JSON alone
    rerendered = tmp_path / "rerendered"
    json_path = tmp_path / "benchmarks.json"
    assert run.main(["--from-json", str(json_path), "--out-dir", str(rerendered)]) == 0
    assert (rerendered / "benchmarks.md").read_text() == markdown


def test_quick_benchmark_draws_the_chart(quick_run) -> None:
    pytest.importorskip("matplotlib", reason="the chart needs the bench extra's matplotlib")
    assert (quick_run / "benchmarks.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("module", "rows"),
    [
        ("merge_costs", ("| RNN | 8 | 1 | 1 | ", "| RNN | 8 | 16 | 1 | ")),
        ("broadcast_costs", ("| GRU | 8 | 2 | 1 | ", "| GRU | 8 | 4 | 1 | ")),
        ("batch_first_costs", ("| GRU | 8 | 2 | 1 | ", "| GRU | 8 | 4 | 1 | ")),
    ],
)
def test_a_cost_grids_quick_run_writes_its_table(module: str, rows, tmp_path) -> None:
    """Each grid of ``benchmarks.rewrite_costs`` writes its page (a quick run writes no
    cost table: ``--table`` is for the full grid)."""
    grid = importlib.import_module(f"benchmarks.{module}")
    out = tmp_path / f"{module}.md"
    assert grid.main(["--quick", "--out", str(out)]) == 0
    text = out.read_text()
    assert all(row in text for row in rows)
    assert f"generated by `python -m benchmarks.{module}`" in text and "Slower cells: " in text
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


def test_merge_costs_names_a_slower_cell() -> None:
    from benchmarks import merge_costs

    slow = merge_costs.Point("LSTM", 512, 16, "onnxruntime", 1.2, 1.1, 1.3)
    even = merge_costs.Point("LSTM", 64, 16, "onnxruntime", 1.02, 0.99, 1.04)
    text = merge_costs.render(merge_costs.CASE, [slow, even], {"commit": "c", "date": "d"})
    assert "Slower cells: 1 of 2: LSTM H=512 seq=16 batch=1 onnxruntime." in text
    assert "**1.20 [1.10-1.30] slower**" in text and "| 1.02 [0.99-1.04] |" in text


def _row(variant: str, nodes: int, ops: dict, ort: float, **extra) -> dict:
    return {
        "variant": variant, "nodes": nodes, "ops": ops, "axes_kept": {"batch": True},
        "ort_opt_s": ort, "ort_noopt_s": 1.0, "max_abs_diff": 0.0, "error": "", **extra,
    }  # fmt: skip


def test_the_target_check_says_why_a_row_is_not_met() -> None:
    """Each "no" row of the target check names what it has beyond the best tool, the other
    target's count, whether it is still no slower than the original, and the rewrites
    the run declined; a met row says nothing."""
    from benchmarks import report

    declined = ["re-roll kept unrolled: rten has no RNN op (target 'portable')"] * 2
    model = {
        "model": "m",
        "variants": [
            _row("original", 30, {"Slice": 4, "MatMul": 4}, 1.0),
            _row("ours", 30, {"Slice": 4, "MatMul": 4}, 0.98, declined=declined),
            _row("ours-onnxruntime", 4, {"RNN": 2, "Concat": 2}, 0.70, declined=[]),
            _row("onnxsim", 26, {"Gemm": 4}, 0.80),
        ],
    }
    lines = report._target_section({"models": [model]})
    rows = {line.split(" | ")[1]: line for line in lines if line.startswith("| m |")}
    why = rows["ours"].rstrip(" |").rsplit(" | ", 1)[1]
    assert why == (
        "vs onnxsim: +4 MatMul, +4 Slice (4 Gemm fewer); ours-onnxruntime has 4; "
        "ORT: no slower than the original (0.98×), onnxsim faster; "
        "2 x re-roll kept unrolled: rten has no RNN op (target 'portable')"
    )
    assert rows["ours-onnxruntime"].endswith("| yes |  |")


def test_a_grid_of_several_runs_gives_each_point_their_median() -> None:
    """``--runs``: each point the runs' median ratio, its spread their range; the table
    keeps every run's ratio and says how it was measured."""
    from benchmarks import rewrite_costs, seq1_chain_costs

    def point(ratio: float) -> rewrite_costs.Point:
        return rewrite_costs.Point("GRU", 8, 2, "onnxruntime", ratio, ratio, ratio)

    runs = [[point(1.0)], [point(1.3)], [point(0.9)]]
    (median,) = rewrite_costs.median_of_runs(runs)
    assert (median.ratio, median.low, median.high) == (1.0, 0.9, 1.3)
    header = {"commit": "c", "date": "d"}
    data = rewrite_costs.table(seq1_chain_costs.CASE, [median], header, runs)
    assert data["points"][0]["ratios"] == [1.0, 1.3, 0.9]
    assert "median of 3 independent runs" in data["methods"]["builder"]
    assert "methods" not in rewrite_costs.table(seq1_chain_costs.CASE, [median], header)
    assert seq1_chain_costs.CASE.runs == 3


def test_the_exact_zero_step_grid_writes_a_table_the_rule_reads(tmp_path) -> None:
    """``benchmarks.exact_zero_step_costs --quick``: the LSTM file at every length, both
    ONNX Runtime levels, as a table of its form that ``costs`` loads."""
    pytest.importorskip("onnxruntime", reason="the grid measures in ONNX Runtime")
    from benchmarks import exact_zero_step_costs

    from rnn_rewrite_rules import costs

    out = tmp_path / "table.json"
    assert exact_zero_step_costs.main(["--quick", "--table", str(out)]) == 0
    table = costs.load(str(out))
    assert table.lengths("LSTM", "exact_zero_step") == list(exact_zero_step_costs.SEQS)
    assert table.runtimes() == set(exact_zero_step_costs.RUNTIMES)
    assert all(p.original_us > 0 and p.repeats for p in table.points)


def test_the_exact_broadcast_grid_writes_a_table_the_rule_reads(tmp_path) -> None:
    """``benchmarks.exact_zero_step_costs --broadcast --quick``: the LSTM file with initial
    states at every length, both ONNX Runtime levels, a table of its form."""
    pytest.importorskip("onnxruntime", reason="the grid measures in ONNX Runtime")
    from benchmarks import exact_zero_step_costs

    from rnn_rewrite_rules import costs

    out = tmp_path / "table.json"
    assert exact_zero_step_costs.main(["--broadcast", "--quick", "--table", str(out)]) == 0
    table = costs.load(str(out))
    assert table.lengths("LSTM", "exact_broadcast") == list(exact_zero_step_costs.SEQS)
    assert table.runtimes() == set(exact_zero_step_costs.RUNTIMES)
    assert {p.model for p in table.points} == {"hand_lstm_initial_states"}

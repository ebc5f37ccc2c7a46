"""``benchmarks.one_step_costs``: a run measuring part of a table keeps the rest, each row
with when it was measured, and the page says so."""

from __future__ import annotations

import argparse
import json

from benchmarks import one_step_costs, rewrite_costs

from rnn_rewrite_rules import costs

OLD = "2026-12-06, commit a"
HEADER = {"commit": "b", "date": "2026-12-07", "onnxruntime": "test"}


def _row(op: str, hidden: int, runtime: str) -> dict:
    cell = {"hidden": hidden, "seq": 1, "batch": 1, "ratio": 1.0, "low": 1.0, "high": 1.0}
    return {"runtime": runtime, "op": op, "form": "one_step", "direction": "forward", **cell}


def _write(tmp_path, monkeypatch, measured: list[tuple[str, int]]) -> tuple[dict, str]:
    """The table after a run measuring ``measured`` (op, hidden) on ONNX Runtime, over one
    holding LSTM and GRU at hidden 32 on ONNX Runtime and tract measured at ``OLD``."""
    rows = [_row(op, 32, r) for op in ("LSTM", "GRU") for r in ("ort", "tract")]
    old = {"points": rows, "runtimes": {"ort": OLD, "tract": OLD}, "measured": "2026-12-06"}
    (tmp_path / "one_step.json").write_text(json.dumps(old))

    def measure(form, args, repeats) -> list[rewrite_costs.Point]:
        points = [rewrite_costs.Point(op, h, 1, "onnxruntime", 0.9, 0.8, 1.0) for op, h in measured]
        repeats.update({(p.op, p.hidden, p.batch, p.runtime): [0.9] for p in points})
        return points

    monkeypatch.setattr(one_step_costs, "_measure", measure)
    args = argparse.Namespace(forms=["one_step"], keep=True)
    page = one_step_costs._write("one_step", args, HEADER, tmp_path)
    return json.loads((tmp_path / "one_step.json").read_text()), page


def test_rows_not_measured_again_stay_with_their_date(tmp_path, monkeypatch) -> None:
    data, page = _write(tmp_path, monkeypatch, [("GRU", 32), ("GRU", 8)])
    found = {(r["runtime"], r["op"], r["hidden"]): r.get("measured") for r in data["points"]}
    assert found == {
        ("ort", "LSTM", 32): OLD,  # kept from the earlier run, saying when
        ("tract", "LSTM", 32): None,  # its column's date
        ("tract", "GRU", 32): None,
        ("ort", "GRU", 32): None,  # measured again: the column's new date
        ("ort", "GRU", 8): None,
    }
    assert data["runtimes"] == {"ort": "2026-12-07, commit b", "tract": OLD}
    assert "onnxruntime 2026-12-07, commit b (LSTM hidden 32: 2026-12-06, commit a)" in page
    table = costs.CostTable.from_json(data)  # the rule reads it
    assert table._index[("ort", "LSTM", "one_step", "forward", 32, 1, 1)].measured == OLD


def test_a_run_measuring_every_row_of_a_column_leaves_no_earlier_part(
    tmp_path, monkeypatch
) -> None:
    data, page = _write(tmp_path, monkeypatch, [("GRU", 32), ("LSTM", 32)])
    assert not [r for r in data["points"] if "measured" in r]
    assert "Columns measured: onnxruntime 2026-12-07, commit b; tract 2026-12-06" in page


def test_the_table_of_several_runs_is_their_per_cell_median(tmp_path) -> None:
    """``--median-of``: per cell the median run's row with every run's ratio; the rows no
    run measured stay, saying when; the page says a cell is a median."""
    for number, ratio in enumerate((1.2, 1.0, 1.1)):
        row = {**_row("GRU", 8, "ort"), "ratio": ratio}
        run = {"points": [row], "runtimes": {"ort": f"2026-12-07, commit {number}"}}
        (tmp_path / f"run{number}").mkdir()
        (tmp_path / f"run{number}" / "one_step.json").write_text(json.dumps(run))
    old = {"points": [_row("LSTM", 32, "ort")], "runtimes": {"ort": OLD}, "measured": "d"}
    (tmp_path / "one_step.json").write_text(json.dumps(old))
    page = tmp_path / "page.md"
    runs = [str(tmp_path / f"run{n}") for n in range(3)]
    argv = ["--tables", str(tmp_path), "--out", str(page), "--median-of", *runs]
    assert one_step_costs.main(argv) == 0
    data = json.loads((tmp_path / "one_step.json").read_text())
    rows = {r["op"]: r for r in data["points"]}
    assert rows["GRU"]["ratio"] == 1.1 and rows["GRU"]["ratios"] == [1.2, 1.0, 1.1]
    assert rows["LSTM"]["measured"] == OLD and data["runtimes"] == {"ort": "2026-12-07, commit 2"}
    assert costs.CostTable.from_json(data)._index[("ort", "GRU", "one_step", "forward", 8, 1, 1)]
    text = page.read_text()
    assert "onnxruntime 2026-12-07, commit 2 (LSTM hidden 32: 2026-12-06, commit a)" in text
    assert "the median of 3 independent runs" in text

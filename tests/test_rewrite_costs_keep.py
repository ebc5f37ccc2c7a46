"""``benchmarks.rewrite_costs`` ``--keep``: a grid measuring new sizes keeps the table's
other points, each saying when it was measured, and the page names them."""

from __future__ import annotations

import json

from benchmarks import batch_first_costs, rewrite_costs


def _row(hidden: int, ratio: float) -> dict:
    cell = {"hidden": hidden, "seq": 2, "batch": 1, "ratio": ratio, "low": ratio, "high": ratio}
    return {"runtime": "ort", "op": "LSTM", "form": "batch_first", "direction": "forward", **cell}


def test_keep_merges_new_sizes_into_the_table(tmp_path, monkeypatch) -> None:
    table, page = tmp_path / "batch_first.json", tmp_path / "page.md"
    old = {
        "measured": "2026-12-06",
        "versions": {"commit": "a"},
        "points": [_row(64, 0.5), _row(8, 2.0)],
    }
    table.write_text(json.dumps(old))

    def measure_grid(case, ops, hiddens, seqs, batches, repeats, rounds):
        return [rewrite_costs.Point("LSTM", h, 2, "onnxruntime", 0.7, 0.6, 0.8) for h in hiddens]

    monkeypatch.setattr(rewrite_costs, "measure_grid", measure_grid)
    argv = ["--hidden", "8", "--table", str(table), "--out", str(page), "--keep"]
    assert batch_first_costs.main(argv) == 0
    rows = {r["hidden"]: r for r in json.loads(table.read_text())["points"]}
    assert rows[64]["ratio"] == 0.5 and rows[64]["measured"] == "2026-12-06, commit a"
    assert rows[8]["ratio"] == 0.7 and "measured" not in rows[8]  # measured again: replaced
    text = page.read_text()
    assert "Rows kept from an earlier run: LSTM hidden 64: 2026-12-06, commit a." in text
    assert "| LSTM | 64 | 2 | 1 | 0.50 [0.50-0.50] |" in text
    # without --keep the table is the run's alone
    assert batch_first_costs.main(argv[:-1]) == 0
    assert [r["hidden"] for r in json.loads(table.read_text())["points"]] == [8]

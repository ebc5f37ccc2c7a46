"""docs/benchmarks.md's int8 section: measured again alone (``run --int8-only``), it says
when, and the rest of the page is what it was."""

from __future__ import annotations

from benchmarks import report


def _results(**extra) -> dict:
    quantized = {"quantized": {"DynamicQuantizeLSTM": 1}, "left_float": {}, "size_mb": 1.0}
    int8 = {
        "tolerance": 0.05,
        "original": {"quantized": {}, "left_float": {"LSTM": 1}, "size_mb": 4.0,
                     "max_abs_diff": 1e-7},
        "ours": {**quantized, "max_abs_diff": 0.01},
        "ort_opt_s": {"original": 1.0, "original-int8": 1.0, "ours-int8": 0.5},
    }  # fmt: skip
    return {"models": [{"model": "m", "int8": int8}], **extra}


def test_int8_rows_measured_alone_say_when() -> None:
    when = {"date": "2026-12-07 06:30 UTC", "commit": "abc1234", "load_average": 3.2}
    text = "\n".join(report._int8_section(_results(int8_measured=when)))
    assert (
        "Measured 2026-12-07 06:30 UTC at commit abc1234, 1-minute load average at start 3.2 "
        "(`python -m benchmarks.run --int8-only`), after the rest of this page."
    ) in text
    assert "| m | ours + int8 | 1 DynamicQuantizeLSTM | – | 1.00 | 0.50× | 0.01 |" in text


def test_int8_rows_measured_with_the_rest_say_nothing_more() -> None:
    text = "\n".join(report._int8_section(_results()))
    assert "--int8-only" not in text

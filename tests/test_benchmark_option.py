"""``--benchmark``'s measurement: interleaved repeats, ratios with a spread, the verdict.

No speed of ours is asserted here (that lives in the benchmarks); a sleeping callable
stands in for a model that is certainly slower.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time

import onnx
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import _report
from rnn_rewrite_rules import benchmark as benchmark_module
from rnn_rewrite_rules.benchmark import (
    BenchmarkResult,
    Latency,
    benchmark,
    best_per_repeat,
    median_interval,
    verify_feeds,
)
from rnn_rewrite_rules.testing.unrolled import UnrolledRnnConfig, build_unrolled_rnn, rnn_inputs


def test_best_per_repeat_interleaves_and_keeps_one_best_per_repeat() -> None:
    order: list[str] = []
    calls = {
        "fast": lambda: order.append("fast"),
        "slow": lambda: (order.append("slow"), time.sleep(0.003)),
    }
    times = best_per_repeat(calls, repeats=3, rounds=2)
    assert [len(v) for v in times.values()] == [3, 3]
    assert min(times["slow"]) >= 0.003 > max(times["fast"])
    timed = order[4:]  # after two warm-up calls each
    assert "fast" in timed[: len(timed) // 2] and "slow" in timed[: len(timed) // 2]


@pytest.mark.parametrize(
    ("low", "high", "interval", "verdict"),
    [
        (0.4, 0.6, True, "faster"),
        (0.93, 0.95, True, "faster"),  # below 1 / 1.05
        (0.98, 1.08, True, "noise"),  # across the band's bound: undecided
        (1.01, 1.05, True, "noise"),  # inside the band: within noise
        (1.06, 1.1, True, "slower"),
        (0.9, 1.2, True, "noise"),
        (1.1, 1.2, False, "noise"),  # too few repeats for an interval: their range
    ],
)
def test_a_verdict_needs_the_interval_beyond_the_noise_band(
    low: float, high: float, interval: bool, verdict: str
) -> None:
    latency = Latency("onnxruntime", "x=1", 1.0, 1.0, (low + high) / 2, low, high, 8, interval)
    assert latency.verdict == verdict and latency.slower is (verdict == "slower")


def test_benchmark_times_both_models_in_each_runtime_and_reports() -> None:
    pytest.importorskip("onnxruntime")
    cfg = UnrolledRnnConfig(hidden_size=8, input_size=4, seq=3)
    model = build_unrolled_rnn(cfg)
    rolled = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
    seen: list[str] = []
    feeds = [("x=3x2x4", rnn_inputs(cfg, 2)), ("x=3x5x4", rnn_inputs(cfg, 5))]
    result = benchmark(
        model.SerializeToString(),
        rolled.SerializeToString(),
        feeds,
        repeats=2,
        rounds=1,
        session_repeats=1,
        progress=seen.append,
    )
    runtimes = ["onnxruntime"] + (["OpenVINO"] if "OpenVINO" in result.sessions else [])
    assert list(result.sessions) == runtimes and not result.skipped
    assert [(t.runtime, t.sizes) for t in result.latencies] == [
        (r, label) for r in runtimes for label, _ in feeds
    ]
    for t in result.latencies:
        assert t.low <= t.ratio <= t.high and t.original_s > 0 and t.result_s > 0
        assert t.repeats >= 2 and t.interval is (t.repeats >= 8)
    assert seen[:3] == [
        "onnxruntime: session creation",
        "onnxruntime: latency at x=3x2x4",
        "onnxruntime: latency at x=3x5x4",
    ]
    lines = _report.benchmark_lines(result)
    assert lines[-1].startswith("benchmark: ")
    assert ("SLOWER" in lines[-1]) is result.slower


def test_a_model_that_does_not_load_is_reported_not_timed() -> None:
    pytest.importorskip("onnxruntime")
    cfg = UnrolledRnnConfig(hidden_size=8, input_size=4, seq=3)
    model = build_unrolled_rnn(cfg).SerializeToString()
    result = benchmark(model, b"not a model", [("x", rnn_inputs(cfg, 2))], openvino=False)
    assert not result.latencies and "onnxruntime" in result.skipped
    assert not result.slower


def test_the_sizes_are_verify_s() -> None:
    cfg = UnrolledRnnConfig(hidden_size=8, input_size=4, seq=3)
    feeds = verify_feeds(build_unrolled_rnn(cfg))
    assert len(feeds) >= 2
    batches = {f["x"].shape[1] for _, f in feeds}
    assert len(batches) == len(feeds) and 0 not in batches  # each run its own batch
    for label, f in feeds:
        assert label == f"x={'x'.join(map(str, f['x'].shape))}"
    (label, only), *_ = verify_feeds(build_unrolled_rnn(cfg), {"x": (3, 6, 4)})
    assert only["x"].shape == (3, 6, 4)


def test_models_on_disk_are_timed_from_their_paths(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    cfg = UnrolledRnnConfig(hidden_size=8, input_size=4, seq=3)
    model = build_unrolled_rnn(cfg)
    paths = [str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx")]
    onnx.save(model, paths[0])
    onnx.save(rnn_rewrite_rules.rewrite(model, target="onnxruntime"), paths[1])
    result = benchmark(*paths, verify_feeds(model)[:1], repeats=1, rounds=1, session_repeats=1)
    assert not result.skipped and len(result.latencies) == len(result.sessions)


_SIGNAL_AFTER_BENCHMARK = """
import os, signal, time
import rnn_rewrite_rules
from rnn_rewrite_rules.benchmark import benchmark
from rnn_rewrite_rules.testing.unrolled import UnrolledRnnConfig, build_unrolled_rnn, rnn_inputs
cfg = UnrolledRnnConfig(hidden_size=8, input_size=4, seq=3)
model = build_unrolled_rnn(cfg)
rolled = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
result = benchmark(model.SerializeToString(), rolled.SerializeToString(),
                   [("x", rnn_inputs(cfg, 2))], repeats=2, rounds=1, session_repeats=2)
assert "OpenVINO" in result.sessions, result.skipped
handled = []
signal.signal(signal.SIGINT, lambda number, _: handled.append(number))
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.1)
print("handled", handled)
"""


def test_a_signal_after_timing_openvino_is_handled() -> None:
    """OpenVINO leaves the compiling thread a freed signal stack when two compiled models
    die in another order than made; the next Ctrl-C would be a segmentation fault."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    done = subprocess.run(
        [sys.executable, "-c", _SIGNAL_AFTER_BENCHMARK],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"handled [{int(signal.SIGINT)}]"), (
        done.stderr[-2000:]
    )


def test_the_interval_of_the_median_is_the_order_statistics_the_confidence_allows() -> None:
    """At 99% (0.5% a side): 8 repeats give their range, 12 the 2nd and 11th, 20 the 4th
    and 17th; fewer than 8 give no interval."""
    assert median_interval([1.0] * 7) == (-math.inf, math.inf)
    assert median_interval(list(range(8))) == (0, 7)
    assert median_interval(list(range(12, 0, -1))) == (2, 11)
    assert median_interval(list(range(20))) == (3, 16)


class _Timings:
    """Stands in for :func:`best_per_repeat`: the best seconds of the original and the
    result in each repeat, taken in turn from ``original`` and ``result``."""

    def __init__(self, original: list[float], result: list[float]) -> None:
        self.times = {"original": original, "result": result}
        self.repeats = 0

    def __call__(self, calls, *, repeats: int, rounds: int, sample: float = 0.002):
        if sample == 0:  # session creation
            return {key: [1e-3] for key in calls}
        taken = {}
        for key in calls:
            series = self.times[key]
            taken[key] = [series[(self.repeats + i) % len(series)] for i in range(repeats)]
        self.repeats += repeats
        return taken


#: Per-repeat times (original, result) whose best ratio is 1.1 (``1.1 / 1.0``) while the
#: paired ratios alternate 1.2 and 0.85: a busy machine. The verdict of the best ratio
#: (above 1.05: slower) called such a result slower on one run and not on the next.
NOISY = ([1.0, 1.3], [1.2, 1.1])


def _unrolled() -> tuple[onnx.ModelProto, onnx.ModelProto, list]:
    cfg = UnrolledRnnConfig(hidden_size=8, input_size=4, seq=3)
    model = build_unrolled_rnn(cfg)
    return (
        model,
        rnn_rewrite_rules.rewrite(model, target="onnxruntime"),
        [("x", rnn_inputs(cfg, 2))],
    )


def test_noise_takes_more_repeats_until_the_budget_and_is_said_so(monkeypatch) -> None:
    pytest.importorskip("onnxruntime")
    monkeypatch.setattr(benchmark_module, "best_per_repeat", _Timings(*NOISY))
    model, rolled, feeds = _unrolled()
    before, after = model.SerializeToString(), rolled.SerializeToString()
    result = benchmark(before, after, feeds, openvino=False, max_repeats=20)
    (latency,) = result.latencies
    assert latency.repeats == 20 and latency.verdict == "noise" and not result.slower
    assert latency.low < 1 < latency.high and latency.interval
    lines = _report.benchmark_lines(result)
    assert "latency at x: 1000000.0 us -> 1100000.0 us, " in lines[2]  # each model's best
    assert lines[-2].endswith("(0.85-1.20, 20 repeats): no difference beyond noise")
    assert lines[-1] == "benchmark: no difference beyond noise"
    monkeypatch.setattr(benchmark_module, "best_per_repeat", _Timings(*NOISY))
    (latency,) = benchmark(before, after, feeds, openvino=False, budget=0).latencies
    assert latency.repeats == 8  # the budget spent: no more repeats


@pytest.mark.parametrize(
    ("result", "verdict"),
    [([1.2], "slower"), ([0.8], "faster"), ([1.01, 0.99], "noise")],
)
def test_an_interval_on_one_side_of_a_bound_needs_no_more_repeats(
    monkeypatch, result, verdict
) -> None:
    """Above the noise band, below it, or inside it: decided after the first repeats."""
    pytest.importorskip("onnxruntime")
    monkeypatch.setattr(benchmark_module, "best_per_repeat", _Timings([1.0], result))
    model, rolled, feeds = _unrolled()
    measured = benchmark(
        model.SerializeToString(), rolled.SerializeToString(), feeds, openvino=False
    )
    (latency,) = measured.latencies
    assert latency.repeats == 8 and latency.verdict == verdict == measured.verdict


def test_a_result_within_noise_is_written_with_the_numbers(monkeypatch, tmp_path) -> None:
    """The busy-machine timings: no difference beyond noise, and the file is written."""
    pytest.importorskip("onnxruntime")
    monkeypatch.setattr(benchmark_module, "best_per_repeat", _Timings(*NOISY))
    source, target = tmp_path / "rnn.onnx", tmp_path / "out.onnx"
    onnx.save(build_unrolled_rnn(UnrolledRnnConfig(hidden_size=8, input_size=4, seq=3)), source)
    options = rnn_rewrite_rules.RewriteOptions(benchmark=True, target="onnxruntime")
    report = rnn_rewrite_rules.rewrite_file(source, target, options)
    assert report.written and target.exists()
    lines = report.lines()
    assert "benchmark: no difference beyond noise" in lines
    assert sum(" latency at " in line and "x (0.85-1.20, " in line for line in lines) == len(
        report.benchmark.latencies
    )


@pytest.mark.parametrize(
    ("verdicts", "overall"),
    [
        (["faster", "noise"], "no slower"),
        (["faster", "faster"], "faster"),
        (["noise", "noise"], "noise"),
        (["faster", "slower"], "slower"),
        ([], "untimed"),
    ],
)
def test_the_verdict_over_the_lines(verdicts: list[str], overall: str) -> None:
    bounds = {"faster": (0.5, 0.6), "noise": (0.99, 1.01), "slower": (1.5, 1.6)}
    result = BenchmarkResult(8, 5)
    for index, name in enumerate(verdicts):
        low, high = bounds[name]
        result.latencies.append(Latency("onnxruntime", f"x={index}", 1, 1, low, low, high, 8))
    assert result.verdict == overall and result.slower is (overall == "slower")
    assert _report.benchmark_lines(result)[-1].startswith("benchmark: ")

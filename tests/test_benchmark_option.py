"""``--benchmark``'s measurement: interleaved repeats, ratios with a spread, the verdict.

No speed of ours is asserted here (that lives in the benchmarks); a sleeping callable
stands in for a model that is certainly slower.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import onnx
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import _report, costs
from rnn_rewrite_rules.benchmark import Latency, benchmark, best_per_repeat, verify_feeds
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
    ("ratio", "low", "slower"),
    [
        (0.5, 0.4, False),
        (1.03, 0.98, False),
        (1.03, 1.01, True),
        (1.2, 0.9, True),
        (1.0, 1.1, False),
    ],
)
def test_slower_means_beyond_the_spread(ratio: float, low: float, slower: bool) -> None:
    latency = Latency("onnxruntime", "x=1", 1.0, ratio, ratio, low, max(low, ratio))
    assert latency.slower is slower is costs.slower(ratio, low)


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
        assert t.low <= t.high and t.original_s > 0 and t.result_s > 0
        assert t.ratio == pytest.approx(t.result_s / t.original_s)
    assert seen[:3] == [
        "onnxruntime: session creation",
        "onnxruntime: latency at x=3x2x4",
        "onnxruntime: latency at x=3x5x4",
    ]
    lines = _report.benchmark_lines(result)
    assert lines[-1].startswith("benchmark: the result is ")
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

"""Time the original and the rewritten model side by side on this machine (``--benchmark``).

Per runtime (ONNX Runtime, and OpenVINO when it is installed), one thread: session
creation (best of interleaved creations), then latency at each of the input sizes
``--verify`` uses: ``repeats`` repeats of ``rounds`` interleaved rounds (one round calls
each model in turn, enough times for about 2 ms), best of each. The ratio is
best(result) / best(original) over every round; its spread is the lowest and highest
per-repeat ratio. The result is *slower* when a ratio is above 1 beyond that spread, by
the rule the cost table uses (:func:`rnn_rewrite_rules.costs.slower`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx

from rnn_rewrite_rules import _openvino, costs, runtime

__all__ = [
    "BenchmarkResult",
    "Latency",
    "benchmark",
    "best_per_repeat",
    "verify_feeds",
]

Progress = Callable[[str], None]
#: A model as serialized bytes or a path (a path keeps external data where it is).
Model = bytes | str


def best_per_repeat(
    calls: Mapping[str, Callable[[], object]], *, repeats: int, rounds: int, sample: float = 0.002
) -> dict[str, list[float]]:
    """Per callable, its best seconds per call in each repeat of ``rounds`` interleaved
    rounds (each call repeated to last about ``sample`` seconds)."""
    inner = {}
    for key, call in calls.items():
        call()  # warm-up
        start = time.perf_counter()
        call()
        inner[key] = max(1, math.ceil(sample / max(time.perf_counter() - start, 1e-7)))
    result: dict[str, list[float]] = {key: [] for key in calls}
    for _ in range(repeats):
        best = dict.fromkeys(calls, math.inf)
        for _ in range(rounds):
            for key, call in calls.items():
                start = time.perf_counter()
                for _ in range(inner[key]):
                    call()
                best[key] = min(best[key], (time.perf_counter() - start) / inner[key])
        for key, seconds in best.items():
            result[key].append(seconds)
    return result


@dataclasses.dataclass(frozen=True)
class Latency:
    """One runtime at one set of input sizes."""

    runtime: str
    sizes: str
    original_s: float
    result_s: float
    ratio: float
    low: float
    high: float

    @property
    def slower(self) -> bool:
        return costs.slower(self.ratio, self.low)


@dataclasses.dataclass
class BenchmarkResult:
    """What ``--benchmark`` measured (also ``Report.benchmark``)."""

    repeats: int
    rounds: int
    #: runtime -> (original, result) best session creation seconds
    sessions: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    latencies: list[Latency] = dataclasses.field(default_factory=list)
    #: runtime -> why it was not timed (not installed, a model does not load)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    #: the runtimes whose ratios decide :attr:`slower` (None: all), e.g. ONNX Runtime alone
    #: for target ``onnxruntime``; the others are shown, not judged
    judged: tuple[str, ...] | None = None

    def is_judged(self, runtime_name: str) -> bool:
        return self.judged is None or runtime_name in self.judged

    @property
    def slower(self) -> bool:
        """Some judged latency ratio is above 1 beyond its spread."""
        return any(t.slower and self.is_judged(t.runtime) for t in self.latencies)


#: One CPU thread, one stream, float32 (OpenVINO's default precision hint computes lower).
_OV_CONFIG = {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"}


def _openvino_compile(model: Model):
    return _openvino.compile_model(model, _OV_CONFIG)


def _openvino_caller(model: Model, feeds: Mapping[str, np.ndarray]) -> Callable[[], object]:
    request = _openvino_compile(model).create_infer_request()
    feeds = dict(feeds)
    return lambda: request.infer(feeds)


def _ort_creator(model: Model) -> Callable[[], object]:
    return lambda: runtime.session(model, threads=1, log_level=4)


def _openvino_creator(model: Model) -> Callable[[], object]:
    return lambda: _openvino_compile(model)


def benchmark(
    before: Model,
    after: Model,
    feeds: Sequence[tuple[str, Mapping[str, np.ndarray]]],
    *,
    repeats: int = 3,
    rounds: int = 7,
    session_repeats: int = 3,
    openvino: bool | None = None,
    judged: tuple[str, ...] | None = None,
    progress: Progress | None = None,
) -> BenchmarkResult:
    """Time ``before`` and ``after`` (serialized models or paths) on ``feeds`` (label,
    feeds) pairs.

    ``openvino`` None: time OpenVINO when it is installed. ``judged``: the runtimes whose
    ratios decide whether the result is slower (None: every runtime timed).

    Raises:
        rnn_rewrite_rules.runtime.OnnxRuntimeMissing: onnxruntime is not installed.
    """
    runtime.require_onnxruntime()
    say = progress or (lambda _text: None)
    result = BenchmarkResult(repeats, rounds, judged=judged)
    if openvino is None:
        openvino = importlib.util.find_spec("openvino") is not None
    runtimes: dict[str, tuple[Callable, Callable]] = {
        "onnxruntime": (_ort_creator, _ort_caller),
    }
    if openvino:
        runtimes["OpenVINO"] = (_openvino_creator, _openvino_caller)
    for name, (creator, caller) in runtimes.items():
        say(f"{name}: session creation")
        try:
            creators = {"original": creator(before), "result": creator(after)}
            created = best_per_repeat(creators, repeats=1, rounds=session_repeats, sample=0)
        except Exception as error:
            result.skipped[name] = runtime.short_error(error)
            continue
        result.sessions[name] = (created["original"][0], created["result"][0])
        for label, feed in feeds:
            say(f"{name}: latency at {label}")
            try:
                calls = {"original": caller(before, feed), "result": caller(after, feed)}
                times = best_per_repeat(calls, repeats=repeats, rounds=rounds)
            except Exception as error:
                result.skipped[name] = runtime.short_error(error)
                break
            ratios = [a / b for a, b in zip(times["result"], times["original"], strict=True)]
            original, rewritten = min(times["original"]), min(times["result"])
            result.latencies.append(
                Latency(
                    name, label, original, rewritten, rewritten / original, min(ratios), max(ratios)
                )
            )
    return result


def verify_feeds(
    model: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    *,
    seed: int = 0,
) -> list[tuple[str, dict[str, np.ndarray]]]:
    """(label, feeds) at the input sizes ``--verify`` uses for ``model`` (``shapes``: its
    ``--shape`` overrides), sizes of 0 left out: nothing to time.

    Raises:
        rnn_rewrite_rules._verify.CannotVerify: an input has no rank or an unsupported type.
    """
    import onnx_ir as ir

    from rnn_rewrite_rules import _verify

    ir_model = ir.serde.deserialize_model(model)
    specs = _verify.input_specs(ir_model)
    known = _verify.weight_fixed_sizes(ir_model)
    rng = np.random.default_rng(seed)
    result = []
    for plan in _verify.plan_runs(specs, shapes or {}, known=known):
        if any(0 in shape for shape in plan.values()):
            continue
        result.append((_verify.format_plan(plan), _verify.make_feeds(specs, plan, rng)))
    return result


def _ort_caller(model: Model, feeds: Mapping[str, np.ndarray]) -> Callable[[], object]:
    session = runtime.session(model, threads=1, log_level=4)
    feeds = dict(feeds)
    return lambda: session.run(None, feeds)

"""Time the original and the rewritten model side by side on this machine (``--benchmark``).

Per runtime (ONNX Runtime, and OpenVINO when it is installed), one thread: session
creation (best of interleaved creations), then latency at each of the input sizes of the
size plan (those ``--verify`` compared): repeats of ``rounds`` interleaved rounds (one
round calls each model in turn, enough times for about 2 ms), the best of each model per
repeat. Each repeat gives one paired ratio, result / original; the ratio shown is their
median, with a distribution-free interval of the median (:func:`median_interval`, 99%).

A verdict that changes between runs is noise. Two sessions of one graph differ by a few
percent on a busy machine, consistently enough over a run to look significant, so the
band within ``costs.NOISE`` (5%) of 1 is noise: the result is *slower* where the interval
lies above the band, *faster* below it, and there is *no difference beyond noise* inside
it. While the interval crosses a bound of the band, more repeats are taken (the order of
the two models alternating), until it does not or the time budget (or
:data:`MAX_REPEATS`) runs out: then there is no difference beyond noise either.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx

from rnn_rewrite_rules import _openvino, runtime
from rnn_rewrite_rules.costs import NOISE

__all__ = [
    "BUDGET_S",
    "CONFIDENCE",
    "MAX_REPEATS",
    "STREAM_FRAMES",
    "BenchmarkResult",
    "Latency",
    "Streaming",
    "benchmark",
    "best_per_repeat",
    "median_interval",
    "plan_feeds",
    "verdict",
    "verify_feeds",
]

if TYPE_CHECKING:
    from rnn_rewrite_rules._size_plan import SizePlan

Progress = Callable[[str], None]
#: A model as serialized bytes or a path (a path keeps external data where it is).
Model = bytes | str

#: The confidence of the interval a verdict needs (two-sided, at each look).
CONFIDENCE = 0.99
#: Seconds one latency line may spend on more repeats while its interval spans 1.
BUDGET_S = 10.0
#: Repeats one latency line takes at most.
MAX_REPEATS = 40
#: Calls per round of a stream (a model with state inputs and outputs).
STREAM_FRAMES = 200
#: Repeats added at each look while the interval spans 1.
_STEP = 2


def median_interval(ratios: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A distribution-free interval of the median of ``ratios``: the order statistics
    ``k`` and ``n + 1 - k``, ``k`` the largest with ``P(Binomial(n, 1/2) < k)`` at most
    ``(1 - confidence) / 2``. Too few ratios for that confidence: ``(-inf, inf)``."""
    ordered = sorted(ratios)
    n = len(ordered)
    tail = (1 - confidence) / 2
    k, below = 0, 0.0
    while k < n // 2:
        below += math.comb(n, k) / 2**n  # P(Binomial(n, 1/2) <= k)
        if below > tail:
            break
        k += 1
    if k == 0:
        return -math.inf, math.inf
    return ordered[k - 1], ordered[n - k]


def _zone(low: float, high: float) -> str:
    """Where the interval of a ratio lies: above the noise band (``slower``), below it
    (``faster``), inside it (``noise``), or across a bound (``undecided``)."""
    if low > 1.0 + NOISE:
        return "slower"
    if high < 1.0 / (1.0 + NOISE):
        return "faster"
    if low >= 1.0 / (1.0 + NOISE) and high <= 1.0 + NOISE:
        return "noise"
    return "undecided"


def verdict(low: float, high: float) -> str:
    """``slower`` or ``faster`` where the interval of the ratio lies beyond the noise band
    (within ``costs.NOISE`` of 1: two sessions of one graph differ by that much on a busy
    machine), else ``noise``: no difference beyond noise."""
    zone = _zone(low, high)
    return "noise" if zone == "undecided" else zone


def best_per_repeat(
    calls: Mapping[str, Callable[[], object]],
    *,
    repeats: int,
    rounds: int,
    sample: float = 0.002,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Per callable, its best seconds per call in each repeat of ``rounds`` interleaved
    rounds (each call repeated to last about ``sample`` seconds), read on ``clock``
    (wall time by default; ``time.process_time``: the CPU time of this process, which
    other processes' load on a shared machine does not inflate)."""
    inner = {}
    for key, call in calls.items():
        call()  # warm-up
        start = clock()
        call()
        inner[key] = max(1, math.ceil(sample / max(clock() - start, 1e-7)))
    result: dict[str, list[float]] = {key: [] for key in calls}
    for _ in range(repeats):
        best = dict.fromkeys(calls, math.inf)
        for _ in range(rounds):
            for key, call in calls.items():
                start = clock()
                for _ in range(inner[key]):
                    call()
                best[key] = min(best[key], (clock() - start) / inner[key])
        for key, seconds in best.items():
            result[key].append(seconds)
    return result


@dataclasses.dataclass(frozen=True)
class Latency:
    """One runtime at one set of input sizes: the best seconds per call of each model, the
    median per-repeat ratio (result / original) and its interval (``low``, ``high``)."""

    runtime: str
    sizes: str
    original_s: float
    result_s: float
    ratio: float
    low: float
    high: float
    #: Repeats taken (more while the interval spanned 1).
    repeats: int = 0
    #: Whether (``low``, ``high``) is the interval of :func:`median_interval`; False: too
    #: few repeats for one, the lowest and highest ratio (no verdict but noise).
    interval: bool = True

    @property
    def verdict(self) -> str:
        """``slower``, ``faster`` or ``noise`` (:func:`verdict`)."""
        return verdict(self.low, self.high) if self.interval else "noise"

    @property
    def slower(self) -> bool:
        return self.verdict == "slower"


@dataclasses.dataclass(frozen=True)
class Streaming:
    """One runtime running a model with state inputs as a stream: ``frames`` calls in a
    loop, each call's new states fed to the next (``_streaming.state_pairs``), at the
    first size timed; frames per second of CPU time (one thread), best of interleaved
    rounds, and the lowest and highest per-round ratio (result / original frames per
    second)."""

    runtime: str
    states: str
    frames: int
    original_fps: float
    result_fps: float
    low: float
    high: float

    @property
    def ratio(self) -> float:
        return self.result_fps / self.original_fps


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
    #: what the reader should know about the sizes timed (those replaced, and why)
    notes: list[str] = dataclasses.field(default_factory=list)
    #: a model with state inputs and outputs: its stream's frames per second (shown, not
    #: judged: the latencies decide the verdict)
    streaming: list[Streaming] = dataclasses.field(default_factory=list)

    def is_judged(self, runtime_name: str) -> bool:
        return self.judged is None or runtime_name in self.judged

    @property
    def slower(self) -> bool:
        """Some judged latency's interval lies above 1."""
        return self.verdict == "slower"

    @property
    def verdict(self) -> str:
        """Over the judged latencies: ``slower`` (one is), ``faster`` (all are), ``no
        slower`` (some are faster, the others within noise), ``noise`` (all within noise),
        or ``untimed`` (none was timed)."""
        verdicts = {t.verdict for t in self.latencies if self.is_judged(t.runtime)}
        if not verdicts:
            return "untimed"
        if "slower" in verdicts:
            return "slower"
        if "faster" in verdicts:
            return "faster" if verdicts == {"faster"} else "no slower"
        return "noise"


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


def _latency(
    name: str, label: str, calls: dict[str, Callable[[], object]], settings: _Settings
) -> Latency:
    """Repeats of interleaved rounds, more while the interval of the ratio spans 1."""
    times: dict[str, list[float]] = {"original": [], "result": []}
    start = time.perf_counter()
    batch, order = settings.repeats, calls
    while True:
        measured = best_per_repeat(order, repeats=batch, rounds=settings.rounds)
        for key in times:
            times[key] += measured[key]
        ratios = [a / b for a, b in zip(times["result"], times["original"], strict=True)]
        low, high = median_interval(ratios)
        if (
            _zone(low, high) != "undecided"
            or len(ratios) >= settings.max_repeats
            or time.perf_counter() - start >= settings.budget
        ):
            break
        batch = min(_STEP, settings.max_repeats - len(ratios))
        order = dict(reversed(order.items()))  # neither model always goes first
    original, result = min(times["original"]), min(times["result"])
    interval = not math.isinf(low)
    if not interval:  # too few repeats for the confidence: their range
        low, high = min(ratios), max(ratios)
    median = statistics.median(ratios)
    return Latency(name, label, original, result, median, low, high, len(ratios), interval)


@dataclasses.dataclass(frozen=True)
class _Settings:
    repeats: int
    rounds: int
    budget: float
    max_repeats: int
    stream_frames: int


def benchmark(
    before: Model,
    after: Model,
    feeds: Sequence[tuple[str, Mapping[str, np.ndarray]]],
    *,
    repeats: int = 8,
    rounds: int = 5,
    session_repeats: int = 3,
    openvino: bool | None = None,
    judged: tuple[str, ...] | None = None,
    progress: Progress | None = None,
    budget: float = BUDGET_S,
    max_repeats: int = MAX_REPEATS,
    stream_frames: int = STREAM_FRAMES,
) -> BenchmarkResult:
    """Time ``before`` and ``after`` (serialized models or paths) on ``feeds`` (label,
    feeds) pairs.

    ``repeats`` repeats first, then more (while the interval spans 1) until ``budget``
    seconds or ``max_repeats`` per latency line. ``openvino`` None: time OpenVINO when it
    is installed. A model with state inputs and outputs (``h`` -> ``h_out``,
    ``cache_in`` -> ``cache_out``) is also run as a stream of ``stream_frames`` chained
    calls per round at the first feeds (:class:`Streaming`; 0: not). ``judged``: the
    runtimes whose ratios decide the verdict (None: every runtime timed).

    Raises:
        rnn_rewrite_rules.runtime.OnnxRuntimeMissing: onnxruntime is not installed.
    """
    runtime.require_onnxruntime()
    say = progress or (lambda _text: None)
    settings = _Settings(repeats, rounds, budget, max(max_repeats, repeats), stream_frames)
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
                result.latencies.append(_latency(name, label, calls, settings))
            except Exception as error:
                result.skipped[name] = runtime.short_error(error)
                break
        if feeds and name not in result.skipped and stream_frames:
            try:
                found = _stream(name, before, after, feeds[0][1], settings)
            except Exception as error:
                result.skipped[f"{name} streaming"] = runtime.short_error(error)
            else:
                result.streaming += [found] if found is not None else []
    return result


def _graph_only(model: Model) -> onnx.ModelProto:
    if isinstance(model, bytes):
        return onnx.load_from_string(model)
    return onnx.load(model, load_external_data=False)


def _stream_runner(name: str, model: Model) -> Callable[[dict[str, np.ndarray]], list]:
    """A call of ``model`` on ``name``'s runtime, its outputs in graph order."""
    if name == "onnxruntime":
        session = runtime.session(model, threads=1, log_level=4)
        return lambda feeds: session.run(None, feeds)
    compiled = _openvino_compile(model)
    request, ports = compiled.create_infer_request(), list(compiled.outputs)

    def run(feeds: dict[str, np.ndarray]) -> list:
        out = request.infer(feeds)
        return [np.asarray(out[port]) for port in ports]

    return run


def _stream(
    name: str, before: Model, after: Model, feeds: Mapping[str, np.ndarray], settings: _Settings
) -> Streaming | None:
    """Frames per second of a chained stream of ``settings.stream_frames`` calls of each
    model, ``settings.rounds`` interleaved rounds (the order alternating); None when the
    model has no state inputs and outputs."""
    from rnn_rewrite_rules._streaming import Stream, state_pairs

    original = _graph_only(before)
    pairs = state_pairs(original)
    if not pairs:
        return None
    stream = Stream([o.name for o in original.graph.output], feeds, pairs)
    runners = {"original": _stream_runner(name, before), "result": _stream_runner(name, after)}
    fps: dict[str, list[float]] = {"original": [], "result": []}
    order = list(runners)
    frames = settings.stream_frames
    for _ in range(max(settings.rounds, 1)):
        for key in order:
            fps[key].append(stream.frames_per_second(runners[key], frames, time.process_time))
        order.reverse()
    ratios = [r / o for o, r in zip(fps["original"], fps["result"], strict=True)]
    states = ", ".join(f"{a} -> {b}" for a, b in pairs)
    best_o, best_r = max(fps["original"]), max(fps["result"])
    return Streaming(name, states, frames, best_o, best_r, min(ratios), max(ratios))


def verify_feeds(
    model: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    *,
    seed: int = 0,
) -> list[tuple[str, dict[str, np.ndarray]]]:
    """(label, feeds) at the input sizes the size plan of ``model`` starts from
    (``shapes``: its ``--shape`` overrides), sizes of 0 left out: nothing to time.

    Raises:
        rnn_rewrite_rules.errors.CannotVerify: an input has no rank or an unsupported type.
    """
    import onnx_ir as ir

    from rnn_rewrite_rules._size_plan import SizePlan

    plan = SizePlan.of(ir.serde.deserialize_model(model), shapes)
    return plan_feeds(plan, plan.runs(), seed=seed)


def plan_feeds(
    plan: SizePlan, runs: Sequence[Mapping[str, tuple[int, ...]]], *, seed: int = 0
) -> list[tuple[str, dict[str, np.ndarray]]]:
    """(label, feeds) of ``plan`` at ``runs``, sizes of 0 left out: nothing to time."""
    from rnn_rewrite_rules._size_plan import format_plan

    rng = np.random.default_rng(seed)
    return [
        (format_plan(sizes), plan.feeds(dict(sizes), rng))
        for sizes in runs
        if not any(0 in shape for shape in sizes.values())
    ]


def _ort_caller(model: Model, feeds: Mapping[str, np.ndarray]) -> Callable[[], object]:
    session = runtime.session(model, threads=1, log_level=4)
    feeds = dict(feeds)
    return lambda: session.run(None, feeds)

"""Running models: ONNX Runtime sessions, the ``onnx.reference`` fallback, feeds, comparison.

One place for what ``--verify``, the demo, the tests and the benchmarks all do: create a
CPU session (one thread, optionally without graph optimizations), run a model where ONNX
Runtime refuses it, make seeded random inputs, and compare outputs. onnxruntime is
optional: it is imported when a session is made.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from rnn_rewrite_rules._ir import NUMPY_DTYPES
from rnn_rewrite_rules.errors import OnnxRuntimeMissing, UnsupportedInput

__all__ = [
    "Runner",
    "compare",
    "diff",
    "latency",
    "make_feed",
    "max_abs_diff",
    "ort_runner",
    "reference_runner",
    "require_onnxruntime",
    "run",
    "session",
    "short_error",
]

#: A model as a path, serialized bytes or a proto.
Source = str | bytes | onnx.ModelProto


def require_onnxruntime() -> str:
    """The installed onnxruntime version.

    Raises:
        OnnxRuntimeMissing: it is not installed.
    """
    try:
        import onnxruntime
    except ImportError:
        raise OnnxRuntimeMissing(
            "onnxruntime is not installed: pip install 'rnn-rewrite-rules[cli]'"
        ) from None
    return onnxruntime.__version__


def session(
    model: Source,
    *,
    optimize: bool = True,
    threads: int = 1,
    log_level: int = 3,
    arena: bool = True,
):
    """A CPU ``InferenceSession``; ``optimize=False`` disables every graph optimization,
    ``arena=False`` ONNX Runtime's memory arena (which keeps a session's peak memory after
    the session is released)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = arena
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = log_level
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def run(
    model: Source, feeds: Mapping[str, np.ndarray], *, optimize: bool = True
) -> list[np.ndarray]:
    """Run ``model`` once in ONNX Runtime on ``feeds`` and return all outputs."""
    return session(model, optimize=optimize).run(None, dict(feeds))


@dataclasses.dataclass
class Runner:
    """A loaded model: ``run(feeds)`` returns the outputs in ``output_names`` order."""

    name: str
    run: Callable[[Mapping[str, np.ndarray]], list[np.ndarray]]
    output_names: list[str]


def ort_runner(model: Source, *, optimize: bool = True, arena: bool = True) -> Runner:
    """ONNX Runtime, one thread, silent (callers report failures once)."""
    loaded = session(model, optimize=optimize, log_level=4, arena=arena)
    names = [o.name for o in loaded.get_outputs()]
    return Runner("onnxruntime", lambda feeds: loaded.run(None, dict(feeds)), names)


def reference_runner(model: Source) -> Runner:
    """``onnx.reference``: slow, but runs what ONNX Runtime's CPU kernels reject."""
    from onnx.reference import ReferenceEvaluator

    if isinstance(model, bytes):
        model = onnx.load_from_string(model)
    elif isinstance(model, str):
        model = onnx.load(model)
    evaluator = ReferenceEvaluator(model)
    names = [o.name for o in model.graph.output]

    def run(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        outputs = evaluator.run(names, dict(feeds))  # a list in ``names`` order
        return outputs if isinstance(outputs, list) else [outputs[name] for name in names]

    return Runner("onnx.reference", run, names)


def make_feed(
    dtype: ir.DataType, shape: tuple[int, ...], rng: np.random.Generator, *, high: int = 1
) -> np.ndarray:
    """A random array (always an ``ndarray``, 0-d for a scalar): floats N(0, 1),
    integers in [1, ``high``], booleans.

    Raises:
        UnsupportedInput: ``dtype`` cannot be generated.
    """
    if dtype not in NUMPY_DTYPES:
        raise UnsupportedInput(f"element type {dtype.name} is not supported")
    if dtype == ir.DataType.BOOL:
        return np.asarray(rng.random(shape) < 0.5, dtype=np.bool_)
    if dtype.is_floating_point():
        return np.asarray(rng.standard_normal(shape), dtype=dtype.numpy())
    return np.asarray(rng.integers(1, max(1, high) + 1, size=shape), dtype=dtype.numpy())


def diff(expected: np.ndarray, actual: np.ndarray) -> float:
    """Max abs difference of two same-shape arrays; NaN where both are NaN counts as equal,
    elsewhere as infinite."""
    if expected.size == 0:
        return 0.0
    if expected.dtype == np.bool_ or actual.dtype == np.bool_:
        return float(np.any(expected != actual))
    a = np.asarray(expected, dtype=np.float64)
    b = np.asarray(actual, dtype=np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    with np.errstate(invalid="ignore"):  # inf - inf is NaN: infinite below
        delta = np.abs(a - b)
    delta = np.where(both_nan, 0.0, np.where(np.isnan(delta), np.inf, delta))
    return float(np.max(delta))


def max_abs_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    """Largest absolute difference over paired outputs.

    Raises:
        ValueError: the output counts or shapes differ.
    """
    if len(a) != len(b):
        raise ValueError(f"{len(a)} outputs vs {len(b)}")
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            raise ValueError(f"output shapes differ: {x.shape} vs {y.shape}")
        worst = max(worst, diff(x, y))
    return worst


def compare(actual: Sequence[np.ndarray] | str | None, expected: Sequence[np.ndarray]) -> float:
    """:func:`max_abs_diff`, but ``inf`` for a failed run (None or an error text), another
    output count or a shape mismatch."""
    if actual is None or isinstance(actual, str):
        return math.inf
    try:
        return max_abs_diff(expected, actual)
    except ValueError:
        return math.inf


def short_error(error: BaseException) -> str:
    """An ONNX Runtime (or other) error as one line without source paths, at most 300 chars."""
    text = str(error) or type(error).__name__
    text = re.sub(r"\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"/onnxruntime_src/\S+:\d+ [\w:~<>]+\([^)]*\)\s*", "", text)
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."


def latency(
    model: Source, feeds: Mapping[str, np.ndarray], repeat: int, *, optimize: bool = True
) -> tuple[float, float]:
    """(session creation, median run) in seconds, ONNX Runtime with one thread."""
    start = time.perf_counter()
    loaded = session(model, threads=1, optimize=optimize)
    created = time.perf_counter() - start
    feeds = dict(feeds)
    for _ in range(3):
        loaded.run(None, feeds)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        loaded.run(None, feeds)
        times.append(time.perf_counter() - start)
    return created, statistics.median(times)

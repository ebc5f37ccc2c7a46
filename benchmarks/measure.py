"""What the table reports about one variant: graph facts, correctness, ORT, OpenVINO and tract
timings."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from benchmarks.tract_worker import interleaved
from rnn_rewrite_rules import _openvino, runtime
from rnn_rewrite_rules.runtime import compare

__all__ = [
    "GraphFacts",
    "TractProbe",
    "analyze",
    "compare",
    "openvino_available",
    "ort_latencies",
    "ort_session_times",
    "ov_compile_times",
    "ov_latencies",
    "ov_run",
    "reference_run",
    "tract_available",
    "tract_probe",
    "tract_repeats",
    "tract_timing",
]

RNN_OPS = frozenset({"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM"})
#: Outputs agree when max abs diff <= this (float32 RNN stacks, up to 128 steps).
ATOL = 1e-4
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tract_worker.py")


@dataclasses.dataclass
class GraphFacts:
    nodes: int
    #: A Shape node reads (transitively) the output of an RNN node: a runtime chain between
    #: layers (or after the last one).
    shape_chain: bool
    #: Every W / R / B input of every RNN node is an initializer or a Constant.
    weights_folded: bool
    #: Graph input axes that are still symbolic, by name.
    symbolic_axes: dict[str, bool]
    size_mb: float
    ops: dict[str, int]


def analyze(model: onnx.ModelProto, dynamic_axes: Mapping[str, int]) -> GraphFacts:
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    constants = {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    folded = True
    frontier: list[str] = []
    for node in graph.node:
        if node.op_type not in RNN_OPS:
            continue
        for name in node.input[1:4]:
            if name and name not in initializers and name not in constants:
                folded = False
        frontier.extend(o for o in node.output if o)
    seen: set[str] = set()
    shape_chain = False
    while frontier and not shape_chain:
        value = frontier.pop()
        if value in seen:
            continue
        seen.add(value)
        for consumer in consumers.get(value, []):
            if consumer.op_type == "Shape":
                shape_chain = True
                break
            frontier.extend(o for o in consumer.output if o)

    dims = graph.input[0].type.tensor_type.shape.dim
    symbolic = {
        name: bool(dims[axis].dim_param) or not dims[axis].HasField("dim_value")
        for name, axis in dynamic_axes.items()
    }
    ops: dict[str, int] = {}
    for node in graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return GraphFacts(
        nodes=len(graph.node),
        shape_chain=shape_chain,
        weights_folded=folded,
        symbolic_axes=symbolic,
        size_mb=model.ByteSize() / 2**20,
        ops=ops,
    )


# ---------------------------------------------------------------- ONNX Runtime


def _session(serialized: bytes, optimize: bool):
    return runtime.session(serialized, optimize=optimize, threads=1)


def ort_session_times(
    models: Mapping[str, bytes], repeats: int
) -> dict[tuple[str, bool], float | str]:
    """Best session creation seconds per (variant, optimize), interleaved; errors as text."""
    best: dict[tuple[str, bool], float | str] = {}
    for _ in range(repeats):
        for key, serialized in models.items():
            for optimize in (True, False):
                if isinstance(best.get((key, optimize)), str):
                    continue
                start = time.perf_counter()
                try:
                    _session(serialized, optimize)
                except Exception as error:
                    best[(key, optimize)] = f"{type(error).__name__}: {str(error)[:160]}"
                    continue
                elapsed = time.perf_counter() - start
                best[(key, optimize)] = min(best.get((key, optimize), math.inf), elapsed)
    return best


def ort_run(serialized: bytes, feeds: Mapping[str, np.ndarray], optimize: bool):
    """Outputs, or the error's text."""
    try:
        return _session(serialized, optimize).run(None, dict(feeds))
    except Exception as error:
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"


def ort_latencies(
    models: Mapping[str, bytes],
    feeds: Mapping[str, np.ndarray],
    *,
    budget: float,
    min_rounds: int,
    max_rounds: int,
) -> dict[tuple[str, bool], float]:
    """Best per-call seconds per (variant, optimize), all interleaved in the same rounds."""
    calls = {}
    for key, serialized in models.items():
        for optimize in (True, False):
            try:
                session = _session(serialized, optimize)
                session.run(None, dict(feeds))
            except Exception:
                continue
            calls[(key, optimize)] = lambda s=session: s.run(None, dict(feeds))
    return interleaved(calls, budget=budget, min_rounds=min_rounds, max_rounds=max_rounds)


# ---------------------------------------------------------------- OpenVINO

#: One CPU thread, one stream, float32 throughout (the default precision hint lets
#: OpenVINO compute in lower precision, about 3e-3 off).
OV_CONFIG = {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"}


def openvino_available() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _ov_core():
    import openvino as ov

    return ov.Core()


def _ov_compile(serialized: bytes):
    return _openvino.compile_model(serialized, OV_CONFIG, _ov_core())


def ov_caller(serialized: bytes, feeds: Mapping[str, np.ndarray]):
    """A callable running the compiled model once and returning the outputs in graph order."""
    compiled = _ov_compile(serialized)
    request = compiled.create_infer_request()
    feeds = dict(feeds)

    def call() -> list[np.ndarray]:
        result = request.infer(feeds)
        return [np.array(result[output]) for output in compiled.outputs]

    return call


def _error_text(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"


def ov_run(serialized: bytes, feeds: Mapping[str, np.ndarray]):
    """OpenVINO's outputs, or the error's text."""
    try:
        return ov_caller(serialized, feeds)()
    except Exception as error:
        return _error_text(error)


def ov_compile_times(models: Mapping[str, bytes], repeats: int) -> dict[str, float]:
    """Best ``read_model`` + ``compile_model`` seconds per variant, interleaved."""
    best: dict[str, float] = {}
    for _ in range(repeats):
        for key, serialized in models.items():
            start = time.perf_counter()
            _ov_compile(serialized)
            best[key] = min(best.get(key, math.inf), time.perf_counter() - start)
    return best


def ov_latencies(
    models: Mapping[str, bytes],
    feeds: Mapping[str, np.ndarray],
    *,
    budget: float,
    min_rounds: int,
    max_rounds: int,
) -> dict[str, tuple[float, float, int, float]]:
    """Best per-call seconds per variant (models known to run), all interleaved."""
    calls = {key: ov_caller(serialized, feeds) for key, serialized in models.items()}
    return interleaved(calls, budget=budget, min_rounds=min_rounds, max_rounds=max_rounds)


# ---------------------------------------------------------------- onnx.reference


def reference_run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]):
    """``onnx.reference``'s outputs, or the error's text."""
    from onnx.reference import ReferenceEvaluator

    try:
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, dict(feeds))]
    except Exception as error:
        return _error_text(error)


# ---------------------------------------------------------------- tract


def tract_available() -> bool:
    try:
        import tract  # noqa: F401
    except ImportError:
        return False
    return True


@dataclasses.dataclass
class TractProbe:
    load_s: float | None = None
    #: Outputs per feed file (None where that run failed).
    outputs: list[list[np.ndarray] | None] = dataclasses.field(default_factory=list)
    error: str = ""
    #: The process died (a Rust panic aborts it): the error is the panic message.
    crashed: bool = False


def _panic_message(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines()]
    for index, line in enumerate(lines):
        if "panicked at" in line:
            detail = lines[index + 1] if index + 1 < len(lines) else ""
            return f"panic: {line.split('panicked at', 1)[1].strip()} {detail}".strip()
    tail = [line for line in lines if line][-2:]
    return " ".join(tail)[:300] or "process died"


def _run_worker(request_path: str, timeout: float) -> tuple[str, str, bool]:
    """Run the tract worker on a request file: (stdout, stderr, timed out).

    A child process, because a tract panic aborts its process. On a timeout, stdout is
    what the worker printed before it and stderr says so.
    """
    try:
        process = subprocess.run(
            [sys.executable, _WORKER, request_path],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "RUST_BACKTRACE": "0"},
        )
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout or ""
        out = out.decode() if isinstance(out, bytes) else out
        return out, f"timeout after {timeout:.0f} s", True
    return process.stdout, process.stderr, False


def tract_probe(
    paths: Sequence[str],
    input_names: Sequence[str],
    feeds: Sequence[str],
    out_prefixes: Sequence[str],
    timeout: float,
) -> list[TractProbe]:
    """Load each model in tract (in child processes) and run it on each feeds file.

    A model that kills its process is recorded as crashed and the rest run in a new one.
    """
    results = [TractProbe(outputs=[None] * len(feeds)) for _ in paths]
    pending = list(range(len(paths)))
    while pending:
        request_path = out_prefixes[pending[0]] + "request.json"
        with open(request_path, "w") as handle:
            json.dump(
                {
                    "mode": "probe",
                    "models": [{"path": paths[i], "out_prefix": out_prefixes[i]} for i in pending],
                    "input_names": list(input_names),
                    "feeds": list(feeds),
                },
                handle,
            )
        finished: set[int] = set()
        stdout, stderr, _ = _run_worker(request_path, timeout)
        for line in stdout.splitlines():
            message = json.loads(line)
            if "model" not in message:
                continue
            index = pending[message["model"]]
            result = results[index]
            if "loaded" in message:
                result.load_s = message["loaded"]
            elif "ran" in message:
                with np.load(f"{out_prefixes[index]}{message['ran']}.npz") as data:
                    arrays = [data[f"o{i}"] for i in range(len(data.files))]
                result.outputs[message["ran"]] = arrays
            elif "error" in message:
                result.error = result.error or f"{message['stage']}: {message['error']}"
            elif message.get("finished"):
                finished.add(index)
        remaining = [i for i in pending if i not in finished]
        if remaining:  # the first unfinished model took the process down
            results[remaining[0]].crashed = True
            results[remaining[0]].error = _panic_message(stderr)
            remaining = remaining[1:]
        pending = remaining
    return results


def _worker_message(request_path: str, request: dict, key: str, timeout: float) -> dict | str:
    """Write ``request`` to ``request_path``, run one tract worker on it and return its first
    message holding ``key``; the error (a timeout or the worker's panic) otherwise."""
    with open(request_path, "w") as handle:
        json.dump(request, handle)
    stdout, stderr, timed_out = _run_worker(request_path, timeout)
    if timed_out:
        return stderr
    for line in stdout.splitlines():
        message = json.loads(line)
        if key in message:
            return message
    return _panic_message(stderr)


def tract_timing(
    paths: Mapping[str, str],
    input_names: Sequence[str],
    feeds: str,
    *,
    load_repeats: int,
    budget: float,
    min_rounds: int,
    max_rounds: int,
    workdir: str,
    timeout: float,
) -> dict[str, dict[str, float]] | str:
    """Best load and per-call seconds per variant in one tract process (models known to run)."""
    request = {
        "mode": "time",
        "models": dict(paths),
        "input_names": list(input_names),
        "feeds": feeds,
        "load_repeats": load_repeats,
        "budget": budget,
        "min_rounds": min_rounds,
        "max_rounds": max_rounds,
    }
    return _worker_message(os.path.join(workdir, "tract_timing.json"), request, "latency", timeout)


def tract_repeats(
    paths: Mapping[str, str],
    input_names: Sequence[str],
    feeds: str,
    *,
    repeats: int,
    rounds: int,
    sample: float,
    workdir: str,
    timeout: float,
) -> dict[str, list[float]] | str:
    """Per model, its best CPU seconds per call in each repeat of interleaved rounds, in one
    tract process (``rnn_rewrite_rules.benchmark.best_per_repeat``); the error otherwise."""
    request = {
        "mode": "repeats",
        "models": dict(paths),
        "input_names": list(input_names),
        "feeds": feeds,
        "repeats": repeats,
        "rounds": rounds,
        "sample": sample,
    }
    path = os.path.join(workdir, "tract_repeats.json")
    found = _worker_message(path, request, "repeats", timeout)
    return found if isinstance(found, str) else found["repeats"]

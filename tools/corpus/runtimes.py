"""Feeds for a corpus file and its runs in ONNX Runtime, OpenVINO and tract.

OpenVINO and tract run in child processes: a crash or a panic on a third-party graph
must not take the caller down. Each runner returns, per feed, the outputs or the text
of the error that stopped it.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from rnn_rewrite_rules import runtime

__all__ = [
    "Aborted",
    "Outcome",
    "agree",
    "feeds",
    "onnxruntime",
    "onnxruntime_child",
    "openvino",
    "run_sizes",
    "shapes",
    "tract",
]

Feeds = dict[str, np.ndarray]
#: Per feed: the outputs, or why the runtime could not produce them.
Outcome = list[list[np.ndarray] | str]

_ELEMENT_TYPES = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.BOOL: np.bool_,
}


def _inputs(path: Path) -> list[onnx.ValueInfoProto]:
    model = onnx.load(str(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def shapes(path: Path, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Each input's shape with its named dynamic axes at ``sizes``.

    Raises:
        KeyError: a dynamic axis has no size in ``sizes``.
    """
    result = {}
    for value in _inputs(path):
        dims = value.type.tensor_type.shape.dim
        result[value.name] = tuple(
            d.dim_value if d.HasField("dim_value") else sizes[d.dim_param] for d in dims
        )
    return result


def run_sizes(sizes: Mapping[str, Sequence[int]], *, zero: bool = True) -> list[dict[str, int]]:
    """Per run, each axis' size (``manifest.Entry.sizes`` is per axis); ``zero=False``
    leaves out runs with a size 0."""
    count = max((len(s) for s in sizes.values()), default=0)
    runs = [{axis: values[i % len(values)] for axis, values in sizes.items()} for i in range(count)]
    return [run for run in runs if zero or 0 not in run.values()]


def feeds(path: Path, sizes: Mapping[str, int], seed: int = 0) -> Feeds:
    """Seeded random inputs (integers in [1, the smallest size]) for ``path`` at ``sizes``."""
    rng = np.random.default_rng(seed)
    planned = shapes(path, sizes)
    positive = [d for shape in planned.values() for d in shape if d > 0]
    high = max(1, min(positive, default=1))
    result: Feeds = {}
    for value in _inputs(path):
        dtype = _ELEMENT_TYPES[value.type.tensor_type.elem_type]
        shape = planned[value.name]
        if np.issubdtype(dtype, np.floating):
            result[value.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            result[value.name] = rng.random(shape) < 0.5
        else:
            result[value.name] = rng.integers(1, high + 1, size=shape).astype(dtype)
    return result


def onnxruntime(path: Path, runs: Sequence[Feeds], *, optimize: bool = True) -> Outcome:
    try:
        session = runtime.session(str(path), optimize=optimize, log_level=4)
    except Exception as error:
        return [runtime.short_error(error)] * len(runs)
    outcome: Outcome = []
    for run in runs:
        try:
            outcome.append([np.asarray(o) for o in session.run(None, dict(run))])
        except Exception as error:
            outcome.append(runtime.short_error(error))
    return outcome


#: The OpenVINO child: compile the model (f32, one thread), run each pickled feed.
_OPENVINO = """
import pickle, sys
import numpy as np
import openvino as ov
path, runs = pickle.load(sys.stdin.buffer)
out = []
try:
    core = ov.Core()
    compiled = core.compile_model(
        core.read_model(path), "CPU",
        {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1},
    )
except Exception as error:
    out = [f"{type(error).__name__}: {error}"[:300]] * len(runs)
else:
    for feeds in runs:
        try:
            result = compiled.create_infer_request().infer(feeds)
            out.append([np.asarray(result[o]) for o in compiled.outputs])
        except Exception as error:
            out.append(f"{type(error).__name__}: {error}"[:300])
with open(sys.argv[1], "wb") as handle:
    pickle.dump(out, handle)
"""


def openvino(path: Path, runs: Sequence[Feeds], timeout: float = 600) -> Outcome:
    """OpenVINO's outputs per feed, in a child process (a crash is an error text)."""
    return _child(_OPENVINO, path, runs, "OpenVINO", timeout)


#: The ONNX Runtime child: run the model on the pickled feeds, pickle the outputs or error.
_ONNXRUNTIME = """
import pickle, sys
from rnn_rewrite_rules import runtime
path, runs = pickle.load(sys.stdin.buffer)
out = []
for feeds in runs:
    try:
        out.append(list(runtime.run(path, feeds)))
    except Exception as error:
        out.append(runtime.short_error(error))
with open(sys.argv[1], "wb") as handle:
    pickle.dump(out, handle)
"""


class Aborted(str):
    """The runtime ended the process (ONNX Runtime on LSTM/GRU at batch 0): its text."""


def onnxruntime_child(path: Path, feeds: Feeds, timeout: float = 600) -> list[np.ndarray] | str:
    """ONNX Runtime's outputs in a child process: an error text, or :class:`Aborted`."""
    return _child(_ONNXRUNTIME, path, [feeds], "ONNX Runtime", timeout)[0]


def _child(script: str, path: Path, runs: Sequence[Feeds], name: str, timeout: float) -> Outcome:
    """``script`` in a child process on ``(path, runs)``; its pickled outcome, or one
    :class:`Aborted` per run when the child died."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with tempfile.TemporaryDirectory(prefix="corpus-child-") as scratch:
        result = Path(scratch) / "out.pickle"
        done = subprocess.run(
            [sys.executable, "-c", script, str(result)],
            input=pickle.dumps((str(path), [dict(r) for r in runs])),
            capture_output=True,
            timeout=timeout,
            env=env,
            check=False,
        )
        if not result.exists():
            last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
            message = f"{name} ended its process (code {done.returncode}): {last[0][:200]}"
            return [Aborted(message)] * len(runs)
        return pickle.loads(result.read_bytes())


def tract(paths: Sequence[Path], runs: Sequence[Feeds], timeout: float = 600) -> list[Outcome]:
    """tract's outputs per model and feed (``benchmarks.measure.tract_probe``: child
    processes, a panic recorded as the model's error)."""
    from benchmarks import measure

    with tempfile.TemporaryDirectory(prefix="corpus-tract-") as scratch:
        feed_files = []
        for index, run in enumerate(runs):
            feed_files.append(str(Path(scratch) / f"feeds{index}.npz"))
            np.savez(feed_files[-1], **run)
        prefixes = [str(Path(scratch) / f"model{i}-") for i in range(len(paths))]
        probes = measure.tract_probe(
            [str(p) for p in paths], list(runs[0]), feed_files, prefixes, timeout=timeout
        )
    return [
        [out if out is not None else (probe.error or "tract failed") for out in probe.outputs]
        for probe in probes
    ]


def agree(actual: list[np.ndarray] | str, expected: list[np.ndarray] | str, atol: float) -> bool:
    """Both ran, with the same output shapes and values within ``atol``."""
    if isinstance(actual, str) or isinstance(expected, str):
        return False
    return runtime.compare(actual, expected) <= atol

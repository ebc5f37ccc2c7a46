"""ONNX Runtime helpers shared by verification, tests and benchmarks (onnxruntime is optional)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

__all__ = ["max_abs_diff", "run", "session"]


def session(
    model: onnx.ModelProto | bytes | str,
    *,
    optimize: bool = True,
    threads: int = 1,
):
    """A CPU ``InferenceSession``; ``optimize=False`` disables every graph optimization."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def run(
    model: onnx.ModelProto | bytes | str,
    feeds: Mapping[str, np.ndarray],
    *,
    optimize: bool = True,
) -> list[np.ndarray]:
    """Run ``model`` once on ``feeds`` and return all outputs."""
    return session(model, optimize=optimize).run(None, dict(feeds))


def max_abs_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    """Largest absolute difference over paired outputs; shapes must agree exactly."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} outputs vs {len(b)}")
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            raise ValueError(f"output shapes differ: {x.shape} vs {y.shape}")
        if x.size:
            worst = max(worst, float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
    return worst

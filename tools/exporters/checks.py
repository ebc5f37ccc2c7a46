"""Each exported file against its source, in the exporter's environment: equal at the
export sizes, and each dynamic role checked at a larger size, where a difference (or an
ONNX Runtime failure) means the exporter froze the axis: it goes to the entry's
``frozen`` with what was seen (torch dynamo declares such an axis dynamic). Then every
other size the tests run (``size_plans``, zeros aside): where ONNX Runtime fails, the
sizes go to ``fails_at`` with the error (the tests check the original still fails
there); where the file differs from its source, ``checked`` says so."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from tests.exporter_files import ExporterFile, make_feeds, size_plans

from tools.exporters.manifest import ExportRefused

__all__ = ["check_against_source"]

#: The source's outputs for a feed, in the graph's output order.
Source = Callable[[Mapping[str, np.ndarray]], Sequence[np.ndarray]]

TOLERANCE = 1e-4


def _dtypes(model: onnx.ModelProto) -> dict[str, np.dtype]:
    return {
        i.name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
        for i in model.graph.input
    }


def _compare(session, source: Source, feeds) -> str | None:
    """None when the file gives the source's outputs, else what differs."""
    try:
        got = session.run(None, dict(feeds))
    except Exception as error:
        return f"ONNX Runtime fails: {' '.join(str(error).split())[:200]}"
    want = [np.asarray(w) for w in source(feeds)]
    if len(got) != len(want):
        return f"{len(got)} outputs, the source has {len(want)}"
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape:
            return f"output {index} has shape {list(g.shape)}, the source {list(w.shape)}"
        diff = float(np.max(np.abs(g - w))) if g.size else 0.0
        if not diff <= TOLERANCE:
            return f"output {index} differs from the source by {diff:.3g}"
    return None


def check_against_source(path: Path, entry: dict, source: Source, *, seed: int = 0) -> dict:
    """``entry`` with ``frozen`` completed and the check recorded under ``checked``.

    Raises:
        ExportRefused: the file fails at its export sizes (the export is not kept).
    """
    model = onnx.load(str(path))
    file = ExporterFile("", path, entry)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:
        raise ExportRefused(f"ONNX Runtime cannot load the export: {error}") from None
    rng = np.random.default_rng(seed)
    dtypes = _dtypes(model)
    base = file.export_sizes
    problem = _compare(session, source, make_feeds(file, base, dtypes, rng))
    if problem:
        raise ExportRefused(f"at the export sizes {base}: {problem}")
    frozen = list(entry.get("frozen", []))
    seen = {}
    for role in file.roles():
        if role in frozen:
            continue
        sizes = {**base, role: base[role] + 2}
        problem = _compare(session, source, make_feeds(file, sizes, dtypes, rng))
        if problem:
            frozen.append(role)
            seen[role] = f"at {role} {sizes[role]} (export {base[role]}): {problem}"
    entry = {**entry, "frozen": frozen}
    fails_at, differs = [], {}
    for sizes in size_plans(ExporterFile("", path, entry))[1:]:
        if 0 in sizes.values():
            continue  # ORT aborts on LSTM/GRU at 0; the tests run zeros apart
        problem = _compare(session, source, make_feeds(file, sizes, dtypes, rng))
        changed = {r: s for r, s in sizes.items() if s != base[r]}
        if problem and problem.startswith("ONNX Runtime fails"):
            fails_at.append({"sizes": changed, "error": problem})
        elif problem:
            differs[", ".join(f"{r} {s}" for r, s in changed.items())] = problem
    checked = {"tolerance": TOLERANCE, "against": "the source at every size the tests run"}
    if seen:
        checked["frozen_found"] = seen
    if differs:
        checked["differs_from_source"] = differs
    return {**entry, "fails_at": fails_at, "checked": checked}

"""Streaming calls: one frame per call, each call's new state fed to the next call.

A streaming model passes its recurrent state in and out (``h``/``h_out``,
``cache_in``/``cache_out``, ``h_enc_in``/``h_enc_out``). :func:`state_pairs` finds those
pairs by name and declared rank; :class:`Stream` runs and times the chained loop.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx

__all__ = ["Call", "StatePair", "Stream", "frame_feeds", "state_pairs"]

#: (graph input name, graph output name) of one carried state.
StatePair = tuple[str, str]

_OUT_SUFFIXES = (("_out", "_in"), ("_out", ""), ("_new", ""), ("_next", ""))


def _rank(value: onnx.ValueInfoProto) -> int | None:
    kind = value.type.tensor_type
    return len(kind.shape.dim) if kind.HasField("shape") else None


def state_pairs(model: onnx.ModelProto) -> list[StatePair]:
    """Graph outputs that are a graph input's next state: ``X_out`` for ``X_in`` or ``X``
    (also ``_new``/``_next``), of the same element type and declared rank."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = {v.name: v for v in model.graph.input if v.name not in initializers}
    pairs: list[StatePair] = []
    for output in model.graph.output:
        for suffix, replacement in _OUT_SUFFIXES:
            if not output.name.endswith(suffix):
                continue
            source = inputs.get(output.name[: -len(suffix)] + replacement)
            same_type = source is not None and (
                source.type.tensor_type.elem_type == output.type.tensor_type.elem_type
            )
            if source is not None and same_type and _rank(source) == _rank(output):
                pairs.append((source.name, output.name))
                break
    return pairs


def frame_feeds(
    model: onnx.ModelProto, sizes: Mapping[str, int], seed: int = 0
) -> dict[str, np.ndarray]:
    """Random feeds for one call: symbolic axes from ``sizes`` (``1`` when not named)."""
    rng = np.random.default_rng(seed)
    initializers = {init.name for init in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        kind = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else sizes.get(d.dim_param, 1)
                 for d in kind.shape.dim]  # fmt: skip
        dtype = onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[value.name] = rng.standard_normal(shape).astype(dtype) * 0.5
        else:
            feeds[value.name] = np.zeros(shape, dtype)
    return feeds


#: One call of a model: feeds by name -> outputs in the graph's order.
Call = Callable[[dict[str, np.ndarray]], Sequence[np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Stream:
    """A model's chained calls: the first call reads ``feeds``, each call's state outputs
    (``pairs``) are the next call's inputs; ``output_names``: the outputs in the graph's
    order (what a :data:`Call` returns)."""

    output_names: Sequence[str]
    feeds: Mapping[str, np.ndarray]
    pairs: Sequence[StatePair]

    def run_frames(self, run: Call, frames: int) -> dict[str, np.ndarray]:
        """Call ``run`` ``frames`` times, chained; the last call's outputs by name."""
        current = dict(self.feeds)
        index = {name: i for i, name in enumerate(self.output_names)}
        outputs: dict[str, np.ndarray] = {}
        for _ in range(frames):
            results = run(current)
            outputs = {name: results[i] for name, i in index.items()}
            for state_in, state_out in self.pairs:
                current[state_in] = outputs[state_out]
        return outputs

    def frames_per_second(
        self, run: Call, frames: int, clock: Callable[[], float] = time.perf_counter
    ) -> float:
        """Frames per second of one chained loop of ``frames`` calls of ``run`` (after one
        warm-up call), on ``clock`` (wall time; ``time.process_time``: this process's CPU
        time, which other processes' load does not inflate, for runtimes at one thread)."""
        self.run_frames(run, 1)
        start = clock()
        self.run_frames(run, frames)
        return frames / max(clock() - start, 1e-9)

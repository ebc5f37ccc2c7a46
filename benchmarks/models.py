"""The benchmark's model matrix: real torch exports, with the torchlib builder as a fallback.

Every model is an ``nn.LSTM`` / ``nn.GRU`` with fixed seeds. It is exported with
``torch.onnx.export(dynamo=True)`` and ``Dim(name, min=2)`` for each dynamic axis (without
``min=2`` torch 2.13 specialises some axes to the example size; an example size of 1 is
raised to 2 for a dynamic axis for the same reason, the benchmark still runs at the
requested size), each export in a fresh process (see :func:`_export`). When the export
freezes a requested axis anyway, or gives other outputs than PyTorch at the benchmark size
or at other sizes (torch 2.13 specialises the sequence length of a bidirectional LSTM
inside the graph although the input declares it dynamic), the model is rebuilt by
:func:`rnn_rewrite_rules.testing.build_torchlib_model` (node for node what torchlib
writes, with a dynamic sequence) holding the torch module's weights, and the table says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import pathlib
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Sequence
from typing import Literal
from unittest import mock

import numpy as np
import onnx

from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model
from rnn_rewrite_rules.testing import torchlib as _torchlib

__all__ = [
    "FULL_MATRIX",
    "QUICK_MATRIX",
    "SEED",
    "ModelSpec",
    "PreparedModel",
    "prepare",
    "select",
]

Source = Literal["torch", "builder"]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One ``nn.LSTM`` / ``nn.GRU`` module and the sizes it is benchmarked at."""

    name: str
    op_type: Literal["LSTM", "GRU", "RNN"]
    input_size: int
    hidden_size: int
    num_layers: int
    bidirectional: bool
    batch_first: bool
    batch: int
    seq: int
    #: Input axes exported as dynamic: "batch" and/or "seq".
    dynamic: tuple[str, ...] = ("batch",)

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def axis(self, name: str) -> int:
        """Index of the ``batch`` / ``seq`` axis in the input."""
        batch_axis = 0 if self.batch_first else 1
        return batch_axis if name == "batch" else 1 - batch_axis

    def x_shape(self, batch: int, seq: int) -> tuple[int, int, int]:
        if self.batch_first:
            return (batch, seq, self.input_size)
        return (seq, batch, self.input_size)

    @property
    def export_sizes(self) -> list[tuple[int, int]]:
        """(batch, seq) export examples to try in turn: at least 2 on a dynamic axis."""
        batch = max(self.batch, 2) if "batch" in self.dynamic else self.batch
        seq = max(self.seq, 2) if "seq" in self.dynamic else self.seq
        return [(batch, seq)]

    def other_sizes(self, axis: str) -> tuple[int, int]:
        """(batch, seq) differing on ``axis`` only from the benchmark's and every export's."""
        exports = self.export_sizes
        if axis == "batch":
            used = {self.batch, *(b for b, _ in exports)}
            return next(b for b in (4, 6, 7, 9) if b not in used), self.seq
        used = {self.seq, *(s for _, s in exports)}
        return self.batch, next(s for s in (9, 11, 13) if s not in used)

    def rnn_config(self) -> RnnConfig:
        if self.op_type == "RNN":  # torch unrolls nn.RNN: no builder replica of an ONNX RNN
            raise ValueError(f"{self.name}: no builder fallback for torch's unrolled nn.RNN")
        return RnnConfig(
            op_type=self.op_type,
            input_size=self.input_size,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            bidirectional=self.bidirectional,
            batch_first=self.batch_first,
            opset=18,
        )


#: The seed model of issues 3 and 8: 4-layer LSTM(256), batch_first, batch 5, seq 1.
SEED = ModelSpec("seed-lstm4x256", "LSTM", 256, 256, 4, False, True, batch=5, seq=1)


def _matrix() -> list[ModelSpec]:
    specs = [SEED]
    for hidden in (64, 512):
        for seq in (1, 16, 128):
            specs.append(
                ModelSpec(f"gru3bi-h{hidden}-s{seq}", "GRU", hidden, hidden, 3, True, False, 5, seq)
            )
    for hidden in (64, 512):
        for seq in (1, 16, 128):
            specs.append(
                ModelSpec(
                    f"lstm2bi-h{hidden}-s{seq}",
                    "LSTM",
                    hidden,
                    hidden,
                    2,
                    True,
                    False,
                    5,
                    seq,
                    dynamic=("batch", "seq"),
                )
            )
    return specs


def _reroll_matrix() -> list[ModelSpec]:
    """Issue 14: ``nn.RNN`` (2 layers, tanh), which torch unrolls step by step (``reroll``)."""
    return [
        ModelSpec(f"rnn2-h{hidden}-s{seq}", "RNN", hidden, hidden, 2, False, False, 5, seq)
        for hidden in (64, 512)
        for seq in (1, 16, 128)
    ]


#: Issue 5's matrix: the seed; GRU 3 layers bidirectional; LSTM 2 layers bidirectional with
#: dynamic batch and seq; seq 1, 16, 128; hidden 64 and 512. Then issue 14's nn.RNN models.
FULL_MATRIX: tuple[ModelSpec, ...] = tuple(_matrix() + _reroll_matrix())

#: ``--quick``: one tiny model of each family, seconds to run.
QUICK_MATRIX: tuple[ModelSpec, ...] = (
    ModelSpec("tiny-lstm2", "LSTM", 8, 8, 2, False, True, batch=2, seq=3),
    ModelSpec("tiny-gru2bi", "GRU", 8, 8, 2, True, False, batch=2, seq=3, dynamic=("batch", "seq")),
)


def select(patterns: Sequence[str] | None, quick: bool = False) -> list[ModelSpec]:
    """Models whose name contains any of ``patterns`` (all of the matrix when None)."""
    pool = list(QUICK_MATRIX if quick else FULL_MATRIX)
    if quick and patterns:
        pool = list(dict.fromkeys([*pool, *FULL_MATRIX]))
    if not patterns:
        return pool
    chosen = [spec for spec in pool if any(p in spec.name for p in patterns)]
    if not chosen:
        names = ", ".join(s.name for s in pool)
        raise SystemExit(f"no model matches {list(patterns)}; models: {names}")
    return chosen


@dataclasses.dataclass
class PreparedModel:
    """A model to benchmark, its feeds and PyTorch's outputs on them."""

    spec: ModelSpec
    model: onnx.ModelProto
    source: Source
    #: Why the builder was used (empty for a torch export).
    note: str
    export_seconds: float
    feeds: dict[str, np.ndarray]
    #: PyTorch's outputs on ``feeds`` (output, h_n[, c_n]).
    expected: list[np.ndarray]
    #: Per dynamic axis: feeds changing that axis only, and PyTorch's outputs on them.
    other: dict[str, tuple[dict[str, np.ndarray], list[np.ndarray]]]
    #: Dynamic axis name -> its index in the input.
    dynamic_axes: dict[str, int]


def _module(spec: ModelSpec):
    import torch

    torch.manual_seed(0)
    cls = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "RNN": torch.nn.RNN}[spec.op_type]
    return cls(
        spec.input_size,
        spec.hidden_size,
        num_layers=spec.num_layers,
        bidirectional=spec.bidirectional,
        batch_first=spec.batch_first,
    ).eval()


def _torch_outputs(module, x: np.ndarray) -> list[np.ndarray]:
    import torch

    with torch.no_grad():
        out, state = module(torch.from_numpy(x))
    states = list(state) if isinstance(state, tuple) else [state]
    return [t.numpy() for t in (out, *states)]


def _input_dynamic(model: onnx.ModelProto, axis: int) -> bool:
    dim = model.graph.input[0].type.tensor_type.shape.dim[axis]
    return bool(dim.dim_param) or not dim.HasField("dim_value")


def _export_here(spec: ModelSpec, batch: int, seq: int, path: str) -> None:
    import torch
    from torch.export import Dim

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed"
    module = _module(spec)
    x = torch.randn(*spec.x_shape(batch, seq))
    dims = {spec.axis(name): Dim(name, min=2) for name in spec.dynamic}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module, (x,), dynamo=True, dynamic_shapes=(dims,), input_names=["input"]
        )
    onnx.save(program.model_proto, path)


def _export(spec: ModelSpec, batch: int, seq: int) -> onnx.ModelProto:
    """``torch.onnx.export`` in a fresh process.

    torch 2.13 keeps process-wide state between exports: the second LSTM export with a
    dynamic sequence axis in one process specialises that axis to the example length
    (the first keeps it), whatever the module. One process per export avoids that.
    """
    root = pathlib.Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="rnn-export-") as tmp:
        path = os.path.join(tmp, "model.onnx")
        request = json.dumps([dataclasses.asdict(spec), batch, seq, path])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        }
        process = subprocess.run(
            [sys.executable, "-m", "benchmarks.models", request],
            capture_output=True,
            text=True,
            cwd=root,
            env=env,
        )
        if process.returncode:
            lines = process.stderr.strip().splitlines()
            raise RuntimeError(lines[-1] if lines else f"exit code {process.returncode}")
        return onnx.load(path)


def _build_with_weights(spec: ModelSpec, module) -> onnx.ModelProto:
    """The builder's replica of the export, holding ``module``'s weights."""
    state = {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}
    params = []
    for layer in range(spec.num_layers):
        for direction in range(spec.num_directions):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            params.append(
                {
                    k: state[k + suffix]
                    for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
                    if k + suffix in state
                }
            )
    with mock.patch.object(_torchlib, "_pytorch_parameters", lambda cfg, rng: params):
        return build_torchlib_model(spec.rnn_config())


def _ort_outputs(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray] | None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # a failure here is expected and reported, not logged
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        return session.run(None, {model.graph.input[0].name: x})
    except Exception:
        return None


def _agrees(actual: list[np.ndarray] | None, expected: list[np.ndarray]) -> bool:
    if actual is None or len(actual) != len(expected):
        return False
    return all(
        a.shape == e.shape and np.allclose(a, e, atol=1e-4, rtol=1e-4)
        for a, e in zip(actual, expected, strict=True)
    )


def _try_export(spec, batch, seq, bench, others) -> tuple[onnx.ModelProto | None, str]:
    """The export at this example size if it is right at every size, else why not."""
    try:
        exported = _export(spec, batch, seq)
    except Exception as error:  # an exporter failure is a result, not a crash
        return None, f"export failed ({type(error).__name__})"
    frozen = [n for n in spec.dynamic if not _input_dynamic(exported, spec.axis(n))]
    if frozen:
        return None, f"torch froze {', '.join(frozen)} in the input"
    if not _agrees(_ort_outputs(exported, bench[0]), bench[1]):
        return None, "wrong at the benchmark size"
    if not all(_agrees(_ort_outputs(exported, a), e) for a, e in others.values()):
        return None, "an axis specialised inside the graph"
    return exported, ""


def prepare(spec: ModelSpec, source: Literal["torch", "builder", "auto"] = "auto") -> PreparedModel:
    """Export (or build) ``spec`` and compute PyTorch's reference outputs."""
    import time

    module = _module(spec)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(spec.x_shape(spec.batch, spec.seq)).astype(np.float32)
    expected = _torch_outputs(module, x)
    others = {}
    for axis in spec.dynamic:
        x_other = rng.standard_normal(spec.x_shape(*spec.other_sizes(axis))).astype(np.float32)
        others[axis] = (x_other, _torch_outputs(module, x_other))

    model, used, note = None, "builder", "--source builder"
    start = time.perf_counter()
    if source in ("torch", "auto"):
        notes = []
        for batch, seq in spec.export_sizes:
            exported, problem = _try_export(spec, batch, seq, (x, expected), others)
            if exported is not None:
                model, used = exported, "torch"
                note = f"example batch {batch}, seq {seq}" + (
                    f" (other examples: {'; '.join(notes)})" if notes else ""
                )
                break
            notes.append(f"batch {batch} seq {seq}: {problem}")
        else:
            note = "; ".join(notes)
            if source == "torch":
                raise RuntimeError(f"{spec.name}: {note}")
    export_seconds = time.perf_counter() - start
    if model is None:
        model = _build_with_weights(spec, module)
    name = model.graph.input[0].name
    return PreparedModel(
        spec=spec,
        model=model,
        source=used,
        note=note,
        export_seconds=export_seconds,
        feeds={name: x},
        expected=expected,
        other={axis: ({name: a}, e) for axis, (a, e) in others.items()},
        dynamic_axes={n: spec.axis(n) for n in spec.dynamic},
    )


if __name__ == "__main__":  # the export child process of _export
    _spec, _batch, _seq, _path = json.loads(sys.argv[1])
    _spec["dynamic"] = tuple(_spec["dynamic"])
    _export_here(ModelSpec(**_spec), _batch, _seq, _path)

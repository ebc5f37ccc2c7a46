"""The default rewrite runs wherever the original runs: ONNX Runtime, tract, OpenVINO and
``onnx.reference``, with the original's outputs, at several sizes of each dynamic axis.

The models: every benchmark model's structure (``benchmarks/models.py``, built without
torch), and the builders of every exporter style (torchlib, TorchScript, tf2onnx/keras,
Paddle, hand-built, unrolled ``nn.RNN`` and cell loops, ``layout=1``). For each runtime
and size where the original runs, the rewrite must run, and where the original's outputs
are right (equal to ONNX Runtime's, or ``onnx.reference``'s where ORT rejects the
model), the rewrite's must be right too; where the original fails, nothing is asked
(OpenVINO 2026.4.1 runs ``layout=1`` nodes as if they were ``layout=0``: wrong shapes,
which the ``layout`` family's output fixes). tract runs in a child process (a panic
aborts the process); OpenVINO compiles with ``INFERENCE_PRECISION_HINT=f32`` (its default
precision differs by about 3e-3).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from benchmarks import measure
from benchmarks.models import FULL_MATRIX, ModelSpec

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.testing import build_torchlib_model, random_inputs
from rnn_rewrite_rules.testing import thirdparty as tp
from rnn_rewrite_rules.testing.exporters import ExporterSpec, build_exporter_model, exporter_inputs
from rnn_rewrite_rules.testing.unrolled import (
    UnrolledCellConfig,
    UnrolledRnnConfig,
    build_unrolled_cell,
    build_unrolled_rnn,
    cell_inputs,
    rnn_inputs,
)
from tests.support import in_tract

pytest.importorskip("openvino", reason="openvino (part of the test extra) is not installed")
pytest.importorskip("tract", reason="tract (part of the test extra) is not installed")

pytestmark = pytest.mark.tract

Feeds = dict[str, np.ndarray]
#: (batch, seq): every dynamic axis takes at least two sizes, none the builders' defaults.
SIZES = ((1, 1), (3, 5), (2, 7))
ATOL = 1e-4


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], onnx.ModelProto]
    #: (batch, seq, rng) -> feeds; a model with a fixed sequence ignores seq.
    feeds: Callable[[int, int, int], Feeds]
    #: ONNX Runtime runs the original (it rejects layout=1 nodes).
    ort_runs: bool = True


def _benchmark_case(spec: ModelSpec) -> Case:
    if spec.op_type == "RNN":  # torch unrolls nn.RNN: the unrolled builder
        cfg = UnrolledRnnConfig(
            input_size=spec.input_size,
            hidden_size=spec.hidden_size,
            num_layers=spec.num_layers,
            bidirectional=spec.bidirectional,
            batch_first=spec.batch_first,
            seq=3,
            transpose_node=spec.hidden_size >= 91,
        )
        return Case(
            spec.name,
            functools.partial(build_unrolled_rnn, cfg),
            lambda b, s, r: rnn_inputs(cfg, b, None, r),
        )
    cfg = spec.rnn_config()
    return Case(
        spec.name,
        functools.partial(build_torchlib_model, cfg),
        lambda b, s, r: random_inputs(cfg, b, s, rng=r),
    )


def _benchmark_cases() -> list[Case]:
    """One per model structure of the benchmark matrix (its seq variants share a graph)."""
    seen: dict[tuple, ModelSpec] = {}
    for spec in FULL_MATRIX:
        key = dataclasses.astuple(dataclasses.replace(spec, name="", seq=0, batch=0))
        seen.setdefault(key, spec)
    return [_benchmark_case(spec) for spec in seen.values()]


def _exporter_case(**fields) -> Case:
    spec = ExporterSpec(**fields)
    name = "-".join(str(v) for v in fields.values())
    return Case(
        f"exporter-{name}",
        functools.partial(build_exporter_model, spec),
        lambda b, s, r: exporter_inputs(spec, b, s, r),
        ort_runs=spec.layout == 0,
    )


def _thirdparty_case(builder: Callable[[], onnx.ModelProto]) -> Case:
    model = builder()
    return Case(
        f"thirdparty-{builder.__name__}",
        lambda: model,
        lambda b, s, r: tp.thirdparty_inputs(model, b, s, rng=r),
    )


def _cell_case(cfg: UnrolledCellConfig) -> Case:
    return Case(
        f"cells-{cfg.op_type}-{cfg.initial_state}",
        functools.partial(build_unrolled_cell, cfg),
        lambda b, s, r: cell_inputs(cfg, b, None, r),
    )


CASES: list[Case] = [
    *_benchmark_cases(),
    *(
        _exporter_case(style=style, op_type=op, initial_state=state, num_layers=2, opset=opset)
        for style, opset in (("torchscript", 14), ("tf2onnx", 13), ("plain", 17))
        for op in ("LSTM", "GRU", "RNN")
        for state in ("absent", "constant_of_shape", "expand", "keras")
    ),
    _exporter_case(
        style="torchscript",
        op_type="LSTM",
        initial_state="constant_of_shape",
        num_layers=2,
        direction="bidirectional",
        batch_first=True,
    ),
    _exporter_case(style="tf2onnx", op_type="GRU", initial_state="keras", wrap="if"),
    *(
        _exporter_case(style="plain", op_type=op, initial_state=state, layout=1, opset=14)
        for op in ("LSTM", "GRU")
        for state in ("absent", "constant_of_shape")
    ),
    *(
        _thirdparty_case(builder)
        for builder in (
            tp.torchscript_batch_first,
            tp.embedding_tagger,
            tp.paddle_states,
            tp.zeros_like_state,
            tp.hand_built_bidirectional,
            tp.one_dim_states,
            tp.computed_reshape,
        )
    ),
    *(
        _cell_case(UnrolledCellConfig(op_type=op, initial_state=state))
        for op in ("LSTM", "GRU")
        for state in ("zeros", "constant_of_shape")
    ),
    Case(
        "rnn-unrolled-bidirectional",
        functools.partial(build_unrolled_rnn, UnrolledRnnConfig(num_layers=2, bidirectional=True)),
        lambda b, s, r: rnn_inputs(UnrolledRnnConfig(num_layers=2, bidirectional=True), b, None, r),
    ),
]


# --- runtimes: each returns the outputs, or the text of the error that stopped it ----------


def _ort(model: onnx.ModelProto, feeds: Feeds) -> list[np.ndarray] | str:
    return measure.ort_run(model.SerializeToString(), feeds, optimize=True)


def _openvino(model: onnx.ModelProto, feeds: Feeds) -> list[np.ndarray] | str:
    """Not ``measure.ov_run``: its timing setup (one shared ``Core``, ``NUM_STREAMS=1``)
    crashed OpenVINO 2026.4.1 with a segmentation fault on the layout=1 LSTM case here."""
    import openvino as ov

    core = ov.Core()
    try:
        compiled = core.compile_model(
            core.read_model(model.SerializeToString(), b""),
            "CPU",
            {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1},
        )
        result = compiled.create_infer_request().infer(dict(feeds))
        return [np.asarray(result[output]) for output in compiled.outputs]
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def _tract(models: list[onnx.ModelProto], feeds: list[Feeds]) -> list[list]:
    """Per model, per feed: the outputs or the error's text (one child process for all)."""
    probes = in_tract(models, feeds)
    return [[out if out is not None else probe.error for out in probe.outputs] for probe in probes]


def _agree(actual: list[np.ndarray], expected: list[np.ndarray]) -> bool:
    return [a.shape for a in actual] == [e.shape for e in expected] and (
        runtime.max_abs_diff(expected, actual) <= ATOL
    )


def _compare(runtime_name: str, size, truth, expected, actual) -> str | None:
    """None when fine, else what went wrong. ``truth``: the original's outputs in ONNX
    Runtime (or onnx.reference where ORT rejects it); ``expected``/``actual``: the original's
    and the rewrite's in this runtime. Where the original fails, nothing is asked; where it
    runs but is wrong (OpenVINO 2026.4 ignores ``layout=1``), the rewrite must still run."""
    if isinstance(expected, str):
        return None
    if isinstance(actual, str):
        return f"{runtime_name} at {size}: the original runs, the rewrite fails: {actual}"
    if isinstance(truth, str) or not _agree(expected, truth):
        return None
    if not _agree(actual, truth):
        shapes = [a.shape for a in actual], [e.shape for e in truth]
        diff = runtime.max_abs_diff(truth, actual) if shapes[0] == shapes[1] else shapes
        return f"{runtime_name} at {size}: the original is right, the rewrite wrong: {diff}"
    return None


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_default_rewrite_runs_wherever_the_original_runs(case: Case) -> None:
    original = case.build()
    rewritten = rnn_rewrite_rules.rewrite(original)
    feeds = [case.feeds(batch, seq, index) for index, (batch, seq) in enumerate(SIZES)]
    truths = [_ort(original, feed) for feed in feeds]
    truths = [
        measure.reference_run(original, feed) if isinstance(truth, str) else truth
        for truth, feed in zip(truths, feeds, strict=True)
    ]
    problems: list[str] = []
    ran = {"onnxruntime": 0, "openvino": 0, "tract": 0, "reference": 0}
    runtimes = (
        ("onnxruntime", _ort),
        ("openvino", _openvino),
        ("reference", measure.reference_run),
    )
    for name, run in runtimes:
        for size, feed, truth in zip(SIZES, feeds, truths, strict=True):
            expected = run(original, feed)
            ran[name] += not isinstance(expected, str)
            problems.append(_compare(name, size, truth, expected, run(rewritten, feed)))
    before, after = _tract([original, rewritten], feeds)
    for size, truth, expected, actual in zip(SIZES, truths, before, after, strict=True):
        ran["tract"] += not isinstance(expected, str)
        problems.append(_compare("tract", size, truth, expected, actual))
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems)
    if case.ort_runs:  # the builders' models run in ORT (but layout=1)
        assert ran["onnxruntime"] == len(SIZES), ran
    others = ran["openvino"] + ran["tract"] + (0 if case.ort_runs else ran["reference"])
    assert others > 0, ran  # a second runtime had something to check


def test_zero_state_benchmark_runs(capsys) -> None:
    """``python -m benchmarks.zero_state --quick``: both targets agree and a ratio prints."""
    from benchmarks import zero_state

    assert zero_state.main(["--quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("lstm2x64")]
    assert len(rows) == 4 and all(("onnxruntime" in r) != ("openvino" in r) for r in rows)

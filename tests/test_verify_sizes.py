"""``--verify``'s sizes on the forms exporters write.

tf2onnx gives each input its own batch name (``x [unk__1, T, F]``, ``h0 [unk__2, H]``),
Paddle feeds ``seq_len`` to the RNN's ``sequence_lens``, a VAD's reflect ``Pad`` needs
more samples than it pads, a frozen export declares the sizes it traced, and ops tie
sizes (``Concat``, ``MatMul``, broadcasting). Each model here fails or is compared on
sizes the original cannot run without the size plan the graph implies.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules import RewriteOptions, rewrite_file
from rnn_rewrite_rules.cli import ExitCode
from tests.support import assert_one_line_error, run

pytest.importorskip("onnxruntime")

F, H = 4, 5


def _model(nodes, inputs, outputs, initializers, value_info=(), opset: int = 17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers, value_info=value_info)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _weights(*shape: int, name: str, seed: int = 0) -> onnx.TensorProto:
    values = np.random.default_rng(seed).uniform(-0.5, 0.5, shape).astype(np.float32)
    return numpy_helper.from_array(values, name)


def _ints(name: str, *values: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _vi(name: str, dims, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def tf2onnx_states() -> onnx.ModelProto:
    """tf2onnx's Keras LSTM with state inputs: each input its own batch name, X transposed
    to time-major, the states ``[batch, H]`` unsqueezed to ``[1, batch, H]``."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
        helper.make_node("Unsqueeze", ["h0", "zero"], ["h0u"]),
        helper.make_node("Unsqueeze", ["c0", "zero"], ["c0u"]),
        helper.make_node("LSTM", ["xt", "W", "R", "", "", "h0u", "c0u"], ["Y", "Y_h", "Y_c"],
                         hidden_size=H),
        helper.make_node("Squeeze", ["Y", "one"], ["ys"]),
        helper.make_node("Transpose", ["ys"], ["y"], perm=[1, 0, 2]),
        helper.make_node("Squeeze", ["Y_h", "zero"], ["h"]),
    ]  # fmt: skip
    inputs = [_vi("x", ["unk__1", "unk__4", F]), _vi("h0", ["unk__2", H]), _vi("c0", ["unk__3", H])]
    outputs = [_vi("y", ["unk__5", "unk__6", H]), _vi("h", ["unk__7", H])]
    weights = [_weights(1, 4 * H, F, name="W"), _weights(1, 4 * H, H, name="R", seed=1)]
    return _model(nodes, inputs, outputs, [*weights, _ints("zero", 0), _ints("one", 1)], opset=15)


def keras_loop_state() -> onnx.ModelProto:
    """tf2onnx's Keras SimpleRNN: a ``Loop`` over time carrying ``h0 [unk__2, H]`` (its own
    batch name) and reading ``x [unk__1, T, F]``: the batch meets inside the body, where
    no size is a fact."""
    body = helper.make_graph(
        [
            helper.make_node("Gather", ["xt", "i"], ["xi"], axis=0),
            helper.make_node("MatMul", ["xi", "W"], ["a"]),
            helper.make_node("MatMul", ["h", "R"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["s"]),
            helper.make_node("Tanh", ["s"], ["h_next"]),
            helper.make_node("Identity", ["cond"], ["cond_out"]),
            helper.make_node("Identity", ["h_next"], ["h_scan"]),
        ],
        "step",
        [_vi("i", [], TensorProto.INT64), _vi("cond", [], TensorProto.BOOL), _vi("h", None)],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("h_next", None), _vi("h_scan", None)],
    )
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
        helper.make_node("Shape", ["xt"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["steps"], axis=0),
        helper.make_node("Loop", ["steps", "", "h0"], ["h", "ys"], body=body),
    ]
    inputs = [_vi("x", ["unk__1", "unk__4", F]), _vi("h0", ["unk__2", H])]
    outputs = [_vi("h", ["unk__5", H]), _vi("ys", ["unk__6", "unk__7", H])]
    weights = [_weights(F, H, name="W"), _weights(H, H, name="R", seed=1)]
    return _model(nodes, inputs, outputs, [*weights, _ints("zero", 0)], opset=15)


def paddle_seq_len() -> onnx.ModelProto:
    """paddle2onnx's LSTM with sequence lengths: ``x [unk__x, seq, F]`` and ``seq_len
    [unk__l]`` (int64, cast to int32) reaching ``sequence_lens``."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
        helper.make_node("Cast", ["seq_len"], ["lens"], to=TensorProto.INT32),
        helper.make_node("LSTM", ["xt", "W", "R", "", "lens"], ["Y", "Y_h"], hidden_size=H),
        helper.make_node("Squeeze", ["Y_h", "zero"], ["h"]),
    ]
    inputs = [_vi("x", ["unk__x", "seq", F]), _vi("seq_len", ["unk__l"], TensorProto.INT64)]
    weights = [_weights(1, 4 * H, F, name="W"), _weights(1, 4 * H, H, name="R", seed=1)]
    return _model(nodes, inputs, [_vi("h", ["unk__h", H])], [*weights, _ints("zero", 0)])


def vad(pad: int) -> onnx.ModelProto:
    """A VAD front end: ``input [batch, samples]`` reflect-padded by ``pad`` (at least
    ``pad + 1`` samples run), cut into frames of 16, one LSTM over the frames."""
    nodes = [
        helper.make_node("Pad", ["input", "pads"], ["padded"], mode="reflect", name="/stft/Pad"),
        helper.make_node("Reshape", ["padded", "frames"], ["framed"], name="/frames"),
        helper.make_node("Transpose", ["framed"], ["x"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["x", "W", "R"], ["Y", "Y_h"], hidden_size=H, name="/lstm"),
        helper.make_node("Squeeze", ["Y_h", "zero"], ["out"]),
    ]
    constants = [_ints("pads", 0, pad, 0, pad), _ints("frames", 0, -1, 2), _ints("zero", 0)]
    weights = [_weights(1, 4 * H, 2, name="W"), _weights(1, 4 * H, H, name="R", seed=1)]
    inputs = [_vi("input", ["batch", "samples"])]
    return _model(nodes, inputs, [_vi("out", ["batch", H])], [*constants, *weights])


def frozen_declared() -> onnx.ModelProto:
    """An export that froze its traced sizes: ``Reshape(x, [2, 7, F])`` behind a value the
    file declares ``[2, 7, F]``; only x = 2x7xF runs."""
    nodes = [
        helper.make_node("Identity", ["x"], ["traced"]),
        helper.make_node("Reshape", ["traced", "frozen"], ["xt"]),
        helper.make_node("Transpose", ["xt"], ["tm"], perm=[1, 0, 2]),
        helper.make_node("GRU", ["tm", "W", "R"], ["Y", "Y_h"], hidden_size=H),
    ]
    weights = [_weights(1, 3 * H, F, name="W"), _weights(1, 3 * H, H, name="R", seed=1)]
    return _model(
        nodes,
        [_vi("x", ["batch", "seq", F])],
        [_vi("Y_h", [1, 2, H])],
        [_ints("frozen", 2, 7, F), *weights],
        value_info=[_vi("traced", [2, 7, F])],
    )


def _save(model: onnx.ModelProto, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _runs(stdout: str) -> list[dict[str, tuple[int, ...]]]:
    """Each run's shapes, from the report."""
    found = []
    for line in re.findall(r"^  run \d+: (.*)$", stdout, re.M):
        pairs = (item.split("=") for item in line.split(", "))
        found.append({name: tuple(map(int, dims.split("x"))) for name, dims in pairs})
    return found


@pytest.mark.command
def test_states_under_their_own_batch_names_take_the_inputs_batch(tmp_path) -> None:
    path = _save(tf2onnx_states(), tmp_path, "tf2onnx")
    proc = run(path, "-o", tmp_path / "out.onnx", "--verify", cwd=tmp_path)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "note: axes the graph needs equal: h0 axis 0 = x axis 0, c0 axis 0 = x axis 0" in (
        proc.stdout
    )
    runs = _runs(proc.stdout)
    assert len(runs) == 2 and runs[0]["x"][0] != runs[1]["x"][0]
    for sizes in runs:
        assert sizes["h0"][0] == sizes["c0"][0] == sizes["x"][0] != sizes["x"][1]
    assert "note: the original rejects" not in proc.stdout  # the first sizes ran


def test_a_state_carried_by_a_loop_gets_one_size_with_the_input(tmp_path) -> None:
    """No op outside the Loop ties h0's batch to x's: where other sizes fail (run 2), the
    sizes that give every free axis one size run; the report says what they replaced."""
    path = _save(keras_loop_state(), tmp_path, "keras_loop")
    options = RewriteOptions(verify=True, allow_no_rnn=True)
    report = rewrite_file(path, tmp_path / "out.onnx", options)
    assert report.verify.ok and len(report.verify.runs) == 2
    first, second = report.verify.runs
    assert first["x"][0] == 1 or first["x"][0] == first["h0"][0]  # the Add broadcasts a 1
    assert second == {"x": (5, 5, F), "h0": (5, H)}
    assert report.verify.notes[1].startswith("the original rejects x=5x6x4, h0=7x5 (")
    assert report.verify.notes[1].endswith("compared x=5x5x4, h0=5x5 instead")


def test_sequence_lengths_are_one_valid_length_per_batch_row(tmp_path, monkeypatch) -> None:
    """Every feed of ``seq_len`` has one value per row of x, each in [1, seq], some shorter
    than seq; the original and the result get the same."""
    import onnxruntime

    fed: list[dict[str, np.ndarray]] = []
    real_run = onnxruntime.InferenceSession.run

    def recording_run(self, output_names, input_feed, *args, **kwargs):
        fed.append({k: np.array(v) for k, v in input_feed.items()})
        return real_run(self, output_names, input_feed, *args, **kwargs)

    monkeypatch.setattr(onnxruntime.InferenceSession, "run", recording_run)
    path = _save(paddle_seq_len(), tmp_path, "paddle")
    report = rewrite_file(path, tmp_path / "out.onnx", RewriteOptions(verify=True))
    assert report.verify.ok and len(report.verify.runs) == 2
    assert len(fed) == 4  # two runs, each model once
    for feeds in fed:
        batch, seq, _ = feeds["x"].shape
        lengths = feeds["seq_len"]
        assert lengths.shape == (batch,) and lengths.dtype == np.int64
        assert lengths.min() >= 1 and lengths.max() == seq
        assert lengths.min() < seq, lengths  # batch and seq are at least 2 here


@pytest.mark.command
def test_a_reflect_pad_gets_the_samples_it_needs(tmp_path) -> None:
    path = _save(vad(pad=96), tmp_path, "vad")
    proc = run(path, "-o", tmp_path / "out.onnx", "--verify", cwd=tmp_path)
    assert proc.returncode == ExitCode.OK, proc.stderr
    runs = _runs(proc.stdout)
    assert len(runs) == 2 and all(sizes["input"][1] > 96 for sizes in runs), runs
    assert "note: the original rejects input=2x3 (" in proc.stdout
    assert "Pad reflect: pre-pad (96) exceeds maximum allowed" in proc.stdout
    assert "verify: OK" in proc.stdout


@pytest.mark.command
def test_no_size_that_runs_names_the_input_the_error_and_the_shape_to_give(tmp_path) -> None:
    """A pad of 5000 needs more samples than the retries try: the error names the input,
    the runtime's message and the --shape argument; with that argument it verifies."""
    path = _save(vad(pad=5000), tmp_path, "vad")
    proc = run(path, "-o", tmp_path / "out.onnx", "--verify", cwd=tmp_path)
    assert_one_line_error(
        proc,
        ExitCode.CANNOT_VERIFY,
        "the original model fails on input=2x3 in onnxruntime: ",
        "Pad reflect: pre-pad (5000) exceeds maximum allowed (2)",
        "e.g. --shape input=<batch>,<samples> (a frozen axis? see --check)",
    )
    assert not (tmp_path / "out.onnx").exists()
    proc = run(
        path, "-o", tmp_path / "out.onnx", "--verify", "--shape", "input=1,6000", cwd=tmp_path
    )
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert _runs(proc.stdout) == [{"input": (1, 6000)}]


def test_the_exports_declared_sizes_are_tried_where_others_fail(tmp_path) -> None:
    path = _save(frozen_declared(), tmp_path, "frozen")
    report = rewrite_file(path, tmp_path / "out.onnx", RewriteOptions(verify=True))
    assert report.verify.ok and report.verify.runs == [{"x": (2, 7, F)}]
    assert report.verify.notes[0].startswith("the original rejects x=2x3x4 (")
    assert report.verify.notes[0].endswith("compared x=2x7x4 instead")
    assert "compared 1 run only (a frozen axis? see --check)" in report.verify.notes[1]


def _pair(op: str) -> onnx.ModelProto:
    """Two inputs whose sizes ``op`` needs equal, each under its own name."""
    shapes = {
        "Concat": (["n", 3], ["m", 4], {"axis": 1}),
        "MatMul": ([2, "k"], ["j", 3], {}),
        "Add": (["n", 3], ["m", 3], {}),
        "Where": (["n"], ["m"], {}),
        "Gemm": ([2, "k"], ["j", 3], {}),
    }
    a, b, attrs = shapes[op]
    inputs = [_vi("a", a), _vi("b", b)]
    node = helper.make_node(op, ["a", "b"], ["y"], **attrs)
    if op == "Where":
        inputs.insert(0, _vi("c", ["p"], TensorProto.BOOL))
        node = helper.make_node(op, ["c", "a", "b"], ["y"])
    output = _vi("y", ["y0"] if op == "Where" else ["y0", "y1"])
    return _model([node], inputs, [output], [])


@pytest.mark.parametrize("op", ["Concat", "MatMul", "Add", "Where", "Gemm"])
def test_sizes_an_op_needs_equal_are_fed_equal(op: str, tmp_path) -> None:
    path = _save(_pair(op), tmp_path, op)
    report = rewrite_file(
        path, tmp_path / "out.onnx", RewriteOptions(verify=True, allow_no_rnn=True)
    )
    assert report.verify.ok and len(report.verify.runs) == 2
    assert not any(n.startswith("the original rejects") for n in report.verify.notes)
    for sizes in report.verify.runs:
        a, b = sizes["a"], sizes["b"]
        if op in ("MatMul", "Gemm"):
            assert a[1] == b[0]
        else:
            assert a[0] == b[0]

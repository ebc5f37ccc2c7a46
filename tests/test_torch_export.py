"""Integration: real ``torch.onnx.export(dynamo=True)`` models, compared with PyTorch itself."""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import onnx
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from tests.support import op_counts, run

torch = pytest.importorskip("torch", reason="torch==2.13.0 is a test dependency")

pytestmark = pytest.mark.torch


def export(module, example: tuple, dynamic_shapes, names: list[str]) -> onnx.ModelProto:
    """Export quietly (torch prints progress) with the default optimize step."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module.eval(), example, dynamo=True, dynamic_shapes=dynamic_shapes, input_names=names
        )
    return program.model_proto


def torch_outputs(module, args: tuple) -> list[np.ndarray]:
    with torch.no_grad():
        output, state = module(*args)
    states = list(state) if isinstance(state, tuple) else [state]
    return [output.numpy()] + [s.numpy() for s in states]


def _x(batch: int, seq: int, size: int, batch_first: bool):
    return torch.randn(batch, seq, size) if batch_first else torch.randn(seq, batch, size)


CASES = [
    # (kind, layers, bidirectional, batch_first, bias, dynamic seq too)
    ("LSTM", 1, False, False, True, False),
    ("LSTM", 1, False, True, False, True),
    ("LSTM", 2, True, True, True, True),
    ("LSTM", 4, False, True, False, True),
    ("LSTM", 3, True, False, True, False),
    ("GRU", 1, True, True, True, False),
    ("GRU", 2, False, False, False, True),
    ("GRU", 4, True, True, True, True),
]


@pytest.mark.parametrize(
    ("kind", "layers", "bidirectional", "batch_first", "bias", "dyn_seq"), CASES
)
def test_export_with_install_matches_pytorch(
    kind: str, layers: int, bidirectional: bool, batch_first: bool, bias: bool, dyn_seq: bool
) -> None:
    torch.manual_seed(layers)
    module = getattr(torch.nn, kind)(
        6, 10, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, bias=bias
    )
    batch_axis, seq_axis = (0, 1) if batch_first else (1, 0)
    dims = {batch_axis: torch.export.Dim("batch")}
    if dyn_seq:
        dims[seq_axis] = torch.export.Dim("seq")
    example = (_x(3, 4, 6, batch_first),)
    original = export(module, example, (dims,), ["x"])
    with rnn_rewrite_rules.installed():
        ours = export(module, example, (dims,), ["x"])
    assert rnn_rewrite_rules.rewrite(original).graph.node  # the CLI path works on it too

    counts = op_counts(ours)
    # one Shape: the batch of the zero state all layers share (the portable default)
    assert counts["Shape"] == counts["ConstantOfShape"] == 1 and counts["Mul"] == 0, counts
    assert len(ours.graph.node) < len(original.graph.node)

    declared = [
        d.dim_param or d.dim_value for d in original.graph.input[0].type.tensor_type.shape.dim
    ]
    assert [
        d.dim_param or d.dim_value for d in ours.graph.input[0].type.tensor_type.shape.dim
    ] == declared
    assert declared[batch_axis] == "batch"
    # torch specialises the sequence axis of many RNN exports to the example length (the
    # input then declares it static): vary it only where the export kept it dynamic.
    seq_lengths = [4, 1, 7] if isinstance(declared[seq_axis], str) else [4]
    for batch in (3, 1, 5):
        for seq in seq_lengths:
            x = _x(batch, seq, 6, batch_first)
            expected = torch_outputs(module, (x,))
            actual = runtime.run(ours, {"x": x.numpy()})
            assert runtime.max_abs_diff(expected, actual) <= 1e-5, (batch, seq)
            try:
                reference = runtime.run(original, {"x": x.numpy()})
            except Exception:  # torch specialised this axis in the original export
                continue
            assert runtime.max_abs_diff(reference, actual) <= 1e-5


def test_seed_model() -> None:
    """LSTM(256, 256, num_layers=4, batch_first=True), input [5, 1, 256], dynamic batch."""
    torch.manual_seed(0)
    module = torch.nn.LSTM(256, 256, num_layers=4, batch_first=True)
    example = (torch.randn(5, 1, 256),)
    dims = ({0: torch.export.Dim("batch")},)
    original = export(module, example, dims, ["x"])
    before = op_counts(original)
    # What torch 2.13 + onnxscript 0.7.2 write: 4 runtime chains + the zero-state Shape.
    assert before["Mul"] == 4 and before["Shape"] == 5 and before["LSTM"] == 4
    with rnn_rewrite_rules.installed():
        ours = export(module, example, dims, ["x"])
    after = op_counts(ours)
    assert after["Shape"] == after["ConstantOfShape"] == 1 and after["Mul"] == 0
    assert len(ours.graph.node) <= 71  # 68 with target="onnxruntime"
    for batch in (5, 1, 8):
        x = torch.randn(batch, 1, 256)
        assert (
            runtime.max_abs_diff(torch_outputs(module, (x,)), runtime.run(ours, {"x": x.numpy()}))
            <= 1e-5
        )


def test_dynamic_sequence_export_stays_dynamic() -> None:
    """A GRU export that keeps batch and seq dynamic: ours must run at other lengths too."""
    torch.manual_seed(1)
    module = torch.nn.GRU(8, 16, num_layers=2, batch_first=True)
    dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")},)
    with rnn_rewrite_rules.installed():
        ours = export(module, (torch.randn(2, 3, 8),), dims, ["x"])
    declared = [d.dim_param or d.dim_value for d in ours.graph.input[0].type.tensor_type.shape.dim]
    if not isinstance(declared[1], str):
        pytest.xfail("torch specialised the sequence axis of this export (a torch issue)")
    assert op_counts(ours)["Shape"] == 1  # the shared zero state's batch
    for batch, seq in [(2, 3), (1, 9), (4, 1)]:
        x = torch.randn(batch, seq, 8)
        assert (
            runtime.max_abs_diff(torch_outputs(module, (x,)), runtime.run(ours, {"x": x.numpy()}))
            <= 1e-5
        )


class _WithStates(torch.nn.Module):
    """``nn.LSTM(8, 16, num_layers=2, batch_first=True)`` called with its states."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)

    def forward(self, x, h0, c0):
        y, (h, c) = self.lstm(x, (h0, c0))
        return y, h, c


@pytest.mark.command
def test_a_dynamo_export_on_disk_takes_every_option(tmp_path) -> None:
    """The file torch 2.13 writes (``model.onnx`` + ``model.onnx.data``), through the
    command with each option, as a user calls it."""
    torch.manual_seed(0)
    module = _WithStates().eval()
    source = tmp_path / "in" / "model.onnx"
    source.parent.mkdir()
    batch = torch.export.Dim("batch")
    example = (torch.randn(2, 5, 8), torch.randn(2, 2, 16), torch.randn(2, 2, 16))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            example,
            str(source),
            dynamo=True,
            dynamic_shapes=({0: batch, 1: torch.export.Dim("seq")}, {1: batch}, {1: batch}),
            input_names=["x", "h0", "c0"],
        )
    assert (tmp_path / "in" / "model.onnx.data").is_file()  # the premise: external data
    out = tmp_path / "out"
    out.mkdir()
    options = ["--verify", "--benchmark", "--benchmark-budget", "0.2", "--keep-slower"]
    proc = run(source, "-o", out / "int8.onnx", "--quantize", "int8", *options, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "quantize int8 (onnxruntime quantize_dynamic): 2 DynamicQuantizeLSTM" in proc.stdout
    assert "verify: OK" in proc.stdout and "benchmark: " in proc.stdout.splitlines()[-2]
    proc = run(source, "--check", "--verify", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "hazards" in proc.stdout and "verify: OK" in proc.stdout
    proc = run(source, "--in-place", "--verify", "--target", "onnxruntime", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    x, h0, c0 = torch.randn(3, 4, 8), torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    with torch.no_grad():
        expected = [t.numpy() for t in module(x, h0, c0)]
    feeds = {"x": x.numpy(), "h0": h0.numpy(), "c0": c0.numpy()}
    for path in (source, out / "int8.onnx"):
        actual = runtime.run(str(path), feeds)
        assert runtime.max_abs_diff(expected, actual) < (1e-5 if path == source else 0.05)

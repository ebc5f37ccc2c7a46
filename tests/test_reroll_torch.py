"""reroll on real ``torch.onnx.export(dynamo=True)`` exports of ``nn.RNN``, against PyTorch."""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from tests.support import op_counts, running_nodes

torch = pytest.importorskip("torch", reason="torch==2.13.0 is a test dependency")

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _cost_model_ignored(monkeypatch):
    """These tests prove the rewrite's structure at any size: the measured cost table's
    decisions are tested in tests/test_reroll_costs.py. Every rewrite here runs with a
    context that ignores the cost model (the one rules read when none is attached)."""
    monkeypatch.setattr(costs, "of", lambda model: costs.Context(ignore=True))


def _export(module, args: tuple, dynamic_shapes) -> onnx.ModelProto:
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=dynamic_shapes)
    return program.model_proto


class _WithState(torch.nn.Module):
    def __init__(self, rnn) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x, h0):
        return self.rnn(x, h0)


def _check(
    hidden: int,
    layers: int,
    bidirectional: bool,
    batch_first: bool,
    bias: bool,
    relu: bool,
    with_h0: bool,
    seq: int,
    dynamic_batch: bool,
) -> None:
    torch.manual_seed(0)
    rnn = torch.nn.RNN(
        3,
        hidden,
        layers,
        nonlinearity="relu" if relu else "tanh",
        bias=bias,
        batch_first=batch_first,
        bidirectional=bidirectional,
    ).eval()
    d = 2 if bidirectional else 1

    def x_of(batch: int):
        return torch.randn(batch, seq, 3) if batch_first else torch.randn(seq, batch, 3)

    batch_dim = {0 if batch_first else 1: torch.export.Dim("batch", min=2)}
    if with_h0:
        module = _WithState(rnn).eval()
        args = (x_of(2), torch.randn(layers * d, 2, hidden))
        dynamic = (batch_dim, {1: batch_dim[next(iter(batch_dim))]}) if dynamic_batch else None
    else:
        module, args = rnn, (x_of(2),)
        dynamic = (batch_dim,) if dynamic_batch else None
    model = _export(module, args, dynamic)
    fast = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
    onnx.checker.check_model(fast, full_check=True)
    counts = op_counts(fast)
    # a bidirectional layer is one node, but at seq 1 torch builds y from the final states
    # (Concat(Y_h_f, Y_h_r, axis=2)), a form the bidirectional family does not merge
    assert counts["RNN"] == (layers * d if seq == 1 else layers), counts
    assert counts["Tanh"] == counts["Relu"] == counts["MatMul"] == 0
    names = [i.name for i in model.graph.input]
    for batch in (2, 1, 5) if dynamic_batch else (2,):
        feeds_t = (x_of(batch), torch.randn(layers * d, batch, hidden))[: len(names)]
        with torch.no_grad():
            expected = module(*feeds_t)
        expected = [expected[0].numpy(), expected[1].numpy()]
        feeds = {n: t.numpy() for n, t in zip(names, feeds_t, strict=True)}
        for optimize in (True, False):
            actual = runtime.run(fast, feeds, optimize=optimize)
            assert runtime.max_abs_diff(expected, actual) <= 1e-5
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(fast, feeds)) <= 1e-5


@pytest.mark.parametrize(
    ("layers", "bidirectional", "batch_first", "bias", "relu", "with_h0", "dynamic_batch"),
    [
        (1, False, False, True, False, False, True),
        (2, True, True, False, True, True, True),
        (2, False, False, True, False, False, False),  # static batch: folded first step
        (1, True, False, True, True, True, False),
    ],
)
def test_exported_rnn_is_rerolled_and_matches_pytorch(
    layers, bidirectional, batch_first, bias, relu, with_h0, dynamic_batch
) -> None:
    _check(5, layers, bidirectional, batch_first, bias, relu, with_h0, 4, dynamic_batch)


@settings(max_examples=6, deadline=None)
@given(
    hidden=st.integers(1, 6),
    layers=st.integers(1, 3),
    bidirectional=st.booleans(),
    batch_first=st.booleans(),
    bias=st.booleans(),
    relu=st.booleans(),
    with_h0=st.booleans(),
    seq=st.integers(1, 5),
    dynamic_batch=st.booleans(),
)
def test_property_random_rnn_configurations_match_pytorch(
    hidden, layers, bidirectional, batch_first, bias, relu, with_h0, seq, dynamic_batch
) -> None:
    _check(hidden, layers, bidirectional, batch_first, bias, relu, with_h0, seq, dynamic_batch)


def test_weights_are_pytorchs() -> None:
    torch.manual_seed(1)
    rnn = torch.nn.RNN(3, 4).eval()
    fast = rnn_rewrite_rules.rewrite(
        _export(rnn, (torch.randn(2, 2, 3),), None), target="onnxruntime"
    )
    (node,) = [n for n in running_nodes(fast) if n.op_type == "RNN"]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in fast.graph.initializer}
    np.testing.assert_array_equal(inits[node.input[1]][0], rnn.weight_ih_l0.detach().numpy())
    np.testing.assert_array_equal(inits[node.input[2]][0], rnn.weight_hh_l0.detach().numpy())
    bias = np.concatenate([rnn.bias_ih_l0.detach().numpy(), rnn.bias_hh_l0.detach().numpy()])
    np.testing.assert_array_equal(inits[node.input[3]][0], bias)


class _CellLoop(torch.nn.Module):
    """A decoder-style Python loop over an LSTMCell / GRUCell, zero states built in forward."""

    def __init__(self, kind: str, inputs: int, hidden: int, reverse: bool, bias: bool) -> None:
        super().__init__()
        cls = torch.nn.LSTMCell if kind == "LSTM" else torch.nn.GRUCell
        self.cell = cls(inputs, hidden, bias=bias)
        self.kind, self.hidden, self.reverse = kind, hidden, reverse

    def forward(self, x):
        h = torch.zeros(x.shape[1], self.hidden)
        c = torch.zeros(x.shape[1], self.hidden)
        outputs = {}
        steps = range(x.shape[0] - 1, -1, -1) if self.reverse else range(x.shape[0])
        for t in steps:
            if self.kind == "LSTM":
                h, c = self.cell(x[t], (h, c))
            else:
                h = self.cell(x[t], h)
            outputs[t] = h
        return torch.stack([outputs[t] for t in range(x.shape[0])]), h


def _export_cell(module, x, dynamo: bool, dynamic_batch: bool) -> onnx.ModelProto:
    if dynamo:
        dynamic = ({1: torch.export.Dim("batch", min=2)},) if dynamic_batch else None
        return _export(module, (x,), dynamic)
    buffer = io.BytesIO()
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (x,),
            buffer,
            dynamo=False,
            input_names=["x"],
            dynamic_axes={"x": {1: "batch"}} if dynamic_batch else None,
        )
    return onnx.load_from_string(buffer.getvalue())


def _check_cell(kind, hidden, seq, reverse, bias, dynamo, dynamic_batch) -> None:
    torch.manual_seed(0)
    module = _CellLoop(kind, 3, hidden, reverse, bias).eval()
    model = _export_cell(module, torch.randn(seq, 2, 3), dynamo, dynamic_batch)
    fast = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(fast, full_check=True)
    counts = op_counts(fast)
    assert counts[kind] == 1, counts
    assert counts["Sigmoid"] == counts["Gemm"] == counts["Split"] == 0
    for batch in (2, 1, 4) if dynamic_batch else (2,):
        x = torch.randn(seq, batch, 3)
        with torch.no_grad():
            expected = [t.numpy() for t in module(x)]
        feeds = {model.graph.input[0].name: x.numpy()}
        for optimize in (True, False):
            actual = runtime.run(fast, feeds, optimize=optimize)
            assert runtime.max_abs_diff(expected, actual) <= 1e-5


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_exported_cell_loops_are_rerolled_and_match_pytorch(kind: str, dynamo: bool) -> None:
    _check_cell(kind, 4, 3, reverse=not dynamo, bias=True, dynamo=dynamo, dynamic_batch=True)


@settings(max_examples=6, deadline=None)
@given(
    kind=st.sampled_from(["LSTM", "GRU"]),
    hidden=st.integers(1, 6),
    seq=st.integers(2, 5),
    reverse=st.booleans(),
    bias=st.booleans(),
    dynamo=st.booleans(),
    dynamic_batch=st.booleans(),
)
def test_property_random_cell_loops_match_pytorch(
    kind, hidden, seq, reverse, bias, dynamo, dynamic_batch
) -> None:
    _check_cell(kind, hidden, seq, reverse, bias, dynamo, dynamic_batch)


class _BidirectionalCellLoops(torch.nn.Module):
    """A forward and a reversed loop over two cells reading one ``x``: dynamo exports one
    ``x[t]`` Gather per step, read by both loops (TorchScript exports one per loop)."""

    def __init__(self, kind: str, inputs: int, hidden: int) -> None:
        super().__init__()
        cls = torch.nn.LSTMCell if kind == "LSTM" else torch.nn.GRUCell
        self.forward_cell, self.backward_cell = cls(inputs, hidden), cls(inputs, hidden)
        self.kind, self.hidden = kind, hidden

    def _run(self, cell, x, steps):
        h = c = torch.zeros(x.shape[1], self.hidden)
        outputs = {}
        for t in steps:
            if self.kind == "LSTM":
                h, c = cell(x[t], (h, c))
            else:
                h = cell(x[t], h)
            outputs[t] = h
        return torch.stack([outputs[t] for t in range(x.shape[0])])

    def forward(self, x):
        seq = x.shape[0]
        ahead = self._run(self.forward_cell, x, range(seq))
        back = self._run(self.backward_cell, x, range(seq - 1, -1, -1))
        return torch.cat([ahead, back], -1)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_two_cell_loops_sharing_their_step_reads_become_one_bidirectional_node(
    kind: str, dynamo: bool
) -> None:
    torch.manual_seed(0)
    module = _BidirectionalCellLoops(kind, 3, 4).eval()
    model = _export_cell(module, torch.randn(5, 2, 3), dynamo, dynamic_batch=True)
    gathers = op_counts(model)["Gather"]
    assert gathers == 5 if dynamo else gathers >= 10  # dynamo: one read per step, shared
    fast = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(fast, full_check=True)
    counts = op_counts(fast)
    assert counts[kind] == 1 and counts["Gather"] == 0, counts
    (node,) = [n for n in running_nodes(fast) if n.op_type == kind]
    assert {a.name: a.s for a in node.attribute}["direction"] == b"bidirectional"
    for batch in (2, 1, 4):
        x = torch.randn(5, batch, 3)
        with torch.no_grad():
            expected = [module(x).numpy()]
        feeds = {model.graph.input[0].name: x.numpy()}
        assert runtime.max_abs_diff(expected, runtime.run(model, feeds)) <= 1e-5
        assert runtime.max_abs_diff(expected, runtime.run(fast, feeds)) <= 1e-5


class _EncoderDecoder(torch.nn.Module):
    """An ``nn.LSTM`` encoder whose final state seeds a decoder loop over an ``LSTMCell``
    or ``GRUCell`` reading another input ``y``: the states' batch is ``x``'s, not ``y``'s."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.encoder = torch.nn.LSTM(3, 4)
        cls = torch.nn.LSTMCell if kind == "LSTM" else torch.nn.GRUCell
        self.decoder, self.kind = cls(5, 4), kind

    def forward(self, x, y):
        _, (h, c) = self.encoder(x)
        h, c = h[0], c[0]
        outputs = []
        for t in range(y.shape[0]):
            if self.kind == "LSTM":
                h, c = self.decoder(y[t], (h, c))
            else:
                h = self.decoder(y[t], h)
            outputs.append(h)
        return torch.stack(outputs)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_a_decoder_loop_seeded_by_an_encoder_becomes_one_node(kind: str, dynamo: bool) -> None:
    torch.manual_seed(0)
    module = _EncoderDecoder(kind).eval()
    args = (torch.randn(6, 2, 3), torch.randn(4, 2, 5))
    if dynamo:
        batch = torch.export.Dim("batch")
        model = _export(module, args, {"x": {1: batch}, "y": {1: batch}})
    else:
        buffer = io.BytesIO()
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                args,
                buffer,
                dynamo=False,
                input_names=["x", "y"],
                dynamic_axes={"x": {1: "batch"}, "y": {1: "batch"}},
            )
        model = onnx.load_from_string(buffer.getvalue())
    fast = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(fast, full_check=True)
    counts = op_counts(fast)
    assert counts[kind] == (1 if kind == "GRU" else 2) and counts["Split"] == 0, counts
    assert counts["LSTM"] >= 1  # the encoder
    for batch in (2, 1, 3):
        x, y = torch.randn(6, batch, 3), torch.randn(4, batch, 5)
        with torch.no_grad():
            expected = [module(x, y).numpy()]
        feeds = {"x": x.numpy(), "y": y.numpy()}
        assert runtime.max_abs_diff(expected, runtime.run(fast, feeds)) <= 1e-5


class _BatchFirstCellLoop(torch.nn.Module):
    """A loop over ``x[:, t]`` of a batch-first ``x``, stacked with ``torch.stack(hs, 1)``."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        cls = torch.nn.LSTMCell if kind == "LSTM" else torch.nn.GRUCell
        self.cell, self.kind = cls(3, 4), kind

    def forward(self, x):
        h = c = torch.zeros(x.shape[0], 4)
        outputs = []
        for t in range(x.shape[1]):
            if self.kind == "LSTM":
                h, c = self.cell(x[:, t], (h, c))
            else:
                h = self.cell(x[:, t], h)
            outputs.append(h)
        return torch.stack(outputs, 1), h


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_a_batch_first_cell_loop_becomes_one_node(kind: str, dynamo: bool) -> None:
    torch.manual_seed(0)
    module = _BatchFirstCellLoop(kind).eval()
    x = torch.randn(2, 5, 3)
    if dynamo:
        model = _export(module, (x,), ({0: torch.export.Dim("batch", min=2)},))
    else:
        buffer = io.BytesIO()
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module, (x,), buffer, dynamo=False, input_names=["x"],
                dynamic_axes={"x": {0: "batch"}},
            )  # fmt: skip
        model = onnx.load_from_string(buffer.getvalue())
    fast = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(fast, full_check=True)
    counts = op_counts(fast)
    assert counts[kind] == 1 and counts["Split"] == counts["Gather"] == 0, counts
    for batch in (2, 1, 4):
        x = torch.randn(batch, 5, 3)
        with torch.no_grad():
            expected = [t.numpy() for t in module(x)]
        feeds = {model.graph.input[0].name: x.numpy()}
        assert runtime.max_abs_diff(expected, runtime.run(fast, feeds)) <= 1e-5

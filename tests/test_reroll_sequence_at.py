"""reroll on torch 2.13 dynamo's ``nn.RNN`` exports that read each step through
``SequenceAt(SplitToSequence(P, axis=0, keepdims=0), t)`` (the committed files under
tests/data/exporters/torch_dynamo/rnn_*.onnx), and the near misses of that read."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules.rules import reroll
from tests.exporter_files import DATA

FILES = {
    "rnn_relu": 1,
    "rnn_tanh": 1,
    "rnn_relu_2layer": 2,
    "rnn_relu_bidirectional_batch_first": 2,
    "rnn_tanh_bidirectional_batch_first": 2,
}
#: the export's sequence length: dynamo froze it (``frozen`` in the manifest)
TRACED = 5


def _load(name: str) -> onnx.ModelProto:
    return onnx.load(DATA / "torch_dynamo" / f"{name}.onnx")


def _ops(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in model.graph.node)


def _rewrite_ignoring_costs(model: onnx.ModelProto, monkeypatch) -> onnx.ModelProto:
    """The structure at any size: the cost table's decision is tested separately below."""
    monkeypatch.setattr(costs, "of", lambda model: costs.Context(ignore=True))
    return rnn_rewrite_rules.rewrite(model, target="onnxruntime")


def _x(name: str, batch: int, seq: int, seed: int) -> np.ndarray:
    shape = (batch, seq, 6) if "batch_first" in name else (seq, batch, 6)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", sorted(FILES))
def test_sequence_at_chains_become_rnn_nodes_with_equal_outputs(name: str, monkeypatch) -> None:
    """One RNN per layer and direction, no step read left; equal outputs at batches 0..7
    and at a longer sequence, where the original (frozen by the exporter) reads only the
    first ``TRACED`` steps and the rewrite must too."""
    original = _load(name)
    rewritten = _rewrite_ignoring_costs(original, monkeypatch)
    onnx.checker.check_model(rewritten, full_check=True)
    ops = _ops(rewritten)
    assert ops["RNN"] == FILES[name]
    assert ops["SequenceAt"] == ops["SplitToSequence"] == 0
    assert len(rewritten.graph.node) < len(original.graph.node)
    before, after = runtime.session(original), runtime.session(rewritten)
    for seed, (batch, seq) in enumerate([(2, 5), (0, 5), (1, 5), (7, 5), (3, TRACED + 2)]):
        feeds = {"x": _x(name, batch, seq, seed)}
        expected, actual = before.run(None, feeds), after.run(None, feeds)
        for e, a in zip(expected, actual, strict=True):
            assert e.shape == a.shape
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


def test_the_rewrite_keeps_the_traced_length(monkeypatch) -> None:
    """The re-rolled RNN reads ``X[:5]``: at seq 7 it returns 5 steps, as the original does
    (the axis stays frozen; equal outputs wherever the original runs)."""
    rewritten = _rewrite_ignoring_costs(_load("rnn_tanh"), monkeypatch)
    y, _ = runtime.session(rewritten).run(None, {"x": _x("rnn_tanh", 2, 9, 0)})
    assert y.shape == (TRACED, 2, 8)


@pytest.mark.parametrize("name", ["rnn_relu", "rnn_relu_2layer"])
def test_portable_keeps_the_chain_with_the_reason(name: str) -> None:
    """``portable`` never emits RNN (rten has none): the chain is now found and the
    report says why it stays, instead of 'no recurrence'."""
    declined = costs.Context()
    rnn_rewrite_rules.rewrite(_load(name), target="portable", context=declined)
    assert declined.declined
    assert all("rten has no RNN op" in d.reason for d in declined.declined)


def _last_relu(model: onnx.ModelProto) -> ir.Node:
    graph = ir.serde.deserialize_model(model).graph
    return [n for n in graph if n.op_type == "Relu"][-1]


def _mutated(edit) -> onnx.ModelProto:
    model = _load("rnn_relu")
    edit(model.graph)
    return model


def _set_attr(graph: onnx.GraphProto, op_type: str, name: str, value: int) -> None:
    node = next(n for n in graph.node if n.op_type == op_type)
    for attr in node.attribute:
        if attr.name == name:
            attr.i = value


def _last_position(graph: onnx.GraphProto, value: int) -> None:
    """The last SequenceAt reads a new constant position ``value``."""
    node = [n for n in graph.node if n.op_type == "SequenceAt"][-1]
    graph.initializer.append(onnx.numpy_helper.from_array(np.array(value, np.int64), "pos"))
    node.input[1] = "pos"


def _with_split(graph: onnx.GraphProto) -> None:
    node = next(n for n in graph.node if n.op_type == "SplitToSequence")
    graph.initializer.append(onnx.numpy_helper.from_array(np.array(1, np.int64), "one_split"))
    node.input.append("one_split")


_SEQUENCE_AT = (
    "the step input is a SequenceAt that does not read one row P[t] "
    "(SplitToSequence(P, axis=0, keepdims=0) without split, at a constant t >= 0)"
)
NEAR_MISSES = {
    # keepdims=1 keeps each row [1, batch, H]: the Add broadcasts to another shape
    "keepdims": (lambda g: _set_attr(g, "SplitToSequence", "keepdims", 1), _SEQUENCE_AT),
    # axis 1 cuts the batch, not the sequence
    "axis": (lambda g: _set_attr(g, "SplitToSequence", "axis", 1), _SEQUENCE_AT),
    # a negative position counts from the end: it depends on the run-time length
    "negative": (lambda g: _last_position(g, -1), _SEQUENCE_AT),
    # an explicit split keeps the axis whatever keepdims says
    "split": (_with_split, _SEQUENCE_AT),
    # the last step reads row 3 again: the chain does not read 0..T-1
    "order": (lambda g: _last_position(g, 3), "step 4 reads index 3 of the sequence, not 4"),
}


@pytest.mark.parametrize("mutation", sorted(NEAR_MISSES))
def test_near_misses_of_the_sequence_read_are_refused(mutation: str) -> None:
    edit, reason = NEAR_MISSES[mutation]
    model = _mutated(edit)
    assert reroll.plan_chain(_last_relu(model)) == reason
    rewritten = rnn_rewrite_rules.rewrite(model, ["reroll"], target="onnxruntime")
    assert _ops(rewritten)["RNN"] == 0

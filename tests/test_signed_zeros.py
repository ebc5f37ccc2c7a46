"""Two constants are the same only when their bits are (``_ir.same_bits``).

``+0.0`` and ``-0.0`` compare equal, yet ``Div(1, +0.0)`` is ``+inf`` and ``Div(1, -0.0)``
``-inf``: computations on them are not one value. Each merge that rests on "the same value"
(``MergeGuards``' conditions, the halves of a hand-built bidirectional pair) is checked
on such a twin, in ONNX Runtime before and after.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules._ir import same_bits
from rnn_rewrite_rules.rules import bidirectional, loop_scan
from rnn_rewrite_rules.rules._graph import same_attribute
from rnn_rewrite_rules.testing import thirdparty as tp
from tests.reasons import refusal_reasons
from tests.support import op_counts

TARGET = "onnxruntime"


def test_same_bits_tells_signed_zeros_and_nan_payloads_apart() -> None:
    assert same_bits(np.float32(0.0), np.float32(0.0))
    assert not same_bits(np.float32(0.0), np.float32(-0.0))
    nan = np.array(np.nan, np.float32)
    assert same_bits(nan, nan.copy())
    other = np.array(0x7FC00001, np.uint32).view(np.float32)
    assert not same_bits(nan, other)  # another NaN payload
    assert not same_bits(np.zeros(2, np.float32), np.zeros(2, np.float64))
    assert not same_bits(np.zeros(2, np.float32), np.zeros((1, 2), np.float32))
    assert same_bits(np.array(["a"], object), np.array(["a"], object))


def _attr_node(**attrs) -> ir.Node:
    return ir.node("LeakyRelu", [], attributes=attrs)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"alpha": 0.0}, {"alpha": -0.0}),
        ({"alpha": [0.0, 1.0]}, {"alpha": [-0.0, 1.0]}),
        (
            {"value": ir.tensor(np.array([0.0], np.float32))},
            {"value": ir.tensor(np.array([-0.0], np.float32))},
        ),
    ],
    ids=["float", "floats", "tensor"],
)
def test_attributes_with_signed_zeros_differ(a, b) -> None:
    (name,) = a
    x, y = _attr_node(**a), _attr_node(**b)
    assert not same_attribute(x.attributes[name], y.attributes[name])
    assert same_attribute(x.attributes[name], _attr_node(**a).attributes[name])


def _const(name: str, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def _condition(tag: str, zero: float) -> list[onnx.NodeProto]:
    """``Less(Div(1, zero), 0)``: true for ``-0.0``, false for ``+0.0``."""
    return [
        _const(f"one_{tag}", np.array(1.0, np.float32)),
        _const(f"zero_{tag}", np.array(zero, np.float32)),
        helper.make_node("Div", [f"one_{tag}", f"zero_{tag}"], [f"inv_{tag}"]),
        helper.make_node("Less", [f"inv_{tag}", f"zero_{tag}"], [f"cond_{tag}"]),
    ]


def _guard(tag: str) -> onnx.NodeProto:
    def branch(kind: str, value: float) -> onnx.GraphProto:
        out = f"{kind}_{tag}"
        node = helper.make_node("Mul", ["x", f"s_{kind}_{tag}"], [out])
        scale = _const(f"s_{kind}_{tag}", np.array(value, np.float32))
        return helper.make_graph(
            [scale, node], out, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [3])]
        )

    return helper.make_node(
        "If",
        [f"cond_{tag}"],
        [f"g_{tag}"],
        then_branch=branch("then", 1.0),
        else_branch=branch("else", -2.6),
    )


def _two_guards(first: float, second: float) -> onnx.ModelProto:
    nodes = [*_condition("a", first), *_condition("b", second), _guard("a"), _guard("b")]
    nodes.append(helper.make_node("Concat", ["g_a", "g_b"], ["y"], axis=0))
    graph = helper.make_graph(
        nodes,
        "guards",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto) -> np.ndarray:
    return runtime.run(model, {"x": np.array([1.0, -2.0, 0.5], np.float32)})[0]


def test_guards_on_plus_and_minus_zero_are_not_merged() -> None:
    """``If(Less(Div(1, +0.0), 0))`` and ``If(Less(Div(1, -0.0), 0))``: one takes its
    then branch, the other its else branch."""
    model = _two_guards(0.0, -0.0)
    onnx.checker.check_model(model, full_check=True)
    rule = [loop_scan.MergeGuards.rule()]
    assert "the two Ifs have different conditions" in refusal_reasons(rule, model)
    after = rnn_rewrite_rules.rewrite(model, target=TARGET)
    assert op_counts(after)["If"] == 2
    expected = _run(model)
    assert not np.array_equal(expected[:3], expected[3:])  # the branches differ
    np.testing.assert_array_equal(_run(after), expected)


def test_guards_on_one_zero_written_twice_are_merged() -> None:
    """The near miss that must fire: ``-0.0`` written twice is one condition."""
    model = _two_guards(-0.0, -0.0)
    after = rnn_rewrite_rules.rewrite(model, target=TARGET)
    assert op_counts(after)["If"] == 1
    np.testing.assert_array_equal(_run(after), _run(model))


def _signed_source(model: onnx.ModelProto, reader: onnx.NodeProto, zero: float, tag: str) -> None:
    """``reader`` reads ``Where(Less(Div(1, zero), 0), x, Neg(x))`` instead of ``x``."""
    nodes = [
        *_condition(tag, zero),
        helper.make_node("Neg", ["x"], [f"neg_{tag}"]),
        helper.make_node("Where", [f"cond_{tag}", "x", f"neg_{tag}"], [f"src_{tag}"]),
    ]
    index = list(model.graph.node).index(reader)
    for offset, node in enumerate(nodes):
        model.graph.node.insert(index + offset, node)
    reader.input[list(reader.input).index("x")] = f"src_{tag}"


def _x_readers(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if "x" in n.input]


def _halves(batch_free: bool, forward_zero: float, backward_zero: float) -> onnx.ModelProto:
    if batch_free:
        model = tp.batch_free_bidirectional("LSTM")
    else:
        model = tp.hand_built_bidirectional("LSTM")
    readers = _x_readers(model)  # the forward half (or its Unsqueeze) and the reversal
    (backward,) = [n for n in readers if n.op_type == "Slice"]
    (forward,) = [n for n in readers if n is not backward]
    _signed_source(model, forward, forward_zero, "f")
    _signed_source(model, backward, backward_zero, "b")
    onnx.checker.check_model(model, full_check=True)
    return model


def _directions(model: onnx.ModelProto) -> list[bytes]:
    return [
        next((a.s for a in n.attribute if a.name == "direction"), b"forward")
        for n in model.graph.node
        if n.op_type == "LSTM"
    ]


def _assert_equal_runs(before: onnx.ModelProto, after: onnx.ModelProto, batch_free: bool):
    for seq, batch in ((3, 2), (1, 1), (5, 3)):
        feeds = tp.thirdparty_inputs(before, 1 if batch_free else batch, seq, rng=seq)
        expected, actual = runtime.run(before, feeds), runtime.run(after, feeds)
        assert [a.shape for a in expected] == [a.shape for a in actual]
        assert runtime.max_abs_diff(expected, actual) <= 1e-5


@pytest.mark.parametrize("batch_free", [False, True], ids=["batched", "batch_free"])
def test_halves_reading_plus_and_minus_zero_are_not_merged(batch_free) -> None:
    """``Where(Div(1, +0.0) < 0, x, -x)`` and the same on ``-0.0``: ``-x`` and ``x``, two
    inputs, not one layer."""
    model = _halves(batch_free, 0.0, -0.0)
    found = refusal_reasons(bidirectional.make_rules(), model)
    assert any("does not read the reversed input of the first" in r for r in found), found
    after = rnn_rewrite_rules.rewrite(model, target=TARGET)
    assert b"bidirectional" not in _directions(after)
    _assert_equal_runs(model, after, batch_free)


@pytest.mark.parametrize("batch_free", [False, True], ids=["batched", "batch_free"])
def test_halves_reading_one_computation_written_twice_are_merged(batch_free) -> None:
    """The same source written twice (one zero) is one value: the pair is merged, in the
    batch-free form too (its sources were compared by identity)."""
    model = _halves(batch_free, -0.0, -0.0)
    after = rnn_rewrite_rules.rewrite(model, target=TARGET)
    assert _directions(after) == [b"bidirectional"]
    _assert_equal_runs(model, after, batch_free)


def test_batch_free_halves_reading_mul_written_twice_are_merged() -> None:
    """The issue's missed merge: ``Unsqueeze(Mul(x, 2), [1])`` and
    ``Unsqueeze(rev(Mul(x, 2)), [1])`` with ``Mul(x, 2)`` written twice."""
    model = tp.batch_free_bidirectional("GRU")
    for tag, reader in zip("fb", _x_readers(model), strict=True):
        index = list(model.graph.node).index(reader)
        model.graph.node.insert(index, _const(f"two_{tag}", np.array(2.0, np.float32)))
        model.graph.node.insert(index + 1, helper.make_node("Mul", ["x", f"two_{tag}"], [tag]))
        reader.input[0] = tag
    onnx.checker.check_model(model, full_check=True)
    after = rnn_rewrite_rules.rewrite(model, target=TARGET)
    assert [n.op_type for n in after.graph.node].count("GRU") == 1
    for seq in (1, 4):
        feeds = tp.thirdparty_inputs(model, 1, seq, rng=seq)
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(after, feeds)) <= 1e-5

"""``loop_scan.fused_projection``: per-gate Slices of one fused projection (Keras 3's GRU
and SimpleRNN cells as tf2onnx writes them), each read as its own product; the graphs
run in ONNX Runtime before and after at several batches, 0 included."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules.cell import Constants
from rnn_rewrite_rules.rules.loop_scan.fused_projection import split_projections

H, GATES = 4, 3
INT32_MAX = 2**31 - 1
RNG = np.random.default_rng(0)
R = RNG.standard_normal((H, GATES * H)).astype(np.float32)


def _model(
    *,
    bias: np.ndarray | None = None,
    rows_end: int = INT32_MAX,
    step: int | None = None,
    h_dims: list | None = None,
    weight_input: bool = False,
) -> onnx.ModelProto:
    """``h [batch, H]`` -> ``MatMul(h, R) (+ b)`` sliced per gate over ``[rows, columns]``,
    as tf2onnx's ``strided_slice`` does (``axes [0, 1]``)."""
    h_dims = ["batch", H] if h_dims is None else h_dims
    inits = [] if weight_input else [numpy_helper.from_array(R, "R")]
    inputs = [helper.make_tensor_value_info("h", TensorProto.FLOAT, h_dims)]
    if weight_input:
        inputs.append(helper.make_tensor_value_info("R", TensorProto.FLOAT, list(R.shape)))
    nodes = [helper.make_node("MatMul", ["h", "R"], ["p"])]
    fused = "p"
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "b"))
        nodes.append(helper.make_node("Add", ["p", "b"], ["pb"]))
        fused = "pb"
    outputs = []
    for gate in range(GATES):
        starts, ends = [0, gate * H], [rows_end, (gate + 1) * H]
        names = [f"s{gate}", f"e{gate}", f"a{gate}"]
        inits += [
            numpy_helper.from_array(np.array(v, np.int64), n)
            for v, n in zip((starts, ends, [0, 1]), names, strict=True)
        ]
        if step is not None:
            inits.append(numpy_helper.from_array(np.array([1, step], np.int64), f"st{gate}"))
            names.append(f"st{gate}")
        nodes.append(helper.make_node("Slice", [fused, *names], [f"g{gate}"]))
        outputs.append(helper.make_tensor_value_info(f"g{gate}", TensorProto.FLOAT, ["b", H]))
    graph = helper.make_graph(nodes, "fused", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _split(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    ir_model = ir.serde.deserialize_model(model)
    count = split_projections(ir_model.graph, Constants(17))
    result = ir.serde.serialize_model(ir_model)
    del result.graph.value_info[:]  # the split's values are declared nothing (a copy's)
    return result, count


def _assert_same(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    for batch in (1, 3, 0):
        feeds = {"h": RNG.standard_normal((batch, H)).astype(np.float32)}
        if any(i.name == "R" for i in before.graph.input):
            feeds["R"] = R
        expected = runtime.run(before, feeds)
        actual = runtime.run(after, feeds)
        for want, got in zip(expected, actual, strict=True):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "bias",
    [None, RNG.standard_normal(GATES * H), RNG.standard_normal((1, GATES * H)), np.ones(1)],
    ids=["none", "vector", "row", "broadcast"],
)
def test_each_gate_reads_its_own_product(bias) -> None:
    model = _model(bias=None if bias is None else bias.astype(np.float32))
    after, count = _split(model)
    onnx.checker.check_model(after)
    assert count == GATES
    ops = [n.op_type for n in after.graph.node if n.op_type != "Constant"]
    assert "Slice" not in ops
    assert ops.count("MatMul") == GATES + 1  # the fused product is left dead
    _assert_same(model, after)


@pytest.mark.parametrize(
    "change",
    [
        {"rows_end": 5},
        {"step": 2},
        {"h_dims": ["a", "batch", H]},
        {"weight_input": True},
        {"bias": np.ones(3, np.float32)},
    ],
    ids=["rows_cut", "strided", "rank_3_state", "weights_fed", "bias_other_width"],
)
def test_near_misses_are_left(change) -> None:
    """A slice that drops rows, a stride, a state not declared of rank 2, weights a caller
    feeds, a bias whose last axis is neither ``N`` nor 1: each slice stays."""
    model = _model(**change)
    after, count = _split(model)
    assert count == 0
    assert [n.op_type for n in after.graph.node].count("Slice") == GATES


def _chunked_model(*, index: int = 1, trans_b: int = 1) -> onnx.ModelProto:
    """``Gemm(h, W, b)`` chunked in 3 per gate as TorchScript writes ``torch.chunk``: the
    bounds computed from ``Gather(Shape(P), index)`` (``(N + 2) / 3 * k``)."""
    weight = R.T if trans_b else R  # [N, K] with transB
    bias = RNG.standard_normal(GATES * H).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.ascontiguousarray(weight), "W"),
        numpy_helper.from_array(bias, "b"),
        *(
            numpy_helper.from_array(np.array([v], np.int64), n)
            for n, v in (("i", index), ("two", 2), ("three", 3), ("zero", 0), ("one", 1))
        ),
        *(numpy_helper.from_array(np.array([k], np.int64), f"k{k}") for k in (1, 2, 3)),
    ]
    nodes = [
        helper.make_node("Gemm", ["h", "W", "b"], ["p"], transB=trans_b),
        helper.make_node("Shape", ["p"], ["shape"]),
        helper.make_node("Gather", ["shape", "i"], ["n"], axis=0),
        helper.make_node("Add", ["n", "two"], ["n2"]),
        helper.make_node("Div", ["n2", "three"], ["chunk"]),
        *(helper.make_node("Mul", ["chunk", f"k{k}"], [f"end{k}"]) for k in (1, 2, 3)),
    ]
    starts = ["zero", "end1", "end2"]
    outputs = []
    for gate in range(GATES):
        nodes.append(
            helper.make_node("Slice", ["p", starts[gate], f"end{gate + 1}", "one"], [f"g{gate}"])
        )
        outputs.append(helper.make_tensor_value_info(f"g{gate}", TensorProto.FLOAT, ["b", H]))
    inputs = [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", H])]
    graph = helper.make_graph(nodes, "chunked", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("trans_b", [1, 0])
def test_a_chunked_gemm_reads_each_gate_from_its_columns(trans_b: int) -> None:
    """Bounds computed from the product's width alone are read as constants; each gate
    is the Gemm of its own columns."""
    model = _chunked_model(trans_b=trans_b)
    after, count = _split(model)
    onnx.checker.check_model(after)
    assert count == GATES
    ops = [n.op_type for n in after.graph.node]
    assert "Slice" not in ops and ops.count("Gemm") == GATES + 1  # the fused one left dead
    _assert_same(model, after)


def test_chunk_bounds_read_from_the_rows_are_left() -> None:
    """``Gather(Shape(P), 0)`` is the batch, not a constant: the slices stay."""
    model = _chunked_model(index=0)
    after, count = _split(model)
    assert count == 0
    assert [n.op_type for n in after.graph.node].count("Slice") == GATES

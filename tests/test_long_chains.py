"""Long recurrences: a cell loop unrolled over hundreds of steps, and constant chains
thousands of nodes deep, are rewritten without recursion (a ``RecursionError`` once came
out of ``rewrite`` at 128 GRU steps) and with outputs equal to the original's."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.shape.constant import Constants
from rnn_rewrite_rules.testing.unrolled import UnrolledCellConfig, build_unrolled_cell, cell_inputs
from tests.support import running_nodes


@pytest.mark.parametrize(
    ("op_type", "seq"), [("GRU", 128), ("LSTM", 128), ("GRU", 1000)], ids=lambda v: str(v)
)
def test_a_long_unrolled_cell_loop_is_one_node_with_the_same_outputs(op_type, seq) -> None:
    cfg = UnrolledCellConfig(op_type=op_type, seq=seq)
    model = build_unrolled_cell(cfg)
    after = rnn_rewrite_rules.rewrite(model)
    assert [n.op_type for n in running_nodes(after)].count(op_type) == 1
    assert len(after.graph.node) < 10
    for batch in (1, 3):
        feeds = cell_inputs(cfg, batch, rng=batch)
        expected, actual = runtime.run(model, feeds), runtime.run(after, feeds)
        assert runtime.max_abs_diff(expected, actual) < 1e-4


def _add_chain(depth: int, first: str, initializers: dict[str, int]) -> ir.Graph:
    """``first + 1 + 1 + ...`` (``depth`` Adds of one initializer ``1``), output ``end``;
    ``initializers`` are int64 ``[1]`` initializers (``first`` among them or an input)."""
    nodes = [
        helper.make_node("Add", [first if i == 0 else f"v{i}", "one"], [f"v{i + 1}"])
        for i in range(depth)
    ]
    nodes.append(helper.make_node("Identity", [f"v{depth}"], ["end"]))
    inputs = [] if first in initializers else [_tensor_info(first)]
    tensors = [numpy_helper.from_array(np.array([v], np.int64), k) for k, v in initializers.items()]
    graph = helper.make_graph(nodes, "chain", inputs, [_tensor_info("end")], tensors)
    return ir.serde.deserialize_graph(graph)


def _tensor_info(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.INT64, [1])


def _end(graph: ir.Graph) -> ir.Value:
    return graph.outputs[0]


def test_a_constant_chain_deeper_than_the_recursion_limit_is_evaluated() -> None:
    graph = _add_chain(5000, "start", {"start": 2, "one": 1})
    np.testing.assert_array_equal(Constants(18)(_end(graph)), [5002])


def test_a_deep_chain_from_a_graph_input_is_not_a_constant() -> None:
    graph = _add_chain(5000, "x", {"one": 1})
    assert Constants(18)(_end(graph)) is None


def test_a_chain_bound_to_a_constant_is_evaluated_through_the_binding() -> None:
    """An input bound to an array (a Loop body's iteration number) is read as that array."""
    graph = _add_chain(3000, "i", {"one": 1})
    bound = Constants(18, {graph.inputs[0]: np.array([4], np.int64)})
    np.testing.assert_array_equal(bound(_end(graph)), [3004])

"""A second layer's Loop reading the zero-step guard of the first (``loop_scan.guarded_input``).

jax2onnx's stacked scans: the second Loop's ``X`` is the first layer's ``If`` output,
whose rank only the ``else`` branch proves. The second node runs where ``X`` is not
empty, and there that branch ran: both layers become nodes. A guard the rules did not
write (read from a file, or an ``If`` whose ``then`` branch gives a non-empty value) is
not read that way. The outputs are compared at every size, 0 included, by
``test_exporter_files``.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import rnn_rewrite_rules
from rnn_rewrite_rules import RewriteOptions, runtime
from rnn_rewrite_rules.rules.loop_scan.guarded_input import guard_read_by_else, mark_guard
from rnn_rewrite_rules.rules.loop_scan.zero_step import batch_dim
from rnn_rewrite_rules.shape import Dim, ShapeProver
from tests.exporter_files import DATA
from tests.exporter_support import all_op_counts

FOLDER = DATA / "jax2onnx"
STACKED = {"hand_lstm_stacked2.onnx": "LSTM", "nnx_gru_stacked2.onnx": "GRU"}


@pytest.mark.parametrize("name", sorted(STACKED))
def test_both_layers_of_a_stacked_scan_become_nodes(name: str, tmp_path) -> None:
    out = tmp_path / name
    rnn_rewrite_rules.rewrite_file(FOLDER / name, out)
    once = onnx.load(out)
    counts = all_op_counts(once)
    assert counts[STACKED[name]] == 2 and counts["If"] == 2
    again = rnn_rewrite_rules.rewrite(once)  # read back: no guard is marked any more
    assert all_op_counts(again) == counts


def test_a_second_layer_behind_an_if_the_rules_did_not_write_stays_a_loop(tmp_path) -> None:
    """Near miss: the first layer's stack passes an ``If`` on a graph input whose ``then``
    branch gives a rank-2 tensor: nothing proves the second Loop's ``X`` of rank 3."""
    model = onnx.load(FOLDER / "hand_lstm_stacked2.onnx")
    loops = [n for n in model.graph.node if n.op_type == "Loop"]
    first_stack = loops[0].output[-1]
    then = helper.make_graph(
        [helper.make_node("Constant", [], ["flat"], value_floats=[1.0, 2.0])],
        "flat_branch",
        [],
        [helper.make_tensor_value_info("flat", TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", [first_stack], ["kept"])],
        "stack_branch",
        [],
        [helper.make_tensor_value_info("kept", TensorProto.FLOAT, None)],
    )
    chosen = helper.make_node("If", ["flag"], ["chosen"], then_branch=then, else_branch=other)
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name == first_stack and node is not loops[0]:
                node.input[i] = "chosen"
    model.graph.node.insert(list(model.graph.node).index(loops[0]) + 1, chosen)
    model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    onnx.checker.check_model(model)
    path = tmp_path / "if.onnx"
    onnx.save(model, path)
    report = rnn_rewrite_rules.rewrite_file(path, None, RewriteOptions(hazards=True))
    reasons = [r for item in report.unimproved for r in item.reasons]
    assert report.after.op_counts["LSTM"] == 1
    assert any("neither a constant nor X's length" in r for r in reasons), reasons


def _guard(then_loop_trips: int | None, stack_index: int) -> tuple[ir.Value, ir.Graph]:
    """An ``If`` whose ``then`` branch is a pass-through Loop (a constant 0 trips, or a
    trip count read from a graph input) and whose ``else`` branch is a rank-3 input; its
    output ``stack_index`` of the Loop is the ``If``'s output. The main graph is returned."""
    state = ir.Value(name="s", type=ir.TensorType(ir.DataType.FLOAT))
    body_in = [
        ir.Value(name="i", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([])),
        ir.Value(name="c", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([])),
        state,
    ]
    passes = [ir.node("Identity", [v]) for v in (body_in[1], state, state)]
    body = ir.Graph(body_in, [n.outputs[0] for n in passes], nodes=passes, name="body")
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 3, 4]))
    h0 = ir.Value(name="h0", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([3, 4]))
    n = ir.Value(name="n", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    flag = ir.Value(name="flag", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    trips = (
        n
        if then_loop_trips is None
        else ir.Value(name="zero", const_value=ir.tensor(np.array(then_loop_trips, np.int64)))
    )
    constant = (
        [] if then_loop_trips is None else [ir.node("Constant", [], {"value": trips.const_value})]
    )
    trip_value = trips if not constant else constant[0].outputs[0]
    loop = ir.node("Loop", [trip_value, None, h0], {"body": body}, num_outputs=2)
    then = ir.Graph([], [loop.outputs[stack_index]], nodes=[*constant, loop], name="then")
    passed = ir.node("Identity", [x])
    other = ir.Graph([], [passed.outputs[0]], nodes=[passed], name="else")
    guard = ir.node("If", [flag], {"then_branch": then, "else_branch": other}, num_outputs=1)
    main = ir.Graph([x, h0, n, flag], [guard.outputs[0]], nodes=[guard], name="main")
    return guard.outputs[0], main


def test_only_a_marked_guard_with_an_empty_stack_is_read_by_its_else_branch() -> None:
    stack, main = _guard(0, 1)
    assert guard_read_by_else(stack, size_guarded=True) is None  # not marked: from a file
    mark_guard(stack)
    guard = guard_read_by_else(stack, size_guarded=False)
    assert guard is stack.producer()
    assert ShapeProver(main).rank(stack) is None  # the branches disagree
    assert ShapeProver(main, (guard,)).dims(stack) == ShapeProver(main).dims(main.inputs[0])


def test_a_carried_value_or_a_stack_of_steps_is_not_read_by_the_else_branch() -> None:
    """The final state (carried) is not empty where the ``then`` branch runs; a stack
    of a Loop that may run steps is empty only behind a size guard."""
    carried, _ = _guard(0, 0)
    mark_guard(carried)
    assert guard_read_by_else(carried, size_guarded=True) is None
    steps, _ = _guard(None, 1)
    mark_guard(steps)
    assert guard_read_by_else(steps, size_guarded=False) is None
    assert guard_read_by_else(steps, size_guarded=True) is steps.producer()


def _transposed(value: ir.Value, main: ir.Graph, perm: list[int] | None) -> ir.Value:
    """``Transpose(value, perm)`` appended to ``main`` (no ``perm``: reversed axes)."""
    attributes = {} if perm is None else {"perm": perm}
    node = ir.node("Transpose", [value], attributes)
    main.append(node)
    return node.outputs[0]


def test_a_stack_read_through_transposes_is_read_by_the_else_branch_behind_a_size_guard() -> None:
    """tf2onnx's pair of Transposes between Keras layers keeps the number of elements: a
    reader behind a size guard reads the guard through them; a reader behind a length
    test does not (a Transpose moves the length to another axis)."""
    stack, main = _guard(None, 1)
    mark_guard(stack)
    twice = _transposed(_transposed(stack, main, [1, 0, 2]), main, [1, 0, 2])
    assert guard_read_by_else(twice, size_guarded=True) is stack.producer()
    assert guard_read_by_else(twice, size_guarded=False) is None
    assert batch_dim(twice, ShapeProver(main)) == Dim.sym(stack, 1)
    swapped = _transposed(stack, main, [1, 0, 2])
    assert batch_dim(swapped, ShapeProver(main)) == Dim.sym(stack, 0)


def test_the_batch_through_a_transpose_without_perm_or_of_no_if_is_not_read() -> None:
    stack, main = _guard(None, 1)
    assert batch_dim(_transposed(stack, main, None), ShapeProver(main)) is None
    x = main.inputs[0]
    assert batch_dim(_transposed(x, main, [1, 0, 2]), ShapeProver(main)) == ShapeProver(main).dim(
        x, 0
    )


def test_the_stacked_rewrite_runs_at_sizes_other_than_the_exports() -> None:
    """Batch 2 and length 5 (the files are exported at other sizes) in ONNX Runtime."""
    model = onnx.load(FOLDER / "hand_lstm_stacked2.onnx")
    after = rnn_rewrite_rules.rewrite(model)
    x = np.random.default_rng(0).standard_normal((5, 2, 6)).astype(np.float32)
    expected, actual = runtime.run(model, {"x": x}), runtime.run(after, {"x": x})
    assert runtime.max_abs_diff(expected, actual) < 1e-4

"""A Loop over ``len(X)`` at length 0: the guard's zero-step branch gives exactly what the
Loop gives there in ONNX Runtime, where the body's declaration of its scan output fixes it.

ONNX Runtime shapes a stack of no step from the body's scan output as declared and
inferred: ``(0, 0, H)`` for ``[?, H]``, ``(0, 1, H)`` for ``[1, H]`` (measured below on the
original); the branch runs a zero-trip Loop declared as the original, so it gives each of
them. Where the declaration leaves an axis open (no shape, ``[?, ?]``, a batch that X's
static batch or a state input's declaration fills in), the original's inference decides,
and the Loop is kept (``loop_scan.zero_step``).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import rnn_rewrite_rules
from rnn_rewrite_rules import RewriteOptions, runtime
from rnn_rewrite_rules.rules.loop_scan.zero_step import ZERO_STEP_REASON
from rnn_rewrite_rules.testing.loops import LoopSpec, build_loop_model, loop_inputs
from tests.support import op_counts

TARGET = "onnxruntime"
_H = 4
#: The body's scan output as declared: no type info at all, rank 2 of unknown sizes,
#: ``[?, H]`` and ``[1, H]`` (a static batch of 1).
DECLARATIONS = {
    "none": None,
    "unknown_2d": [None, None],
    "batch_h": ["batch", _H],
    "one_h": [1, _H],
}
#: The declarations that fix the stack of no step (the guard fires), and the others.
FIXED = ("batch_h", "one_h")
OPEN = ("none", "unknown_2d")


def _spec(cell: str = "LSTM") -> LoopSpec:
    return LoopSpec(cell=cell, form="torch", trip_count="length", hidden_size=_H, outputs=("y",))


def _declare(model: onnx.ModelProto, dims: list | None) -> None:
    """The Loop body's stacked output declared as ``dims`` (None: nothing at all)."""
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    body = loop.attribute[0].g
    stacked = body.output[-1]
    if dims is None:
        stacked.CopyFrom(helper.make_empty_tensor_value_info(stacked.name))
        for value in body.input[2:]:  # and the states: nothing for inference to start from
            value.CopyFrom(helper.make_empty_tensor_value_info(value.name))
        del body.value_info[:]
    else:
        stacked.CopyFrom(helper.make_tensor_value_info(stacked.name, TensorProto.FLOAT, dims))


def _trip_count_as_vector(model: onnx.ModelProto) -> None:
    """The trip count ``[len(X)]`` (a 1-element tensor), as some exporters write it."""
    gather = next(n for n in model.graph.node if n.op_type == "Gather")
    const = next(n for n in model.graph.node if n.output[0] == gather.input[1])
    const.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(np.array([0], np.int64)))


def _in_if(model: onnx.ModelProto) -> onnx.ModelProto:
    """The whole graph in the then-branch of an ``If`` on a graph input ``pick``."""
    graph = model.graph
    then = helper.make_graph(list(graph.node), "then", [], list(graph.output))
    zeros = helper.make_node(
        "Constant",
        [],
        ["other"],
        value=onnx.numpy_helper.from_array(np.zeros((1, 1, _H), np.float32)),
    )
    other = helper.make_graph(
        [zeros], "else", [], [helper.make_tensor_value_info("other", TensorProto.FLOAT, [None] * 3)]
    )
    outer = helper.make_node("If", ["pick"], ["picked"], then_branch=then, else_branch=other)
    pick = helper.make_tensor_value_info("pick", TensorProto.BOOL, [])
    result = helper.make_graph(
        [outer],
        graph.name,
        [*graph.input, pick],
        [helper.make_tensor_value_info("picked", TensorProto.FLOAT, [None] * 3)],
        list(graph.initializer),
    )
    new = helper.make_model(result, opset_imports=list(model.opset_import))
    new.ir_version = model.ir_version
    return new


def _in_loop(model: onnx.ModelProto) -> onnx.ModelProto:
    """The whole graph in the body of a one-trip ``Loop`` (its output stacked once more)."""
    graph = model.graph
    (out,) = graph.output
    nodes = [*graph.node, helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    body = helper.make_graph(
        nodes,
        "outer_body",
        [
            helper.make_tensor_value_info("it", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), out],
    )
    consts = [
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("", 7, [], [1])),
        helper.make_node("Constant", [], ["go"], value=helper.make_tensor("", 9, [], [True])),
    ]
    outer = helper.make_node("Loop", ["one", "go"], ["stacked"], body=body)
    result = helper.make_graph(
        [*consts, outer],
        graph.name,
        list(graph.input),
        [helper.make_tensor_value_info("stacked", TensorProto.FLOAT, [None] * 4)],
        list(graph.initializer),
    )
    new = helper.make_model(result, opset_imports=list(model.opset_import))
    new.ir_version = model.ir_version
    return new


def _model(declared: str, trip: str, where: str) -> onnx.ModelProto:
    model = build_loop_model(_spec())
    _declare(model, DECLARATIONS[declared])
    if trip == "vector":
        _trip_count_as_vector(model)
    if where == "if":
        model = _in_if(model)
    elif where == "loop":
        model = _in_loop(model)
    return model


def _feeds(model: onnx.ModelProto, batch: int, seq: int, seed: int = 0) -> dict:
    feeds = loop_inputs(_spec(), batch, seq, seed=seed)
    if any(i.name == "pick" for i in model.graph.input):
        feeds["pick"] = np.array(True)
    return feeds


def _loops(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every Loop node, at any depth, with the trip counts of the main graph's guards."""

    def walk(graph: onnx.GraphProto):
        for node in graph.node:
            yield node
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from walk(attr.g)

    return [n for n in walk(model.graph) if n.op_type == "Loop"]


@pytest.mark.parametrize("where", ["main", "if", "loop"])
@pytest.mark.parametrize("trip", ["scalar", "vector"])
@pytest.mark.parametrize("declared", FIXED)
def test_zero_steps_give_what_the_loop_gives_for_each_declaration(declared, trip, where) -> None:
    model = _model(declared, trip, where)
    onnx.checker.check_model(model, full_check=True)
    after = rnn_rewrite_rules.rewrite(model, target=TARGET)
    onnx.checker.check_model(after, full_check=True)
    kinds = [n.op_type for n in _loops(after)]
    lstm_count = str(after).count('op_type: "LSTM"')
    assert lstm_count == 1, "the rule fired"
    # the Loop that is left runs no step: its trip count is a constant 0
    assert len(kinds) == len(_loops(model))
    expected = runtime.run(model, _feeds(model, 2, 0))
    actual = runtime.run(after, _feeds(after, 2, 0))
    assert [a.shape for a in expected] == [a.shape for a in actual]
    assert [a.dtype for a in expected] == [a.dtype for a in actual]
    for batch, seq in ((2, 3), (1, 1), (3, 5)):
        feeds = _feeds(model, batch, seq, seed=batch + seq)
        expected, actual = runtime.run(model, feeds), runtime.run(after, feeds)
        assert [a.shape for a in expected] == [a.shape for a in actual]
        assert runtime.max_abs_diff(expected, actual) <= 1e-5
    assert rnn_rewrite_rules.rewrite(after, target=TARGET) == after  # twice is once


def test_onnxruntime_shapes_a_stack_of_no_step_by_the_declaration() -> None:
    """The premise: the original Loop's stack at length 0 differs by declaration, so no
    one constant shape is right for all of them."""
    shapes = {
        name: runtime.run(
            _model(name, "scalar", "main"), _feeds(_model(name, "scalar", "main"), 2, 0)
        )[0].shape
        for name in DECLARATIONS
    }
    assert shapes["batch_h"] == (0, 0, _H)
    assert shapes["one_h"] == (0, 1, _H)
    assert len(set(shapes.values())) >= 3, shapes


def test_the_zero_step_loop_keeps_its_inputs_alive() -> None:
    """Dead-node removal after the rewrite keeps what the zero-step Loop reads (its
    initial states, computed in the main graph) and drops the trip count's Shape/Gather."""
    model = _model("batch_h", "scalar", "main")
    _declare_states(model, None)
    after = rnn_rewrite_rules.rewrite(model, target=TARGET)
    onnx.checker.check_model(after, full_check=True)
    counts = op_counts(after)
    assert counts["If"] == 1 and not counts["Loop"] and not counts["Gather"]
    expected = runtime.run(model, _feeds(model, 3, 0))
    actual = runtime.run(after, _feeds(after, 3, 0))
    assert [a.shape for a in expected] == [a.shape for a in actual]


def _declare_states(model: onnx.ModelProto, dims: list | None) -> None:
    """The Loop body's state inputs declared as ``dims`` (None: no shape), no value_info."""
    body = next(n for n in model.graph.node if n.op_type == "Loop").attribute[0].g
    for value in body.input[2:]:
        if dims is None:
            value.type.tensor_type.ClearField("shape")
        else:
            value.CopyFrom(helper.make_tensor_value_info(value.name, TensorProto.FLOAT, dims))
    del body.value_info[:]


def _static_batch(model: onnx.ModelProto, batch: int) -> None:
    """X declared with a static batch."""
    dim = model.graph.input[0].type.tensor_type.shape.dim[1]
    dim.Clear()
    dim.dim_value = batch


def _reasons(model: onnx.ModelProto, tmp_path) -> list[str]:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    report = rnn_rewrite_rules.rewrite_file(path, None, RewriteOptions(hazards=True))
    return [reason for item in report.unimproved for reason in item.reasons]


def _refused(model: onnx.ModelProto, tmp_path, why: str, batch: int = 2) -> None:
    """The Loop is kept with the zero-step reason saying ``why``, and the model (so
    unchanged) gives the original's stack at length 0 at both optimisation levels."""
    reasons = _reasons(model, tmp_path)
    prefix = ZERO_STEP_REASON.split("{loop}")[0]
    assert any(prefix in r and why in r for r in reasons), reasons
    after = rnn_rewrite_rules.rewrite(model, target=TARGET)
    assert op_counts(after)["Loop"] == 1 and 'op_type: "LSTM"' not in str(after)
    for optimize in (True, False):
        expected = runtime.run(model, _feeds(model, batch, 0), optimize=optimize)
        actual = runtime.run(after, _feeds(after, batch, 0), optimize=optimize)
        assert [a.shape for a in actual] == [a.shape for a in expected]


@pytest.mark.parametrize("declared", OPEN)
def test_a_stack_declared_without_its_hidden_axis_is_refused(declared: str, tmp_path) -> None:
    """No shape or ``[?, ?]``: ONNX Runtime may infer H from the weights, or not, by the
    body's form and the optimisation level; only the Loop gives its shape."""
    model = _model(declared, "scalar", "main")
    why = "its rank is not declared 2" if declared == "none" else "its last axis is not declared 4"
    _refused(model, tmp_path, why)


def test_a_stack_declared_with_another_hidden_size_is_refused(tmp_path) -> None:
    """Near miss: ``[?, 5]`` where the cell computes 4 columns (a false declaration)."""
    model = _model("batch_h", "scalar", "main")
    _declare(model, [None, _H + 1])
    _refused(model, tmp_path, "its last axis is not declared 4, the hidden size ([?, 5])")


@pytest.mark.parametrize("static", [1, 2])
def test_a_static_batch_of_x_under_an_open_stack_batch_is_refused(static: int, tmp_path) -> None:
    """Near miss: X's batch a number, the stack's batch declared open: ONNX Runtime's
    inference fills it from X (``(0, 2, H)`` for the Loop, ``(0, 0, H)`` from the guard)."""
    model = _model("batch_h", "scalar", "main")
    _static_batch(model, static)
    _refused(model, tmp_path, f"X's batch is the number {static}", batch=static)


def test_a_state_input_declaring_another_batch_is_refused(tmp_path) -> None:
    """Near miss: the body's ``h`` declared ``[2, H]``, its stack ``[?, H]``: inference
    carries the 2 to the stack."""
    model = _model("batch_h", "scalar", "main")
    _declare_states(model, [2, _H])
    _refused(model, tmp_path, "declares axis 0 as 2 ([2, 4])")


@pytest.mark.parametrize("states", [None, [None, None], ["batch", _H]])
def test_a_stack_declared_with_the_static_batch_of_x_is_rewritten(states) -> None:
    """X's batch 2 and the stack declared ``[2, H]``: the declaration fixes the shape
    whatever the state inputs declare (nothing, ``[?, ?]`` or ``[batch, H]``)."""
    model = _model("batch_h", "scalar", "main")
    _static_batch(model, 2)
    _declare(model, [2, _H])
    _declare_states(model, states)
    after = rnn_rewrite_rules.rewrite(model, target=TARGET)
    assert str(after).count('op_type: "LSTM"') == 1
    for optimize in (True, False):
        expected = runtime.run(model, _feeds(model, 2, 0), optimize=optimize)
        actual = runtime.run(after, _feeds(after, 2, 0), optimize=optimize)
        assert expected[0].shape == (0, 2, _H)
        assert [a.shape for a in actual] == [a.shape for a in expected]
    for seq in (1, 4):
        feeds = _feeds(model, 2, seq, seed=seq)
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(after, feeds)) <= 1e-5


@pytest.mark.parametrize("optimize", [True, False])
def test_zero_steps_where_the_body_infers_more_than_it_declares(optimize: bool, tmp_path) -> None:
    """``h`` and its stack declared ``[?, ?]`` (rank 2, no sizes): ONNX Runtime infers the
    stack's last axis from the weights, so the Loop gives ``(0, 0, H)`` at length 0; the
    lean guard would give ``(0, 0, 0)``, so the Loop is kept."""
    model = _model("unknown_2d", "scalar", "main")
    _declare_states(model, [None, None])
    after = rnn_rewrite_rules.rewrite(model, target=TARGET)
    expected = runtime.run(model, _feeds(model, 2, 0), optimize=optimize)
    actual = runtime.run(after, _feeds(after, 2, 0), optimize=optimize)
    assert expected[0].shape == (0, 0, _H)
    assert [a.shape for a in actual] == [a.shape for a in expected]
    assert any("its last axis is not declared 4" in r for r in _reasons(model, tmp_path))


def test_two_stacks_declared_with_different_shapes_are_refused(tmp_path) -> None:
    """Near miss: a second scan output stacks ``h_t`` too, declared ``[1, H]`` beside
    ``[?, H]``: the guard makes one stack of no step for both, so it cannot give both
    ``(0, 0, H)`` and ``(0, 1, H)``."""
    model = _model("batch_h", "scalar", "main")
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    body = loop.attribute[0].g
    h_t = next(n for n in body.node if n.output[0] == body.output[-1].name).input[0]
    body.node.append(helper.make_node("Identity", [h_t], ["second_stack"]))
    body.output.append(helper.make_tensor_value_info("second_stack", TensorProto.FLOAT, [1, _H]))
    loop.output.append("loop_second")
    model.graph.node.append(helper.make_node("Identity", ["loop_second"], ["y_second"]))
    model.graph.output.append(
        helper.make_tensor_value_info("y_second", TensorProto.FLOAT, [None, None, _H])
    )
    onnx.checker.check_model(model, full_check=True)
    reasons = _reasons(model, tmp_path)
    assert any("scan outputs of h_t are declared with different shapes" in r for r in reasons)
    after = rnn_rewrite_rules.rewrite(model, target=TARGET)
    assert 'op_type: "LSTM"' not in str(after)
    expected = runtime.run(model, _feeds(model, 2, 0))
    assert [a.shape for a in expected] == [(0, 0, _H), (0, 1, _H)]  # the premise


def test_a_stack_declaring_another_batch_than_x_s_static_one_is_refused(tmp_path) -> None:
    """Near miss: X's batch a static 1, the stack declared ``[2, H]`` (a false
    declaration): which of the two numbers ONNX Runtime keeps is its merge's choice."""
    model = _model("batch_h", "scalar", "main")
    _static_batch(model, 1)
    _declare(model, [2, _H])
    _refused(model, tmp_path, "X's batch is the number 1, not the declared 2", batch=1)

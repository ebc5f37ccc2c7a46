"""Hostile near misses for the exact zero-step guard of a Loop that carries ``X``
(``loop_scan``, jax2onnx's scan): a committed scan edited so that the carried ``X``
changes between steps, a step reads another index than ``X[t]``, or the trip count is
not ``X``'s own length, must keep its Loop; edits that keep the steps ``X[t]`` (an
``Identity`` chain, a counter from 0 by 1) are rewritten and equal at lengths 0, 1 and 3,
batches 1 and 3, with ONNX Runtime's graph optimisations off and on.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from tests.exporter_files import DATA
from tests.support import op_counts

FILE = DATA / "jax2onnx" / "hand_lstm_time_major.onnx"
Edit = Callable[[onnx.ModelProto], None]


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def _body(model: onnx.ModelProto) -> tuple[onnx.NodeProto, onnx.GraphProto, onnx.NodeProto]:
    """The Loop, its body, and the step's ``Gather(X, t)`` of the carried ``X``."""
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    body = loop.attribute[0].g
    sequence = body.input[-1].name
    gather = next(n for n in body.node if n.op_type == "Gather" and n.input[0] == sequence)
    return loop, body, gather


def _passed_on(model: onnx.ModelProto) -> onnx.NodeProto:
    """The body's node that passes the carried ``X`` on (``Identity`` as exported)."""
    _, body, _ = _body(model)
    sequence = body.input[-1].name
    return next(n for n in body.node if n.op_type == "Identity" and n.input == [sequence])


def _carried_through(op: str, value: float) -> Edit:
    def edit(model: onnx.ModelProto) -> None:
        node = _passed_on(model)
        _, body, _ = _body(model)
        body.node.insert(0, _constant("operand", np.array(value, np.float32)))
        node.op_type = op
        node.input.append("operand")

    return edit


def _identity_chain(model: onnx.ModelProto) -> None:
    node = _passed_on(model)
    _, body, _ = _body(model)
    out = node.output[0]
    node.output[0] = "passed_once"
    body.node.append(helper.make_node("Identity", ["passed_once"], [out]))


def _next_index(model: onnx.ModelProto) -> None:
    """Each step reads ``X[t + 1]`` (the last step fails; at length 0 none runs)."""
    _, body, gather = _body(model)
    body.node.insert(0, _constant("one", np.array(1, np.int64)))
    body.node.insert(1, helper.make_node("Add", [body.input[0].name, "one"], ["t_plus_1"]))
    gather.input[1] = "t_plus_1"


def _counter(start: int, step: int) -> Edit:
    """Each step reads ``X[c]``, ``c`` carried from ``start`` by ``step``."""

    def edit(model: onnx.ModelProto) -> None:
        loop, body, gather = _body(model)
        carried = len(loop.input) - 2
        model.graph.node.insert(0, _constant("counter_init", np.array(start, np.int64)))
        loop.input.append("counter_init")
        body.input.append(helper.make_tensor_value_info("counter", TensorProto.INT64, []))
        body.node.insert(0, _constant("counter_step", np.array(step, np.int64)))
        body.node.insert(1, helper.make_node("Add", ["counter", "counter_step"], ["counter_next"]))
        body.output.insert(1 + carried, helper.make_tensor_value_info("counter_next", 7, []))
        loop.output.insert(carried, "counter_final")
        gather.input[1] = "counter"

    return edit


def _trip_count_of_batch(model: onnx.ModelProto) -> None:
    """The trip count is ``Shape(X)[1]``, the batch: equal to the length only sometimes."""
    gather = next(
        n
        for n in model.graph.node
        if n.op_type == "Gather" and any(i.startswith("scan_trip_dynamic_idx") for i in n.input)
    )
    model.graph.node.insert(0, _constant("batch_axis", np.array([1], np.int64)))
    gather.input[1] = "batch_axis"


def _carries_another_input(model: onnx.ModelProto) -> None:
    """The Loop carries ``x2`` (declared as ``x``) while its trip count is ``x``'s length."""
    x2 = copy.deepcopy(model.graph.input[0])
    x2.name = "x2"
    model.graph.input.append(x2)
    loop, _, _ = _body(model)
    loop.input[-1] = "x2"


KEPT: dict[str, Edit] = {
    "x_carried_through_add_0": _carried_through("Add", 0.0),
    "x_carried_through_mul_2": _carried_through("Mul", 2.0),
    "step_reads_t_plus_1": _next_index,
    "step_reads_counter_from_1": _counter(1, 1),
    "step_reads_counter_by_2": _counter(0, 2),
    "trip_count_is_the_batch": _trip_count_of_batch,
    "carries_another_input": _carries_another_input,
}
REWRITTEN: dict[str, Edit] = {
    "x_carried_through_two_identities": _identity_chain,
    "step_reads_counter_from_0_by_1": _counter(0, 1),
}


def _edited(edit: Edit) -> onnx.ModelProto:
    model = onnx.load(FILE)
    edit(model)
    onnx.checker.check_model(model)
    return model


def _assert_equal_where_the_original_runs(original: onnx.ModelProto, after: onnx.ModelProto):
    inputs = [i.name for i in original.graph.input]
    for optimize in (False, True):
        for seq in (0, 1, 3):
            for batch in (1, 3):
                rng = np.random.default_rng(seq * 7 + batch)
                feeds = {
                    name: rng.standard_normal((seq, batch, 6)).astype(np.float32) for name in inputs
                }
                try:
                    expected = runtime.run(original, feeds, optimize=optimize)
                except Exception:  # the original fails: anything goes
                    continue
                actual = runtime.run(after, feeds, optimize=optimize)
                where = f"seq {seq}, batch {batch}, optimize {optimize}"
                for want, got in zip(expected, actual, strict=True):
                    assert got.shape == want.shape, where
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=where)


@pytest.mark.parametrize("name", sorted(KEPT))
def test_a_loop_whose_steps_are_not_x_t_of_its_own_x_is_kept(name: str) -> None:
    original = _edited(KEPT[name])
    after = rnn_rewrite_rules.rewrite(original, target="onnxruntime")
    assert op_counts(after) == op_counts(original)
    _assert_equal_where_the_original_runs(original, after)


@pytest.mark.parametrize("name", sorted(REWRITTEN))
def test_a_loop_whose_steps_stay_x_t_is_rewritten_and_equal(name: str) -> None:
    original = _edited(REWRITTEN[name])
    after = rnn_rewrite_rules.rewrite(original, target="onnxruntime")
    counts = op_counts(after)
    assert counts["Loop"] == 0 and counts["If"] == 1, counts
    _assert_equal_where_the_original_runs(original, after)

"""A Loop without a trip count whose conditions count its steps up to ``T`` is given
``M = T`` (``normalize.loop_trip_count``), so ``loop_scan`` reads it (tf2onnx on a Keras 2
``GRU(reset_after=False)``: ``M`` empty, ``Less(0.0, T)`` and ``Less(float(t + 1), T)``).

The model: ``testing.loops``' Keras GRU Loop with its trip count removed, its first
condition ``Less(0.0, float(T))`` and the body comparing with that outer ``float(T)``
(``T`` an int32 Cast of X's length, as Keras 2's ``strided_slice``). It
becomes one GRU with the original's outputs at every length, 0 included. Near misses (no
leaf bounding the steps, a first condition that lets step 0 run at ``T = 0``) keep the
Loop and say why; a Loop given ``M`` that no rule rewrites gets its empty ``M`` back.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.normalize import LoopTripCountPass
from rnn_rewrite_rules.testing.loops import LoopSpec, build_loop_model, loop_inputs
from tests.exporter_files import DATA
from tests.exporter_support import assert_same_on_sequences
from tests.test_cell_update_spellings import op_counts

SPEC = LoopSpec(cell="GRU", form="keras", trip_count="length", hidden_size=4, outputs=("y", "h"))


def _while_loop(*, leaves: tuple[str, ...] = ("iteration", "counter"), first: bool = True):
    """The Keras GRU Loop as a ``while``: no ``M``; ``leaves``: which body leaves stay."""
    model = build_loop_model(SPEC)
    graph = model.graph
    loop = next(n for n in graph.node if n.op_type == "Loop")
    body = loop.attribute[0].g
    at = list(graph.node).index(loop)
    narrow = helper.make_node("Cast", ["trips"], ["trips_32"], to=TensorProto.INT32)
    bound = helper.make_node("Cast", ["trips_32"], ["trips_f"], to=TensorProto.FLOAT)
    zero = helper.make_node("Constant", [], ["zero_f"], value=helper.make_tensor("", 1, [], [0.0]))
    start = helper.make_node("Less", ["zero_f", "trips_f"], ["starts"])
    graph.node.insert(at, start if first else helper.make_node("Identity", ["cond0"], ["starts"]))
    graph.node.insert(at, zero)
    graph.node.insert(at, bound)
    graph.node.insert(at, narrow)
    loop.input[0], loop.input[1] = "", "starts"
    (and_node,) = [n for n in body.node if n.op_type == "And"]
    less = {n.output[0]: n for n in body.node if n.op_type == "Less"}
    for node in less.values():
        node.input[1] = "trips_f"  # the outer float(T), not the body's constant
    kept = [name for name, node in less.items() if _reads(body, node, leaves)]
    if len(kept) == 1:
        and_node.CopyFrom(helper.make_node("Identity", kept, and_node.output))
    onnx.checker.check_model(model)
    return model


def _reads(body: onnx.GraphProto, less: onnx.NodeProto, which: tuple[str, ...]) -> bool:
    """``less`` compares ``float(iteration)`` (``"iteration"``) or ``float(counter + 1)``."""
    cast = next(n for n in body.node if n.output[0] == less.input[0])
    return ("iteration" if cast.input[0] == "iteration" else "counter") in which


def _assert_same(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    for batch, seq in ((1, 1), (3, 5), (2, 0), (0, 3)):
        feeds = loop_inputs(SPEC, batch, seq, seed=seq)
        want, got = runtime.run(before, feeds), runtime.run(after, feeds)
        assert [g.shape for g in got] == [w.shape for w in want], (batch, seq)
        assert runtime.max_abs_diff(want, got) <= 1e-5, (batch, seq)


def test_a_while_loop_counted_to_t_becomes_one_gru() -> None:
    model = _while_loop()
    result = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(result, full_check=True)
    assert op_counts(result)["GRU"] == 1
    _assert_same(model, result)


def test_the_pass_gives_the_bound_as_the_trip_count() -> None:
    model = ir.serde.deserialize_model(_while_loop())
    assert LoopTripCountPass()(model).modified
    loop = next(n for n in model.graph if n.op_type == "Loop")
    trips = loop.inputs[0]
    assert trips is not None and trips.producer().op_type == "Cast"
    assert trips.producer().inputs[0].name == "trips_32"


@pytest.mark.parametrize(
    ("leaves", "first", "reason"),
    [
        # iteration < T alone lets step T run: not bounded by T (it reads past X there)
        (("iteration",), True, "no condition bounds its steps"),
        # step 0 runs whatever T is: one more step than T where T is 0
        (("iteration", "counter"), False, "no condition bounds its steps"),
    ],
)
def test_near_misses_keep_the_loop(leaves: tuple[str, ...], first: bool, reason: str) -> None:
    model = _while_loop(leaves=leaves, first=first)
    normalization = LoopTripCountPass()
    ir_model = ir.serde.deserialize_model(model)
    assert not normalization(ir_model).modified
    assert any(reason in str(why) for _, why in normalization.refusals), normalization.refusals
    result = rnn_rewrite_rules.rewrite(model)
    assert op_counts(result)["GRU"] == 0 and op_counts(result)["Loop"] == 1


def test_an_unused_trip_count_is_put_back() -> None:
    """A cell no rule reads (the update gate a Tanh): the Loop keeps its empty ``M``."""
    model = _while_loop()
    body = next(n for n in model.graph.node if n.op_type == "Loop").attribute[0].g
    next(n for n in body.node if n.op_type == "Sigmoid").op_type = "Tanh"
    result = rnn_rewrite_rules.rewrite(model)
    (loop,) = [n for n in result.graph.node if n.op_type == "Loop"]
    assert loop.input[0] == "" and op_counts(result)["GRU"] == 0


def test_the_original_runs_t_steps() -> None:
    """The premise: the hand-made while loop gives the GRU's outputs of ``T`` steps (the
    same as the builder's Loop with its trip count)."""
    counted, whiled = build_loop_model(SPEC), _while_loop()
    feeds = loop_inputs(SPEC, 2, 4, seed=1)
    assert runtime.max_abs_diff(runtime.run(counted, feeds), runtime.run(whiled, feeds)) == 0
    np.testing.assert_equal(runtime.run(whiled, feeds)[0].shape[:2], (4, 2))  # [T, B, H]


def test_the_keras2_export_is_such_a_loop() -> None:
    """tf2onnx on a Keras 2 ``GRU(reset_after=False)`` (``tools/exporters``,
    ``tf2onnx_keras2``): the Loop has no trip count, and becomes one GRU."""
    path = DATA / "tf2onnx_keras2" / "gru_reset_before.onnx"
    model = onnx.load(path)
    (loop,) = [n for n in model.graph.node if n.op_type == "Loop"]
    assert loop.input[0] == ""
    result = rnn_rewrite_rules.rewrite(model)
    assert op_counts(result)["GRU"] == 1
    assert_same_on_sequences(model, result)

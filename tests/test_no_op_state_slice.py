"""NoOpStateSlicePass: a Slice that keeps all of a state read as an RNN's initial state
is removed (and put back where no rule used it); near misses stay."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.normalize import Journal, NoOpStateSlicePass

HIDDEN, FEATURES = 4, 3
INT64_MAX = np.iinfo(np.int64).max


def _model(
    op_type: str = "GRU",
    *,
    state_dims: tuple = (1, "batch", HIDDEN),
    starts=(0,),
    ends=(1,),
    axes=(0,),
    steps=(1,),
    read_by: str = "initial_h",
) -> onnx.ModelProto:
    """``y = RNN(x, initial_h=Slice(h, starts, ends, axes, steps))`` with ``h`` a graph
    input of ``state_dims``; ``read_by="X"``: the Slice feeds an Abs instead."""
    rng = np.random.default_rng(0)
    gates = {"GRU": 3, "LSTM": 4, "RNN": 1}[op_type]
    inits = [
        numpy_helper.from_array((rng.standard_normal(shape) * 0.4).astype(np.float32), name)
        for name, shape in (
            ("W", [1, gates * HIDDEN, FEATURES]),
            ("R", [1, gates * HIDDEN, HIDDEN]),
            ("B", [1, 2 * gates * HIDDEN]),
        )
    ]
    for name, values in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps)):
        inits.append(numpy_helper.from_array(np.array(values, np.int64), name))
    nodes = [
        helper.make_node("Slice", ["h", "starts", "ends", "axes", "steps"], ["h0"], name="cut")
    ]
    dims = ["seq", 1, "batch", HIDDEN] if read_by == "initial_h" else ["a", "b", HIDDEN]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)]
    if read_by == "initial_h":
        nodes.append(
            helper.make_node(
                op_type, ["x", "W", "R", "B", "", "h0"], ["y"], name="rnn", hidden_size=HIDDEN
            )
        )
    else:
        nodes.append(helper.make_node("Abs", ["h0"], ["y"], name="abs"))
    graph = helper.make_graph(
        nodes,
        "state_slice",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", FEATURES]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, list(state_dims)),
        ],
        outputs,
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def _normalized(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    ir_model = ir.serde.deserialize_model(model)
    modified = NoOpStateSlicePass(Journal())(ir_model).modified
    return ir.serde.serialize_model(ir_model), modified


def _feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((seq, batch, FEATURES)).astype(np.float32),
        "h": rng.standard_normal((1, batch, HIDDEN)).astype(np.float32),
    }


@pytest.mark.parametrize("op_type", ["GRU", "LSTM", "RNN"])
@pytest.mark.parametrize(
    "bounds",
    [
        {},
        {"ends": (INT64_MAX,)},
        {"starts": (-1,)},
        {"axes": (-3,)},
        {"starts": (0, 0), "ends": (1, INT64_MAX), "axes": (0, 2), "steps": (1, 1)},
    ],
    ids=["0:1", "0:max", "-1:1", "axis_-3", "two_axes"],
)
def test_a_slice_keeping_the_whole_state_is_removed(op_type: str, bounds: dict) -> None:
    before = _model(op_type, **bounds)
    after, modified = _normalized(before)
    assert modified
    assert [n.op_type for n in after.graph.node] == [op_type]
    assert after.graph.node[0].input[5] == "h"
    for seed, (batch, seq) in enumerate(((1, 1), (3, 5), (2, 7))):
        feeds = _feeds(batch, seq, seed)
        diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
        assert diff == 0, (batch, seq)
    # batch 0: ONNX Runtime aborts on LSTM/GRU there; onnx.reference runs them
    feeds = _feeds(0, 3)
    expected = ReferenceEvaluator(before).run(None, feeds)
    (got,) = ReferenceEvaluator(after).run(None, feeds)
    assert got.shape == expected[0].shape == (3, 1, 0, HIDDEN)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"state_dims": (2, "batch", HIDDEN)},  # the Slice keeps one of two rows
        {"state_dims": ("layers", "batch", HIDDEN)},  # rows not proven to be 1
        {"steps": (2,)},
        {"starts": (1,), "ends": (2,), "state_dims": (2, "batch", HIDDEN)},
        {"axes": (1,), "ends": (1,)},  # the batch axis, not proven 1
        {"read_by": "Abs"},  # not an RNN's state
    ],
    ids=["two_rows", "symbolic_rows", "step_2", "second_row", "batch_axis", "not_a_state"],
)
def test_near_misses_stay(kwargs: dict) -> None:
    before = _model(**kwargs)
    after, modified = _normalized(before)
    assert not modified
    assert after.graph.node[0].op_type == "Slice"


def test_a_slice_of_two_rows_is_not_the_state() -> None:
    """Why the proven size is needed: the RNN takes one row of a [2, batch, H] state."""
    model = _model(state_dims=(2, "batch", HIDDEN))
    feeds = _feeds(2, 3)
    feeds["h"] = np.random.default_rng(1).standard_normal((2, 2, HIDDEN)).astype(np.float32)
    runtime.run(model, feeds)  # the original runs on two rows
    bypassed = onnx.ModelProto()
    bypassed.CopyFrom(model)
    bypassed.graph.node[1].input[5] = "h"
    with pytest.raises(Exception, match="initial_h"):
        runtime.run(bypassed, feeds)


def test_no_rule_using_it_puts_the_slice_back() -> None:
    """rewrite(): where no rule fires, the model comes back as given (the Journal)."""
    import rnn_rewrite_rules

    before = _model()
    after = rnn_rewrite_rules.rewrite(before)
    assert [n.op_type for n in after.graph.node] == ["Slice", "GRU"]


def test_the_undo_puts_back_the_bounds_cleanup_dropped() -> None:
    """A bypass detaches the Slice's bounds and the cleanup after a round drops them; where
    no rule used the bypass, the Slice comes back with them (5 inputs, the same names)."""
    from rnn_rewrite_rules.passes import RemoveDeadNodesPass

    before = _model()
    ir_model = ir.serde.deserialize_model(before)
    original = list(ir_model.graph)
    journal = Journal()
    assert NoOpStateSlicePass(journal)(ir_model).modified
    RemoveDeadNodesPass()(ir_model)
    assert "starts" not in ir_model.graph.initializers
    assert journal.restore(original) == 1
    after = ir.serde.serialize_model(ir_model)
    onnx.checker.check_model(after, full_check=True)
    assert list(after.graph.node[0].input) == ["h", "starts", "ends", "axes", "steps"]
    assert {i.name for i in after.graph.initializer} == {i.name for i in before.graph.initializer}
    feeds = _feeds(2, 3)
    assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) == 0

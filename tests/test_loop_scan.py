"""loop_scan: Loop and Scan recurrences become one RNN, LSTM or GRU node."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import families, loop_scan
from rnn_rewrite_rules.rules.loop_scan._common import BROADCAST_BRANCH_REASON, FLOAT16_REASON
from rnn_rewrite_rules.testing.loops import NEAR_MISSES, LoopSpec, build_loop_model, loop_inputs
from tests.reasons import refusal_reasons
from tests.support import apply, onnxruntime_in_child, op_counts, recurrent_nodes

RNN_OPS = ("LSTM", "GRU", "RNN")
RECURRENCES = ("Loop", "Scan")
#: The target whose runtimes have every cell's node (portable's rten has no RNN: see
#: test_portable_keeps_an_rnn_cell_loop).
TARGET = "onnxruntime"


def _outputs(cell: str) -> tuple[str, ...]:
    return ("y", "h", "c") if cell == "LSTM" else ("y", "h")


def _spec(**fields) -> LoopSpec:
    fields.setdefault("outputs", _outputs(fields.get("cell", "LSTM")))
    return LoopSpec(**fields)


def _sizes(spec: LoopSpec) -> list[tuple[int, int]]:
    """(batch, seq): the trip count and a longer X (a Loop reads its first T steps; a Scan
    all of them, so its length changes too)."""
    return [(1, spec.steps), (3, spec.steps), (2, spec.steps + 3)]


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]


def assert_same(
    before: onnx.ModelProto, after: onnx.ModelProto, spec: LoopSpec, atol: float = 1e-5
) -> None:
    """Same outputs and shapes in ONNX Runtime at several sizes; at batch 0 the original
    in ONNX Runtime and the result in the reference evaluator (ONNX Runtime aborts the
    process on an LSTM/GRU of batch 0; the evaluator's Loop stacks nothing at batch 0)."""
    for seed, (batch, seq) in enumerate(_sizes(spec)):
        feeds = loop_inputs(spec, batch, seq, seed=seed)
        expected, actual = runtime.run(before, feeds), runtime.run(after, feeds)
        for a, b in zip(expected, actual, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        diff = runtime.max_abs_diff(expected, actual)
        assert diff <= atol, f"batch={batch} seq={seq}: max abs diff {diff}"
    if not spec.float16 and spec.activation == "Tanh":  # the evaluator's RNN has no Relu
        feeds = loop_inputs(spec, 0)
        expected, actual = runtime.run(before, feeds), _reference(after, feeds)
        assert [a.shape for a in expected] == [a.shape for a in actual]


ALL_FORMS = ("keras", "tf1", "torch", "scan")
FORMS = list(itertools.product(RNN_OPS, ALL_FORMS, ("forward", "reverse")))


@pytest.mark.parametrize(("cell", "form", "direction"), FORMS)
def test_every_form_becomes_one_node(cell: str, form: str, direction: str) -> None:
    spec = _spec(cell=cell, form=form, direction=direction)
    model = build_loop_model(spec)
    after, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 1
    counts = op_counts(after)
    assert not any(counts[op] for op in RECURRENCES)
    # the reversals of a backwards layer (ReverseSequence, tf2onnx's Transpose pair) go
    assert not counts["ReverseSequence"] and not counts["Transpose"]
    (node,) = recurrent_nodes(after)
    assert node.op_type == cell
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attributes["direction"] == direction.encode()
    assert [o.name for o in after.graph.output] == [o.name for o in model.graph.output]
    assert [o.type for o in after.graph.output] == [o.type for o in model.graph.output]
    assert after.opset_import == model.opset_import
    assert_same(model, after, spec)
    again, count = apply(loop_scan.make_rules(TARGET), after)
    assert count == 0 and again == after  # twice is once


@pytest.mark.parametrize(
    "spec",
    [
        _spec(cell="GRU", linear_before_reset=0),  # Keras reset_after=False
        _spec(cell="RNN", activation="Relu", form="torch"),
        _spec(cell="RNN", activation="Relu", form="scan", direction="reverse"),
        _spec(opset=11),  # Squeeze/Unsqueeze axes as attributes
        _spec(cell="GRU", form="scan", opset=17),
        _spec(form="torch", opset=21, outputs=("h",)),
        _spec(outputs=("c", "y")),
        _spec(steps=1, input_size=1, hidden_size=1),
    ],
    ids=str,
)
def test_other_variants(spec: LoopSpec) -> None:
    model = build_loop_model(spec)
    after, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 1 and not any(op_counts(after)[op] for op in RECURRENCES)
    assert_same(model, after, spec)


@pytest.mark.parametrize(("cell", "form"), list(itertools.product(("LSTM", "GRU"), ALL_FORMS)))
def test_keras_relu_activation(cell: str, form: str) -> None:
    """``LSTM(activation="relu")``: the activations are read from the body and written
    to the node (ONNX Runtime runs Relu in its LSTM and GRU kernels)."""
    spec = _spec(cell=cell, form=form, activation="Relu", direction="reverse")
    model = build_loop_model(spec)
    after, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 1
    (node,) = recurrent_nodes(after)
    (activations,) = [a.strings for a in node.attribute if a.name == "activations"]
    expected = [b"Sigmoid", b"Relu", b"Relu"] if cell == "LSTM" else [b"Sigmoid", b"Relu"]
    assert list(activations) == expected
    assert_same(model, after, spec)


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_a_relu_cell_is_kept_on_the_portable_target(cell: str) -> None:
    """tract computes an LSTM/GRU node's default activations whatever its attribute
    (``tests/test_tract.py`` pins that), so on ``portable`` a Relu cell's Loop stays."""
    model = build_loop_model(_spec(cell=cell, form="keras", activation="Relu"))
    after, count = apply(loop_scan.make_rules("portable"), model)
    assert count == 0 and op_counts(after)["Loop"] == 1
    acts = ["Sigmoid", "Relu", "Relu"] if cell == "LSTM" else ["Sigmoid", "Relu"]
    want = (
        f"tract computes {cell}'s default activations whatever its activations attribute says"
        f" ({acts}; target 'portable')"
    )
    assert want in refusal_reasons(loop_scan.make_rules("portable"), model)


def test_gru_linear_before_reset_read_from_the_body() -> None:
    for reset_after in (0, 1):
        model = build_loop_model(_spec(cell="GRU", linear_before_reset=reset_after))
        after, _ = apply(loop_scan.make_rules(TARGET), model)
        (node,) = recurrent_nodes(after)
        attributes = {a.name: a.i for a in node.attribute if a.name == "linear_before_reset"}
        assert attributes == {"linear_before_reset": reset_after}


def test_a_scan_whose_output_runs_the_other_way_is_reversed_once() -> None:
    spec = _spec(form="scan", direction="reverse")
    model = build_loop_model(spec)
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    directions = next(a for a in scan.attribute if a.name == "scan_output_directions")
    directions.ints[:] = [0]  # inputs backwards, the stack in step order
    after, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 1 and op_counts(after)["Slice"] >= 1
    assert_same(model, after, spec)


@pytest.mark.parametrize(
    ("form", "static_seq", "nodes"),
    [("scan", False, 1), ("keras", True, 1), ("torch", True, 1), ("keras", False, 2)],
)
def test_bidirectional_layers(form: str, static_seq: bool, nodes: int) -> None:
    """A forward and a backward layer on one X become one bidirectional node (with
    the bidirectional family) when both read all of X: a Scan always, a Loop when X's
    length is provably its trip count; else two nodes (each Loop reads its own window
    of a longer X: the first T steps, and the last T reversed)."""
    spec = LoopSpec(form=form, cell="GRU", bidirectional=True, static_seq=static_seq)
    model = build_loop_model(spec)
    after = rnn_rewrite_rules.rewrite(model)
    assert not any(op_counts(after)[op] for op in RECURRENCES)
    assert len(recurrent_nodes(after)) == nodes
    sizes = [(1, spec.steps), (3, spec.steps)] if static_seq else _sizes(spec)
    for seed, (batch, seq) in enumerate(sizes):
        feeds = loop_inputs(spec, batch, seq, seed=seed)
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(after, feeds)) < 1e-5


def test_float16_cells_are_refused_by_default() -> None:
    model = build_loop_model(_spec(float16=True))
    after, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 0 and op_counts(after) == op_counts(model)
    reasons = set(refusal_reasons(loop_scan.make_rules(TARGET), model)) - _count_refusals(model)
    assert reasons == {FLOAT16_REASON.format(op="LSTM")}


@pytest.mark.parametrize(("cell", "form"), list(itertools.product(RNN_OPS, ALL_FORMS)))
def test_float16_cells_in_float32_between_casts(cell: str, form: str) -> None:
    spec = _spec(cell=cell, form=form, float16=True, direction="reverse")
    model = build_loop_model(spec)
    after, count = apply(loop_scan.widened_rules(TARGET), model)
    assert count == 1
    (node,) = recurrent_nodes(after)
    weights = {i.name: i for i in after.graph.initializer}
    assert weights[node.input[1]].data_type == onnx.TensorProto.FLOAT
    assert op_counts(after)["Cast"] >= 2  # X to float32, Y back to float16
    # the tolerance this changes: the body rounds every op to float16, the node does not
    assert_same(model, after, spec, atol=4e-3)


def _count_refusals(model: onnx.ModelProto) -> set[str]:
    """The refusals of the rules for other output counts (one rule per count)."""
    return {
        r for r in refusal_reasons(loop_scan.make_rules(TARGET), model) if " outputs, not " in r
    }


NEAR_MISS_REASONS = {
    "early_exit": "the condition is false after step 3 (the loop ends early)",
    "not_the_state": "h_t is not f(o) * h(c_t) (LSTM)",
    "shifted_step": "the step input is not X[t]: the index is not the iteration number",
    "side_output": "scan output 1 is not h_t (a side output is read)",
    "wrong_gate": "c_t is not f(f) * c_(t-1) + f(i) * g(g) with o's f (LSTM)",
    "state_not_hidden": "cannot prove the initial c is [batch, 4]",
}


@pytest.mark.parametrize(
    ("near_miss", "form"),
    [
        (miss, form)
        for miss, form in itertools.product(NEAR_MISSES, ALL_FORMS)
        if not (form == "scan" and miss in ("early_exit", "shifted_step"))
    ],
)
def test_near_misses_are_refused_with_their_reason(near_miss: str, form: str) -> None:
    spec = _spec(form=form, near_miss=near_miss)
    model = build_loop_model(spec)
    after, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 0 and op_counts(after) == op_counts(model)
    reasons = set(refusal_reasons(loop_scan.make_rules(TARGET), model)) - _count_refusals(model)
    assert reasons == {NEAR_MISS_REASONS[near_miss]}
    if near_miss == "early_exit":  # the twin is real: it stops early, the LSTM would not
        feeds = loop_inputs(spec, 2)
        assert runtime.run(model, feeds)[0].shape[0] < spec.steps
    if near_miss == "state_not_hidden" and form != "scan":  # a Loop runs it: c broadcasts
        assert runtime.run(model, loop_inputs(spec, 3))[2].shape == (3, spec.hidden_size)


_ZERO_STEPS = """
import sys
import numpy as np
import onnx
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.testing.loops import LoopSpec, loop_inputs
spec = LoopSpec(cell=sys.argv[2], form="torch", trip_count="length",
                state_inputs=sys.argv[4] == "1", outputs=tuple(sys.argv[3].split(",")))
outputs = runtime.run(onnx.load(sys.argv[1]), loop_inputs(spec, 2, 0))
np.savez(sys.argv[1] + ".npz", *outputs)
"""


def _run_at_zero_steps(model: onnx.ModelProto, spec: LoopSpec, tmp_path) -> list[np.ndarray]:
    """The outputs at 0 steps, run in a child process (ONNX Runtime's GRU aborts there)."""
    import subprocess
    import sys

    path = tmp_path / f"model{len(list(tmp_path.iterdir()))}.onnx"
    onnx.save(model, path)
    command = [sys.executable, "-c", _ZERO_STEPS, str(path), spec.cell, ",".join(spec.outputs)]
    command.append("1" if spec.state_inputs else "0")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with np.load(f"{path}.npz") as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def _assert_same_down_to_zero_steps(
    model: onnx.ModelProto, after: onnx.ModelProto, spec: LoopSpec, tmp_path
) -> list[np.ndarray]:
    """Same outputs and shapes in ONNX Runtime at :func:`_sizes` and one step, and at 0
    steps (in a child process) the same outputs exactly (the initial states); the
    original's outputs at 0 steps."""
    for seed, (batch, seq) in enumerate([*_sizes(spec), (2, 1)]):
        feeds = loop_inputs(spec, batch, seq, seed=seed)
        expected, actual = runtime.run(model, feeds), runtime.run(after, feeds)
        assert [a.shape for a in expected] == [a.shape for a in actual]
        assert runtime.max_abs_diff(expected, actual) <= 1e-5
    expected = _run_at_zero_steps(model, spec, tmp_path)
    actual = _run_at_zero_steps(after, spec, tmp_path)
    assert [a.shape for a in expected] == [a.shape for a in actual]
    assert runtime.max_abs_diff(expected, actual) == 0
    return expected


@pytest.mark.parametrize("cell", RNN_OPS)
@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_a_trip_count_of_x_s_length_is_guarded_at_zero_steps(cell, direction, tmp_path) -> None:
    """torch's Loop over ``Shape(X)[0]`` steps: the node sits in ``If(len(X) == 0)``,
    whose other branch gives what the Loop gives after no step (the initial states, ONNX
    Runtime's ``[0, 0, H]`` stack) where the node would not (ONNX Runtime's GRU aborts
    on 0 steps; its LSTM and RNN give zero states)."""
    spec = _spec(cell=cell, form="torch", direction=direction, trip_count="length")
    model = build_loop_model(spec)
    after, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 1
    counts = op_counts(after)
    assert counts["If"] == 1 and not counts["Loop"] and not counts["ReverseSequence"]
    (guard,) = [n for n in after.graph.node if n.op_type == "If"]
    branches = {a.name: [n.op_type for n in a.g.node] for a in guard.attribute}
    assert cell in branches["else_branch"] and cell not in branches["then_branch"]
    expected = _assert_same_down_to_zero_steps(model, after, spec, tmp_path)
    assert expected[0].shape == (0, 0, spec.hidden_size)  # the stack of no step
    again, count = apply(loop_scan.make_rules(TARGET), after)
    assert count == 0 and again == after  # twice is once


@pytest.mark.parametrize("cell", RNN_OPS)
def test_a_guarded_forward_and_backward_pair_is_one_guarded_bidirectional_node(
    cell, tmp_path
) -> None:
    """A forward and a backward Loop over ``X``'s length, concatenated: each becomes a
    guarded node (``If(len(X) == 0)``), the two guards one ``If`` with the Concat inside
    (``MergeGuards``), and ``bidirectional`` merges the pair in its branch; the other
    branch runs both Loops with a trip count of 0 (what the pair gives at length 0).
    Equal at every length, 0 included."""
    spec = LoopSpec(cell=cell, form="torch", trip_count="length", bidirectional=True)
    model = build_loop_model(spec)
    after = rnn_rewrite_rules.rewrite(model, target=TARGET)
    onnx.checker.check_model(after, full_check=True)
    counts = op_counts(after)
    assert counts["If"] == 1 and not counts["Loop"] and not counts["ReverseSequence"], counts
    (guard,) = [n for n in after.graph.node if n.op_type == "If"]
    (no_step,) = [a.g for a in guard.attribute if a.name == "then_branch"]
    assert [n.op_type for n in no_step.node].count("Loop") == 2
    (steps,) = [a.g for a in guard.attribute if a.name == "else_branch"]
    (node,) = [n for n in steps.node if n.op_type == cell]
    assert {a.name: a.s for a in node.attribute}["direction"] == b"bidirectional"
    for seed, seq in enumerate((1, 4, 9)):
        feeds = loop_inputs(spec, 3, seq, seed=seed)
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(after, feeds)) <= 1e-5
    expected = _run_at_zero_steps(model, spec, tmp_path)
    actual = _run_at_zero_steps(after, spec, tmp_path)
    assert [a.shape for a in expected] == [a.shape for a in actual]
    assert rnn_rewrite_rules.rewrite(after, target=TARGET) == after  # twice is once


def _two_guards(cell: str = "GRU", before=None) -> onnx.ModelProto:
    """The pair's two guarded nodes, before ``MergeGuards`` (``before``: an edit of the
    Loops' model first)."""
    spec = LoopSpec(cell=cell, form="torch", trip_count="length", bidirectional=True)
    rules = [r for r in loop_scan.make_rules(TARGET) if "MergeGuards" not in str(r.name)]
    model = build_loop_model(spec)
    if before is not None:
        before(model)
    after, count = apply(rules, model)
    assert count == 2
    return after


def _other_condition(model: onnx.ModelProto) -> None:
    second = [n for n in model.graph.node if n.op_type == "If"][1]
    flipped = onnx.helper.make_node("Not", [second.input[0]], ["flipped"])
    model.graph.node.insert(list(model.graph.node).index(second), flipped)
    second.input[0] = "flipped"


def _final_state_read(model: onnx.ModelProto) -> None:
    """Before the rules: the forward Loop's final state is read too, so its guard passes
    it beside the stack (a guard passes only what is read)."""
    first = next(n for n in model.graph.node if n.op_type == "Loop")
    final = onnx.helper.make_tensor_value_info(first.output[0], onnx.TensorProto.FLOAT, ["b", "h"])
    model.graph.output.append(final)


_BEFORE_RULES = (_final_state_read,)


def _stack_also_read(model: onnx.ModelProto) -> None:
    """The backward guard's stack (the Concat's second input, through its Identity) is
    also a graph output."""
    concat = next(n for n in model.graph.node if n.op_type == "Concat" and n.output == ["y"])
    model.graph.output.append(onnx.helper.make_empty_tensor_value_info(concat.input[1]))


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (_other_condition, "the two Ifs have different conditions"),
        (_final_state_read, "another output of a guard is read"),
        (_stack_also_read, "a concatenated guard output has another reader"),
    ],
    ids=["other_condition", "final_state_read", "stack_also_read"],
)
def test_guards_that_are_not_one_are_left_two(edit, reason) -> None:
    if edit in _BEFORE_RULES:
        model = _two_guards(before=edit)
    else:
        model = _two_guards()
        edit(model)
    assert reason in refusal_reasons([loop_scan.MergeGuards.rule()], model)
    after = rnn_rewrite_rules.rewrite(model, target=TARGET)
    assert op_counts(after)["If"] == 2


def test_zero_steps_are_what_the_node_alone_gets_wrong(tmp_path) -> None:
    """The premise of the guard: an LSTM node alone does not give its initial states at 0
    steps (ONNX Runtime 1.32 gives zeros; 1.31 left them uninitialized), the Loop does."""
    spec = _spec(form="torch", trip_count="length", state_inputs=True)
    model = build_loop_model(spec)
    (h_n,) = (v for v in _run_at_zero_steps(model, spec, tmp_path)[1:2])
    assert np.abs(h_n).sum() > 0  # the initial state, random
    feeds = loop_inputs(spec, 2, 0)
    node = onnx.helper.make_node(
        "LSTM", ["x", "w", "r", "", "", "h", "h"], ["y", "y_h"], hidden_size=spec.hidden_size
    )
    size = spec.hidden_size
    graph = onnx.helper.make_graph(
        [node],
        "alone",
        [
            onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [0, 2, 5]),
            onnx.helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, [1, 2, size]),
        ],
        [onnx.helper.make_tensor_value_info("y_h", onnx.TensorProto.FLOAT, None)],
        [
            onnx.numpy_helper.from_array(np.ones((1, 4 * size, 5), np.float32), "w"),
            onnx.numpy_helper.from_array(np.ones((1, 4 * size, size), np.float32), "r"),
        ],
    )
    alone = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 14)])
    alone.ir_version = 8
    (y_h,) = runtime.run(alone, {"x": feeds["x"], "h": feeds["h0"][np.newaxis]})
    assert y_h.shape == (1, 2, size) and not np.allclose(y_h[0], feeds["h0"])


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_a_lean_guard_beside_a_broadcast_is_refused(cell) -> None:
    """X's length as the trip count and states whose batch is not proven X's: the lean
    guard's branch would pass the states through where the Loop broadcasts them."""
    spec = _spec(cell=cell, form="torch", trip_count="length", state_inputs=True)
    model = build_loop_model(spec)
    _, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 0
    reasons = set(refusal_reasons(loop_scan.make_rules(TARGET), model)) - _count_refusals(model)
    assert reasons == {BROADCAST_BRANCH_REASON}


def test_at_batch_0_the_loop_broadcasts_a_state_of_batch_1() -> None:
    """The premise of that refusal: X of batch 0 beside h0 of batch 1 gives states of
    batch 0 from the first step on (of batch 1 at length 0), not the initial ones."""
    spec = _spec(cell="GRU", form="torch", trip_count="length", state_inputs=True)
    model = build_loop_model(spec)
    shapes = {}
    for seq in (0, 1, 3):
        outputs = onnxruntime_in_child(model, loop_inputs(spec, 0, seq, state_batch=1))
        assert not isinstance(outputs, str), outputs
        shapes[seq] = [o.shape for o in outputs]
    hidden = spec.hidden_size
    assert shapes == {s: [(s, 0, hidden), (min(s, 1) ^ 1, hidden)] for s in (0, 1, 3)}


def test_a_trip_count_of_another_length_is_refused() -> None:
    """The trip count is the length of a second input, not of X."""
    spec = _spec(form="torch", trip_count="length")
    model = build_loop_model(spec)
    (shape,) = [n for n in model.graph.node if n.output[0] == "x_shape"]
    shape.input[0] = "other"
    model.graph.input.append(
        onnx.helper.make_tensor_value_info("other", onnx.TensorProto.FLOAT, ["n", 1])
    )
    _, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 0
    reasons = set(refusal_reasons(loop_scan.make_rules(TARGET), model)) - _count_refusals(model)
    assert reasons == {"the trip count is neither a constant nor X's length"}


def test_gru_near_miss_whose_reset_gate_has_another_activation() -> None:
    model = build_loop_model(_spec(cell="GRU"))
    graph = next(n for n in model.graph.node if n.op_type == "Loop").attribute[0].g
    mul = next(n for n in graph.node if n.op_type == "Mul" and "sigmoid" in n.input[0])
    sigmoid = next(n for n in graph.node if n.output[0] == mul.input[0])
    sigmoid.op_type = "Tanh"  # tanh(r) where sigmoid(r), z's activation, belongs
    _, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 0
    (reason,) = set(refusal_reasons(loop_scan.make_rules(TARGET), model)) - _count_refusals(model)
    assert reason == "the reset gate's activation is not the update gate's (GRU)"


def test_weights_that_are_graph_inputs_are_not_constants() -> None:
    model = build_loop_model(_spec(form="scan"))
    kernel = next(i for i in model.graph.initializer if i.name == "kernel")
    model.graph.input.append(
        onnx.helper.make_tensor_value_info("kernel", kernel.data_type, list(kernel.dims))
    )
    _, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 0
    (reason,) = set(refusal_reasons(loop_scan.make_rules(TARGET), model)) - _count_refusals(model)
    assert "not a constant matrix" in reason


def test_registered_and_run_by_rewrite() -> None:
    registered = families()
    assert registered["loop_scan"].install_by_default
    # the widened rules change outputs: never in a family, so never in rewrite(model)
    widened = {str(rule.name) for rule in loop_scan.widened_rules(TARGET)}
    assert not widened & {str(rule.name) for f in registered.values() for rule in f.all_rules}
    spec = _spec(direction="reverse")
    model = build_loop_model(spec)
    after = rnn_rewrite_rules.rewrite(model)
    assert not any(op_counts(after)[op] for op in RECURRENCES)
    assert_same(model, after, spec)


@settings(max_examples=40, deadline=None)
@given(
    cell=st.sampled_from(RNN_OPS),
    form=st.sampled_from(ALL_FORMS),
    direction=st.sampled_from(["forward", "reverse"]),
    input_size=st.integers(1, 7),
    hidden_size=st.integers(1, 7),
    steps=st.integers(1, 7),
    opset=st.sampled_from([11, 13, 17, 21]),
    state_inputs=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_always_equivalent(
    cell: str,
    form: str,
    direction: str,
    input_size: int,
    hidden_size: int,
    steps: int,
    opset: int,
    state_inputs: bool,
    seed: int,
) -> None:
    spec = _spec(
        cell=cell,
        form=form,
        direction=direction,
        input_size=input_size,
        hidden_size=hidden_size,
        steps=steps,
        opset=opset,
        state_inputs=state_inputs,
        seed=seed,
    )
    model = build_loop_model(spec)
    after, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 1
    assert_same(model, after, spec)


@settings(max_examples=30, deadline=None)
@given(
    near_miss=st.sampled_from(sorted(NEAR_MISSES)),
    form=st.sampled_from(ALL_FORMS),
    cell=st.sampled_from(RNN_OPS),
    seed=st.integers(0, 2**16),
)
def test_near_misses_never_fire(near_miss: str, form: str, cell: str, seed: int) -> None:
    try:
        model = build_loop_model(_spec(cell=cell, form=form, near_miss=near_miss, seed=seed))
    except ValueError:
        return  # a twin the form has no meaning for
    _, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 0


_SWAPS = {
    "Sigmoid": "Tanh",
    "Tanh": "Sigmoid",
    "Relu": "Tanh",
    "Add": "Sub",
    "Sub": "Add",
    "Mul": "Add",
}


def _mutate_body(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """One random change inside the Loop/Scan body: an op swapped for a look-alike, a
    binary op's operands exchanged, or a body constant scaled; returns what changed."""
    node = next(n for n in model.graph.node if n.op_type in RECURRENCES)
    body = next(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
    candidates = [n for n in body.node if n.op_type in _SWAPS or n.op_type == "Constant"]
    target = candidates[int(rng.integers(len(candidates)))]
    if target.op_type == "Constant":
        tensor = target.attribute[0].t
        array = onnx.numpy_helper.to_array(tensor)
        # a float (a weight, a bias, the GRU's 1) halved; an int (a counter's start or
        # step, a bound, a Slice bound) moved by one
        array = array * np.asarray(0.5, array.dtype) if array.dtype.kind == "f" else array + 1
        tensor.CopyFrom(onnx.numpy_helper.from_array(array.astype(array.dtype), tensor.name))
        return f"constant {target.output[0]} changed"
    if len(target.input) == 2 and rng.integers(2):
        target.input[:] = [target.input[1], target.input[0]]
        return f"{target.op_type} {target.output[0]} operands exchanged"
    before = target.op_type
    target.op_type = _SWAPS[before]
    return f"{before} {target.output[0]} became {target.op_type}"


def _runs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    try:
        return runtime.run(model, feeds)
    except Exception:  # a mutant the runtime rejects proves nothing
        return None


@settings(max_examples=60, deadline=None)
@given(
    cell=st.sampled_from(RNN_OPS),
    form=st.sampled_from(ALL_FORMS),
    direction=st.sampled_from(["forward", "reverse"]),
    state_inputs=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_fuzzed_bodies_are_refused_or_equivalent(
    cell: str, form: str, direction: str, state_inputs: bool, seed: int
) -> None:
    """A random change to a body either makes the rules refuse it or leaves a model the
    rewrite reproduces exactly: a rule never fires on a body it misread."""
    spec = _spec(cell=cell, form=form, direction=direction, state_inputs=state_inputs)
    model = build_loop_model(spec)
    what = _mutate_body(model, np.random.default_rng(seed))
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return  # an invalid mutant (operands the op refuses)
    after, count = apply(loop_scan.make_rules(TARGET), model)
    if not count:
        return
    for batch, seq in _sizes(spec):
        feeds = loop_inputs(spec, batch, seq)
        expected = _runs(model, feeds)
        if expected is None:
            continue  # the mutant fails here; the rewrite may do anything
        diff = runtime.max_abs_diff(expected, runtime.run(after, feeds))
        assert diff <= 1e-5, f"{what}: batch={batch} seq={seq}: max abs diff {diff}"


def test_a_loop_inside_an_if_branch_gets_constant_nodes() -> None:
    """In a subgraph the weights and axes are Constant nodes (a new initializer name
    there could shadow one outside), and the main graph gets none."""
    spec = _spec(cell="GRU", direction="reverse", outputs=("y",))
    inner = build_loop_model(spec)
    elem = inner.graph.output[0].type.tensor_type.elem_type
    dims = ["s", "b", spec.hidden_size]
    then = onnx.helper.make_graph(
        list(inner.graph.node), "then", [], [onnx.helper.make_tensor_value_info("y", elem, dims)]
    )
    zeros = onnx.numpy_helper.from_array(np.zeros((1, 1, spec.hidden_size), np.float32))
    otherwise = onnx.helper.make_graph(
        [onnx.helper.make_node("Constant", [], ["zeros"], value=zeros)],
        "else",
        [],
        [onnx.helper.make_tensor_value_info("zeros", elem, dims)],
    )
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=otherwise)],
        "wrapped",
        [inner.graph.input[0], onnx.helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [onnx.helper.make_tensor_value_info("out", elem, dims)],
        list(inner.graph.initializer),
    )
    model = onnx.helper.make_model(graph, opset_imports=list(inner.opset_import))
    model.ir_version = inner.ir_version
    after, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 1
    branch = next(a.g for a in after.graph.node[0].attribute if a.name == "then_branch")
    ops = [n.op_type for n in branch.node]
    assert "GRU" in ops and "Loop" not in ops
    assert not after.graph.initializer  # the kernels the body read went with it
    for batch, seq in _sizes(spec):
        feeds = {**loop_inputs(spec, batch, seq), "c": np.array(True)}
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(after, feeds)) < 1e-5


@pytest.mark.corpus
def test_mk8dx_loops() -> None:
    """The corpus' tf2onnx Keras 3 model: two float16 LSTM Loops (forward, and backward
    between ReverseSequences). Refused by default (a float16 node rounds otherwise);
    the widened rules make them two LSTM nodes whose outputs differ by float16 rounding,
    and the rest of the rewrite one bidirectional node (the halves' inputs are one
    computation written twice, each half's Y cast back to float16 alike)."""
    manifest = pytest.importorskip("tools.corpus.manifest", reason="tools/corpus is not here")
    entry = manifest.entry("mk8dx-number-recognition")
    path = manifest.present(entry, manifest.corpus_dir())
    if path is None:
        pytest.skip(f"{entry.filename} is not there: run `{manifest.FETCH_COMMAND}`")
    assert manifest.sha256_file(path) == entry.sha256
    model = onnx.load(path)
    reasons = set(refusal_reasons(loop_scan.make_rules(TARGET), model)) - _count_refusals(model)
    assert reasons == {FLOAT16_REASON.format(op="LSTM")}
    after, count = apply(loop_scan.widened_rules(TARGET), model)
    assert count == 2
    counts = op_counts(after)
    assert counts["Loop"] == 0 and counts["LSTM"] == 2 and counts["ReverseSequence"] == 0
    directions = sorted(
        onnx.helper.get_attribute_value(a)
        for n in recurrent_nodes(after)
        for a in n.attribute
        if a.name == "direction"
    )
    assert directions == [b"forward", b"reverse"]
    rng = np.random.default_rng(0)
    for batch in (1, 3):  # not 0: ONNX Runtime aborts the process on an LSTM of batch 0
        feeds = {"image": rng.random((batch, 40, 30, 1), dtype=np.float32)}
        expected, actual = runtime.run(model, feeds), runtime.run(after, feeds)
        assert expected[0].shape == actual[0].shape == (batch, 7, 11)
        assert runtime.max_abs_diff(expected, actual) < 2e-3  # logits of size ~12
        assert (expected[0].argmax(-1) == actual[0].argmax(-1)).all()
    merged = rnn_rewrite_rules.rewrite(after)
    assert op_counts(merged)["LSTM"] == 1 and op_counts(merged)["Cast"] < counts["Cast"]
    (node,) = recurrent_nodes(merged)
    assert {a.name: a.s for a in node.attribute}["direction"] == b"bidirectional"
    for batch in (1, 3):
        feeds = {"image": rng.random((batch, 40, 30, 1), dtype=np.float32)}
        after_out, merged_out = runtime.run(after, feeds), runtime.run(merged, feeds)
        assert runtime.max_abs_diff(after_out, merged_out) < 1e-5  # float32 either way


@pytest.mark.parametrize(("cell", "form"), list(itertools.product(RNN_OPS, ALL_FORMS)))
def test_initial_states_from_graph_inputs(cell: str, form: str) -> None:
    """States fed by the caller have a batch not proven X's: X and the states are expanded
    to the batch they broadcast to, as the body's arithmetic does; equal wherever the
    original runs (a state batch of 1 against X's, or X's 1 against the state's)."""
    spec = _spec(cell=cell, form=form, state_inputs=True, outputs=("y", "h"))
    model = build_loop_model(spec)
    after, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 1 and op_counts(after)["Expand"] >= 2
    compared = 0
    for batch, state_batch in ((3, 3), (2, 2), (3, 1), (1, 3)):
        feeds = loop_inputs(spec, batch, state_batch=state_batch)
        try:
            expected = runtime.run(model, feeds)
        except Exception:  # ONNX Runtime's Loop/Scan refuses some broadcasts
            continue
        diff = runtime.max_abs_diff(expected, runtime.run(after, feeds))
        assert diff < 1e-5, f"batch={batch} state batch={state_batch}: {diff}"
        compared += 1
    assert compared >= 2


# --- what --check and the report say of a Loop left alone -------------------------------


def test_check_names_a_recurrent_loop_left_alone_and_why(tmp_path, capsys) -> None:
    from rnn_rewrite_rules.cli import ExitCode, main

    path = tmp_path / "f16.onnx"
    onnx.save(build_loop_model(_spec(float16=True)), path)
    assert main([str(path), "--check"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "Loop/Scan recurrences not rewritten (1):" in out
    assert "[loop-recurrence] Loop" in out
    assert FLOAT16_REASON.format(op="LSTM") in " ".join(out.split())
    assert "node has 7 outputs" not in out and "no RNN, LSTM or GRU node" not in out
    # written as asked (a recurrence was found, just not rewritten)
    assert main([str(path), "-o", str(tmp_path / "out.onnx"), "-q"]) == ExitCode.OK
    # once rewritten, nothing is left to name
    onnx.save(build_loop_model(_spec()), path)
    assert main([str(path), "--check"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "Loop/Scan recurrences not rewritten" not in out
    # the Loop's constant trip count of 6 over a dynamic axis: the node reads Slice(x, 0, 6),
    # as frozen as the Loop was (which the Loop's body hid from the check)
    assert "after the rewrite: 1 remain (frozen-axis x1)" in out
    assert "constant window 0..5" in out


def test_a_loop_without_a_cell_is_no_recurrence() -> None:
    """A Loop carrying a counter and adding to it is not a recurrent cell."""
    from rnn_rewrite_rules import diagnostics

    body = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Identity", ["cond"], ["cond_out"]),
            onnx.helper.make_node("Add", ["acc", "acc"], ["acc_out"]),
        ],
        "body",
        [
            onnx.helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
            onnx.helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
            onnx.helper.make_tensor_value_info("acc", onnx.TensorProto.FLOAT, [2]),
        ],
        [
            onnx.helper.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []),
            onnx.helper.make_tensor_value_info("acc_out", onnx.TensorProto.FLOAT, [2]),
        ],
    )
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
        "g",
        [
            onnx.helper.make_tensor_value_info("n", onnx.TensorProto.INT64, []),
            onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2]),
        ],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    model = ir.serde.deserialize_model(onnx.helper.make_model(graph))
    assert diagnostics.find_hazards(model) == []


@pytest.mark.parametrize("cell", RNN_OPS)
def test_portable_keeps_an_rnn_cell_loop(cell: str) -> None:
    """The portable target never emits ``RNN`` (rten has none); LSTM and GRU it does."""
    model = build_loop_model(_spec(cell=cell, form="keras"))
    _, count = apply(loop_scan.make_rules("portable"), model)
    reasons = set(refusal_reasons(loop_scan.make_rules("portable"), model))
    reasons -= _count_refusals(model)
    if cell == "RNN":
        assert count == 0
        assert reasons == {"rten has no RNN op (target 'portable')"}
    else:
        assert count == 1


def _trip_count_round_trip(model: onnx.ModelProto, narrow: int) -> onnx.ModelProto:
    """The trip count (X's length) cast to ``narrow`` and back to int64, as tf2onnx
    computes shapes in int32."""
    nodes = list(model.graph.node)
    (gather,) = [n for n in nodes if n.output[0] == "trips"]
    gather.output[0] = "trips_wide"
    casts = [
        onnx.helper.make_node("Cast", ["trips_wide"], ["trips_narrow"], to=narrow),
        onnx.helper.make_node("Cast", ["trips_narrow"], ["trips"], to=onnx.TensorProto.INT64),
    ]
    del model.graph.node[:]
    for node in nodes:
        model.graph.node.append(node)
        if node is gather:
            model.graph.node.extend(casts)
    return model


def test_a_trip_count_round_tripped_through_int32_is_x_s_length(tmp_path) -> None:
    """``Cast(int64 -> int32 -> int64)`` of X's length is that length wherever the node
    runs (below ``2**31``): the prover's narrowed size (``ShapeProver.narrowed_from``)."""
    spec = _spec(form="torch", trip_count="length")
    model = _trip_count_round_trip(build_loop_model(spec), onnx.TensorProto.INT32)
    after, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 1 and not op_counts(after)["Loop"]
    _assert_same_down_to_zero_steps(model, after, spec, tmp_path)


def test_a_trip_count_round_tripped_through_int16_is_refused() -> None:
    """An int16 round trip wraps at 32768 steps, a length the node runs: not X's length."""
    spec = _spec(form="torch", trip_count="length")
    model = _trip_count_round_trip(build_loop_model(spec), onnx.TensorProto.INT16)
    _, count = apply(loop_scan.make_rules(TARGET), model)
    assert count == 0
    reasons = set(refusal_reasons(loop_scan.make_rules(TARGET), model)) - _count_refusals(model)
    assert reasons == {"the trip count is neither a constant nor X's length"}

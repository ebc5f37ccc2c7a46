"""``normalize.LoopConditionPass`` and the Loops it lets ``LoopToRnn`` read: tf2onnx's
``while_loop`` (Keras 3 GRU) with its conditions ``time < T and counter < T``.

tf2onnx 1.17 compares in float32 (``Cast`` of both sides): exact only below ``2**24``, so
with ``T`` the run-time length the pass replaces the trip count by the count of steps the
float condition lets run (``ReduceSum`` of ``float(j) < float(T)``), checked against the
Loop's semantics beyond ``2**24`` too. The same file with its comparisons in int64
(``_integer_conditions``) or with a constant length (``_constant_length``) is proven
without a count: the pass alone keeps the outputs, and the rewrite gives one GRU, equal at
several sizes, 0 steps included.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.printer
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.normalize import Journal, LoopConditionPass
from rnn_rewrite_rules.normalize.loop_condition import condition_refusal
from rnn_rewrite_rules.rules import loop_scan
from tests.reasons import refusal_reasons
from tests.support import op_counts

DATA = Path(__file__).parent / "data" / "exporters" / "tf2onnx"
#: Keras GRU and SimpleRNN Loops, each with its float32 conditions.
KERAS_LOOPS = ["gru_sequences", "gru_last", "gru_reset_before", "gru_go_backwards"]
KERAS_LOOPS += ["simplernn_sequences", "stack_gru_gru", "bidirectional_gru_concat"]
SIZES = [(2, 5), (1, 1), (3, 7), (2, 0)]


def _load(name: str) -> onnx.ModelProto:
    return onnx.load(str(DATA / f"{name}.onnx"))


def _loop(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "Loop")


def _body(model: onnx.ModelProto) -> onnx.GraphProto:
    return _loop(model).attribute[0].g


def _integer_conditions(model: onnx.ModelProto) -> onnx.ModelProto:
    """The body's conditions compared in int64 instead of float32 (each ``Cast`` feeding a
    ``Less`` in a body casts to int64: every value of the int32 and int64 operands kept)."""
    for node in model.graph.node:
        if node.op_type != "Loop":
            continue
        body = node.attribute[0].g
        compared = {name for n in body.node if n.op_type == "Less" for name in n.input}
        for inner in body.node:
            if inner.op_type == "Cast" and inner.output[0] in compared:
                inner.attribute[0].i = TensorProto.INT64
    return model


def _constant_length(model: onnx.ModelProto, steps: int) -> onnx.ModelProto:
    """``x`` declared with ``steps`` steps and the length tf2onnx reads from its shape
    (``strided_slice_3``, the Squeeze after ``Shape -> Cast -> Slice``) a constant."""
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = steps
    loop = _loop(model)
    length = loop.input[4]  # the carried copy of T starts from it
    index = next(i for i, n in enumerate(model.graph.node) if n.output[0] == length)
    constant = helper.make_node(
        "Constant", [], [length], value=numpy_helper.from_array(np.array(steps, np.int32))
    )
    model.graph.node[index].CopyFrom(constant)
    return model


def _feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, seq, 6)).astype(np.float32)}


def _assert_equal(before: onnx.ModelProto, after: onnx.ModelProto, sizes=SIZES) -> None:
    for seed, (batch, seq) in enumerate(sizes):
        try:
            expected = runtime.run(before, _feeds(batch, seq, seed))
        except Exception:  # the original fails here (Keras' last step of no step)
            assert seq == 0
            continue
        actual = runtime.run(after, _feeds(batch, seq, seed))
        for want, got in zip(expected, actual, strict=True):
            assert got.shape == want.shape, (batch, seq)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str((batch, seq)))


def _normalized(model: onnx.ModelProto, journal: Journal | None = None) -> ir.Model:
    ir_model = ir.serde.deserialize_model(model)
    LoopConditionPass(journal)(ir_model)
    return ir_model


def _conditions(model: ir.Model) -> tuple[str, str]:
    """What the Loop's first condition and its body's condition are computed by."""
    loop = next(n for n in model.graph if n.op_type == "Loop")
    body = loop.attributes["body"].as_graph()
    first, cond_out = loop.inputs[1], body.outputs[0]
    return first.producer().op_type, cond_out.producer().op_type


def test_integer_conditions_become_constant_true_and_keep_the_outputs() -> None:
    model = _integer_conditions(_load("gru_sequences"))
    normalized = _normalized(model)
    assert _conditions(normalized) == ("Constant", "Identity")
    after = ir.serde.serialize_model(normalized)
    onnx.checker.check_model(after)
    _assert_equal(model, after, [*SIZES, (0, 3)])


@pytest.mark.parametrize(
    ("name", "integer", "loops"),
    [
        ("gru_sequences", True, 1),
        ("gru_sequences", False, 1),  # float32: a step count as trip count, taken out
        ("gru_initial_state", False, 1),  # Less(0.0, T) alone reads its 0.0
        ("bidirectional_simplernn_concat", False, 2),  # two Loops share T and conditions
    ],
    ids=["integer", "float32", "float32_own_zero", "two_loops_sharing"],
)
@pytest.mark.parametrize("cleanup", [False, True], ids=["as_left", "after_cleanup"])
def test_the_journal_puts_the_conditions_back(cleanup, name, integer, loops) -> None:
    """Also after a cleanup removed the nodes that computed only the conditions and the
    trip count, and the initializers only they read (as one does after a round where a
    rule fired elsewhere); a value two Loops read is put back before the first."""
    model = _load(name)
    if integer:
        model = _integer_conditions(model)
    journal = Journal()
    normalized = _normalized(model, journal)
    if cleanup:
        before = len(list(ir.traversal.RecursiveGraphIterator(normalized.graph)))
        ir.passes.common.RemoveUnusedNodesPass()(normalized)
        after = len(list(ir.traversal.RecursiveGraphIterator(normalized.graph)))
        assert after < before  # the conditions' nodes were removed
        for graph in (normalized.graph, *_bodies(normalized)):  # and unread initializers
            for key, value in list(graph.initializers.items()):
                if not value.uses() and not value.is_graph_output():
                    graph.initializers.pop(key)
    assert journal.restore() == loops
    assert _conditions(normalized) == ("And", "And")
    restored = ir.serde.serialize_model(normalized).graph
    written = ir.serde.serialize_model(ir.serde.deserialize_model(model)).graph
    if cleanup:  # the nodes put back stand right before their reader: the same lines
        lines = [
            sorted(onnx.printer.to_text(_without_value_info(g)).splitlines())
            for g in (restored, written)
        ]
        assert lines[0] == lines[1]
    else:
        assert _without_value_info(restored) == _without_value_info(written)


def _bodies(model: ir.Model) -> list[ir.Graph]:
    return [
        attr.as_graph()
        for node in ir.traversal.RecursiveGraphIterator(model.graph)
        for attr in node.attributes.values()
        if attr.type == ir.AttributeType.GRAPH
    ]


def _without_value_info(graph: onnx.GraphProto) -> onnx.GraphProto:
    """``graph`` as its nodes compute it (a copy without value_info, initializers by
    name, subgraphs too)."""
    copy = onnx.GraphProto()
    copy.CopyFrom(graph)
    pending = [copy]
    while pending:
        current = pending.pop()
        del current.value_info[:]
        initializers = sorted(current.initializer, key=lambda t: t.name)  # order: no meaning
        del current.initializer[:]
        current.initializer.extend(initializers)
        for node in current.node:
            pending.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
    return copy


@pytest.mark.parametrize("name", KERAS_LOOPS)
def test_float_conditions_against_the_run_time_length_become_a_step_count(name) -> None:
    """tf2onnx 1.17's own files: each Loop's trip count becomes the count of steps its
    float32 condition lets run, the conditions constant true; the outputs stay."""
    model = _load(name)
    normalized = _normalized(model)
    loops = [n for n in normalized.graph if n.op_type == "Loop"]
    assert loops
    for loop in loops:
        assert loop.inputs[0].producer().op_type == "ReduceSum"
        assert loop.inputs[1].producer().op_type == "Constant"
        assert loop.attributes["body"].as_graph().outputs[0].producer().op_type == "Identity"
    after = ir.serde.serialize_model(normalized)
    onnx.checker.check_model(after)
    _assert_equal(model, after, [*SIZES, (1, 33)])


def test_float_conditions_against_a_constant_length_are_proven() -> None:
    model = _constant_length(_load("gru_sequences"), 5)
    normalized = _normalized(model)
    assert _conditions(normalized) == ("Constant", "Identity")
    after = rnn_rewrite_rules.rewrite(model)
    counts = op_counts(after)
    assert counts["GRU"] == 1 and not counts["Loop"], counts
    _assert_equal(model, after, [(2, 5), (1, 5), (4, 5)])


def test_float_conditions_against_a_declared_length_are_proven() -> None:
    """``x`` declared with 5 steps: the length tf2onnx computes from its shape is 5 (a
    fact of the main graph's input), so the float32 comparisons are exact."""
    model = _load("gru_sequences")
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 5
    assert _conditions(_normalized(model)) == ("Constant", "Identity")
    after = rnn_rewrite_rules.rewrite(model)
    counts = op_counts(after)
    assert counts["GRU"] == 1 and not counts["Loop"] and not counts["If"], counts
    _assert_equal(model, after, [(2, 5), (1, 5), (4, 5)])


@pytest.mark.parametrize("conditions", ["integer", "float32"])
@pytest.mark.parametrize(
    "name", ["gru_sequences", "gru_last", "gru_reset_before", "gru_go_backwards", "gru_state"]
)
def test_keras_gru_loops_become_one_gru(name, conditions) -> None:
    """With integer conditions or as exported (float32: over the counted steps), each
    Keras GRU Loop (``reset_after`` true and false, ``go_backwards``, ``return_state``) is
    one GRU in a zero-step guard, smaller than the Loop, equal at every size (0 steps: the
    guard's other branch)."""
    model = _load(name)
    if conditions == "integer":
        model = _integer_conditions(model)
    after = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(after)
    ops = collect_ops(after)
    assert ops.count("GRU") == 1 and ops.count("Loop") == 1, ops  # the Loop runs no step
    assert len(ops) < len(collect_ops(model)), (len(collect_ops(model)), len(ops))
    _assert_equal(model, after)


def collect_ops(model: onnx.ModelProto) -> list[str]:
    """Every node's op, subgraphs included."""
    ops: list[str] = []
    pending = [model.graph]
    while pending:
        graph = pending.pop()
        for node in graph.node:
            ops.append(node.op_type)
            pending.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
    return ops


def _edit_body_less(model: onnx.ModelProto, edit) -> onnx.ModelProto:
    """``edit(body, less)`` on the body's ``Less`` whose first operand is the next time."""
    body = _body(model)
    casts = {n.output[0]: n for n in body.node if n.op_type == "Cast"}
    for node in body.node:
        cast = casts.get(node.input[0]) if node.op_type == "Less" else None
        if cast is not None and cast.input[0].endswith("Identity_2:0"):
            edit(body, node)
            return model
    raise AssertionError("no Less(time + 1, T)")


def _two_ahead(body: onnx.GraphProto, less: onnx.NodeProto) -> None:
    """``Less(time + 2, T)``: false after the last step but one."""
    body.initializer.append(numpy_helper.from_array(np.array(1, np.int64), "one_more"))
    body.node.append(helper.make_node("Add", [less.input[0], "one_more"], ["two_ahead"]))
    less.input[0] = "two_ahead"
    _sort(body)


def _bound_computed(body: onnx.GraphProto, less: onnx.NodeProto) -> None:
    """``Less(time + 1, T - 1)``, ``T - 1`` computed in the body."""
    body.initializer.append(numpy_helper.from_array(np.array(1, np.int64), "one_less"))
    body.node.append(helper.make_node("Sub", [less.input[1], "one_less"], ["t_minus_1"]))
    less.input[1] = "t_minus_1"
    _sort(body)


def _bound_is_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """The outer ``Less(0, T)`` against the batch (``strided_slice`` of ``Shape(x)``)."""
    batch = next(n for n in model.graph.node if n.name == "functional_1/gru_1/strided_slice")
    squeeze = helper.make_node("Squeeze", [batch.output[0], "const_axes__36"], ["batch_scalar"])
    cast = helper.make_node("Cast", ["batch_scalar"], ["batch_float"], to=TensorProto.FLOAT)
    less = next(n for n in model.graph.node if n.op_type == "Less")
    less.input[1] = "batch_float"
    model.graph.node.extend([squeeze, cast])
    _sort(model.graph)
    return model


def _starts_at_one(model: onnx.ModelProto) -> onnx.ModelProto:
    """The outer ``Less(1, T)``: false at ``T`` 1, where the Loop would run one step."""
    model.graph.initializer.append(numpy_helper.from_array(np.array(1, np.float32), "one_f"))
    less = next(n for n in model.graph.node if n.op_type == "Less")
    less.input[0] = "one_f"
    return model


def _sort(graph: onnx.GraphProto) -> None:
    """Topological order (new nodes were appended after their readers)."""
    produced = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    outer = {name for n in graph.node for name in n.input} - {
        o for n in graph.node for o in n.output
    }
    produced |= outer  # values of the scopes around
    pending, ordered = list(graph.node), []
    while pending:
        ready = [n for n in pending if all(not i or i in produced for i in n.input)]
        assert ready, "a cycle"
        for node in ready:
            ordered.append(node)
            produced.update(node.output)
            pending.remove(node)
    del graph.node[:]
    graph.node.extend(ordered)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda m: _edit_body_less(m, _two_ahead), "ends before its trip count"),
        (lambda m: _edit_body_less(m, _bound_computed), "compares with a value it computes"),
        (_bound_is_batch, "initial condition is not against its trip count"),
        (_starts_at_one, "may not start"),
    ],
    ids=["two_ahead", "bound_computed", "bound_is_batch", "starts_at_one"],
)
def test_near_misses_keep_their_conditions(edit, reason) -> None:
    model = edit(_integer_conditions(_load("gru_sequences")))
    onnx.checker.check_model(model)
    ir_model = ir.serde.deserialize_model(model)
    loop = next(n for n in ir_model.graph if n.op_type == "Loop")
    refused = condition_refusal(loop)
    assert refused is not None and reason in refused
    assert "functional_1/gru_1/while_loop" in refused  # the reason names the Loop
    assert not LoopConditionPass()(ir_model).modified
    after = rnn_rewrite_rules.rewrite(model)
    assert op_counts(after)["Loop"] == 1 and not op_counts(after)["GRU"]
    _assert_equal(model, after, [(2, 5), (1, 1)])


@pytest.mark.parametrize("name", ["gru_masking", "simplernn_masking", "lstm_masking"])
def test_masked_loops_are_refused_naming_the_mask(name) -> None:
    """Keras ``Masking``: the body keeps the state where a per-step mask is false, so steps
    may be skipped mid-sequence; refused naming the mask, with integer conditions too."""
    for model in (_load(name), _integer_conditions(_load(name))):
        reasons = refusal_reasons(loop_scan.make_rules("onnxruntime"), model)
        assert any("reads a mask per step (functional_1/" in r for r in reasons), reasons
        after = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
        assert op_counts(after)["Loop"] == 1


def _float_body_less(model: onnx.ModelProto) -> tuple[onnx.GraphProto, onnx.NodeProto]:
    """The body and its ``Cast(time + 1 -> float)`` feeding ``Less(., Cast(T))``."""
    body = _body(model)
    cast = next(n for n in body.node if n.op_type == "Cast" and n.input[0].endswith("Identity_2:0"))
    return body, cast


def _float_bound_is_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """``Less(float(time + 1), float(batch))``: compared with the batch, not the length."""
    batch = next(n for n in model.graph.node if n.name == "functional_1/gru_1/strided_slice")
    model.graph.node.append(
        helper.make_node("Squeeze", [batch.output[0], "const_axes__36"], ["batch_scalar"])
    )
    _sort(model.graph)
    body, cast = _float_body_less(model)
    less = next(n for n in body.node if n.op_type == "Less" and n.input[0] == cast.output[0])
    bound = next(n for n in body.node if n.output[0] == less.input[1])
    bound.input[0] = "batch_scalar"
    return model


def _float_decreasing(model: onnx.ModelProto) -> onnx.ModelProto:
    """``Less(float(-(time + 1)), float(T))``: true on every step, not monotone falling."""
    body, cast = _float_body_less(model)
    body.node.append(helper.make_node("Neg", [cast.input[0]], ["minus_next"]))
    cast.input[0] = "minus_next"
    _sort(body)
    return model


def _float_two_ahead(model: onnx.ModelProto) -> onnx.ModelProto:
    """``Less(float(time + 2), float(T))``: false after the last step but one."""
    body, cast = _float_body_less(model)
    body.initializer.append(numpy_helper.from_array(np.array(1, np.int32), "one_more"))
    body.node.append(helper.make_node("Add", [cast.input[0], "one_more"], ["two_ahead"]))
    cast.input[0] = "two_ahead"
    _sort(body)
    return model


def _float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The body compares in float16 (exact below 2**11), which ONNX Runtime runs in
    float32 (it has no float16 Less)."""
    for node in _body(model).node:
        if node.op_type == "Cast" and node.attribute[0].i == TensorProto.FLOAT:
            readers = [n for n in _body(model).node if node.output[0] in n.input]
            if all(n.op_type == "Less" for n in readers):
                node.attribute[0].i = TensorProto.FLOAT16
    return model


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (_float_bound_is_batch, "exact only below 2**24, and its bound is not a constant"),
        (_float_decreasing, "reads more than the step number"),
        (_float_two_ahead, "ends before its trip count"),
        (_float16, "compares in float16"),
    ],
    ids=["bound_is_batch", "decreasing", "two_ahead", "float16"],
)
def test_float_near_misses_keep_their_conditions(edit, reason) -> None:
    """tf2onnx's float32 conditions edited so the steps they let run are not the count
    of ``float(k + 1) < float(T)`` against the trip count: each refused, named, kept."""
    model = edit(_load("gru_sequences"))
    onnx.checker.check_model(model)
    ir_model = ir.serde.deserialize_model(model)
    loop = next(n for n in ir_model.graph if n.op_type == "Loop")
    refused = condition_refusal(loop)
    assert refused is not None and reason in refused, refused
    assert "functional_1/gru_1/while_loop" in refused
    assert not LoopConditionPass()(ir_model).modified
    after = rnn_rewrite_rules.rewrite(model)
    assert op_counts(after)["Loop"] == 1 and not op_counts(after)["GRU"]
    _assert_equal(model, after, [(2, 5), (1, 1)])


def _counting_loop() -> onnx.ModelProto:
    """tf2onnx's while_loop with nothing but its counters: ``T`` (int32) an input, the
    conditions ``Less(0.0, float(T))`` and ``float(i) < float(T) and float(t + 1) <
    float(T)``; the output stacks ``t``, so its length is the steps run."""
    scalar = []

    def value(name: str, elem: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, scalar)

    cast = TensorProto.FLOAT
    body = helper.make_graph(
        [
            helper.make_node("Add", ["t", "one"], ["t1"]),
            helper.make_node("Cast", ["i"], ["i_f"], to=cast),
            helper.make_node("Cast", ["T"], ["T_f_outer"], to=cast),
            helper.make_node("Less", ["i_f", "T_f_outer"], ["by_counter"]),
            helper.make_node("Cast", ["t1"], ["t1_f"], to=cast),
            helper.make_node("Cast", ["T_in"], ["T_in_f"], to=cast),
            helper.make_node("Less", ["t1_f", "T_in_f"], ["by_time"]),
            helper.make_node("And", ["by_counter", "by_time"], ["cond_out"]),
            helper.make_node("Identity", ["t"], ["t_scan"]),
        ],
        "body",
        [
            value("i", TensorProto.INT64),
            value("cond_in", TensorProto.BOOL),
            value("t", TensorProto.INT32),
            value("T_in", TensorProto.INT32),
        ],
        [
            value("cond_out", TensorProto.BOOL),
            value("t1", TensorProto.INT32),
            value("T_in_out", TensorProto.INT32),
            helper.make_tensor_value_info("t_scan", TensorProto.INT32, None),
        ],
        [numpy_helper.from_array(np.array(1, np.int32), "one")],
    )
    body.node.append(helper.make_node("Identity", ["T_in"], ["T_in_out"]))
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["T"], ["T_f"], to=cast),
            helper.make_node("Less", ["zero_f", "T_f"], ["started"]),
            helper.make_node("And", ["started", "started"], ["first"]),
            helper.make_node("Cast", ["T"], ["M"], to=TensorProto.INT64),
            helper.make_node(
                "Loop", ["M", "first", "t0", "T"], ["t_last", "T_last", "ts"], body=body
            ),
        ],
        "counting_loop",
        [value("T", TensorProto.INT32)],
        [helper.make_tensor_value_info("ts", TensorProto.INT32, [None])],
        [
            numpy_helper.from_array(np.array(0.0, np.float32), "zero_f"),
            numpy_helper.from_array(np.array(0, np.int32), "t0"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _steps_of_the_loop(length: int) -> int:
    """The steps ``_counting_loop`` runs at ``T = length`` by the Loop's semantics: step 0
    when ``M >= 1`` and ``0.0 < float(T)``, step ``j >= 1`` while ``j < M`` and the
    condition after step ``j - 1``, ``float(j - 1) < float(T) and float(j) < float(T)``,
    holds. Evaluated over the last 300 steps; before them every float is below
    ``float(T)`` (asserted), and the condition is monotone."""
    bound = np.float32(length)
    if length < 1 or not np.float32(0) < bound:
        return 0
    first = max(1, length - 300)
    assert first == 1 or np.float32(first) < bound
    j = np.arange(first, length, dtype=np.int64)
    runs = (j.astype(np.float32) < bound) & ((j - 1).astype(np.float32) < bound)
    stops = np.flatnonzero(~runs)
    return int(j[stops[0]]) if stops.size else length


def test_the_step_count_is_the_steps_the_float_condition_lets_run() -> None:
    """At small lengths the normalised Loop stacks what the original does; beyond
    ``2**24``, where ``float(T)`` rounds and the original stops early (``T = 2**24 + 1``
    runs ``2**24`` steps, ``2**24 + 5`` runs ``2**24 + 3``), the count the pass writes
    is the steps the Loop runs."""
    model = _counting_loop()
    onnx.checker.check_model(model)
    ir_model = ir.serde.deserialize_model(model)
    assert LoopConditionPass()(ir_model).modified
    after = ir.serde.serialize_model(ir_model)
    onnx.checker.check_model(after)
    for length in (0, 1, 2, 5, 64):
        feeds = {"T": np.array(length, np.int32)}
        (want,), (got,) = runtime.run(model, feeds), runtime.run(after, feeds)
        np.testing.assert_array_equal(got, want)
        assert len(got) == _steps_of_the_loop(length) == length
    loop = next(n for n in after.graph.node if n.op_type == "Loop")
    count = onnx.ModelProto()
    count.CopyFrom(after)
    count.graph.node.remove(next(n for n in count.graph.node if n.op_type == "Loop"))
    del count.graph.output[:]
    count.graph.output.append(helper.make_tensor_value_info(loop.input[0], TensorProto.INT64, []))
    for length in (2**24 - 1, 2**24 + 1, 2**24 + 5):
        (steps,) = runtime.run(count, {"T": np.array(length, np.int32)})
        assert int(steps) == _steps_of_the_loop(length), length
    assert _steps_of_the_loop(2**24 + 1) == 2**24 and _steps_of_the_loop(2**24 + 5) == 2**24 + 3


def _counted(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` after ``LoopConditionPass``: its Loops over a count of steps."""
    return ir.serde.serialize_model(_normalized(model))


def _sum_of_steps(model: onnx.ModelProto) -> onnx.ModelProto:
    """The count's ``Cast`` reads the steps themselves: a sum of step numbers."""
    cast = next(n for n in model.graph.node if n.name.endswith("step_count/ones"))
    cast.input[0] = next(n for n in model.graph.node if n.name.endswith("step_count/Cast")).output[
        0
    ]
    cast.attribute[0].i = TensorProto.INT64
    return model


def _kept_elements(model: onnx.ModelProto) -> onnx.ModelProto:
    """``ReduceSum(noop_with_empty_axes=1)``: no axes means no reduction."""
    node = next(n for n in model.graph.node if n.op_type == "ReduceSum")
    node.attribute.append(helper.make_attribute("noop_with_empty_axes", 1))
    return model


@pytest.mark.parametrize("edit", [_sum_of_steps, _kept_elements], ids=["sum", "no_reduction"])
def test_a_trip_count_that_is_not_a_count_is_refused(edit) -> None:
    """``LoopToRnn`` reads ``X[0:n]`` only for a trip count ``n`` that counts booleans."""
    model = edit(_counted(_load("gru_sequences")))
    reasons = refusal_reasons(loop_scan.make_rules(), model)
    assert "the trip count is neither a constant nor X's length" in reasons, reasons
    assert op_counts(rnn_rewrite_rules.rewrite(model))["Loop"] == 1
    counted = _counted(_load("gru_sequences"))  # the near miss's twin: one guarded GRU
    after = rnn_rewrite_rules.rewrite(counted)
    assert not op_counts(after)["Loop"] and op_counts(after)["If"] == 1
    _assert_equal(_load("gru_sequences"), after)


def test_without_the_pass_the_rule_says_the_pass_makes_the_condition_true() -> None:
    """The rules alone (no normalisation) on tf2onnx's float32 conditions: refused, the
    reason naming the pass that would make them true (none of its refusals applies)."""
    reasons = refusal_reasons(loop_scan.make_rules(), _load("gru_sequences"))
    assert any("normalize.LoopConditionPass makes it one" in r for r in reasons), reasons

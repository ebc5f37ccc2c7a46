"""The ``one_step`` family: one streaming step written as plain ops -> one RNN node."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules._streaming import frame_feeds
from rnn_rewrite_rules.passes.batch_zero_guard import guarded_branch
from rnn_rewrite_rules.rules import one_step, select_rules
from rnn_rewrite_rules.testing.one_step import StepConfig, build_step, step_feeds
from tests.reasons import refusal_reasons
from tests.support import op_counts, running_nodes

DATA = pathlib.Path(__file__).parent / "data" / "exporters"
IGNORE = costs.Context(ignore=True)


def _rewrite(model: onnx.ModelProto, target: str = "onnxruntime", context=None):
    return rnn_rewrite_rules.rewrite(
        model, context=context or costs.Context(ignore=True), target=target
    )


def _assert_same(before: onnx.ModelProto, after: onnx.ModelProto, batches=(1, 3)) -> None:
    for batch in batches:
        feeds = step_feeds(before, batch, seed=batch)
        diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
        assert diff <= 1e-5, f"batch {batch}: {diff}"


def _assert_same_at_zero(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    """Batch 0 in ``onnx.reference`` (ONNX Runtime's LSTM/GRU abort the process there)."""
    feeds = step_feeds(before, 0)
    expected = ReferenceEvaluator(before).run(None, feeds)
    actual = ReferenceEvaluator(after).run(None, feeds)
    assert [a.shape for a in actual] == [e.shape for e in expected]


CASES = [
    (op, activation, batch)
    for op, activation in [
        ("LSTM", "Tanh"),
        ("GRU", "Tanh"),
        ("RNN", "Tanh"),
        ("RNN", "Relu"),
        ("RNN", "Sigmoid"),
    ]
    for batch in (1, 3)
] + [("GRU", "Tanh", "batch")]  # symbolic batches: the broadcast form and the batch-0 guard


@pytest.mark.parametrize(("op", "activation", "batch"), CASES)
def test_a_step_becomes_one_node_with_equal_outputs(op, activation, batch) -> None:
    """A symbolic batch: the GRU step with MatMul + Add projections (16 nodes), which the
    node, the broadcast and the batch-0 guard (16) do not outgrow."""
    symbolic = isinstance(batch, str)
    cfg = StepConfig(op_type=op, batch=batch, activation=activation, gemm=not symbolic)
    before = build_step(cfg)
    after = _rewrite(before)
    counts = op_counts(after)
    assert counts[op] == 1
    assert counts["Gemm"] == 0 and counts["Split"] == 0 and counts["MatMul"] == 0
    assert sum(guarded_branch(n) is not None for n in after.graph.node) == int(symbolic)
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]
    node = next(n for n in running_nodes(after) if n.op_type == op)
    written = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if op == "RNN" and activation != "Tanh":
        assert written["activations"] == [activation.encode()]
    else:
        assert "activations" not in written  # the op's defaults
    if op == "GRU":
        assert written["linear_before_reset"] == 1
    batches = (1, 3) if isinstance(batch, str) else (batch,)
    _assert_same(before, after, batches)
    if isinstance(batch, str) and activation == "Tanh":  # onnx.reference's RNN: Tanh only
        _assert_same_at_zero(before, after)
    # the two forms: the node alone for a static batch, Expands for symbolic ones
    assert (counts["Expand"] > 0) == isinstance(batch, str)


@pytest.mark.parametrize(
    ("op", "nodes"), [("LSTM", "23 nodes, the step 13"), ("RNN", "12 nodes, the step 4")]
)
def test_a_broadcast_larger_than_the_step_is_refused(op, nodes) -> None:
    """Batches not proven equal (each input its own ``dim_param``): the Expands would make
    the rewrite larger than the step."""
    model = build_step(StepConfig(op_type=op))
    reasons = refusal_reasons(one_step.make_rules("onnxruntime"), model, IGNORE)
    assert any("not proven equal" in r and nodes in r for r in reasons), reasons
    assert op_counts(_rewrite(model))[op] == 0


def test_a_states_batch_of_one_is_broadcast_as_the_ops_broadcast_it() -> None:
    before = build_step(StepConfig(op_type="GRU", gemm=False))
    before.graph.input[1].type.tensor_type.shape.dim[0].dim_param = "state_batch"
    after = _rewrite(before)
    assert op_counts(after)["GRU"] == 1
    feeds = step_feeds(before, 3)
    feeds["h"] = feeds["h"][:1]
    diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
    assert diff <= 1e-5


def test_rewriting_twice_equals_once() -> None:
    once = _rewrite(build_step(StepConfig(op_type="GRU", batch=1)))
    twice = _rewrite(once)
    assert once.graph.SerializeToString() == twice.graph.SerializeToString()


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_a_relu_step_is_a_node_on_onnxruntime_and_kept_on_portable(op) -> None:
    """The step's candidate (and the LSTM's output) activation made Relu: ONNX Runtime's
    node computes it; tract computes an LSTM/GRU node's default activations whatever its
    attribute (``tests/test_tract.py`` pins that), so ``portable`` keeps the step."""
    model = build_step(StepConfig(op_type=op, batch=1))
    for node in model.graph.node:
        if node.op_type == "Tanh":
            node.op_type = "Relu"
    after = _rewrite(model)
    node = next(n for n in running_nodes(after) if n.op_type == op)
    written = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    acts = ["Sigmoid", "Relu", "Relu"] if op == "LSTM" else ["Sigmoid", "Relu"]
    assert written["activations"] == [a.encode() for a in acts]
    _assert_same(model, after, (1,))
    assert op_counts(_rewrite(model, target="portable"))[op] == 0
    reasons = refusal_reasons(one_step.make_rules("portable"), model, IGNORE)
    want = f"tract computes {op}'s default activations whatever its activations attribute says"
    want += f" ({acts}; target 'portable')"
    assert any(want in r for r in reasons), reasons


def test_portable_never_emits_rnn() -> None:
    model = build_step(StepConfig(op_type="RNN", batch=1))
    reasons = refusal_reasons(one_step.make_rules("portable"), model, IGNORE)
    assert any("rten has no RNN op" in r for r in reasons), reasons


@pytest.mark.parametrize(
    ("op", "mutation", "reason"),
    [
        ("LSTM", "peephole", "gate f: pc is computed by Mul"),
        ("LSTM", "clip", "clips the cell state"),
        ("LSTM", "gate_read_outside", "is a graph output"),
        ("GRU", "gate_read_outside", "is a graph output"),
        ("LSTM", "float64", "has no float64 LSTM kernel"),
        ("GRU", "float64", "has no float64 GRU kernel"),
    ],
)
def test_what_one_node_cannot_say_is_refused_with_a_reason(op, mutation, reason) -> None:
    model = build_step(StepConfig(op_type=op, batch=1, mutation=mutation))
    reasons = refusal_reasons(one_step.make_rules("onnxruntime"), model, IGNORE)
    assert any(reason in r for r in reasons), reasons
    assert op_counts(_rewrite(model))[op] == 0


def test_an_activation_with_a_parameter_is_left_alone() -> None:
    model = build_step(StepConfig(op_type="RNN", batch=1, mutation="leaky"))
    assert op_counts(_rewrite(model))["RNN"] == 0


def test_a_step_feeding_another_as_its_state_is_left_to_reroll() -> None:
    """Two chained steps (``h_out`` of one is the next one's ``h``): an unrolled chain."""
    step = build_step(StepConfig(op_type="GRU", batch=1))
    second = onnx.compose.add_prefix(step, "s2_")
    chained = onnx.compose.merge_models(step, second, io_map=[("h_out", "s2_h")])
    reasons = refusal_reasons(one_step.make_rules("onnxruntime"), chained, IGNORE)
    assert any("feeds another step as its state" in r for r in reasons), reasons


def test_the_cost_table_decides(tmp_path) -> None:
    """A table saying the node is slower keeps the step, with the reason."""
    slower = costs.CostTable(
        [
            costs.Point("ort", "LSTM", "one_step", "forward", 8, 1, 1, 1.5, 1.4, 1.6),
            costs.Point("ort_noopt", "LSTM", "one_step", "forward", 8, 1, 1, 1.5, 1.4, 1.6),
        ],
        {},
    )
    model = build_step(StepConfig(op_type="LSTM", batch=1))
    reasons = refusal_reasons(
        one_step.make_rules("onnxruntime"), model, costs.Context(table=slower)
    )
    assert any("one step kept as plain ops" in r and "slower" in r for r in reasons), reasons
    assert op_counts(_rewrite(model, context=costs.Context(table=slower)))["LSTM"] == 0


def test_the_family_is_selectable_by_name() -> None:
    assert {str(r.name) for r in select_rules(["one_step"])} == {
        "OneStepCell[LSTM]",
        "OneStepCell[GRU]",
        "OneStepCell[RNN]",
    }


#: file -> the nodes it becomes (cost model ignored, target onnxruntime): torch declares a
#: symbolic batch per input, so every step is guarded against batch 0 and broadcast, and
#: outgrows the step (GRU 16 nodes against 14; the VAD decoder's ``Concat(x, h)`` proves
#: their batches equal, but ``c``'s broadcast and the guard make 17 against 12).
STEP_FILES = {
    "torch_dynamo/grucell_step.onnx": {"GRU": 0},
    "torch_dynamo/grucell_step_h64.onnx": {"GRU": 0},
    "torch_dynamo/streaming_enhancer_cache.onnx": {"GRU": 0},
    "torch_script/grucell_step.onnx": {"GRU": 0},
    "torch_script/grucell_step_h64.onnx": {"GRU": 0},
    "torch_dynamo/lstmcell_step.onnx": {"LSTM": 0},
    "torch_dynamo/lstmcell_step_h64.onnx": {"LSTM": 0},
    "torch_dynamo/rnncell_step_h64.onnx": {"RNN": 0},
    "torch_dynamo/vad_decoder_plain_lstm_step.onnx": {"LSTM": 0},
    "torch_script/lstmcell_step_h64.onnx": {"LSTM": 0},
    "torch_script/vad_decoder_plain_lstm_step.onnx": {"LSTM": 0},
    "torch_script/rnncell_step_h64.onnx": {"RNN": 0},
}


@pytest.mark.parametrize("name", list(STEP_FILES))
def test_exported_steps_before_and_after(name) -> None:
    """The step files in ONNX Runtime at batch 1 and 3, and at 0 in ``onnx.reference``."""
    before = onnx.load(DATA / name)
    after = _rewrite(before)
    counts = op_counts(after)
    assert {op: counts[op] for op in STEP_FILES[name]} == STEP_FILES[name]
    assert len(after.graph.node) <= len(before.graph.node)
    zero = {d.dim_param: 0 for v in before.graph.input for d in v.type.tensor_type.shape.dim}
    feeds = frame_feeds(before, zero)
    expected = ReferenceEvaluator(before).run(None, feeds)
    actual = ReferenceEvaluator(after).run(None, feeds)
    assert [a.shape for a in actual] == [e.shape for e in expected]
    for batch in (1, 3):
        sizes = {
            d.dim_param: batch
            for v in before.graph.input
            for d in v.type.tensor_type.shape.dim
            if d.dim_param
        }
        feeds = frame_feeds(before, sizes, seed=batch)
        diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
        assert diff <= 1e-5, f"{name} batch {batch}: {diff}"


def test_float_state_values_are_unchanged_by_the_batch_broadcast() -> None:
    """The broadcast form at equal batches is exactly the node's (no arithmetic)."""
    before = build_step(StepConfig(op_type="GRU", gemm=False))
    after = _rewrite(before)
    assert op_counts(after)["GRU"] == 1
    feeds = step_feeds(before, 2)
    expected, actual = runtime.run(before, feeds), runtime.run(after, feeds)
    assert all(np.allclose(e, a, atol=1e-6) for e, a in zip(expected, actual, strict=True))


@pytest.mark.parametrize("name", ["lstmcell_step_h64", "rnncell_step_h64"])
def test_exported_steps_at_a_static_batch_become_nodes(name) -> None:
    """The same exports with the batch fixed to 1 (a streaming export at batch 1): the node
    alone, at fewer nodes."""
    before = onnx.load(DATA / "torch_dynamo" / f"{name}.onnx")
    for value in [*before.graph.input, *before.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_value = 1
    after = _rewrite(before)
    op = "LSTM" if name.startswith("lstm") else "RNN"
    assert op_counts(after)[op] == 1
    assert len(after.graph.node) < len(before.graph.node) or op == "RNN"
    feeds = frame_feeds(before, {})
    diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
    assert diff <= 1e-5

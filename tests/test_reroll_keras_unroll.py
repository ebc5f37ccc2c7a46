"""reroll: Keras ``unroll=True`` layers as tf2onnx writes them become one ``GRU`` / ``LSTM``.

The committed exporter files (``tests/data/exporters/tf2onnx/*_unroll.onnx``, Keras 3,
tf2onnx 1.17, input ``[batch, 5, 6]``, units 8): every step reads ``Squeeze(Split(
Transpose(x), axis=0)[t], [0])``, computes the Keras cell (one kernel ``MatMul`` and one
recurrent ``MatMul``, gates ``Split`` or ``Slice``-d per gate from the fused recurrent
projection), and the steps are stacked by ``Concat(Unsqueeze(h_t, 0), ...)``. The zero
states are ``Expand(0, Cast(int64, Concat(Slice(Cast(int32, Shape(x))), [8])))``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules.rules.reroll import RerollCell
from tests.reasons import refusal_reasons
from tests.support import op_counts, running_nodes

DATA = Path(__file__).parent / "data" / "exporters" / "tf2onnx"
SEQ, FEATURES = 5, 6


def _load(layer: str) -> onnx.ModelProto:
    return onnx.load(str(DATA / f"{layer}_unroll.onnx"))


def _feeds(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, SEQ, FEATURES)).astype(np.float32)}


def _assert_same_outputs(original: onnx.ModelProto, rewritten: onnx.ModelProto) -> None:
    """Equal in ONNX Runtime at batch 1 and 3; at batch 0 (where ORT aborts on LSTM/GRU
    nodes) in ``onnx.reference``."""
    for batch in (1, 3):
        feeds = _feeds(batch, batch)
        expected, actual = runtime.run(original, feeds), runtime.run(rewritten, feeds)
        assert [a.shape for a in actual] == [e.shape for e in expected]
        assert runtime.max_abs_diff(expected, actual) <= 1e-5
    feeds = _feeds(0)
    expected = runtime.reference_runner(original).run(feeds)
    actual = runtime.reference_runner(rewritten).run(feeds)
    assert [a.shape for a in actual] == [e.shape for e in expected] == [(0, SEQ, 8)]


@pytest.mark.parametrize(
    ("layer", "target", "after"),
    [
        # + the batch-0 guard's Size, Equal (passes.BatchZeroGuardPass)
        ("gru", "portable", 9),  # + the shared zero state: Shape, Concat, ConstantOfShape
        ("gru", "onnxruntime", 6),
        ("lstm", "onnxruntime", 6),
    ],
)
def test_an_unrolled_keras_layer_becomes_one_node(layer: str, target: str, after: int) -> None:
    original = _load(layer)
    rewritten = rnn_rewrite_rules.rewrite(original, target=target)
    onnx.checker.check_model(rewritten, full_check=True)
    counts = op_counts(rewritten)
    assert counts[layer.upper()] == 1
    assert counts.total() == after, counts
    assert counts["MatMul"] == counts["Split"] == counts["Cast"] == 0
    assert [o.name for o in rewritten.graph.output] == [o.name for o in original.graph.output]
    _assert_same_outputs(original, rewritten)
    again = rnn_rewrite_rules.rewrite(rewritten, target=target)
    assert op_counts(again) == counts


def test_an_unrolled_keras_lstm_stays_unrolled_where_the_table_says_slower() -> None:
    """A table saying OpenVINO's LSTM kernel is slower than the unrolled cells near hidden
    8, seq 5 keeps the proven chain on portable, with the reason."""
    points = [
        costs.Point(runtime_key, "LSTM", form, "forward", 8, seq, batch, 1.5, 1.4, 1.6)
        for runtime_key in ("openvino",)
        for form in costs.FORMS
        for seq in (2, 16)
        for batch in (1, 5)
    ]
    context = costs.Context(table=costs.CostTable(points, {}))
    original = _load("lstm")
    found = refusal_reasons([RerollCell.rule("LSTM", "portable")], original, context)
    assert any(r.startswith("re-roll kept unrolled: hidden 8, seq 5") for r in found), found
    assert op_counts(rnn_rewrite_rules.rewrite(original, context=context))["LSTM"] == 0


def test_an_unrolled_keras_simplernn_is_found_and_kept_on_portable() -> None:
    """SimpleRNN on portable: the chain is proven (the report says why it stays), and kept."""
    original = _load("simplernn")
    found = refusal_reasons([RerollCell.rule("RNN", "portable")], original)
    reason = "re-roll kept unrolled: rten has no RNN op (target 'portable')"
    assert reason in found, found
    assert op_counts(rnn_rewrite_rules.rewrite(original))["RNN"] == 0


def test_an_unrolled_keras_simplernn_becomes_one_rnn_on_onnxruntime_by_the_table() -> None:
    """Hidden 8, seq 5, symbolic batch: ONNX Runtime's RNN kernel measured no slower at
    hidden 8, seq 1 and 16, batch 1 and 5 (costs/measured.json), so the table lets it fire."""
    original = _load("simplernn")
    rewritten = rnn_rewrite_rules.rewrite(original, target="onnxruntime")
    assert op_counts(rewritten)["RNN"] == 1 and len(rewritten.graph.node) == 4
    _assert_same_outputs(original, rewritten)


def test_an_unrolled_keras_simplernn_is_kept_where_the_table_has_no_hidden_8() -> None:
    """The table without its hidden-8 points: hidden 64 stands in, where ONNX Runtime's RNN
    kernel is slower at seq 128 batch 5 next to hidden 256's slowdown, and the chain stays."""
    table = costs.load()
    context = costs.Context(table=costs.CostTable([p for p in table.points if p.hidden != 8], {}))
    rewritten = rnn_rewrite_rules.rewrite(_load("simplernn"), target="onnxruntime", context=context)
    assert op_counts(rewritten)["RNN"] == 0
    reasons = [d.reason for d in context.declined]
    prefix = "re-roll kept unrolled: hidden 8, seq 5, batch symbolic: ONNX Runtime's RNN kernel"
    assert any(r.startswith(prefix) and "measured hidden 64" in r for r in reasons), reasons


def test_an_unrolled_keras_simplernn_becomes_one_rnn_where_the_cost_allows() -> None:
    original = _load("simplernn")
    context = costs.Context(ignore=True)
    rewritten = rnn_rewrite_rules.rewrite(original, target="onnxruntime", context=context)
    onnx.checker.check_model(rewritten, full_check=True)
    counts = op_counts(rewritten)
    assert counts["RNN"] == 1
    assert counts.total() == 4, counts  # Transpose, RNN, Squeeze, Transpose
    _assert_same_outputs(original, rewritten)


@pytest.mark.parametrize("layer", ["gru", "lstm", "simplernn"])
def test_the_zero_states_int32_round_trip_is_x_batch(layer: str) -> None:
    """With the family alone, the node reads zeros built from X's batch, not the
    exporter's Cast(int32) round trip of it (which differs from 2**31 rows on)."""
    rewritten = rnn_rewrite_rules.rewrite(
        _load(layer), ["reroll"], target="onnxruntime", context=costs.Context(ignore=True)
    )
    op_type = {"simplernn": "RNN"}.get(layer, layer.upper())
    (node,) = [n for n in running_nodes(rewritten) if n.op_type == op_type]
    producers = {o: n for n in rewritten.graph.node for o in n.output}
    for state in node.input[5:]:
        unsqueeze = producers[state]
        assert unsqueeze.op_type == "Unsqueeze"
        assert producers[unsqueeze.input[0]].op_type == "ConstantOfShape"
    _assert_same_outputs(_load(layer), rewritten)


def test_a_split_with_sizes_of_one_row_reads_the_same_steps() -> None:
    """``Split(P, [1, 1, 1, 1, 1], axis=0)``: part ``k`` is row ``k``, as equal parts are."""
    original = _load("gru")
    sized = _load("gru")
    sized.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(5, np.int64), "ones"))
    _node(sized, "unstack").input.append("ones")
    rewritten = rnn_rewrite_rules.rewrite(sized, target="onnxruntime")
    assert op_counts(rewritten)["GRU"] == 1
    _assert_same_outputs(original, rewritten)


# ---------------------------------------------------------------- near misses


def _node(model: onnx.ModelProto, suffix: str) -> onnx.NodeProto:
    (node,) = [n for n in model.graph.node if n.name.endswith(suffix)]
    return node


def _reasons(model: onnx.ModelProto, layer: str) -> list[str]:
    rule = RerollCell.rule(layer.upper())
    return refusal_reasons([rule], model, costs.Context(ignore=True))


def _assert_kept(model: onnx.ModelProto, layer: str, expected: str) -> None:
    found = _reasons(model, layer)
    assert expected in found, "\n".join(sorted(set(found)))
    rewritten = rnn_rewrite_rules.rewrite(model, ["reroll"], context=costs.Context(ignore=True))
    assert op_counts(rewritten)[layer.upper()] == 0


def test_near_miss_a_step_with_a_different_kernel() -> None:
    """Step 2 (``gru_cell_5``) multiplies x_t by another kernel: its own initializer."""
    model = _load("gru")
    matmul = _node(model, "gru_cell_5/MatMul")
    (kernel,) = [i for i in model.graph.initializer if i.name == matmul.input[1]]
    other = onnx.numpy_helper.to_array(kernel).copy()
    other[0, 0] += 1.0
    model.graph.initializer.append(onnx.numpy_helper.from_array(other, "other_kernel"))
    matmul.input[1] = "other_kernel"
    _assert_kept(model, "gru", "step 2 uses other weights")


def test_near_miss_a_step_that_reads_another_row_of_x() -> None:
    """Steps 2 and 3 (``lstm_cell_5`` and ``_7``) read each other's row of X."""
    model = _load("lstm")
    a = _node(model, "lstm_cell_5/MatMul")
    b = _node(model, "lstm_cell_7/MatMul")
    a.input[0], b.input[0] = b.input[0], a.input[0]
    _assert_kept(
        model, "lstm", "the steps read indices [0, 1, 3, 2, 4], not 0..4 in order or reversed"
    )


def test_near_miss_a_split_of_x_on_another_axis() -> None:
    """``Split(Transpose(x), axis=1)``: parts of the batch, not steps."""
    model = _load("gru")
    split = _node(model, "unstack")
    (axis,) = split.attribute
    axis.i = 1
    _assert_kept(model, "gru", "no gate reads one step of X (Gather(X, t) or Slice)")


def test_near_miss_a_split_into_rows_of_two() -> None:
    """Explicit sizes ``[2, 1, 1, 1, 0]``: part ``k`` is row ``k + 1`` for k = 1..3, parts 0
    and 4 are not one row."""
    model = _load("gru")
    split = _node(model, "unstack")
    sizes = onnx.numpy_helper.from_array(np.array([2, 1, 1, 1, 0], np.int64), "sizes")
    model.graph.initializer.append(sizes)
    split.input.append("sizes")
    _assert_kept(model, "gru", "the steps read indices [2, 3, 4], not 0..2 in order or reversed")


def test_near_miss_a_gate_slice_that_drops_rows() -> None:
    """The recurrent projection's z block sliced to rows ``[0, 4)``: not every row."""
    model = _load("gru")
    sliced = _node(model, "gru_cell_5/strided_slice")
    ends = onnx.numpy_helper.from_array(np.array([4, 8], np.int64), "few_rows")
    model.graph.initializer.append(ends)
    sliced.input[2] = "few_rows"
    _assert_kept(
        model,
        "gru",
        "functional_1/gru_1/gru_cell_5/strided_slice is not a Slice of constant columns "
        "keeping every row",
    )


def _num_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The file at opset 18 with its ``unstack`` a ``Split(num_outputs=5)`` (as tf2onnx
    writes it at opset 18)."""
    model.opset_import[0].version = 18
    for node in model.graph.node:
        if node.op_type == "Split" and len(node.input) == 1:
            node.attribute.append(onnx.helper.make_attribute("num_outputs", len(node.output)))
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("layer", ["gru", "lstm"])
def test_the_last_part_of_a_num_outputs_split_beside_the_others_is_the_last_row(
    layer: str,
) -> None:
    """Opset 18's ``Split(num_outputs=5)``: the last part ends at X's last row whatever its
    length (``[2, 2, 1]`` at 5 rows in 3 parts), but the Squeezes of the other parts run
    only where every part but the last has one row (``N <= 5``), and the last one only where
    it has one too: ``N = 5``, where it is row 4. The original fails at any other length."""
    model = _num_outputs(_load(layer))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "seq"  # not read as 5
    rewritten = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
    assert op_counts(rewritten)[layer.upper()] == 1
    _assert_same_outputs(model, rewritten)
    for seq in (4, 6, 9):
        feeds = {"x": np.zeros((2, seq, FEATURES), np.float32)}
        with pytest.raises(Exception, match=r"Squeeze|Split"):
            runtime.run(model, feeds)


def test_near_miss_the_last_part_of_a_num_outputs_split_alone() -> None:
    """The same Split with no other part read by a Squeeze (the first step's read made an
    ``Identity`` of a ``Reshape``): the last part may be any number of rows, not a step."""
    model = _num_outputs(_load("gru"))
    split = _node(model, "unstack")
    for output in split.output[:-1]:
        for node in model.graph.node:
            if node.op_type == "Squeeze" and node.input[0] == output:
                shape = onnx.numpy_helper.from_array(np.array([-1, FEATURES], np.int64))
                shape.name = f"{node.name}_shape"
                model.graph.initializer.append(shape)
                node.op_type = "Reshape"
                node.input[1] = shape.name
    _assert_kept(model, "gru", "no gate reads one step of X (Gather(X, t) or Slice)")

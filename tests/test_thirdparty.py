"""Third-party exporter forms: what fires, what is refused and why, and that
every rewrite equals the original at several sizes (ONNX Runtime), batch 0 included
(``onnx.reference``: ORT aborts on LSTM/GRU with batch 0)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import pytest
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules import diagnostics, runtime
from rnn_rewrite_rules._api import _RefusalTracer
from rnn_rewrite_rules.rules.bidirectional import MergeHandBuiltBidirectional
from rnn_rewrite_rules.rules.bidirectional.states import state_rules
from rnn_rewrite_rules.testing import thirdparty as tp
from rnn_rewrite_rules.testing.exporters import ExporterSpec, build_exporter_model
from tests.exporter_support import all_nodes, all_op_counts, assert_target_form, rnn_nodes
from tests.reasons import refusal_reasons
from tests.support import direction

#: (batch, seq), pairwise different and different from nothing the builders fix.
SIZES = ((1, 1), (3, 5), (6, 2))
#: Op types ONNX Runtime ends the process on at seq 0: GRU (it aborts), and RNN before
#: 1.31 (1.22, the lowest supported, segfaults; 1.31 runs it).
_ORT_VERSION = tuple(int(part) for part in onnxruntime.__version__.split(".")[:2])
_SEQ_0_UNSAFE = {"GRU"} | (set() if _ORT_VERSION >= (1, 31) else {"RNN"})


def _reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray] | Exception:
    try:
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]
    except Exception as error:  # the original may fail at this size: so must the rewrite
        return error


def assert_equivalent(
    before: onnx.ModelProto, after: onnx.ModelProto, *, zero: bool = True, seq_zero: bool = True
):
    """``seq_zero=False``: no ORT run at seq 0 (ORT 1.31 leaves an LSTM's Y_h/Y_c
    uninitialized there, up to 3e38 on the original too; onnx.reference fails at seq 0)."""
    for seed, (batch, seq) in enumerate(SIZES):
        feeds = tp.thirdparty_inputs(before, batch, seq, rng=seed)
        diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
        assert diff <= 1e-5, f"batch={batch} seq={seq}: {diff}"
    if not zero:
        return
    if seq_zero and not any(n.op_type in _SEQ_0_UNSAFE for n in all_nodes(before.graph)):
        # seq 0: ORT runs LSTM (and RNN) there, onnx.reference does not
        feeds = tp.thirdparty_inputs(before, 2, 0, rng=8)
        try:
            expected = runtime.run(before, feeds)
        except Exception:  # TorchScript's Reshape [0, 0, -1] fails at 0 (see below)
            expected = None
        if expected is not None:
            assert runtime.max_abs_diff(expected, runtime.run(after, feeds)) <= 1e-5, "seq=0"
    feeds = tp.thirdparty_inputs(before, 0, 4, rng=9)
    expected, actual = _reference(before, feeds), _reference(after, feeds)
    # where the original fails (neither ORT nor onnx.reference infers Reshape's -1 next to
    # a 0 size, which TorchScript's [0, 0, -1] asks for), a rewrite with constant targets
    # (layer_output's [0, 0, D*H]) runs
    if not isinstance(expected, Exception):
        assert not isinstance(actual, Exception), actual
        assert runtime.max_abs_diff(expected, actual) <= 1e-5


def rewrite(model: onnx.ModelProto, families=None, target: str = "portable") -> onnx.ModelProto:
    after = rnn_rewrite_rules.rewrite(model, families, target=target)
    onnx.checker.check_model(after)
    again = rnn_rewrite_rules.rewrite(after, families, target=target)
    assert again.graph == after.graph, "rewriting twice differs from once"
    return after


def reasons(model: onnx.ModelProto, families=None) -> list[str]:
    """Every failed condition of the rules on ``model`` (nothing is rewritten)."""
    ir_model = ir.serde.deserialize_model(model)
    tracer = _RefusalTracer()
    rnn_rewrite_rules.rules(families).apply_to_model(ir_model, tracer=tracer)
    return [str(match.reason) for _, _, match, _ in tracer.failures]


def _states(model: onnx.ModelProto) -> list[str]:
    return [name for n in rnn_nodes(model) for name in n.input[5:7] if name]


def _counts(model: onnx.ModelProto) -> collections.Counter[str]:
    return all_op_counts(model)


# ---------------------------------------------------------------- zero initial states

ZERO_STATE_BUILDERS = {
    "torchscript_gru": lambda: tp.torchscript_batch_first("GRU"),
    "torchscript_lstm_bi": lambda: tp.torchscript_batch_first("LSTM", direction="bidirectional"),
    "torchscript_lstm_1layer": lambda: tp.torchscript_batch_first("LSTM", num_layers=1),
    "embedding": lambda: tp.embedding_tagger(),
    "embedding_ids": lambda: tp.embedding_tagger(batch_source="ids"),
    "embedding_x": lambda: tp.embedding_tagger(batch_source="transposed", direction="forward"),
    "quantized": lambda: tp.embedding_tagger(quantized=True),
    "quantized_dequantized": lambda: tp.embedding_tagger(
        quantized=True, batch_source="dequantized"
    ),
    "quantized_transpose_first": lambda: tp.embedding_tagger(quantized=True, transpose_first=True),
    "paddle_lstm": lambda: tp.paddle_states("LSTM"),
    "paddle_gru_forward": lambda: tp.paddle_states("GRU", direction="forward", num_layers=3),
    "zeros_like": lambda: tp.zeros_like_state("zeros_like"),
    "expand_shape_of": lambda: tp.zeros_like_state("expand"),
    "finite_times_zero": lambda: tp.zeros_like_state("mul_finite", "LSTM"),
}


@pytest.mark.parametrize("target", ["portable", "onnxruntime"])
@pytest.mark.parametrize("name", sorted(ZERO_STATE_BUILDERS))
def test_zero_states_are_replaced(name: str, target: str) -> None:
    """portable: one explicit shared zero state per shape; onnxruntime: none."""
    before = ZERO_STATE_BUILDERS[name]()
    assert _states(before)
    after = rewrite(before, target=target)
    assert_target_form(after, target, before)
    counts = _counts(after)
    gone = ("Tile", "Expand", "Mul") + (
        ("Shape", "ConstantOfShape", "Cast") if target == "onnxruntime" else ()
    )
    for op in gone:
        assert not counts[op], counts  # the state's computation died with it
    quantized = any(n.op_type == "DynamicQuantizeLSTM" for n in rnn_nodes(before))
    # onnx.reference has no DequantizeLinear-14 kernel nor DynamicQuantizeLSTM
    assert_equivalent(before, after, zero=not quantized)


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (
            lambda: tp.torchscript_batch_first("GRU", near_miss="unrelated_batch"),
            "is not provably [D, batch of X, H]",
        ),
        (
            lambda: tp.zeros_like_state("mul_reduction"),
            "no initial state is a provable all-zero tensor",
        ),
    ],
    ids=["batch_of_an_unrelated_input", "reduction_times_zero"],
)
def test_zero_state_near_misses(model, reason: str) -> None:
    before = model()
    assert any(reason in r for r in reasons(before, ["initial_state"])), reasons(before)
    after = rewrite(before)
    assert _states(after) == _states(before)
    assert_equivalent(before, after)


def test_reduction_times_zero_is_nan_for_an_infinite_input() -> None:
    """Why ``t * 0`` for a reduction ``t`` of the input stays: 0 * inf is NaN."""
    model = tp.zeros_like_state("mul_reduction")
    feeds = tp.thirdparty_inputs(model, 2, 3)
    feeds["x"][0, 0, 0] = np.inf
    (y,) = runtime.run(model, feeds)
    assert np.isnan(y).any()


# ---------------------------------------------------------------- hand-built directions


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("concat", ["sequence", "directions"])
@pytest.mark.parametrize("states", [False, True])
def test_hand_built_bidirectional_is_one_node(op_type, concat, states) -> None:
    before = tp.hand_built_bidirectional(op_type, concat=concat, states=states)
    after = rewrite(before)
    (node,) = rnn_nodes(after)
    direction = {a.name: a.s for a in node.attribute}["direction"]
    assert direction == b"bidirectional"
    assert not _counts(after)["Slice"]
    assert len(after.graph.node) < len(before.graph.node)
    assert node.name == rnn_nodes(before)[1].name  # the forward half's name
    assert_equivalent(before, after)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("concat", ["sequence", "directions"])
def test_reversed_half_alone_is_a_reverse_node(op_type, concat) -> None:
    """On target ``onnxruntime``; ``portable`` keeps the half (tract runs a reverse node
    forward)."""
    before = tp.hand_built_bidirectional(op_type, halves="reverse", concat=concat)
    after = rewrite(before, target="onnxruntime")
    (node,) = rnn_nodes(after)
    assert {a.name: a.s for a in node.attribute}["direction"] == b"reverse"
    assert not _counts(after)["Slice"]
    assert_equivalent(before, after)
    kept = rewrite(before)
    (node,) = rnn_nodes(kept)
    assert {a.name: a.s for a in node.attribute}.get("direction", b"forward") == b"forward"


@pytest.mark.parametrize(
    ("near_miss", "reason"),
    [
        ("sequence_lens", "sequence_lens is present"),
        ("partial", "ends at -1000: not a full reversal"),
        ("unreversed_output", "not a forward half followed by a reversed half"),
    ],
)
def test_hand_built_near_misses(near_miss: str, reason: str) -> None:
    before = tp.hand_built_bidirectional("LSTM", near_miss=near_miss)
    found = reasons(before, ["bidirectional"])
    assert any(reason in r for r in found), found
    after = rewrite(before, ["bidirectional"])
    assert len(rnn_nodes(after)) == 2
    assert_equivalent(before, after)


def _directions(model: onnx.ModelProto) -> list[bytes]:
    return [
        next((a.s for a in n.attribute if a.name == "direction"), b"forward")
        for n in rnn_nodes(model)
    ]


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("reverse_at", ["input", "batched"])
@pytest.mark.parametrize("states", [False, True])
def test_batch_free_bidirectional_stack_is_one_node_per_layer(op_type, reverse_at, states) -> None:
    """``x [seq, I]`` unsqueezed to a batch of 1, ``Squeeze(Y, [1, 2])`` per half."""
    before = tp.batch_free_bidirectional(op_type, layers=2, reverse_at=reverse_at, states=states)
    after = rewrite(before)
    assert _directions(after) == [b"bidirectional"] * 2
    counts = _counts(after)
    assert not counts["Slice"] and not counts["Squeeze"] and not counts["Transpose"]
    assert rnn_nodes(after)[0].name == rnn_nodes(before)[0].name  # the forward half's name
    assert_equivalent(before, after)


@pytest.mark.parametrize(
    ("near_miss", "reason"),
    [
        ("batched_input", "the batch is not proven to be 1"),
        ("other_input", "does not read the reversed input of the first"),
        ("concat_axis", "not concatenated on the feature axis"),
    ],
)
def test_batch_free_near_misses(near_miss: str, reason: str) -> None:
    before = tp.batch_free_bidirectional("GRU", near_miss=near_miss)
    found = reasons(before, ["bidirectional"])
    assert any(reason in r for r in found), found
    after = rewrite(before, ["bidirectional"])
    assert b"bidirectional" not in _directions(after)
    if near_miss != "batched_input":
        assert_equivalent(before, after)
        return
    for seq in (1, 5):  # the original runs at batch 1 only (see below)
        feeds = tp.thirdparty_inputs(before, 1, seq, rng=seq)
        assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) == 0


def test_batch_free_batched_input_runs_only_at_batch_1() -> None:
    """Why ``batched_input`` is refused: its ``[1, 2]`` Squeeze fails at any other batch, and
    a merged node's Reshape would not."""
    model = tp.batch_free_bidirectional("GRU", near_miss="batched_input")
    runtime.run(model, tp.thirdparty_inputs(model, 1, 3))
    with pytest.raises(Exception, match=r"Squeeze|dimension"):
        runtime.run(model, tp.thirdparty_inputs(model, 2, 3))


def test_sequence_lens_reversal_differs() -> None:
    """Why ``sequence_lens`` blocks the merge: a reverse node reverses within each length."""
    model = tp.hand_built_bidirectional("GRU", halves="reverse", near_miss="sequence_lens")
    feeds = tp.thirdparty_inputs(model, 2, 4)
    feeds["sequence_lens"] = np.array([4, 2], dtype=np.int32)
    ir_model = ir.serde.deserialize_model(model)
    (node,) = [n for n in ir_model.graph if n.op_type == "GRU"]
    node.attributes["direction"] = ir.AttrString("direction", "reverse")
    node.replace_input_with(0, ir_model.graph.inputs[0])
    merged = ir.serde.serialize_model(ir_model)
    (a,), (b,) = runtime.run(model, feeds), runtime.run(merged, feeds)
    assert np.abs(a - b).max() > 1e-3


# ---------------------------------------------------------------- glue and shape checks


@pytest.mark.parametrize("op_type", ["GRU", "LSTM"])
@pytest.mark.parametrize("stacked", [False, True])
def test_one_dim_states_pairs_cancel(op_type: str, stacked: bool) -> None:
    before = tp.one_dim_states(op_type, steps=3, stacked=stacked)
    after = rewrite(before)
    counts = _counts(after)
    states = 2 if op_type == "LSTM" else 1
    # Unsqueeze: x, and each state at the first step only; the pairs between steps (and
    # between stacked layers) cancel
    assert counts["Unsqueeze"] == 1 + states, counts
    # Squeeze: y (per step, or between layers and at the end) and the final h (c is unread)
    assert counts["Squeeze"] == 4, counts
    assert len(after.graph.node) < len(before.graph.node)
    assert_equivalent(before, after, zero=False)  # batch is 1 by construction


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_computed_reshape_target_becomes_constant(direction: str) -> None:
    before = tp.computed_reshape("LSTM", direction=direction)
    after = rewrite(before)
    counts = _counts(after)
    assert not counts["Shape"] and not counts["Concat"] and not counts["Gather"], counts
    assert len(after.graph.node) <= 4
    assert_equivalent(before, after)


@pytest.mark.parametrize("op_type", ["GRU", "LSTM", "RNN"])
def test_rank_checks_fold(op_type: str) -> None:
    before = tp.rank_checks(op_type)
    after = rewrite(before)
    counts = _counts(after)
    assert not counts["If"] and not counts["Size"] and not counts["Not"], counts
    assert counts["Squeeze"] == 2  # Y's and the branch that runs: Squeeze(Y_h, 0)
    assert_equivalent(before, after)
    folded = rewrite(before, ["fold_if"])
    assert "single_squeeze" in {n.name for n in folded.graph.node}  # inlined with its name


def test_rank_check_on_a_runtime_size_stays() -> None:
    before = tp.rank_checks("GRU", near_miss="runtime_condition")
    found = reasons(before, ["fold_if"])
    assert any("the If condition is not provable" in r for r in found), found
    after = rewrite(before)
    assert _counts(after)["If"] == 1  # the first (rank) check still folds
    assert_equivalent(before, after)


# ---------------------------------------------------------------- rules that stay quiet


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    for index, node in enumerate(all_nodes(model.graph)):
        node.name = f"{node.op_type}_{index}"
        node.doc_string = f"doc of {node.op_type}_{index}"
    return model


def test_rewritten_rnn_nodes_keep_name_and_doc_string() -> None:
    spec = ExporterSpec(
        op_type="LSTM", initial_state="constant_of_shape", num_layers=2, wrap="if", style="plain"
    )
    before = _named(build_exporter_model(spec))
    after = rewrite(before)
    # the zero states were replaced (the nodes were re-emitted), in each branch
    assert_target_form(after, "portable", before)
    assert _states(after) != _states(before)
    old = [(n.name, n.doc_string) for n in rnn_nodes(before)]
    new = [(n.name, n.doc_string) for n in rnn_nodes(after)]
    assert new == old
    names = [n.name for n in all_nodes(after.graph) if n.name]
    assert len(names) == len(set(names)), collections.Counter(names).most_common(3)


def test_untouched_model_is_returned_unchanged() -> None:
    """No rule applies (states are graph inputs, Y is a graph output): same bytes, and
    no value_info appears for the initializers."""
    g = tp._Graph()
    x = g.input("x", ["seq", "batch", 3])
    h0 = g.input("h0", [1, "batch", 4])
    y, h = g.rnn("GRU", x, 3, 4, initial_h=h0)
    for value, dims in ((y, ["s", 1, "b", 4]), (h, [1, "b", 4])):
        g.outputs.append(onnx.helper.make_tensor_value_info(value, onnx.TensorProto.FLOAT, dims))
    model = g.model("untouched")
    after = rnn_rewrite_rules.rewrite(model)
    assert after.SerializeToString() == model.SerializeToString()
    assert not after.graph.value_info


def test_rewrite_adds_no_initializer_value_info() -> None:
    before = tp.torchscript_batch_first("GRU")
    after = rewrite(before)
    initializers = {t.name for t in after.graph.initializer}
    assert not [v.name for v in after.graph.value_info if v.name in initializers]


# ---------------------------------------------------------------- --check names what stays


@pytest.mark.parametrize(
    ("model", "kind", "text"),
    [
        (
            lambda: tp.torchscript_batch_first("GRU", near_miss="unrelated_batch"),
            "unproven-zero-state",
            "not provably [D, batch of X, H]",
        ),
        (
            lambda: tp.zeros_like_state("mul_reduction"),
            "unproven-zero-state",
            "not provably zeros",
        ),
        (
            lambda: tp.hand_built_bidirectional(near_miss="sequence_lens"),
            "hand-built-direction",
            "reversed by Slice",
        ),
        (
            lambda: tp.rank_checks(near_miss="runtime_condition"),
            "runtime-rank-check",
            "branches on its output's shape",
        ),
    ],
    ids=["unrelated_batch", "reduction_times_zero", "sequence_lens", "runtime_condition"],
)
def test_forms_left_alone_are_hazards(model, kind: str, text: str) -> None:
    before = model()
    after = rnn_rewrite_rules.rewrite(before)
    hazards = diagnostics.find_hazards(ir.serde.deserialize_model(after))
    assert any(h.kind == kind and text in h.message for h in hazards), hazards


@pytest.mark.parametrize(
    "model",
    [
        lambda: tp.hand_built_bidirectional(),
        lambda: tp.rank_checks(),
        lambda: tp.torchscript_batch_first("LSTM"),
        lambda: tp.zeros_like_state("zeros_like"),
    ],
    ids=["bidirectional", "rank_checks", "torchscript_states", "zeros_like"],
)
def test_rewritten_forms_leave_no_hazard(model) -> None:
    before = model()
    kinds = ("unproven-zero-state", "hand-built-direction", "runtime-rank-check")
    after = rnn_rewrite_rules.rewrite(before)
    hazards = diagnostics.find_hazards(ir.serde.deserialize_model(after))
    assert not [h for h in hazards if h.kind in kinds], hazards


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize("sequence_lens", [False, True])
def test_forward_and_reverse_node_pair_is_one_node(op_type: str, sequence_lens: bool) -> None:
    """A converter's forward + ``direction="reverse"`` pair on one x: sequence_lens shared
    is fine here (both nodes honour it the way a bidirectional node does)."""
    before = tp.hand_built_bidirectional(
        op_type, reverse_node=True, sequence_lens=sequence_lens, states=True
    )
    after = rewrite(before)
    (node,) = rnn_nodes(after)
    assert {a.name: a.s for a in node.attribute}["direction"] == b"bidirectional"
    assert bool(node.input[4]) == sequence_lens
    assert_equivalent(before, after)
    if sequence_lens:  # lengths below seq: the padding is where a Slice would differ
        feeds = tp.thirdparty_inputs(before, 3, 5, rng=4)
        feeds["sequence_lens"] = np.array([5, 2, 3], dtype=np.int32)
        assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) <= 1e-5


# ---------------------------------------------------------------- pairs with read states


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("concat", ["sequence", "directions"])
@pytest.mark.parametrize("states", [False, True])
def test_pair_with_concatenated_states_is_one_node(op_type, concat, states) -> None:
    """A converter's forward + reverse pair whose ``Y_h`` (``Y_c``) are concatenated:
    that Concat is the merged node's ``Y_h``, no Split or Concat is left."""
    before = tp.hand_built_bidirectional(
        op_type, reverse_node=True, state_concat=True, concat=concat, states=states
    )
    for families in (["bidirectional"], None):
        after = rewrite(before, families)
        (node,) = rnn_nodes(after)
        assert direction(node) == b"bidirectional"
        counts = _counts(after)
        stacked = (2 if op_type == "LSTM" else 1) if states else 0  # initial states
        assert not counts["Split"] and counts["Concat"] == stacked, counts
        read = {o.name for o in after.graph.output}
        producer = {o: n for n in after.graph.node for o in n.output}
        for index, name in enumerate(("h_n", "c_n")[: 2 if op_type == "LSTM" else 1], 1):
            assert producer[name].input[0] == node.output[index]  # Identity(Y_h) of the node
        assert {"y", "h_n"} <= read
        assert_equivalent(before, after, seq_zero=op_type != "LSTM")


def test_hand_built_pair_with_a_read_state_is_merged() -> None:
    """The forward half's ``Y_h`` is a graph output: the merged node's ``Split(Y_h)``
    forward half is that output."""
    before = tp.hand_built_bidirectional("LSTM", near_miss="state_read")
    after = rewrite(before, ["bidirectional"])
    assert _directions(after) == [b"bidirectional"]
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]
    assert_equivalent(before, after, seq_zero=False)


#: Refused by the states' merge (a Concat of the pair) and merged by the hand-built one,
#: each half's Y_h read per direction (``Split``); ``y_sequence_axis`` stays two nodes.
@pytest.mark.parametrize(
    ("near_miss", "reason"),
    [
        ("state_reversed", "the Concat does not read the forward Y_h right before the reverse Y_h"),
        ("state_also_read", "a half's Y_h is read by something other than one Concat of the pair"),
        ("state_axis", "the Y_h Concat is on axis 2, not the direction axis 0"),
        ("state_first", "the Y_h Concat comes before the Y Concat"),
        ("state_read", "a half's Y_h is read by something other than one Concat of the pair"),
        ("state_two_concats", "the halves' Y_h are not read by one Concat"),
        ("y_sequence_axis", "the halves are not concatenated on the feature axis"),
    ],
)
@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_pair_with_concatenated_states_near_misses(op_type: str, near_miss: str, reason: str):
    before = tp.hand_built_bidirectional(op_type, reverse_node=True, near_miss=near_miss)
    found = refusal_reasons(state_rules(), before)  # the merge of a pair with states
    assert reason in found, found
    after = rewrite(before)
    if near_miss == "y_sequence_axis":
        assert [direction(n) for n in rnn_nodes(after)] == [b"reverse", b"forward"]
        assert not _counts(after)["Split"]
    else:
        assert [direction(n) for n in rnn_nodes(after)] == [b"bidirectional"]
    assert_equivalent(before, after, seq_zero=op_type != "LSTM")


def test_reversed_state_concat_differs() -> None:
    """Why the order matters: ``Concat(Y_h_r, Y_h_f)`` is not the bidirectional ``Y_h``."""
    good = tp.hand_built_bidirectional("GRU", reverse_node=True, state_concat=True)
    swapped = tp.hand_built_bidirectional("GRU", reverse_node=True, near_miss="state_reversed")
    feeds = tp.thirdparty_inputs(good, 2, 3)
    assert runtime.max_abs_diff(runtime.run(good, feeds), runtime.run(swapped, feeds)) > 1e-3


def test_concat_of_a_whole_split_is_its_input() -> None:
    """ConcatWholeSplit alone: only a whole Split in order on its own axis folds."""
    text = """
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[2, B, 3] v, float[1, B, 3] w) => (float[3, B, 3] a, float[2, B, 3] b,
                                              float[1, B, 6] c, float[2, B, 3] d) {
        s0, s1 = Split <axis = 0, num_outputs = 2> (v)
        a = Concat <axis = 0> (w, s0, s1)
        b = Concat <axis = -3> (s0, s1)
        c = Concat <axis = 2> (s0, s1)
        d = Concat <axis = 0> (s1, s0)
    }
    """
    before = onnx.parser.parse_model(text)
    after = rnn_rewrite_rules.rewrite(before, ["ConcatWholeSplit"])
    onnx.checker.check_model(after)
    producer = {o: n for n in after.graph.node for o in n.output}
    assert list(producer["a"].input) == ["w", "v"]
    assert producer["b"].op_type == "Identity" and producer["b"].input == ["v"]
    assert producer["c"].op_type == producer["d"].op_type == "Concat"
    rng = np.random.default_rng(0)
    for batch in (0, 1, 4):
        feeds = {
            "v": rng.standard_normal((2, batch, 3)).astype(np.float32),
            "w": rng.standard_normal((1, batch, 3)).astype(np.float32),
        }
        assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) == 0


@pytest.mark.parametrize("opset", [17, 18])  # Split: equal halves / num_outputs=2
def test_merge_alone_leaves_a_valid_split(opset: int) -> None:
    before = tp.hand_built_bidirectional("GRU", reverse_node=True, state_concat=True)
    before.opset_import[0].version = opset
    after = rewrite(before, ["MergeForwardReverse[GRU]"])
    onnx.checker.check_model(after, full_check=True)
    counts = _counts(after)
    assert counts["GRU"] == counts["Split"] == 1 and counts["Concat"] == 1, counts
    assert_equivalent(before, after, seq_zero=False)  # GRU: ORT aborts at seq 0


def _expanded_pair(same_source: bool) -> onnx.ModelProto:
    """A GRU pair on ``Expand(x, [1, batch of a, 1])`` each, computed twice; the reverse
    half's target from ``b`` instead of ``a`` when not ``same_source``."""
    g = tp._Graph()
    x = g.input("x", ["seq", "batch", 3])
    sources = [g.input(name, [1, "batch", 4]) for name in ("a", "b")]

    def expand(source: str) -> str:
        batch = g.one("Slice", g.one("Shape", source), g.ints(1), g.ints(2))
        return g.one("Expand", x, g.one("Concat", g.ints(1), batch, g.ints(1), axis=0))

    forward = g.rnn("GRU", expand(sources[0]), 3, 4)
    backward = g.rnn("GRU", expand(sources[0 if same_source else 1]), 3, 4, direction="reverse")
    ys = [g.one("Squeeze", half[0], g.ints(1)) for half in (forward, backward)]
    g.output(g.one("Concat", *ys, axis=-1), "y", 3)
    g.output(g.one("Concat", forward[1], backward[1], axis=0), "h_n", 3)
    g.output(g.one("Add", *sources), "ab", 3)  # a and b are read
    return g.model("expanded_pair")


def test_pair_on_provably_equal_expands_is_one_node() -> None:
    before = _expanded_pair(same_source=True)
    after = rewrite(before, ["bidirectional"])
    (node,) = rnn_nodes(after)
    assert direction(node) == b"bidirectional"
    assert _counts(after)["Expand"] == 1
    assert_equivalent(before, after, seq_zero=False)


def test_pair_on_expands_of_two_batches_is_left_alone() -> None:
    """``a`` and ``b`` both declare ``batch``, which ONNX does not enforce: x expanded to
    the batch of ``b`` is not provably x expanded to the batch of ``a``."""
    before = _expanded_pair(same_source=False)
    found = reasons(before, ["bidirectional"])
    assert any("the reverse RNN does not read the forward RNN's input" in r for r in found)
    after = rewrite(before, ["bidirectional"])
    assert len(rnn_nodes(after)) == 2
    assert_equivalent(before, after, seq_zero=False)


# ---------------------------------------------------------------- tf2onnx per-direction reads


def _layer_output_reasons(model: onnx.ModelProto) -> list[str]:
    return refusal_reasons(rnn_rewrite_rules.rules(["layer_output"]).rules, model)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("opset", [9, 12, 15, 17])
@pytest.mark.parametrize("bounds", ["plain", "open", "step"])
def test_tf2onnx_direction_reads_become_one_reshape(op_type, opset, bounds) -> None:
    if bounds == "step" and opset < 10:
        pytest.skip("no steps before opset 10")
    """Y's and Y_h's Slice -> Squeeze -> Concat become Transpose -> Reshape (and the
    Transpose / Unsqueeze after them collapse into those: layer_glue)."""
    before = tp.tf2onnx_bidirectional(op_type, opset=opset, bounds=bounds)
    alone = rewrite(before, ["layer_output"])
    counts = _counts(alone)
    assert counts["Concat"] == 2 and counts["Reshape"] == 2, counts  # the states' Concat + Cast's
    assert counts["Slice"] == 1 and counts["Squeeze"] == 0, counts  # the batch's Slice stays
    reshapes = [n for n in alone.graph.node if n.op_type == "Reshape"]
    targets = {
        tuple(onnx.numpy_helper.to_array(i).tolist())
        for i in alone.graph.initializer
        if i.name in {n.input[1] for n in reshapes}
    }
    assert targets == {(0, 0, 8), (0, 8)}
    assert [o.name for o in alone.graph.output] == ["y", "h"]
    # seq 0: ORT leaves Y_h uninitialized (output h): batch 0 runs in onnx.reference
    assert_equivalent(before, alone, seq_zero=False)
    after = rewrite(before)
    assert len(after.graph.node) < len(alone.graph.node) < len(before.graph.node)
    assert_equivalent(before, after, seq_zero=False)


def test_tf2onnx_hand_built_rule_says_it_is_not_a_pair() -> None:
    before = tp.tf2onnx_bidirectional()
    found = refusal_reasons([MergeHandBuiltBidirectional.rule()], before)
    reason = (
        "both halves are Slices of one RNN node's output (a converter's per-direction read,"
        " not a hand-built pair)"
    )
    # Y's and Y_h's Concat; the states' Concat(z, z) reads one value twice; the zero
    # state's shape Concat(Slice(Shape(x)), [H]) starts with a Slice that is no reversal
    assert sorted(found) == [
        "a concatenated value has another reader",
        reason,
        reason,
        "the Slice has no steps (step 1)",
    ], found


@pytest.mark.parametrize(
    ("near_miss", "reason"),
    [
        ("swapped", "the Concat reads directions 1, 0, not 0 then 1"),
        ("repeated", "the Concat reads directions 0, 0, not 0 then 1"),
        ("concat_axis", "the Concat is not on the last (feature) axis"),
        ("squeeze_all", "the Squeeze has no axes: it removes every axis of size 1"),
        ("batch_axis", "the Slice is not on the direction axis"),
    ],
)
def test_tf2onnx_direction_read_near_misses(near_miss: str, reason: str) -> None:
    before = tp.tf2onnx_bidirectional(near_miss=near_miss)
    assert reason in _layer_output_reasons(before), _layer_output_reasons(before)
    after = rewrite(before, ["layer_output"])
    # Y's Concat stays; Y_h's (a correct read) is rewritten
    assert _counts(after)["Concat"] == _counts(before)["Concat"] - 1
    if near_miss not in ("squeeze_all", "batch_axis"):  # these fail at batch 1 already
        assert_equivalent(before, after, seq_zero=False)


def _edited_node(model: onnx.ModelProto, index: int, edit) -> onnx.ModelProto:
    edited = onnx.ModelProto()
    edited.CopyFrom(model)
    edit(edited.graph.node[index])
    return edited


def test_tf2onnx_halves_of_two_outputs_are_refused() -> None:
    """Y_h's forward half and Y_c's backward half: two values, not one read in two."""
    before = tp.tf2onnx_bidirectional("LSTM")
    rnn = next(n for n in before.graph.node if n.op_type == "LSTM")
    slices = [n for n in before.graph.node if n.op_type == "Slice" and n.input[0] == rnn.output[1]]

    def edit(node: onnx.NodeProto) -> None:
        node.input[0] = rnn.output[2]

    edited = _edited_node(before, list(before.graph.node).index(slices[1]), edit)
    assert "the two halves slice different values" in _layer_output_reasons(edited)
    after = rewrite(edited, ["layer_output"])
    assert_equivalent(edited, after, seq_zero=False)


def test_tf2onnx_reads_of_a_forward_rnn_are_refused() -> None:
    """A forward node's one direction read twice is [seq, batch, 2H] of copies."""
    from onnx import helper

    from tests.near_misses import gru_node, rnn_model

    nodes = [gru_node(["Y"])]
    for i in (0, 1):
        nodes += [
            helper.make_node("Slice", ["Y", "zero", "one", "one"], [f"s{i}"]),
            helper.make_node("Squeeze", [f"s{i}", "one"], [f"q{i}"]),
        ]
    nodes.append(helper.make_node("Concat", ["q0", "q1"], ["y"], axis=2))
    ints = {"zero": np.array([0]), "one": np.array([1])}
    model = rnn_model(nodes, constants=ints, gates=3)
    assert "the sliced RNN is not bidirectional" in _layer_output_reasons(model)


def test_tf2onnx_direction_reads_in_if_branches() -> None:
    """Inside a subgraph the targets are Constant nodes of the branch."""
    from rnn_rewrite_rules.testing.exporters import in_if_branches

    before = in_if_branches(tp.tf2onnx_bidirectional("LSTM"), tp.tf2onnx_bidirectional("GRU"))
    after = rewrite(before, ["layer_output"])
    counts = _counts(after)
    assert counts["Squeeze"] == 0 and counts["Reshape"] == 4, counts
    assert not after.graph.initializer
    for cond in (True, False):
        for seed, (batch, seq) in enumerate(SIZES):
            feeds = tp.thirdparty_inputs(before, batch, seq, rng=seed)
            feeds["cond"] = np.array(cond)
            diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
            assert diff <= 1e-5, (cond, batch, seq, diff)

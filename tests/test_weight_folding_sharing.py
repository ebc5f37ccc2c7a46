"""weight_folding: which tensor a fold stores, reuses or refuses when weights are shared.

Near misses of the reuse and dedup logic: originals read raw and prepared, read by other
ops, equal bytes of another shape, ``Constant``-node originals, the input size ``X``
fixes, ``DynamicQuantizeLSTM``'s transposed ``R`` and ``B``, IR versions 3 and 4, and the
names a new tensor takes next to a model's functions.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model, random_inputs
from rnn_rewrite_rules.testing.exporters import (
    in_if_branches,
    initializers_as_constants,
    quantized_lstm_model,
)
from tests.reasons import refusal_reasons
from tests.support import apply, join_halves, op_counts

FAMILY = ["weight_folding"]
RULES = rnn_rewrite_rules.rules(FAMILY)
H, SIZE = 2, 4  # hidden and input size of the hand-built models: W is [1, 8, 4]
#: (seq, batch) sizes the models run at (ONNX Runtime aborts on an LSTM batch of 0).
RUN_SIZES = ((1, 1), (5, 3), (2, 7))
#: ``x_dims``: the LSTMs read ``Reshape(X, dims)``, ``dims`` a graph input of unknown
#: length: an input of unknown rank.
UNRANKED = "unranked"


def _ints(name: str, *values: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _floats(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(array, name)


def _lstm(w: str, y: str, *, r: str = "r", hidden: int = H) -> onnx.NodeProto:
    return helper.make_node("LSTM", ["X", w, r], [y], hidden_size=hidden, name=f"lstm_{y}")


def _model(
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
    outputs: list[str],
    *,
    others: Sequence[str] = (),
    extra_inputs: Sequence[onnx.ValueInfoProto] = (),
    x_dims: list | str | None = None,
    ir_version: int = 8,
    functions: Sequence[onnx.FunctionProto] = (),
    opsets: Sequence[onnx.OperatorSetIdProto] = (),
    check: bool = True,
) -> onnx.ModelProto:
    """One graph reading ``X`` (``[seq, batch, SIZE]`` unless ``x_dims`` says otherwise,
    or :data:`UNRANKED`): the given nodes and initializers, 4-D ``outputs``, 3-D ``others``."""
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["seq", "batch", SIZE])]
    if x_dims == UNRANKED:
        inputs.append(helper.make_tensor_value_info("dims", TensorProto.INT64, ["rank"]))
        nodes = [helper.make_node("Reshape", ["X", "dims"], ["X_any"]), *nodes]
        for node in nodes[1:]:
            node.input[:] = ["X_any" if n == "X" else n for n in node.input]
    elif x_dims is not None:
        inputs[0] = helper.make_tensor_value_info("X", TensorProto.FLOAT, x_dims)
    inputs += extra_inputs
    graph = helper.make_graph(
        nodes,
        "weights",
        inputs,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * 4) for n in outputs]
        + [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * 3) for n in others],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), *opsets],
        functions=list(functions),
    )
    model.ir_version = ir_version
    if check:
        onnx.checker.check_model(model, full_check=True)
    return model


def _feeds(model: onnx.ModelProto, seq: int, batch: int, seed: int = 0) -> dict:
    x = np.random.default_rng(seed).standard_normal((seq, batch, SIZE)).astype(np.float32)
    feeds = {"X": x}
    if "dims" in {i.name for i in model.graph.input}:  # UNRANKED: X's own dims
        feeds["dims"] = np.array(x.shape, np.int64)
    return feeds


def _reasons(model: onnx.ModelProto) -> list[str]:
    """The rule's refusals on ``model``'s one-output RNN nodes (the rules for two and
    three outputs refuse them for that alone)."""
    return [r for r in refusal_reasons(RULES, model) if not r.startswith("node has 1 outputs")]


def _assert_same_outputs(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    for seed, (seq, batch) in enumerate(RUN_SIZES):
        feeds = _feeds(before, seq, batch, seed)
        diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
        assert diff == 0, f"seq={seq} batch={batch}: max abs diff {diff}"


def _out(name: str, rank: int = 4) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * rank)


def _initializer_bytes(model: onnx.ModelProto) -> int:
    return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


def _rnn_inputs(model: onnx.ModelProto, index: int) -> list[str]:
    return [n.input[index] for n in model.graph.node if n.op_type == "LSTM"]


def _reverse(source: str, out: str) -> onnx.NodeProto:
    """The gate rows of ``source`` in reverse order: another tensor of the same shape."""
    return helper.make_node("Slice", [source, "last", "before_first", "rows", "back"], [out])


#: The bounds ``_reverse`` reads.
_REVERSE_BOUNDS = [
    _ints("last", -1),
    _ints("before_first", -(2**62)),
    _ints("rows", 1),
    _ints("back", -1),
]


def _swap_halves(source: str, out: str) -> list[onnx.NodeProto]:
    """The gate rows of ``source``, second half first: a third tensor of the same shape."""
    return [
        helper.make_node("Split", [source], [f"{out}_a", f"{out}_b"], axis=1, num_outputs=2),
        helper.make_node("Concat", [f"{out}_b", f"{out}_a"], [out], axis=1),
    ]


# ---------------------------------------------------------------- originals read elsewhere


@pytest.mark.parametrize("raw_read_first", [True, False])
def test_an_original_also_read_by_another_op_is_named_in_the_refusal(raw_read_first) -> None:
    """``w`` feeds one LSTM raw, a reordering for another, and a ``ReduceSum``: it stays,
    so folding the reordered copy would store the weights twice. The refusal names the
    ``ReduceSum`` whether the raw read comes before it or not (its output feeds a graph
    output only through ``Identity``, which folding would follow)."""
    readers = [_lstm("w", "y1"), helper.make_node("ReduceSum", ["w"], ["s"], name="sum_w")]
    nodes = [
        *(readers if raw_read_first else readers[::-1]),
        _reverse("w", "w_rev"),
        _lstm("w_rev", "y2"),
        helper.make_node("Identity", ["s"], ["total"]),
    ]
    inits = [_floats("w", (1, 4 * H, SIZE), 0), _floats("r", (1, 4 * H, H), 1), *_REVERSE_BOUNDS]
    model = _model(nodes, inits, ["y1", "y2"], others=["total"])
    after, count = apply(RULES, model)
    assert count == 0 and op_counts(after)["Slice"] == 1
    assert sorted(_reasons(model)) == [
        "W, R and B are constants already",  # the raw reader
        "W: w is also read by ReduceSum 'sum_w' (input 0): folding would store it twice",
    ]


def test_a_value_reached_twice_does_not_hide_a_later_reader() -> None:
    """``Concat(w, w)`` reaches the same value twice; the ``Identity`` before it leads to a
    ``ReduceSum`` that keeps ``w``: the search goes on past the value it saw already."""
    nodes = [
        helper.make_node("Identity", ["w"], ["w_copy"]),
        helper.make_node("Concat", ["w", "w"], ["w_twice"], axis=2),
        _lstm("w_twice", "y"),
        helper.make_node("ReduceSum", ["w_copy"], ["s"], name="sum_copy"),
    ]
    inits = [_floats("w", (1, 4 * H, SIZE // 2), 0), _floats("r", (1, 4 * H, H), 1)]
    model = _model(nodes, inits, ["y"], others=["s"])
    after, count = apply(RULES, model)
    assert count == 0 and op_counts(after)["Concat"] == 1
    assert _reasons(model) == [
        "W: w is also read by ReduceSum 'sum_copy' (input 0): folding would store it twice"
    ]


def test_one_reader_of_an_original_used_twice_folds() -> None:
    """``Concat(w, w)`` feeds one LSTM: the folded tensor (twice ``w``) is what the node
    reads, so it is stored; with no other reader there is nothing to share or weigh."""
    nodes = [helper.make_node("Concat", ["w", "w"], ["w_twice"], axis=2), _lstm("w_twice", "y")]
    inits = [_floats("w", (1, 4 * H, SIZE // 2), 0), _floats("r", (1, 4 * H, H), 1)]
    model = _model(nodes, inits, ["y"])
    after, count = apply(RULES, model)
    assert count == 1 and op_counts(after)["Concat"] == 0
    _assert_same_outputs(model, after)


def test_a_preparation_that_cannot_be_evaluated_is_named_by_every_reader() -> None:
    """One reader of ``w`` reshapes it to a shape its size cannot take: that reader's W is
    refused with the evaluator's reason, and the other reader's (a reversal, foldable on
    its own) because its weights are shared with one that cannot fold."""
    nodes = [
        _reverse("w", "w_rev"),
        _lstm("w_rev", "y1"),
        helper.make_node("Reshape", ["w", "bad_shape"], ["w_bad"]),
        _lstm("w_bad", "y2"),
    ]
    inits = [
        _floats("w", (1, 4 * H, SIZE), 0),
        _floats("r", (1, 4 * H, H), 1),
        _ints("bad_shape", 1, 4 * H, SIZE + 1),
        *_REVERSE_BOUNDS,
    ]
    model = _model(nodes, inits, ["y1", "y2"], check=False)
    assert apply(RULES, model, check=False)[1] == 0
    error = f"cannot evaluate w_bad: Reshape of (1, {4 * H}, {SIZE}) to [1, {4 * H}, {SIZE + 1}]"
    assert sorted(_reasons(model)) == [
        f"W: {error}",
        f"W: w_bad shares its weights but cannot be folded: {error}",
    ]


def test_a_computed_weight_declared_of_another_type_is_not_folded() -> None:
    """The graph declares W float16 (value_info) where the preparation computes float32:
    the rule never reads a type from value_info to fire, but refuses on a disagreement."""
    nodes = [helper.make_node("Unsqueeze", ["w2d", "zero"], ["w"]), _lstm("w", "y")]
    inits = [_floats("w2d", (4 * H, SIZE), 0), _floats("r", (1, 4 * H, H), 1), _ints("zero", 0)]
    model = _model(nodes, inits, ["y"], check=False)
    model.graph.value_info.append(
        helper.make_tensor_value_info("w", TensorProto.FLOAT16, [1, 4 * H, SIZE])
    )
    assert apply(RULES, model, check=False)[1] == 0
    assert _reasons(model) == ["W: computed dtype float32, declared FLOAT16"]


# ---------------------------------------------------------------- one original, several tensors


_READERS = {
    "raw": [_lstm("w", "y_raw")],
    "reversed": [_reverse("w", "w_rev"), _lstm("w_rev", "y_rev")],
    "swapped": [*_swap_halves("w", "w_swap"), _lstm("w_swap", "y_swap")],
}


@pytest.mark.parametrize("order", list(itertools.permutations(_READERS)), ids="-".join)
def test_one_original_prepared_two_ways_is_not_folded_in_any_order(order) -> None:
    """``w`` read raw, reversed and with its halves swapped: three tensors where there is
    one. Whichever reader the search meets first, every one of them counts, so neither
    preparation folds and the model keeps one copy of the weights."""
    nodes = [node for reader in order for node in _READERS[reader]]
    inits = [_floats("w", (1, 4 * H, SIZE), 0), _floats("r", (1, 4 * H, H), 1), *_REVERSE_BOUNDS]
    model = _model(nodes, inits, ["y_raw", "y_rev", "y_swap"])
    after, count = apply(RULES, model)
    assert count == 0
    assert _initializer_bytes(after) == _initializer_bytes(model)
    reasons = sorted(_reasons(model))
    assert reasons[0] == "W, R and B are constants already", reasons  # the raw reader
    assert [r.partition(":")[0] for r in reasons[1:]] == ["W", "W"], reasons
    for reason, other in zip(reasons[1:], ("w_rev", "w_swap"), strict=True):
        assert f"also feed 'w', '{other}'" in reason or f"'{other}', 'w'" in reason, reasons
        assert reason.endswith("would take 384 bytes where the originals take 128"), reason


def test_an_original_read_raw_is_reused_only_when_equal() -> None:
    """``w`` is read raw by one LSTM; another's W takes the first half of ``w``'s gate rows
    and the second half of ``v``'s: a new tensor as big as ``v``, stored in its place
    (``v`` goes), never ``w`` itself, which has the same shape and type."""
    half = 2 * H
    nodes = [
        _lstm("w", "y_raw"),
        helper.make_node("Slice", ["w", "zero", "half", "rows"], ["w_top"]),
        helper.make_node("Slice", ["v", "half", "end", "rows"], ["v_bottom"]),
        helper.make_node("Concat", ["w_top", "v_bottom"], ["mixed"], axis=1),
        _lstm("mixed", "y_mixed"),
    ]
    inits = [
        _floats("w", (1, 4 * H, SIZE), 0),
        _floats("v", (1, 4 * H, SIZE), 2),
        _floats("r", (1, 4 * H, H), 1),
        _ints("zero", 0),
        _ints("half", half),
        _ints("end", 4 * H),
        _ints("rows", 1),
    ]
    model = _model(nodes, inits, ["y_raw", "y_mixed"])
    after, count = apply(RULES, model)
    assert count == 1
    raw, mixed = _rnn_inputs(after, 1)
    stored = {t.name: numpy_helper.to_array(t) for t in after.graph.initializer}
    assert raw == "w" and mixed not in {"w", "v"} and "v" not in stored
    assert _initializer_bytes(after) == _initializer_bytes(model) - 4 * 8  # the bounds went
    _assert_same_outputs(model, after)


def test_constant_node_original_read_raw_and_through_identity_is_reused() -> None:
    """The original is a ``Constant`` node's output: it is a leaf too, so the ``Identity``
    reader takes it as it is and no second copy is stored."""
    nodes = [
        helper.make_node("Identity", ["w"], ["w_same"]),
        _lstm("w", "y1"),
        _lstm("w_same", "y2"),
    ]
    inits = [_floats("w", (1, 4 * H, SIZE), 0), _floats("r", (1, 4 * H, H), 1)]
    model = initializers_as_constants(_model(nodes, inits, ["y1", "y2"]))
    after, count = apply(RULES, model)
    assert count == 1
    assert _rnn_inputs(after, 1) == ["w", "w"]
    assert not after.graph.initializer and op_counts(after)["Constant"] == 2  # w and r
    _assert_same_outputs(model, after)


def test_equal_bytes_of_another_shape_are_not_shared() -> None:
    """Two LSTMs whose folded W hold the same 32 floats as [1, 8, 4] and [1, 16, 2]: each
    gets a tensor of its own shape (one tensor's bytes are not the other's weights)."""
    values = np.arange(32, dtype=np.float32) / 32
    inits = [
        numpy_helper.from_array(values.reshape(8, 4), "wa"),
        numpy_helper.from_array(values.reshape(16, 2), "wb"),
        _floats("ra", (1, 8, 2), 1),
        _floats("rb", (1, 16, 4), 2),
        _ints("zero", 0),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["wa", "zero"], ["wa3"]),
        helper.make_node("Unsqueeze", ["wb", "zero"], ["wb3"]),
        _lstm("wa3", "ya", r="ra"),
        helper.make_node("Slice", ["X", "zero", "two", "last_axis"], ["x2"]),
        helper.make_node("LSTM", ["x2", "wb3", "rb"], ["yb"], hidden_size=4, name="lstm_yb"),
    ]
    inits += [_ints("two", 2), _ints("last_axis", 2)]
    model = _model(nodes, inits, ["ya", "yb"])
    after, count = apply(RULES, model)
    assert count == 2
    shapes = {t.name: tuple(t.dims) for t in after.graph.initializer}
    wa, wb = (n.input[1] for n in after.graph.node if n.op_type == "LSTM")
    assert (shapes[wa], shapes[wb]) == ((1, 8, 4), (1, 16, 2))
    _assert_same_outputs(model, after)


# ---------------------------------------------------------------- the input size X fixes


def _unsqueezed_w_model(x_dims: list | str, w_size: int = SIZE) -> onnx.ModelProto:
    nodes = [helper.make_node("Unsqueeze", ["w2d", "zero"], ["w"]), _lstm("w", "y")]
    inits = [
        _floats("w2d", (4 * H, w_size), 0),
        _floats("r", (1, 4 * H, H), 1),
        _ints("zero", 0),
    ]
    return _model(nodes, inits, ["y"], x_dims=x_dims)


@pytest.mark.parametrize(
    "x_dims",
    [[5, 3, SIZE], [1, 1, SIZE], ["seq", "batch", SIZE], ["seq", "batch", "feature"], UNRANKED],
    ids=["static", "static ones", "batch symbolic", "all symbolic", "no shape"],
)
def test_w_folds_whatever_x_declares_that_agrees(x_dims: list | str) -> None:
    """``I`` is X's last dim where X fixes it: other static dims (seq, batch) are not it,
    and an X without a shape (not even a rank) fixes nothing."""
    model = _unsqueezed_w_model(x_dims)
    after, count = apply(RULES, model)
    assert count == 1 and op_counts(after)["Unsqueeze"] == 0
    seq, batch = x_dims[:2] if isinstance(x_dims[0], int) else (2, 3)
    feeds = _feeds(model, seq, batch)
    assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(after, feeds)) == 0


def test_w_of_another_input_size_than_x_declares_is_not_folded() -> None:
    model = _unsqueezed_w_model(["seq", "batch", SIZE + 3])
    _, count = apply(RULES, model, check=False)
    assert count == 0
    assert _reasons(model) == [
        f"W: computed shape (1, {4 * H}, {SIZE}), but the node needs (1, {4 * H}, {SIZE + 3})"
    ]


# ---------------------------------------------------------------- DynamicQuantizeLSTM


def test_dynamic_quantize_lstm_r_and_b_fold() -> None:
    """The contrib op's R is [D, H, 4H] and B [D, 8H]: each re-assembled from two halves
    (along their last axis) folds, to what ONNX Runtime computes."""
    model = quantized_lstm_model(direction="bidirectional", zero_states=False, hidden_size=3)
    join_halves(model, 2, 3)
    onnx.checker.check_model(model, full_check=True)
    after, count = apply(RULES, model)
    assert count == 2 and op_counts(after)["Concat"] == op_counts(model)["Concat"] - 2
    for seq, batch in RUN_SIZES:
        x = np.random.default_rng(seq).standard_normal((seq, batch, 4)).astype(np.float32)
        before, result = runtime.run(model, {"input": x}), runtime.run(after, {"input": x})
        assert runtime.max_abs_diff(before, result) == 0


# ---------------------------------------------------------------- IR versions 3 and 4


def test_ir_version_4_stores_initializers() -> None:
    """From IR 4 an initializer need not be a graph input: the folded tensors are
    initializers, not ``Constant`` nodes."""
    cfg = RnnConfig(fold_limit=0, hidden_size=4, input_size=3)
    model = build_torchlib_model(cfg)
    model.ir_version = 4
    onnx.checker.check_model(model, full_check=True)
    after = rnn_rewrite_rules.rewrite(model, FAMILY)
    assert op_counts(after)["Constant"] == 0
    stored = {t.name for t in after.graph.initializer}
    lstm = next(n for n in after.graph.node if n.op_type == "LSTM")
    assert set(lstm.input[1:4]) <= stored
    assert not stored & {i.name for i in after.graph.input}


def _ir3_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    model = initializers_as_constants(model)
    model.ir_version = 3
    onnx.checker.check_model(model, full_check=True)
    return model


def test_ir_version_3_identical_preparations_share_one_constant() -> None:
    """Two LSTMs prepare the same W from ``Constant`` nodes: one ``Constant`` holds it,
    named after the original, and the originals go."""
    nodes = [
        helper.make_node("Unsqueeze", ["w2d", "zero"], ["w"]),
        helper.make_node("Unsqueeze", ["w2d", "zero"], ["w_again"]),
        _lstm("w", "y1"),
        _lstm("w_again", "y2"),
    ]
    inits = [_floats("w2d", (4 * H, SIZE), 0), _floats("r", (1, 4 * H, H), 1), _ints("zero", 0)]
    model = _ir3_constants(_model(nodes, inits, ["y1", "y2"]))
    after = rnn_rewrite_rules.rewrite(model, FAMILY)
    onnx.checker.check_model(after, full_check=True)
    assert _rnn_inputs(after, 1) == ["w2d_W", "w2d_W"]
    constants = [n.output[0] for n in after.graph.node if n.op_type == "Constant"]
    assert sorted(constants) == ["r", "w2d_W"]
    _assert_same_outputs(model, after)


def test_ir_version_3_weights_prepared_in_both_branches_are_hoisted() -> None:
    """The same ``Constant`` weights prepared in each ``If`` branch: the ``Constant``
    folded in one branch moves to the main graph, where the other branch finds it."""
    cfg = RnnConfig(fold_limit=0, hidden_size=4, input_size=3)
    model = in_if_branches(build_torchlib_model(cfg), build_torchlib_model(cfg))
    model.ir_version = 3
    onnx.checker.check_model(model, full_check=True)
    after = rnn_rewrite_rules.rewrite(model, FAMILY)
    onnx.checker.check_model(after, full_check=True)
    main = {n.output[0] for n in after.graph.node if n.op_type == "Constant"}
    branches = [a.g for a in after.graph.node[-1].attribute]
    lstms = [n for g in branches for n in g.node if n.op_type == "LSTM"]
    assert len(lstms) == 2 and lstms[0].input[1:4] == lstms[1].input[1:4]
    assert set(lstms[0].input[1:4]) <= main
    for batch, seq in ((1, 2), (3, 4)):
        for cond in (True, False):
            feeds = random_inputs(cfg, batch, seq) | {"cond": np.array(cond)}
            assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(after, feeds)) == 0


# ---------------------------------------------------------------- names next to functions


def test_new_names_avoid_the_values_of_functions() -> None:
    """A local function's input and an inner output take ``w2d_W`` and ``w2d_W_1``: the
    folded W is ``w2d_W_2``, the first name no value of the model has."""
    function = helper.make_function(
        "local",
        "Twice",
        ["w2d_W"],
        ["out"],
        [
            helper.make_node("Add", ["w2d_W", "w2d_W"], ["w2d_W_1"]),
            helper.make_node("Identity", ["w2d_W_1"], ["out"]),
        ],
        [helper.make_opsetid("", 18)],
    )
    nodes = [
        helper.make_node("Unsqueeze", ["w2d", "zero"], ["w"]),
        _lstm("w", "y"),
        helper.make_node("Twice", ["X"], ["twice"], domain="local"),
    ]
    inits = [_floats("w2d", (4 * H, SIZE), 0), _floats("r", (1, 4 * H, H), 1), _ints("zero", 0)]
    model = _model(
        nodes,
        inits,
        ["y"],
        others=["twice"],
        functions=[function],
        opsets=[helper.make_opsetid("local", 1)],
    )
    after, count = apply(RULES, model)
    assert count == 1 and _rnn_inputs(after, 1) == ["w2d_W_2"]
    _assert_same_outputs(model, after)


# ---------------------------------------------------------------- H without hidden_size


def _h_model(r_form: str, *, hidden_size: bool, with_b: bool = False) -> onnx.ModelProto:
    """W = Unsqueeze(w2d); R an initializer, ``Unsqueeze(r2d)``, a graph input of unknown
    size, or ``Reshape(r, dims)`` (unknown rank); ``hidden_size`` given or not (it is
    optional in ONNX); ``with_b``: B = ``Unsqueeze(b1d)`` too."""
    nodes = [helper.make_node("Unsqueeze", ["w2d", "zero"], ["w"])]
    inits = [_floats("w2d", (4 * H, SIZE), 0), _ints("zero", 0)]
    if with_b:
        nodes.append(helper.make_node("Unsqueeze", ["b1d", "zero"], ["b"]))
        inits.append(_floats("b1d", (8 * H,), 2))
    r_array = _floats("r", (1, 4 * H, H), 1)
    if r_form == "computed":
        nodes.append(helper.make_node("Unsqueeze", ["r2d", "zero"], ["r"]))
        inits.append(numpy_helper.from_array(numpy_helper.to_array(r_array)[0], "r2d"))
    elif r_form == "initializer":
        inits.append(r_array)
    elif r_form == "unknown rank":
        nodes.append(helper.make_node("Reshape", ["r_flat", "r_dims"], ["r"]))
        inits.append(numpy_helper.from_array(numpy_helper.to_array(r_array).ravel(), "r_flat"))
    attrs = {"hidden_size": H} if hidden_size else {}
    lstm_inputs = ["X", "w", "r", "b"] if with_b else ["X", "w", "r"]
    nodes.append(helper.make_node("LSTM", lstm_inputs, ["y"], name="lstm", **attrs))
    r_input = helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, "gates", "hidden"])
    r_dims = helper.make_tensor_value_info("r_dims", TensorProto.INT64, ["rank"])
    extra = {"graph input": [r_input], "unknown rank": [r_dims]}.get(r_form, [])
    return _model(nodes, inits, ["y"], extra_inputs=extra)


@pytest.mark.parametrize("r_form", ["initializer", "computed"])
def test_without_hidden_size_h_is_rs_last_dim(r_form: str) -> None:
    """R [D, 4H, H] tells H: W folds (R too, when computed). ONNX Runtime requires the
    attribute, so ``onnx.reference`` runs both."""
    model = _h_model(r_form, hidden_size=False)
    after, count = apply(RULES, model)
    assert count == (2 if r_form == "computed" else 1) and op_counts(after)["Unsqueeze"] == 0
    for seed, (seq, batch) in enumerate(RUN_SIZES):
        feeds = _feeds(model, seq, batch, seed)
        before = ReferenceEvaluator(model).run(None, feeds)
        assert runtime.max_abs_diff(before, ReferenceEvaluator(after).run(None, feeds)) == 0


@pytest.mark.parametrize("r_form", ["graph input", "unknown rank"])
def test_without_hidden_size_and_an_r_of_unknown_size_w_and_b_are_not_folded(r_form) -> None:
    """W and B need H; R is folded (or refused) on its own."""
    model = _h_model(r_form, hidden_size=False, with_b=True)
    assert apply(RULES, model)[1] == 0
    unknown = "hidden_size is unknown (no attribute, R not constant)"
    r_reason = "; R: r_dims is a graph input" if r_form == "unknown rank" else ""
    assert _reasons(model) == [f"W: {unknown}{r_reason}; B: {unknown}"]


@pytest.mark.parametrize("op_type", ["LSTM", "DynamicQuantizeLSTM"])
def test_without_hidden_size_an_r_of_another_rank_is_not_folded(op_type: str) -> None:
    """R computed with a trailing axis (rank 4): no H from its proven dims, so R itself
    says H (LSTM: its last dim; the contrib op: its second), and its shape is wrong."""
    if op_type == "LSTM":
        model = _h_model("computed", hidden_size=False)
        expected = f"R: computed shape (1, {4 * H}, {H}, 1), but the node needs (1, 4, 1)"
    else:
        model = quantized_lstm_model(zero_states=False, hidden_size=3)
        expected = "R: computed shape (1, 3, 12, 1), but the node needs (1, 3, 12)"
    node = next(n for n in model.graph.node if n.op_type == op_type)
    if op_type == "DynamicQuantizeLSTM":
        del node.attribute[[a.name for a in node.attribute].index("hidden_size")]
    model.graph.initializer.append(_ints("three", 3))
    unsqueeze = helper.make_node("Unsqueeze", [node.input[2], "three"], ["r4"])
    node.input[2] = "r4"
    nodes = list(model.graph.node)
    nodes.insert(nodes.index(node), unsqueeze)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    assert apply(RULES, model, check=False)[1] == 0
    reasons = [r for r in _reasons(model) if r.startswith(("R: ", "W: "))]
    assert any(expected in r for r in reasons), reasons


def test_hidden_size_attribute_needs_no_size_from_r() -> None:
    model = _h_model("graph input", hidden_size=True)
    after, count = apply(RULES, model)
    assert count == 1 and op_counts(after)["Unsqueeze"] == 0
    r = np.random.default_rng(3).standard_normal((1, 4 * H, H)).astype(np.float32)
    for seed, (seq, batch) in enumerate(RUN_SIZES):
        feeds = _feeds(model, seq, batch, seed) | {"r": r}
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(after, feeds)) == 0


def test_dynamic_quantize_lstm_without_hidden_size_takes_h_from_r() -> None:
    """The contrib op's R is [D, H, 4H]: H is its second dim. W [D, I, 4H], re-assembled
    from two halves, folds to exactly the original W (ONNX Runtime requires the
    attribute and ``onnx.reference`` has no such op: the tensor is compared instead)."""
    model = quantized_lstm_model(direction="bidirectional", zero_states=False, hidden_size=3)
    node = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM")
    del node.attribute[[a.name for a in node.attribute].index("hidden_size")]
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == node.input[1]))
    join_halves(model, 1)
    after, count = apply(RULES, model)
    assert count == 1
    folded = next(n for n in after.graph.node if n.op_type == "DynamicQuantizeLSTM").input[1]
    stored = {t.name: numpy_helper.to_array(t) for t in after.graph.initializer}
    np.testing.assert_array_equal(stored[folded], w)


def test_graphs_attribute_bodies_share_one_tensor_in_the_outer_graph() -> None:
    """A custom op holding a list of graphs (a GRAPHS attribute; no ONNX op has one): each
    body prepares the same W from the main graph's weights, and the folded tensor is
    stored once, in the main graph both bodies read. Not runnable (custom op): the
    stored tensor is compared with the preparation's result."""
    w2d = _floats("w2d", (4 * H, SIZE), 0)

    def body(index: int) -> onnx.GraphProto:
        nodes = [
            helper.make_node("Unsqueeze", ["w2d", "zero"], [f"w{index}"]),
            _lstm(f"w{index}", f"y{index}"),
        ]
        out = helper.make_tensor_value_info(f"y{index}", TensorProto.FLOAT, [None] * 4)
        return helper.make_graph(nodes, f"body{index}", [], [out])

    holder = helper.make_node("Bodies", ["X"], ["y"], domain="custom", bodies=[body(1), body(2)])
    inits = [w2d, _floats("r", (1, 4 * H, H), 1), _ints("zero", 0)]
    model = _model([holder], inits, ["y"], opsets=[helper.make_opsetid("custom", 1)], check=False)
    after = rnn_rewrite_rules.rewrite(model, FAMILY)
    bodies = after.graph.node[0].attribute[0].graphs
    lstms = [n for g in bodies for n in g.node]
    assert [n.op_type for n in lstms] == ["LSTM", "LSTM"] and not any(g.initializer for g in bodies)
    stored = {t.name: numpy_helper.to_array(t) for t in after.graph.initializer}
    assert lstms[0].input[1] == lstms[1].input[1] == "w2d_W"
    np.testing.assert_array_equal(stored["w2d_W"], numpy_helper.to_array(w2d)[None])


def test_a_preparation_split_between_the_main_graph_and_a_branch_folds() -> None:
    """The main graph reverses ``w``'s gate rows; the ``If`` branch unsqueezes the result
    for its LSTM: one preparation across two graphs, evaluated in order and folded into
    one tensor stored where ``w`` was (the branch reads it from the outer scope)."""
    branch_nodes = [helper.make_node("Unsqueeze", ["w_rev", "zero"], ["w3"]), _lstm("w3", "y")]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)
    branch = helper.make_graph(branch_nodes, "then", [], [y])
    other = helper.make_graph(
        [helper.make_node("Unsqueeze", ["X", "zero"], ["x4"])], "else", [], [_out("x4")]
    )
    nodes = [
        helper.make_node("Slice", ["w2d", "last", "before_first", "zero", "back"], ["w_rev"]),
        helper.make_node("If", ["cond"], ["picked"], then_branch=branch, else_branch=other),
    ]
    inits = [
        _floats("w2d", (4 * H, SIZE), 0),
        _floats("r", (1, 4 * H, H), 1),
        _ints("zero", 0),
        *_REVERSE_BOUNDS[:2],
        _ints("back", -1),
    ]
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    model = _model(nodes, inits, ["picked"], extra_inputs=[cond])
    after, count = apply(RULES, model)
    assert count == 1 and op_counts(after)["Slice"] == 0
    (then,) = [a.g for a in after.graph.node[-1].attribute if a.name == "then_branch"]
    lstm = next(n for n in then.node if n.op_type == "LSTM")
    assert lstm.input[1] in {t.name for t in after.graph.initializer}
    for seed, (seq, batch) in enumerate(RUN_SIZES):
        feeds = _feeds(model, seq, batch, seed) | {"cond": np.array(True)}
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(after, feeds)) == 0


def test_a_weight_computed_by_another_domains_op_names_it() -> None:
    nodes = [helper.make_node("Prepare", ["w2d"], ["w"], domain="custom"), _lstm("w", "y")]
    inits = [_floats("w2d", (4 * H, SIZE), 0), _floats("r", (1, 4 * H, H), 1)]
    model = _model(nodes, inits, ["y"], opsets=[helper.make_opsetid("custom", 1)], check=False)
    assert apply(RULES, model, check=False)[1] == 0
    assert _reasons(model) == ["W: w is computed by custom::Prepare, not one of the foldable ops"]

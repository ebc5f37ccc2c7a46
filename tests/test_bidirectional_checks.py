"""bidirectional: the checks of the hand-built merges, one fact at a time.

Each near miss changes one fact of a graph the family merges (a Slice bound, an axis, a
reader, an input) and asserts the exact refusal; each boundary that is still a full
reversal or the right axis is merged and checked in ONNX Runtime. Edits are made on the
IR of :func:`rnn_rewrite_rules.testing.thirdparty.hand_built_bidirectional`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import bidirectional
from rnn_rewrite_rules.rules.bidirectional import states as bidirectional_states
from rnn_rewrite_rules.testing import thirdparty as tp
from rnn_rewrite_rules.testing.exporters import in_if_branches
from tests.reasons import refusal_reasons
from tests.support import apply, as_function

#: Target ``onnxruntime``: on ``portable`` a lone reversed half stays (tract runs a reverse
#: node forward: ``rules._kernels.WRONG_DIRECTIONS``, tested in
#: tests/test_lone_reversed_half_states.py); the checks are the same on both targets.
TARGET = "onnxruntime"
RULES = bidirectional.FAMILY.rules_for(TARGET)
#: Each rule alone, so that a refusal is the one rule's (two rules often give one reason).
#: In the family, the reverse rule turns a Slice-reversed half into a reverse node before
#: the Concat is reached, so the merge's own Slice proof only runs with the merge alone.
MERGE = [bidirectional.MergeHandBuiltBidirectional.rule()]
REVERSE = [bidirectional.MergeHandBuiltReverse.rule(TARGET)]
STATES = bidirectional_states.state_rules()
FULL = 2**62  # an end at or below -FULL, a start at or above FULL: every length
Edit = Callable[[ir.Graph], None]


def _edited(model: onnx.ModelProto, edit: Edit) -> onnx.ModelProto:
    ir_model = ir.serde.deserialize_model(model)
    edit(ir_model.graph)
    return ir.serde.serialize_model(ir_model)


def _nodes(graph: ir.Graph, op_type: str) -> list[ir.Node]:
    return [node for node in graph if node.op_type == op_type]


def _ints(graph: ir.Graph, *values: int) -> ir.Value:
    value = ir.Value(
        name=f"edit_{len(graph.initializers)}", const_value=ir.tensor(np.array(values, np.int64))
    )
    graph.register_initializer(value)
    return value


def _input_slice(graph: ir.Graph) -> ir.Node:
    """The Slice that reverses ``x`` (the other Slice reverses the backward half's Y)."""
    (node,) = [n for n in _nodes(graph, "Slice") if n.inputs[0] is graph.inputs[0]]
    return node


def _output_slice(graph: ir.Graph) -> ir.Node:
    (node,) = [n for n in _nodes(graph, "Slice") if n.inputs[0] is not graph.inputs[0]]
    return node


def _bound(index: int, *values: int, which: Callable[[ir.Graph], ir.Node] = _input_slice) -> Edit:
    """Set input ``index`` (1 starts, 2 ends, 3 axes, 4 steps) of a reversal Slice."""

    def edit(graph: ir.Graph) -> None:
        which(graph).replace_input_with(index, _ints(graph, *values))

    return edit


def _also_read(pick: Callable[[ir.Graph], ir.Value]) -> Edit:
    """A second reader of a value: ``Abs`` of it, a graph output of its own."""

    def edit(graph: ir.Graph) -> None:
        node = ir.Node("", "Abs", [pick(graph)], name="also_read")
        node.outputs[0].name = "also_read"
        graph.append(node)
        graph.outputs.append(node.outputs[0])

    return edit


def _concat(graph: ir.Graph) -> ir.Node:
    """Y's Concat (before the states' Concats, if any)."""
    return _nodes(graph, "Concat")[0]


def _set_axis(node_of: Callable[[ir.Graph], ir.Node], axis: int | None) -> Edit:
    def edit(graph: ir.Graph) -> None:
        node = node_of(graph)
        if axis is None:
            del node.attributes["axis"]
        else:
            node.attributes["axis"] = ir.AttrInt64("axis", axis)

    return edit


def _rnns(graph: ir.Graph) -> list[ir.Node]:
    """The RNN nodes, the backward (built first) then the forward one."""
    return [n for n in graph if n.op_type in ("LSTM", "GRU", "RNN")]


def _merged(
    before: onnx.ModelProto,
    direction: str = "bidirectional",
    rules=None,
    *,
    constant_nodes: bool = False,
) -> onnx.ModelProto:
    """Rewritten (by the family, or ``rules`` alone) to one RNN node of ``direction``, no
    Slice and, unless ``constant_nodes``, no Constant node (its constants are initializers
    of the main graph), equal outputs in ONNX Runtime."""
    if rules is None:
        after = rnn_rewrite_rules.rewrite(before, ["bidirectional"], target=TARGET)
    else:
        after, _ = apply(rules, before)
    onnx.checker.check_model(after, full_check=True)
    ops = [n.op_type for n in after.graph.node]
    rnn = [n for n in after.graph.node if n.op_type in ("LSTM", "GRU", "RNN")]
    assert len(rnn) == 1, ops
    assert {a.name: a.s for a in rnn[0].attribute}["direction"] == direction.encode()
    assert "Slice" not in ops and (constant_nodes or "Constant" not in ops), ops
    for seed, (batch, seq) in enumerate(((1, 1), (3, 5), (2, 7))):
        feeds = tp.thirdparty_inputs(before, batch, seq, rng=seed)
        diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
        assert diff <= 1e-5, f"batch={batch} seq={seq}: {diff}"
    return after


def _directions(model: onnx.ModelProto) -> list[bytes]:
    return sorted(
        {a.name: a.s for a in n.attribute}.get("direction", b"forward")
        for n in model.graph.node
        if n.op_type in ("LSTM", "GRU", "RNN")
    )


def _refused(model: onnx.ModelProto, reason: str, rules=MERGE, *, unchanged: bool = False) -> None:
    """``reason`` is among the refusals of ``rules``, and the family makes no node
    bidirectional; ``unchanged``: nor turns one around (a near miss of the reversed input)."""
    found = refusal_reasons(rules, model)
    assert reason in found, found
    after = rnn_rewrite_rules.rewrite(model, ["bidirectional"], target=TARGET)
    assert b"bidirectional" not in _directions(after)
    if unchanged:
        assert _directions(after) == _directions(model)


# ---------------------------------------------------------------- the reversal Slices

BOUNDARIES = {
    "start_at_full": _bound(1, FULL),
    "end_at_full": _bound(2, -FULL),
    "axis_minus_3": _bound(3, -3),
    "axes_omitted": lambda g: _input_slice(g).replace_input_with(3, None),
    "output_start_at_full": _bound(1, FULL, which=_output_slice),
}


@pytest.mark.parametrize("edit", BOUNDARIES.values(), ids=BOUNDARIES.keys())
@pytest.mark.parametrize("halves", ["both", "reverse"])
def test_every_full_reversal_is_merged(edit: Edit, halves: str) -> None:
    before = _edited(tp.hand_built_bidirectional("GRU", halves=halves), edit)
    direction = "bidirectional" if halves == "both" else "reverse"
    _merged(before, direction)
    _merged(before, direction, MERGE if halves == "both" else REVERSE)


SLICE_NEAR_MISSES = {
    "start_-2": (_bound(1, -2), "the Slice starts at -2, not at the last element"),
    "start_below_full": (
        _bound(1, FULL - 1),
        f"the Slice starts at {FULL - 1}, not at the last element",
    ),
    "end_above_full": (_bound(2, -FULL + 1), f"the Slice ends at {-FULL + 1}: not a full reversal"),
    "step_-2": (_bound(4, -2), "the Slice does not step backwards over axis 0"),
    "axis_1": (_bound(3, 1), "the Slice does not step backwards over axis 0"),
    "axis_-2": (_bound(3, -2), "the Slice does not step backwards over axis 0"),
    "no_steps": (
        lambda g: _input_slice(g).resize_inputs(4),
        "the Slice has no steps (step 1)",
    ),
    "two_axes": (
        lambda g: [
            _input_slice(g).replace_input_with(i, _ints(g, *v))
            for i, v in ((1, (-1, -1)), (2, (-FULL, -FULL)), (3, (0, 1)), (4, (-1, -1)))
        ],
        "the Slice's bounds are not constant or not one axis",
    ),
    "runtime_start": (
        lambda g: _input_slice(g).replace_input_with(1, _runtime_input(g)),
        "the Slice's bounds are not constant or not one axis",
    ),
    "custom_domain": (lambda g: setattr(_input_slice(g), "domain", "custom"), "not a Slice"),
    # -1 of an unknown rank: not provably axis 0
    "axis_-1_rank_unknown": (
        lambda g: [setattr(g.inputs[0], "shape", None), _bound(3, -1)(g)],
        "the Slice does not step backwards over axis 0",
    ),
}


def _runtime_input(graph: ir.Graph) -> ir.Value:
    value = ir.Value(name="start", shape=ir.Shape([1]), type=ir.TensorType(ir.DataType.INT64))
    graph.inputs.append(value)
    return value


@pytest.mark.parametrize(
    ("edit", "reason"), SLICE_NEAR_MISSES.values(), ids=SLICE_NEAR_MISSES.keys()
)
@pytest.mark.parametrize("halves", ["both", "reverse"])
def test_input_slice_near_misses(edit: Edit, reason: str, halves: str) -> None:
    """The Slice of ``x`` is not a full reversal: refused by the merge (both halves) and
    by the reverse rule (one half) alike."""
    model = _edited(tp.hand_built_bidirectional("LSTM", halves=halves), edit)
    _refused(model, reason, MERGE if halves == "both" else REVERSE, unchanged=True)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (_bound(1, -2, which=_output_slice), "the Slice starts at -2, not at the last element"),
        (_bound(3, 1, which=_output_slice), "the Slice does not step backwards over axis 0"),
    ],
)
def test_output_slice_near_misses(edit: Edit, reason: str) -> None:
    _refused(_edited(tp.hand_built_bidirectional("LSTM"), edit), reason, REVERSE)


def _backward_reads(make: Callable[[ir.Graph], ir.Value]) -> Edit:
    def edit(graph: ir.Graph) -> None:
        backward = _rnns(graph)[0]
        backward.replace_input_with(0, make(graph))

    return edit


_NOT_REVERSED_X = "the second RNN does not read the reversed input of the first"


def _neg_of_x(graph: ir.Graph) -> ir.Value:
    node = ir.Node("", "Neg", [graph.inputs[0]], name="neg")
    graph.insert_before(_rnns(graph)[0], node)
    return node.outputs[0]


def _reversed_other_input(graph: ir.Graph) -> ir.Value:
    other = ir.Value(name="x2", shape=graph.inputs[0].shape, type=graph.inputs[0].type)
    graph.inputs.append(other)
    _input_slice(graph).replace_input_with(0, other)
    return _nodes(graph, "Slice")[0].outputs[0]


@pytest.mark.parametrize(
    ("edit", "reason", "unchanged"),
    [
        (_backward_reads(_neg_of_x), "not a Slice", True),
        (_backward_reads(lambda g: g.inputs[0]), _NOT_REVERSED_X, True),
        # the backward half alone is a reverse node on x2
        (_backward_reads(_reversed_other_input), _NOT_REVERSED_X, False),
    ],
    ids=["neg", "x_itself", "other_input"],
)
def test_backward_half_input_near_misses(edit: Edit, reason: str, unchanged: bool) -> None:
    model = _edited(tp.hand_built_bidirectional("RNN"), edit)
    _refused(model, reason, unchanged=unchanged)


def test_reverse_half_alone_reading_x_itself() -> None:
    """A forward node on ``x`` whose Y is reversed is not a reverse node."""
    model = _edited(
        tp.hand_built_bidirectional("GRU", halves="reverse"), _backward_reads(lambda g: g.inputs[0])
    )
    found = refusal_reasons(REVERSE, model)
    assert "the RNN does not read a reversed input" in found, found


def test_reverse_node_reading_another_input() -> None:
    def edit(graph: ir.Graph) -> None:
        other = ir.Value(name="x2", shape=graph.inputs[0].shape, type=graph.inputs[0].type)
        graph.inputs.append(other)
        _rnns(graph)[0].replace_input_with(0, other)

    model = _edited(tp.hand_built_bidirectional("GRU", reverse_node=True), edit)
    _refused(model, "the reverse RNN does not read the forward RNN's input")
    state_model = _edited(
        tp.hand_built_bidirectional("GRU", reverse_node=True, state_concat=True), edit
    )
    _refused(state_model, "the reverse RNN does not read the forward RNN's input", STATES)


# ---------------------------------------------------------------- the Concat and the path to Y


def _squeeze(graph: ir.Graph, which: int) -> ir.Node:
    """The Squeeze after the backward (0) or forward (1) node."""
    return _nodes(graph, "Squeeze")[which]


@pytest.mark.parametrize(
    ("concat", "edit"),
    [
        ("sequence", _set_axis(_concat, 2)),
        ("sequence", lambda g: _squeeze(g, 0).replace_input_with(1, _ints(g, -3))),
        ("directions", _set_axis(_concat, -3)),
    ],
    ids=["feature_axis_2", "squeeze_-3", "direction_axis_-3"],
)
@pytest.mark.parametrize("pair", ["sliced", "reverse_node", "state_concat"])
def test_other_spellings_of_the_axes_are_merged(concat: str, edit: Edit, pair: str) -> None:
    kwargs = {"reverse_node": pair != "sliced", "state_concat": pair == "state_concat"}
    before = _edited(tp.hand_built_bidirectional("GRU", concat=concat, **kwargs), edit)
    _merged(before)


@pytest.mark.parametrize("pair", ["sliced", "reverse_node", "state_concat"])
@pytest.mark.parametrize(
    ("concat", "edit", "reason"),
    [
        ("sequence", _set_axis(_concat, 0), "the halves are not concatenated on the feature axis"),
        ("sequence", _set_axis(_concat, 1), "the halves are not concatenated on the feature axis"),
        (
            "directions",
            _set_axis(_concat, 0),
            "the halves are not concatenated on the direction axis",
        ),
        (
            "directions",
            _set_axis(_concat, None),
            "the halves are not concatenated on the direction axis",
        ),
        (
            "directions",
            _set_axis(_concat, 2),
            "the halves are not concatenated on the direction axis",
        ),
        (
            "sequence",
            lambda g: _squeeze(g, 1).replace_input_with(1, _ints(g, 0)),
            "the Squeeze does not remove the direction axis",
        ),
    ],
    ids=["feature_0", "feature_1", "direction_0", "direction_default", "direction_2", "squeeze_0"],
)
def test_concat_near_misses(pair: str, concat: str, edit: Edit, reason: str) -> None:
    kwargs = {"reverse_node": pair != "sliced", "state_concat": pair == "state_concat"}
    model = _edited(tp.hand_built_bidirectional("LSTM", concat=concat, **kwargs), edit)
    _refused(model, reason, STATES if pair == "state_concat" else MERGE)


def _swap_concat(graph: ir.Graph) -> None:
    concat = _concat(graph)
    a, b = concat.inputs
    concat.replace_input_with(0, b)
    concat.replace_input_with(1, a)


def _unsqueezed_backward(graph: ir.Graph) -> None:
    """The backward half reversed without its Squeeze (the forward one keeps its)."""
    squeeze = _squeeze(graph, 0)
    _output_slice(graph).replace_input_with(0, squeeze.inputs[0])
    graph.remove(squeeze, safe=True)


def _y_h_concatenated(graph: ir.Graph) -> None:
    _squeeze(graph, 1).replace_input_with(0, _rnns(graph)[1].outputs[1])


def _twice_reversed(graph: ir.Graph) -> None:
    first = _output_slice(graph)
    again = ir.Node("", "Slice", [first.outputs[0], *first.inputs[1:]], name="again")
    graph.insert_after(first, again)
    _concat(graph).replace_input_with(1, again.outputs[0])


def _graph_input_concatenated(graph: ir.Graph) -> None:
    other = ir.Value(name="z", shape=ir.Shape(["seq", "batch", 4]), type=graph.inputs[0].type)
    graph.inputs.append(other)
    _concat(graph).replace_input_with(0, other)


def _layout_1(graph: ir.Graph) -> None:
    _rnns(graph)[1].attributes["layout"] = ir.AttrInt64("layout", 1)


def _custom_domain(graph: ir.Graph) -> None:
    forward = _rnns(graph)[1]
    node = ir.Node("custom", "LSTM", forward.inputs, forward.attributes.values(), num_outputs=3)
    graph.insert_before(forward, node)
    forward.outputs[0].replace_all_uses_with(node.outputs[0])
    graph.remove(forward, safe=True)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (_swap_concat, "not a forward half followed by a reversed half"),
        (_unsqueezed_backward, "only one half is squeezed"),
        (_also_read(lambda g: _concat(g).inputs[0]), "a concatenated value has another reader"),
        (_also_read(lambda g: _concat(g).inputs[1]), "a concatenated value has another reader"),
        (_also_read(lambda g: _rnns(g)[0].outputs[0]), "an intermediate value has another reader"),
        (_y_h_concatenated, "the value is not the RNN's Y"),
        (_twice_reversed, "Slice between the RNN and the Concat"),
        (_graph_input_concatenated, "the concatenated value is not computed from an RNN's Y"),
        (_custom_domain, "LSTM between the RNN and the Concat"),
        (_layout_1, "layout=1 RNN"),
    ],
    ids=[
        "swapped", "one_squeezed", "forward_read", "backward_read", "intermediate_read",
        "y_h", "twice_reversed", "graph_input", "custom_domain", "layout",
    ],
)  # fmt: skip
def test_path_near_misses(edit: Edit, reason: str) -> None:
    _refused(_edited(tp.hand_built_bidirectional("LSTM"), edit), reason)


# ---------------------------------------------------------------- where the merged node goes


@pytest.mark.parametrize(
    "build",
    [
        lambda: tp.hand_built_bidirectional("GRU", halves="reverse"),
        lambda: tp.hand_built_bidirectional("GRU", reverse_node=True, state_concat=True),
    ],
    ids=["reverse", "state_concat"],
)
def test_a_function_importing_another_opset_is_left_alone(build) -> None:
    model = build()
    version = model.opset_import[0].version
    reason = (
        f"function 'layer' imports opset {version - 1} of 'ai.onnx' but the model "
        f"{version}: an emitted op would be invalid in one of them"
    )
    found = refusal_reasons(RULES, as_function(model, version - 1))
    assert reason in found, found


#: The three merges: a reversed half, a sliced pair, a pair with concatenated states.
_THREE_MERGES = pytest.mark.parametrize(
    "build",
    [
        lambda: tp.hand_built_bidirectional("GRU", halves="reverse"),
        lambda: tp.hand_built_bidirectional("GRU"),
        lambda: tp.hand_built_bidirectional("GRU", reverse_node=True, state_concat=True),
    ],
    ids=["reverse", "sliced", "state_concat"],
)


@_THREE_MERGES
def test_merged_in_a_function_with_constant_nodes(build) -> None:
    """In a function (no initializers), stacked weights and targets are Constant nodes."""
    model = build()
    wrapped = as_function(model, model.opset_import[0].version)
    after = rnn_rewrite_rules.rewrite(wrapped, ["bidirectional"], target=TARGET)
    onnx.checker.check_model(after, full_check=True)
    (function,) = after.functions
    ops = [n.op_type for n in function.node]
    assert ops.count("GRU") == 1 and "Slice" not in ops, ops
    for seed, (batch, seq) in enumerate(((1, 1), (3, 5))):
        feeds = tp.thirdparty_inputs(model, batch, seq, rng=seed)
        diff = runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(after, feeds))
        assert diff <= 1e-5, f"batch={batch} seq={seq}: {diff}"


@_THREE_MERGES
def test_merged_in_if_branches_with_constant_nodes(build) -> None:
    """In a subgraph, the stacked weights and the Reshape target (Squeeze axes) are
    Constant nodes: a subgraph cannot tell which names the rest of the model takes."""
    model = build()
    before = in_if_branches(model, model)
    after = rnn_rewrite_rules.rewrite(before, ["bidirectional"], target=TARGET)
    onnx.checker.check_model(after, full_check=True)
    for branch in after.graph.node[0].attribute:
        ops = [n.op_type for n in branch.g.node]
        assert ops.count("GRU") == 1 and "Constant" in ops, ops
        assert not branch.g.initializer  # the weights stacked are Constant nodes too
    for seed, (batch, seq) in enumerate(((1, 1), (3, 5))):
        feeds = {**tp.thirdparty_inputs(before, batch, seq, rng=seed), "cond": np.array(seed == 0)}
        diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
        assert diff <= 1e-5, f"batch={batch} seq={seq}: {diff}"


# ---------------------------------------------------------------- the pair with concatenated states


def test_lstm_pair_without_y_c_is_merged_by_the_two_output_rule() -> None:
    """LSTMs with only ``Y`` and ``Y_h``: the three-output rule refuses, the two-output
    one merges."""

    def edit(graph: ir.Graph) -> None:
        (c_n,) = [v for v in graph.outputs if v.name == "c_n"]
        identity = c_n.producer()
        concat = identity.inputs[0].producer()
        graph.outputs.remove(c_n)
        graph.remove([identity, concat], safe=True)
        for node in _rnns(graph):
            node.resize_outputs(2)

    model = _edited(tp.hand_built_bidirectional("LSTM", reverse_node=True, state_concat=True), edit)
    found = refusal_reasons(STATES, model)
    assert "an RNN node has fewer than 3 outputs" in found, found
    _merged(model)


def test_state_pair_of_different_clips_is_left_alone() -> None:
    def edit(graph: ir.Graph) -> None:
        for clip, node in zip((1.0, 2.0), _rnns(graph), strict=True):
            node.attributes["clip"] = ir.AttrFloat32("clip", clip)

    model = _edited(tp.hand_built_bidirectional("GRU", reverse_node=True, state_concat=True), edit)
    _refused(model, "the two halves differ in clip", STATES)


def _without_x(graph: ir.Graph) -> None:
    """The backward node reads no ``X`` (a malformed node must be refused, not crash)."""
    _rnns(graph)[0].replace_input_with(0, None)


@pytest.mark.parametrize(
    ("near_miss", "edit", "reason"),
    [
        (
            None,
            _also_read(lambda g: _rnns(g)[0].outputs[0]),
            "an intermediate value has another reader",
        ),
        ("sequence_lens", None, "sequence_lens is present: the Slice reverses the padding too"),
        (None, _without_x, "the RNN does not read a reversed input"),
    ],
    ids=["intermediate_read", "sequence_lens", "no_x"],
)
def test_reversed_half_alone_near_misses(near_miss, edit, reason: str) -> None:
    model = tp.hand_built_bidirectional("LSTM", halves="reverse", near_miss=near_miss)
    if edit is not None:
        model = _edited(model, edit)
    found = refusal_reasons(REVERSE, model)
    assert reason in found, found


def test_reversed_half_alone_with_its_state_read_is_one_reverse_node() -> None:
    """A read ``Y_h`` (an ``Abs`` to a graph output) becomes the reverse node's ``Y_h``
    (issue 42: before, refused as "Y_h or Y_c is read")."""

    def edit(graph: ir.Graph) -> None:
        _also_read(lambda g: _rnns(g)[0].outputs[1])(graph)
        graph.outputs[-1].type = ir.TensorType(ir.DataType.FLOAT)
        graph.outputs[-1].shape = ir.Shape([1, "batch", 4])

    model = _edited(tp.hand_built_bidirectional("LSTM", halves="reverse"), edit)
    after = _merged(model, "reverse")
    assert [o.name for o in after.graph.output] == ["y", "also_read"]


def test_merge_without_x_is_refused() -> None:
    model = _edited(tp.hand_built_bidirectional("GRU"), _without_x)
    _refused(model, _NOT_REVERSED_X)


# ---------------------------------------------------------------- a Concat of a whole Split

WHOLE_SPLIT = [bidirectional_states.ConcatWholeSplit.rule()]
_NOT_WHOLE = "a Split's outputs are not concatenated whole, in order, on its axis"


def _split_concat(split_axis: int | None, concat_axis: int, inputs: str) -> onnx.ModelProto:
    """``s0, s1 = Split(v)`` on ``split_axis`` (None: no attribute, axis 0), ``u0 =
    Split(w)`` whole on axis 1 (one output); ``o = Concat(inputs)`` on ``concat_axis``."""
    axis = "" if split_axis is None else f"axis = {split_axis}, "
    return onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[2, 2, 2] v, float[2, 2, 2] w) => (float[?, ?, ?] o) {{
        s0, s1 = Split <{axis}num_outputs = 2> (v)
        u0 = Split <axis = 1, num_outputs = 1> (w)
        o = Concat <axis = {concat_axis}> ({inputs})
    }}
    """)


def _rank_unknown(model: onnx.ModelProto) -> onnx.ModelProto:
    """``v`` declares no shape: the rank a negative axis needs is unknown."""
    model.graph.input[0].type.tensor_type.ClearField("shape")
    return model


@pytest.mark.parametrize(
    ("split_axis", "concat_axis", "inputs", "folded"),
    [
        (0, 0, "s0, s1, w", ["v", "w"]),
        (0, 0, "w, s0, s1", ["w", "v"]),
        (0, 0, "s1, s0, s1", ["s1", "v"]),  # a later output first, then the whole Split
        (0, 0, "s0, s0, s1", ["s0", "v"]),  # the first output, not followed by the rest
        (-3, 0, "s0, s1, w", ["v", "w"]),
        (0, -3, "s0, s1, w", ["v", "w"]),
        (-1, 2, "w, s0, s1", ["w", "v"]),
        (0, 0, "w, u0, s0, s1", ["w", "u0", "v"]),  # u0: a whole Split on another axis
        (None, 0, "s0, s1, w", ["v", "w"]),
    ],
)
def test_a_whole_split_in_a_concat_is_its_input(split_axis, concat_axis, inputs, folded) -> None:
    before = _split_concat(split_axis, concat_axis, inputs)
    after, count = apply(WHOLE_SPLIT, before)
    assert count == 1
    (concat,) = [n for n in after.graph.node if n.op_type == "Concat"]
    assert list(concat.input) == folded
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((2, 2, 2)).astype(np.float32) for n in ("v", "w")}
    assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) == 0


@pytest.mark.parametrize(
    ("split_axis", "concat_axis", "inputs", "reason"),
    [
        (0, 0, "w, w", "no input is a Split's output"),
        (0, 0, "s1, s0", _NOT_WHOLE),
        (0, 1, "s0, s1", _NOT_WHOLE),
        (-3, 2, "s0, s1", _NOT_WHOLE),
        (0, 0, "s0, w, s1", _NOT_WHOLE),
        (None, 1, "s0, s1", _NOT_WHOLE),
        ("unranked", -1, "s0, s1", _NOT_WHOLE),  # -1 on both, of an unknown rank
    ],
)
def test_a_split_not_concatenated_whole_is_refused(split_axis, concat_axis, inputs, reason):
    if split_axis == "unranked":
        model = _rank_unknown(_split_concat(-1, concat_axis, inputs))
    else:
        model = _split_concat(split_axis, concat_axis, inputs)
    assert reason in refusal_reasons(WHOLE_SPLIT, model)
    assert apply(WHOLE_SPLIT, model, check=False)[1] == 0  # an unranked input: not checked


def test_a_whole_split_of_a_graph_output_is_copied() -> None:
    """Folded to one value that is also a graph output: an Identity keeps both names."""
    before = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[2, 2, 2] w) => (float[2, 2, 2] v, float[2, 2, 2] o) {
        v = Abs (w)
        s0, s1 = Split <axis = 0, num_outputs = 2> (v)
        o = Concat <axis = 0> (s0, s1)
    }
    """)
    after, count = apply(WHOLE_SPLIT, before)
    assert count == 1
    assert [o.name for o in after.graph.output] == ["v", "o"]
    feeds = {"w": np.random.default_rng(0).standard_normal((2, 2, 2)).astype(np.float32)}
    assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) == 0


# ---------------------------------------------------------------- the two halves' nodes


def _weights(graph: ir.Graph, node: ir.Node, hidden: int) -> None:
    """Give a GRU node weights (W, R, B) and ``hidden_size`` for ``hidden``."""
    rng = np.random.default_rng(1)
    size = node.inputs[1].const_value.shape[2]
    for index, shape in (
        (1, (1, 3 * hidden, size)),
        (2, (1, 3 * hidden, hidden)),
        (3, (1, 6 * hidden)),
    ):
        value = ir.Value(
            name=f"resized_{index}",
            const_value=ir.tensor(rng.standard_normal(shape).astype(np.float32)),
        )
        graph.register_initializer(value)
        node.replace_input_with(index, value)
    node.attributes["hidden_size"] = ir.AttrInt64("hidden_size", hidden)


def _other_lens(graph: ir.Graph) -> None:
    lens = ir.Value(
        name="other_lens", shape=ir.Shape(["batch"]), type=ir.TensorType(ir.DataType.INT32)
    )
    graph.inputs.append(lens)
    _rnns(graph)[0].replace_input_with(4, lens)


def _set_attr(which: int, attr: ir.Attr) -> Edit:
    def edit(graph: ir.Graph) -> None:
        _rnns(graph)[which].attributes[attr.name] = attr

    return edit


def _drop_state(graph: ir.Graph) -> None:
    _rnns(graph)[0].replace_input_with(5, None)


PAIR_NEAR_MISSES = {
    "ops": (
        {},
        lambda g: setattr(_rnns(g)[0], "op_type", "RNN"),
        "the two halves are different ops",
    ),
    "sequence_lens": (
        {"sequence_lens": True},
        _other_lens,
        "the halves have different sequence_lens",
    ),
    "hidden": (
        {},
        lambda g: _weights(g, _rnns(g)[0], 5),
        "the two halves have different hidden sizes",
    ),
    "attributes": (
        {},
        _set_attr(1, ir.AttrFloat32("clip", 1.0)),
        "the two halves have different attributes",
    ),
    "attribute_value": (
        {},
        _set_attr(0, ir.AttrInt64("linear_before_reset", 0)),
        "the two halves differ in linear_before_reset",
    ),
    "one_state": ({"states": True}, _drop_state, "only one half has an initial state or peepholes"),
    "forward_reversed": (
        {},
        _set_attr(1, ir.AttrString("direction", "reverse")),
        "the RNN is not a forward one",
    ),
}


@pytest.mark.parametrize(
    ("kwargs", "edit", "reason"), PAIR_NEAR_MISSES.values(), ids=PAIR_NEAR_MISSES.keys()
)
def test_pair_near_misses(kwargs: dict, edit: Edit, reason: str) -> None:
    """A forward and a reverse GRU on ``x`` that are not one bidirectional layer."""
    model = _edited(tp.hand_built_bidirectional("GRU", reverse_node=True, **kwargs), edit)
    _refused(model, reason)


@pytest.mark.parametrize("half", [0, 1], ids=["reverse", "forward"])
def test_a_half_whose_state_is_read_is_merged(half: int) -> None:
    """A half's ``Y_h`` read on its own (here by an ``Abs`` graph output): the merged
    node's ``Split(Y_h)`` half of that direction takes its place."""

    def edit(graph: ir.Graph) -> None:
        _also_read(lambda g: _rnns(g)[half].outputs[1])(graph)
        graph.outputs[-1].type = ir.TensorType(ir.DataType.FLOAT)
        graph.outputs[-1].shape = ir.Shape([1, "batch", 4])
        graph.outputs[-1].shape = ir.Shape([1, "batch", 4])

    model = _edited(tp.hand_built_bidirectional("GRU", reverse_node=True), edit)
    after = _merged(model)
    assert [n.op_type for n in after.graph.node].count("Split") == 1


def test_activations_given_for_both_halves_are_merged() -> None:
    """Activations are per direction: given on both halves, they are concatenated."""

    def edit(graph: ir.Graph) -> None:
        for node in _rnns(graph):
            node.attributes["activations"] = ir.AttrStrings("activations", ["Sigmoid", "Tanh"])

    before = _edited(tp.hand_built_bidirectional("GRU", reverse_node=True), edit)
    after = _merged(before)
    (node,) = [n for n in after.graph.node if n.op_type == "GRU"]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attributes["activations"] == [b"Sigmoid", b"Tanh"] * 2


def _drop_bias(graph: ir.Graph) -> None:
    _rnns(graph)[0].replace_input_with(3, None)


def _computed_forward_bias(graph: ir.Graph) -> None:
    """The forward half's B read through an Identity (not a constant), the backward's
    dropped: the merged B is Concat(B_f, B_f * 0)."""
    forward = _rnns(graph)[1]
    node = ir.Node("", "Identity", [forward.inputs[3]], name="bias")
    graph.insert_before(forward, node)
    forward.replace_input_with(3, node.outputs[0])
    _drop_bias(graph)


def _no_direction(graph: ir.Graph) -> None:
    for node in _rnns(graph):
        del node.attributes["direction"]


def _attribute_squeezes(graph: ir.Graph) -> None:
    """Squeeze's axes as an attribute (opset 12)."""
    for node in _nodes(graph, "Squeeze"):
        axes = node.inputs[1].const_value.numpy().tolist()
        node.resize_inputs(1)
        node.attributes["axes"] = ir.AttrInt64s("axes", axes)


@pytest.mark.parametrize(
    ("reverse_node", "edit", "opset"),
    [
        (True, _drop_bias, None),
        (True, _computed_forward_bias, None),
        (False, _no_direction, None),
        (False, _attribute_squeezes, 12),
        (True, _attribute_squeezes, 12),
    ],
    ids=["one_bias", "computed_bias", "no_direction", "squeeze_attribute", "reverse_attribute"],
)
def test_pair_forms_are_merged(reverse_node: bool, edit: Edit, opset: int | None) -> None:
    model = tp.hand_built_bidirectional("GRU", reverse_node=reverse_node)
    if opset is not None:
        model.opset_import[0].version = opset
    before = _edited(model, edit)
    # zeros for the half without B: a Constant node, when the other B is computed
    _merged(before, constant_nodes=edit is _computed_forward_bias)
    if not reverse_node:
        _merged(before, rules=MERGE)


def test_stacked_weights_are_named_after_the_forward_half() -> None:
    """W, R, B stack into one initializer each, named ``<forward's>_bidirectional`` (or
    ``_1``, ``_2``... past a name an initializer, a graph input or a node output takes);
    the merged node has Y only."""
    model = tp.hand_built_bidirectional("GRU", reverse_node=True)
    forward = [n for n in model.graph.node if n.op_type == "GRU"][1]
    w, r, b = forward.input[1:4]
    for name in (f"{w}_bidirectional", f"{w}_bidirectional_1"):  # unused initializers
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(1, np.float32), name))
    unused = onnx.helper.make_tensor_value_info(f"{r}_bidirectional", onnx.TensorProto.FLOAT, [1])
    model.graph.input.append(unused)
    x = model.graph.input[0].name
    model.graph.node.append(onnx.helper.make_node("Identity", [x], [f"{b}_bidirectional"]))
    after, count = apply(MERGE, model)
    assert count == 1
    (node,) = [n for n in after.graph.node if n.op_type == "GRU"]
    expected = [f"{w}_bidirectional_2", f"{r}_bidirectional_1", f"{b}_bidirectional_1"]
    assert node.input[1:4] == expected
    assert len(node.output) == 1


@pytest.mark.parametrize(("opset", "edit"), [(12, _attribute_squeezes), (13, None)])
def test_a_reversed_half_is_squeezed_as_its_opset_wants(opset: int, edit: Edit | None) -> None:
    """Squeeze's axes: an attribute before opset 13, an input from 13 (the checker tells)."""
    model = tp.hand_built_bidirectional("GRU", halves="reverse")
    model.opset_import[0].version = opset
    _merged(model if edit is None else _edited(model, edit), "reverse", REVERSE)


def test_a_reversed_half_alone_keeps_its_activations() -> None:
    def edit(graph: ir.Graph) -> None:
        _rnns(graph)[0].attributes["activations"] = ir.AttrStrings(
            "activations", ["Sigmoid", "Tanh"]
        )

    before = _edited(tp.hand_built_bidirectional("GRU", halves="reverse"), edit)
    after = _merged(before, "reverse", REVERSE)
    (node,) = [n for n in after.graph.node if n.op_type == "GRU"]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attributes["activations"] == [b"Sigmoid", b"Tanh"]


def test_a_squeeze_of_every_unit_axis_is_refused() -> None:
    """``Squeeze(Y)`` without axes also drops a batch of 1: not the direction axis alone."""

    def edit(graph: ir.Graph) -> None:
        _squeeze(graph, 1).resize_inputs(1)

    model = _edited(tp.hand_built_bidirectional("LSTM"), edit)
    _refused(model, "the Squeeze does not remove the direction axis")


# ---------------------------------------------------------------- inputs Expand-ed per direction

#: A target element: "batch" (x's), an int, "untracked" (min(batch, 1): the prover does not
#: follow it; "untracked_swapped": min(1, batch), that number written otherwise), "rnn"
#: (the batch of a GRU on an Expand of x to a graph input: a symbol of an Expand output
#: whose own facts are unknown), or (op, data, target[, axis]): that axis of
#: ``op(data, target)``, op "Expand" or "Slice" (``Slice(data, 0, target[0], axis 1)``). Data:
#: a graph input ("h", "h2": ``[1, batch, 4]``; "v", "v2": ``[batch, 4]``) or such a tuple.
Spec = object
_DATA_SHAPES = {"h": [1, "batch", 4], "h2": [1, "batch", 4], "v": ["batch", 4], "v2": ["batch", 4]}


def _b(element: Spec) -> tuple:
    """The target ``[1, element, 1]``: reroll's ``Concat(one, batch, one)``."""
    return (1, element, 1)


def _expanded(forward: tuple | str | None, reverse: tuple | str | None, op: str = "Expand") -> Edit:
    """Each half reads ``Expand(x, target)``, as reroll feeds the halves of a layer whose
    ``h_0`` it cannot prove of ``x``'s batch (or ``op(x, target)``; None: x itself); a
    target is a tuple of elements or "input"/"input2" (graph inputs: no element known).
    Each half's nodes are its own: equal specs are one computation written twice."""

    def edit(graph: ir.Graph) -> None:
        backward, forward_node = _rnns(graph)
        x, weights = graph.inputs[0], forward_node.inputs[1:4]

        def add(op_type: str, *inputs: ir.Value, **attrs: int) -> ir.Value:
            node = ir.Node(
                "", op_type, inputs, attributes=[ir.AttrInt64(k, v) for k, v in attrs.items()]
            )
            graph.insert_before(backward, node)
            return node.outputs[0]

        def graph_input(name: str, dims: list, dtype=ir.DataType.FLOAT) -> ir.Value:
            for value in graph.inputs:
                if value.name == name:
                    return value
            value = ir.Value(name=name, shape=ir.Shape(dims), type=ir.TensorType(dtype))
            graph.inputs.append(value)
            return value

        def target(spec: tuple | str) -> ir.Value:
            if spec in ("input", "input2"):
                return graph_input("n" if spec == "input" else "n2", [3], ir.DataType.INT64)
            return add("Concat", *map(element, spec), axis=0)

        def data(spec: Spec) -> ir.Value:
            if isinstance(spec, str):
                return graph_input(spec, _DATA_SHAPES[spec])
            op_type, source, shape = spec[:3]
            if op_type == "Slice":
                return add("Slice", data(source), _ints(graph, 0), target(shape), _ints(graph, 1))
            return add(op_type, data(source), target(shape))

        def element(spec: Spec) -> ir.Value:
            if isinstance(spec, int):
                return _ints(graph, spec)
            if spec == "batch":
                return add("Shape", x, start=1, end=2)
            if spec == "untracked":
                return add("Min", element("batch"), _ints(graph, 1))
            if spec == "untracked_swapped":  # the same number, spelled otherwise
                return add("Min", _ints(graph, 1), element("batch"))
            if spec == "rnn":
                hidden = [ir.AttrInt64("hidden_size", 4)]
                inputs = [add("Expand", x, target("input")), *weights]
                rnn = ir.Node("", "GRU", inputs, attributes=hidden, num_outputs=2)
                graph.insert_before(backward, rnn)
                return add("Shape", rnn.outputs[1], start=1, end=2)
            axis = spec[3] if len(spec) > 3 else 1
            return add("Shape", data(spec), start=axis, end=axis + 1)

        for node, spec in ((forward_node, forward), (backward, reverse)):
            if spec is not None:
                node.replace_input_with(0, add(op, x, target(spec)))

    return edit


def _nested(depth: int, data: bool = False) -> tuple:
    """reroll's target, its batch an Expand's ``depth`` Expands deep, in the target
    (``Expand(h, [1, <deeper>, 1])``) or in the data (``Expand(<deeper>, [1, batch, 1])``)."""
    element: Spec = "batch"
    source: Spec = "h"
    for _ in range(depth):
        if data:
            source = ("Expand", source, _b("batch"))
        else:
            element = ("Expand", "h", _b(element))
    return _b(("Expand", source, _b("batch")) if data else element)


def _pair_with_states(edit: Edit) -> onnx.ModelProto:
    return _edited(tp.hand_built_bidirectional("GRU", reverse_node=True, state_concat=True), edit)


#: Targets proven equal element by element (an Expand's axis: the same broadcast of the
#: same sizes), up to 4 Expands deep.
EXPANDED = {
    "batch": (_b("batch"), _b("batch")),
    "reroll": (_nested(1), _nested(1)),
    "target_depth_4": (_nested(4), _nested(4)),
    "data_depth_4": (_nested(3, data=True), _nested(3, data=True)),
    # [batch, 4] right-aligned to [1, batch, 1]: axis 1 is the data's axis 0
    "data_rank_2": (_b(("Expand", "v", _b("batch"))),) * 2,
    # a target of two elements right-aligned to [1, batch, 4]: axis 1 is its element 0
    "target_length_2": (_b(("Expand", "h", ("batch", 1))),) * 2,
    # axis 0 of a target of two elements (padded: 1) and of three (1), both from h's 1
    "padded_target": (
        _b(("Expand", "h", (1, "untracked"), 0)),
        _b(("Expand", "h", (1, 1, "untracked"), 0)),
    ),
    # axis 0 of [batch, 4] (padded: 1) and of [1, batch, 4] (1), both broadcast to batch
    "padded_data": (
        _b(("Expand", "v", ("batch", 1, "untracked"), 0)),
        _b(("Expand", "h", ("batch", 1, "untracked"), 0)),
    ),
}


@pytest.mark.parametrize(("forward", "reverse"), EXPANDED.values(), ids=EXPANDED.keys())
def test_a_pair_reading_expands_of_x_is_merged(forward, reverse) -> None:
    _merged(_pair_with_states(_expanded(forward, reverse)))


#: One computation written twice (``rules._graph.same_value``), whatever the prover knows:
#: (forward, reverse, op).
WRITTEN_TWICE = {
    "untracked": (_b("untracked"), _b("untracked"), "Expand"),
    "untracked_target": (_b(("Expand", "h", _b("untracked"))),) * 2 + ("Expand",),
    "data_depth_5": (_nested(4, data=True), _nested(4, data=True), "Expand"),
    "tiles": (_b(1), _b(1), "Tile"),
}


@pytest.mark.parametrize(
    ("forward", "reverse", "op"), WRITTEN_TWICE.values(), ids=WRITTEN_TWICE.keys()
)
def test_a_pair_reading_one_computation_written_twice_is_merged(forward, reverse, op) -> None:
    _merged(_pair_with_states(_expanded(forward, reverse, op=op)))


_NOT_X = "the reverse RNN does not read the forward RNN's input"
EXPANDED_NEAR_MISSES = {
    "target_depth_5": (_nested(5), _nested(5)),
    "other_data": (_b(("Expand", "h", _b("batch"))), _b(("Expand", "h2", _b("batch")))),
    "other_data_rank_2": (_b(("Expand", "v", _b("batch"))), _b(("Expand", "v2", _b("batch")))),
    "other_target": (_b(("Expand", "h", _b("batch"))), _b(("Expand", "h", _b(1)))),
    "other_target_length_2": (
        _b(("Expand", "h", ("batch", 1))),
        _b(("Expand", "h", ("untracked", 1))),
    ),
    "untracked": (_b("untracked"), _b("untracked_swapped")),
    "untracked_target": (
        _b(("Expand", "h", _b("untracked"))),
        _b(("Expand", "h", _b("untracked_swapped"))),
    ),
    "constant_and_expand": (_b(1), _b(("Expand", "h", _b("batch")))),
    "zero_and_expand": (_b(0), _b(("Expand", "h", _b("batch")))),
    "input_and_expand": (_b("batch"), _b(("Expand", "h", _b("batch")))),
    "expand_and_input": (_b(("Expand", "h", _b("batch"))), _b("batch")),
    "other_axis": (_b(("Expand", "h", ("batch",) * 3, 1)), _b(("Expand", "h", ("batch",) * 3, 2))),
    "slices": (_b(("Slice", "h", ("untracked",))), _b(("Slice", "h", ("untracked_swapped",)))),
    "unknown_target": ("input", _b("batch")),
    "known_and_unknown_target": (_b("batch"), "input"),
    "x_and_expand": (None, _b("batch")),
    "expand_and_x": (_b("batch"), None),
    "unknown_targets": ("input", "input2"),
    "target_lengths": ((1, "batch", 1), ("batch", 1)),
}


@pytest.mark.parametrize(
    ("forward", "reverse"), EXPANDED_NEAR_MISSES.values(), ids=EXPANDED_NEAR_MISSES.keys()
)
def test_a_pair_reading_expands_not_proven_equal_is_refused(forward, reverse) -> None:
    _refused(_pair_with_states(_expanded(forward, reverse)), _NOT_X, STATES)


def test_a_pair_reading_tiles_of_x_is_refused() -> None:
    """Only an Expand's target is read as the shape of the value it makes: as Expands,
    these would be one value (x); as Tiles, the second is empty at batch 0."""
    model = _pair_with_states(_expanded(_b(1), _b("untracked_swapped"), op="Tile"))
    _refused(model, _NOT_X, STATES)


# ---------------------------------------------------------------- which states the merge reads


def _without_h_n(graph: ir.Graph) -> None:
    """An LSTM pair's ``Y_h`` unread, its ``Y_c`` still concatenated."""
    (h_n,) = [v for v in graph.outputs if v.name == "h_n"]
    identity = h_n.producer()
    graph.outputs.remove(h_n)
    graph.remove([identity, identity.inputs[0].producer()], safe=True)


def _state_concat_axis(axis: int) -> Edit:
    def edit(graph: ir.Graph) -> None:
        for node in _nodes(graph, "Concat")[1:]:
            node.attributes["axis"] = ir.AttrInt64("axis", axis)

    return edit


@pytest.mark.parametrize(
    ("op_type", "state_concat", "edit", "outputs"),
    [
        ("GRU", False, None, 1),  # no state read: the merged node has Y only
        ("LSTM", True, _without_h_n, 3),  # Y_c read: Y_h is computed before it
        ("GRU", True, _state_concat_axis(-3), 2),  # -3 of the rank-3 state: axis 0
    ],
    ids=["unread", "y_c_alone", "axis_-3"],
)
def test_states_read_or_not_are_merged(op_type, state_concat, edit, outputs: int) -> None:
    before = tp.hand_built_bidirectional(op_type, reverse_node=True, state_concat=state_concat)
    if edit is not None:
        before = _edited(before, edit)
    after = _merged(before, rules=STATES)
    (node,) = [n for n in after.graph.node if n.op_type == op_type]
    assert len(node.output) == outputs


def _state_concat_in_if(model: onnx.ModelProto) -> onnx.ModelProto:
    """The states' Concat in an ``If``'s then branch (reading the outer ``Y_h``), zeros in
    its else branch."""
    index, concat = [(i, n) for i, n in enumerate(model.graph.node) if n.op_type == "Concat"][1]
    output = concat.output[0]
    zeros = onnx.numpy_helper.from_array(np.zeros((2, 1, 4), np.float32))
    branches = {}
    for name, node in (
        ("then_branch", onnx.helper.make_node("Concat", concat.input, ["then"], axis=0)),
        ("else_branch", onnx.helper.make_node("Constant", [], ["else"], value=zeros)),
    ):
        out = onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)
        branches[name] = onnx.helper.make_graph([node], name, [], [out])
    model.graph.node[index].CopyFrom(onnx.helper.make_node("If", ["cond"], [output], **branches))
    cond = onnx.helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])
    model.graph.input.append(cond)
    return model


def test_a_state_concat_in_a_subgraph_is_read_per_direction() -> None:
    """Not a node of the pair's graph: the states' merge refuses it, and the pair is merged
    with the If branch reading each direction's half of ``Split(Y_h)``."""
    model = _state_concat_in_if(
        tp.hand_built_bidirectional("GRU", reverse_node=True, state_concat=True)
    )
    assert "the Y_h Concat is in a subgraph" in refusal_reasons(STATES, model)
    _merged(model)


def _states_summed(graph: ir.Graph) -> None:
    """``Sum(Y_h_f, Y_h_r)``: one node reads the pair, in order, but not a Concat."""
    concat = _nodes(graph, "Concat")[1]
    concat.op_type = "Sum"
    del concat.attributes["axis"]


@pytest.mark.parametrize(
    ("near_miss", "edit", "reason"),
    [
        ("state_read", None, "a half's Y_h is read by something other than one Concat of the pair"),
        (None, _states_summed, "the halves' Y_h are not read by one Concat"),
    ],
    ids=["graph_output", "sum"],
)
def test_state_reader_near_misses(near_miss, edit, reason: str) -> None:
    """Refused by the states' merge, merged with the states read per direction."""
    model = tp.hand_built_bidirectional(
        "GRU", reverse_node=True, state_concat=near_miss is None, near_miss=near_miss
    )
    if edit is not None:
        model = _edited(model, edit)
    assert reason in refusal_reasons(STATES, model)
    _merged(model)


# ---------------------------------------------------------------- activation_alpha / beta


def _activations(forward: list[str], backward: list[str], alphas: tuple[list, list]) -> Edit:
    """The halves' activations and activation_alpha values (the backward node is first)."""

    def edit(graph: ir.Graph) -> None:
        for node, names, alpha in zip(_rnns(graph), (backward, forward), alphas[::-1], strict=True):
            node.attributes["activations"] = ir.AttrStrings("activations", names)
            node.attributes["activation_alpha"] = ir.AttrFloat32s("activation_alpha", alpha)

    return edit


@pytest.mark.parametrize("reverse_node", [True, False])
def test_activation_alphas_one_per_activation_taking_one_are_merged(reverse_node: bool) -> None:
    """ONNX Runtime hands activation_alpha values in order to the activations that take
    one: when each half gives one per such activation, the merged list is theirs in turn."""
    edit = _activations(["HardSigmoid", "LeakyRelu"], ["Sigmoid", "LeakyRelu"], ([0.3, 0.4], [0.7]))
    before = _edited(tp.hand_built_bidirectional("GRU", reverse_node=reverse_node), edit)
    (node,) = [n for n in _merged(before).graph.node if n.op_type == "GRU"]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attributes["activation_alpha"] == pytest.approx([0.3, 0.4, 0.7])


@pytest.mark.parametrize(
    ("alphas", "reason"),
    [
        (([0.3], [0.7]), "the forward half gives 1 activation_alpha for 2 activations taking one"),
        (
            ([0.3, 0.4], [0.7, 0.8]),
            "the reverse half gives 2 activation_alpha for 1 activation taking one",
        ),
    ],
    ids=["too_few", "too_many"],
)
def test_activation_alphas_that_would_shift_are_not_merged(alphas, reason: str) -> None:
    """A half that leaves an activation its default (or gives extra values): concatenated,
    a value would land on the other half's activation (outputs off by up to 1.6)."""
    edit = _activations(["HardSigmoid", "LeakyRelu"], ["Sigmoid", "LeakyRelu"], alphas)
    model = _edited(tp.hand_built_bidirectional("GRU", reverse_node=True), edit)
    feeds = tp.thirdparty_inputs(model, 2, 3)
    runtime.run(model, feeds)  # the original runs
    _refused(model, reason)
    sliced = _edited(tp.hand_built_bidirectional("GRU"), edit)
    _refused(sliced, reason.replace("reverse half", "backward half"))


# ---------------------------------------------------------------- a missing bias


def _bias_input(graph: ir.Graph) -> None:
    """The forward half's B a graph input (fed at run time), the backward's dropped."""
    forward = _rnns(graph)[1]
    bias = ir.Value(name="b_fed", shape=ir.Shape([1, 24]), type=ir.TensorType(ir.DataType.FLOAT))
    graph.inputs.append(bias)
    forward.replace_input_with(3, bias)
    _drop_bias(graph)


def test_a_missing_bias_is_zeros_even_beside_an_infinite_one() -> None:
    """The half without B gets zeros, not ``B_other * 0`` (NaN where B_other is inf)."""
    model = _edited(tp.hand_built_bidirectional("GRU", reverse_node=True), _bias_input)
    after = rnn_rewrite_rules.rewrite(model, ["bidirectional"], target=TARGET)
    onnx.checker.check_model(after, full_check=True)
    assert b"bidirectional" in _directions(after)
    feeds = tp.thirdparty_inputs(model, 2, 3)
    for value in (0.5, np.inf):
        feeds["b_fed"] = np.full((1, 24), value, np.float32)
        expected, actual = runtime.run(model, feeds), runtime.run(after, feeds)
        for a, b in zip(expected, actual, strict=True):
            np.testing.assert_allclose(b, a, atol=1e-5)  # NaN where (and only where) a is


def test_a_missing_bias_has_the_element_type_of_the_weights() -> None:
    """In a float64 model the zeros are float64 (a float32 ``Mul`` operand is invalid)."""
    from onnx.reference import ReferenceEvaluator

    from tests.support import as_float64

    model = as_float64(
        _edited(tp.hand_built_bidirectional("GRU", reverse_node=True), _computed_forward_bias)
    )
    after, count = apply(RULES, model)  # the full checker: types included
    assert count == 1 and b"bidirectional" in _directions(after)
    feeds = {k: v.astype(np.float64) for k, v in tp.thirdparty_inputs(model, 2, 3).items()}
    expected = ReferenceEvaluator(model).run(None, feeds)
    actual = ReferenceEvaluator(after).run(None, feeds)
    assert runtime.max_abs_diff(expected, actual) <= 1e-12


def test_a_missing_bias_without_a_constant_weight_is_refused() -> None:
    """No constant W or R to take the zeros' element type and size from: refused."""

    def edit(graph: ir.Graph) -> None:
        _computed_forward_bias(graph)
        for node in _rnns(graph):
            for index in (1, 2):
                copy = ir.Node("", "Identity", [node.inputs[index]])
                graph.insert_before(node, copy)
                node.replace_input_with(index, copy.outputs[0])

    model = _edited(tp.hand_built_bidirectional("GRU", reverse_node=True), edit)
    found = refusal_reasons(MERGE, model)
    assert "a half has no B, and no W or R is a constant to make its zeros of" in found
    _merged(model)  # rewrite() normalises first: the Identity copies go, W and R are constants


def test_a_branch_inside_a_function_importing_another_opset_is_left_alone() -> None:
    """The If branch holding the half is in a function importing opset 11 of an opset-17
    model: its nodes take the function's form, and an emitted op would be invalid in one
    of the two (the 2-input Squeeze was emitted there)."""
    model = tp.hand_built_bidirectional("GRU", halves="reverse")
    model.opset_import[0].version = 17
    wrapped = as_function(in_if_branches(model, model), 11)
    reason = (
        "function 'layer' imports opset 11 of 'ai.onnx' but the model 17: "
        "an emitted op would be invalid in one of them"
    )
    found = refusal_reasons(RULES, wrapped)
    assert reason in found, found
    after = rnn_rewrite_rules.rewrite(wrapped, ["bidirectional"], target=TARGET)
    (if_node,) = after.functions[0].node
    for branch in if_node.attribute:
        ops = [node.op_type for node in branch.g.node]
        assert ops.count("Slice") == 2, ops  # left as it is: both reversals stay


# ---------------------------------------------------------------- one computation written twice


def _halves_read_own(make: Callable[[ir.Graph, str], ir.Value]) -> Edit:
    """Each half reads its own copy of a computation of ``x`` (``make(graph, suffix)``)
    instead of ``x``: the reversed half's Slice (or the reverse node) reads the second."""

    def edit(graph: ir.Graph) -> None:
        backward, forward = _rnns(graph)
        forward.replace_input_with(0, make(graph, "f"))
        if backward.attributes.get_string("direction", "forward") == "reverse":
            backward.replace_input_with(0, make(graph, "b"))
        else:
            _input_slice(graph).replace_input_with(0, make(graph, "b"))

    return edit


def _scaled(values: dict[str, float]) -> Callable[[ir.Graph, str], ir.Value]:
    """``Mul(x, s)`` with ``s`` an initializer of its own per half (``values[suffix]``)."""

    def make(graph: ir.Graph, suffix: str) -> ir.Value:
        scale = ir.Value(name=f"s_{suffix}", const_value=ir.tensor(np.float32(values[suffix])))
        graph.register_initializer(scale)
        node = ir.Node("", "Mul", [graph.inputs[0], scale], name=f"mul_{suffix}")
        graph.insert_before(graph.node(0), node)
        return node.outputs[0]

    return make


def _noisy(graph: ir.Graph, suffix: str) -> ir.Value:
    """``Add(x, RandomUniformLike(x))``: written twice, two different tensors."""
    noise = ir.Node("", "RandomUniformLike", [graph.inputs[0]], name=f"noise_{suffix}")
    add = ir.Node("", "Add", [graph.inputs[0], noise.outputs[0]], name=f"add_{suffix}")
    graph.insert_before(graph.node(0), [noise, add])
    return add.outputs[0]


@pytest.mark.parametrize("pair", ["sliced", "reverse_node", "state_concat"])
def test_an_input_computed_twice_alike_is_one_input(pair: str) -> None:
    """Two ``Mul(x, s)`` of equal initializers are one value: merged, one copy left."""
    kwargs = {"reverse_node": pair != "sliced", "state_concat": pair == "state_concat"}
    before = _edited(
        tp.hand_built_bidirectional("GRU", **kwargs), _halves_read_own(_scaled({"f": 2, "b": 2}))
    )
    after = _merged(before)
    assert [n.op_type for n in after.graph.node].count("Mul") == 1


@pytest.mark.parametrize("pair", ["sliced", "reverse_node", "state_concat"])
@pytest.mark.parametrize(
    "make", [_scaled({"f": 2, "b": 3}), _noisy], ids=["other_constant", "random_op"]
)
def test_an_input_computed_twice_differently_is_not_one_input(pair: str, make) -> None:
    kwargs = {"reverse_node": pair != "sliced", "state_concat": pair == "state_concat"}
    model = _edited(tp.hand_built_bidirectional("GRU", **kwargs), _halves_read_own(make))
    reason = {
        "sliced": _NOT_REVERSED_X,
        "reverse_node": "the reverse RNN does not read the forward RNN's input",
        "state_concat": "the reverse RNN does not read the forward RNN's input",
    }[pair]
    _refused(model, reason, STATES if pair == "state_concat" else MERGE)


# ---------------------------------------------------------------- Casts on the way to the Concat


def _cast_halves(*to: int) -> Edit:
    """A Cast after each half's Squeeze (``to[0]`` the backward's, ``to[1]`` the forward's;
    0: no Cast on that half), the way a float16 cell computed in float32 casts back."""

    def edit(graph: ir.Graph) -> None:
        for which, target in enumerate(to):
            if target:
                squeeze = _squeeze(graph, which)
                out = squeeze.outputs[0]
                cast = ir.Node("", "Cast", [out], [ir.AttrInt64("to", target)], name=f"c{which}")
                graph.insert_after(squeeze, cast)
                for user, index in list(out.uses()):
                    if user is not cast:
                        user.replace_input_with(index, cast.outputs[0])
        graph.outputs[0].dtype = ir.DataType(max(to))

    return edit


_F32, _F64 = int(ir.DataType.FLOAT), int(ir.DataType.DOUBLE)


@pytest.mark.parametrize("pair", ["sliced", "reverse_node"])
def test_halves_cast_alike_are_merged_and_cast_once(pair: str) -> None:
    before = _edited(
        tp.hand_built_bidirectional("LSTM", reverse_node=pair == "reverse_node"),
        _cast_halves(_F64, _F64),
    )
    after = _merged(before)
    assert [n.op_type for n in after.graph.node].count("Cast") == 1
    assert after.graph.output[0].type.tensor_type.elem_type == _F64


def test_a_cast_reversed_half_alone_keeps_its_cast() -> None:
    before = _edited(tp.hand_built_bidirectional("GRU", halves="reverse"), _cast_halves(_F64))
    after = _merged(before, "reverse", REVERSE)
    assert [n.op_type for n in after.graph.node].count("Cast") == 1


@pytest.mark.parametrize("to", [(_F32, 0), (0, _F32)], ids=["backward_only", "forward_only"])
def test_halves_cast_differently_are_not_merged(to: tuple[int, int]) -> None:
    model = _edited(tp.hand_built_bidirectional("LSTM", reverse_node=True), _cast_halves(*to))
    assert "the halves are not cast alike" in refusal_reasons(MERGE, model)
    _merged(model)  # rewrite() normalises first: a float Cast of a float goes

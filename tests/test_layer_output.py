"""layer_output: the RNN output reshape chain -> Squeeze / constant Reshape, and its near misses."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import layer_output
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model, random_inputs
from tests.near_misses import BATCH, INPUT, INT64, H, assert_refused, op_types, rnn_model
from tests.support import apply, assert_equivalent, op_counts

RULES = rnn_rewrite_rules.rules(["layer_output"])


def _chain_nodes(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """The first layer's chain nodes by op type (the model's first RNN output chain)."""
    graph = model.graph
    transpose = next(
        n
        for n in graph.node
        if n.op_type == "Transpose" and list(n.attribute[0].ints) == [0, 2, 1, 3]
    )
    chain: dict[str, list[onnx.NodeProto]] = {"Transpose": [transpose]}
    frontier = set(transpose.output)
    for node in graph.node:
        if set(node.input) & frontier and node.op_type not in ("LSTM", "GRU"):
            chain.setdefault(node.op_type, []).append(node)
            if node.op_type != "Reshape" or node.input[0] not in set(transpose.output):
                frontier |= set(node.output)
    return chain


def _constant(model: onnx.ModelProto, name: str, values: list[int]) -> str:
    model.graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), name))
    return name


def _final_reshape(model: onnx.ModelProto) -> onnx.NodeProto:
    """The chain's last Reshape (one-layer, sequence-first models: it writes ``output``)."""
    return next(n for n in model.graph.node if n.output[0] == "output")


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize("opset", [12, 14, 18, 21])
def test_unidirectional_becomes_squeeze(op_type: str, opset: int) -> None:
    cfg = RnnConfig(op_type=op_type, num_layers=2, initial_states=True, opset=opset)
    model = build_torchlib_model(cfg)
    after, count = apply(RULES, model)
    assert count == 2
    counts = op_counts(after)
    assert counts["Shape"] == counts["Mul"] == counts["Reshape"] == 0
    assert counts["Squeeze"] == 2
    squeezes = [n for n in after.graph.node if n.op_type == "Squeeze"]
    assert all((len(n.input) == 2) == (opset >= 13) for n in squeezes)
    assert_equivalent(model, after, cfg)


def test_bidirectional_becomes_constant_reshape() -> None:
    cfg = RnnConfig(
        op_type="GRU", hidden_size=5, num_layers=3, bidirectional=True, initial_states=True
    )
    model = build_torchlib_model(cfg)
    after, count = apply(RULES, model)
    assert count == 3
    counts = op_counts(after)
    assert counts["Shape"] == counts["Mul"] == counts["Concat"] - 1 == 0  # Concat of h_n stays
    targets = {
        tuple(numpy_helper.to_array(i).tolist())
        for i in after.graph.initializer
        if i.name.startswith("rnn_rewrite_rules_")
    }
    assert targets == {(0, 0, 10)}
    assert_equivalent(model, after, cfg)


def test_shape_with_start_end_and_gather_variants() -> None:
    """What ORT's offline optimizer leaves: Gather on Shape(Y)."""
    cfg = RnnConfig(hidden_size=6, num_layers=2, bidirectional=True, initial_states=True)
    model = build_torchlib_model(cfg)
    y_shape_nodes = []
    chain = _chain_nodes(model)
    y = chain["Transpose"][0].input[0]
    shape = chain["Shape"][0]
    shape.input[0] = y  # Shape(Y): dims [seq, D, batch, H]
    del shape.attribute[:]
    gathers = {0: 0, 1: 2, 2: 1, 3: 3}  # transposed axis -> Y axis
    for index, node in enumerate(chain["Slice"]):
        node.op_type = "Gather"
        node.input[:] = [shape.output[0], _constant(model, f"gather_{index}", [gathers[index]])]
        y_shape_nodes.append(node)
    after, count = apply(RULES, model)
    assert count == 2
    assert op_counts(after)["Shape"] == 0
    assert_equivalent(model, after, cfg)


@pytest.mark.parametrize(
    ("target", "allowzero"), [([0, 0, -1], 0), ([0, 0, 8], 0), ([0, -1, 8], 0)]
)
def test_constant_targets_that_copy_dims(target: list[int], allowzero: int) -> None:
    cfg = RnnConfig(hidden_size=8, initial_states=True)
    model = build_torchlib_model(cfg)
    reshape = _final_reshape(model)
    reshape.input[1] = _constant(model, "target", target)
    reshape.attribute[0].i = allowzero
    after, count = apply(RULES, model)
    assert count == 1
    assert op_counts(after)["Squeeze"] == 1
    assert_equivalent(model, after, cfg)


def test_already_minimal_target_is_not_rewritten_again() -> None:
    cfg = RnnConfig(bidirectional=True, initial_states=True)
    once = rnn_rewrite_rules.rewrite(build_torchlib_model(cfg), ["layer_output"])
    twice, count = apply(RULES, once)
    assert count == 0
    assert op_counts(twice) == op_counts(once)


# ---------------------------------------------------------------- near misses: must not fire


def _mutated(mutation: str) -> tuple[RnnConfig, onnx.ModelProto]:
    cfg = RnnConfig(hidden_size=4, num_layers=1, initial_states=True)
    model = build_torchlib_model(cfg)
    chain = _chain_nodes(model)
    slices, concat, reshape = chain["Slice"], chain["Concat"][0], _final_reshape(model)
    if mutation == "perm":
        chain["Transpose"][0].attribute[0].ints[:] = [0, 1, 2, 3]
    elif mutation == "slice_bounds":
        slices[0].input[1:3] = slices[1].input[1:3]
    elif mutation == "concat_order":
        concat.input[0], concat.input[1] = concat.input[1], concat.input[0]
    elif mutation == "mul_to_add":
        chain["Mul"][0].op_type = "Add"
    elif mutation == "frozen_seq":  # what torch writes when it specialises the sequence axis
        reshape.input[1] = _constant(model, "frozen", [3, -1, 4])
    elif mutation == "frozen_batch":
        reshape.input[1] = _constant(model, "frozen", [-1, 2, 4])
    elif mutation == "allowzero_literal_zero":
        reshape.input[1] = _constant(model, "zeros", [0, 0, -1])
        reshape.attribute[0].i = 1
    elif mutation == "wrong_width":
        reshape.input[1] = _constant(model, "wide", [0, 0, -1, 1])
    elif mutation == "y_h_instead_of_y":
        rnn = next(n for n in model.graph.node if n.op_type == "LSTM")
        chain["Transpose"][0].input[0] = rnn.output[1]
    elif mutation == "layout_1":
        rnn = next(n for n in model.graph.node if n.op_type == "LSTM")
        next(a for a in rnn.attribute if a.name == "layout").i = 1
    elif mutation == "unknown_hidden_size":
        rnn = next(n for n in model.graph.node if n.op_type == "LSTM")
        rnn.attribute.remove(next(a for a in rnn.attribute if a.name == "hidden_size"))
        r_name = rnn.input[2]
        init = next(i for i in model.graph.initializer if i.name == r_name)
        model.graph.initializer.remove(init)
        model.graph.input.append(
            helper.make_tensor_value_info(r_name, onnx.TensorProto.FLOAT, None)
        )
    elif mutation == "target_overridable_initializer":  # a constant the caller can replace
        reshape.input[1] = _constant(model, "dims", [0, 0, -1])
        model.graph.input.append(helper.make_tensor_value_info("dims", onnx.TensorProto.INT64, [3]))
    elif mutation == "target_from_graph_input":
        model.graph.input.append(helper.make_tensor_value_info("dims", onnx.TensorProto.INT64, [3]))
        reshape.input[1] = "dims"
    else:
        raise AssertionError(mutation)
    return cfg, model


NEAR_MISSES = [
    "perm",
    "slice_bounds",
    "concat_order",
    "mul_to_add",
    "frozen_seq",
    "frozen_batch",
    "allowzero_literal_zero",
    "wrong_width",
    "y_h_instead_of_y",
    "layout_1",
    "unknown_hidden_size",
    "target_from_graph_input",
    "target_overridable_initializer",
]


@pytest.mark.parametrize("mutation", NEAR_MISSES)
def test_near_miss_is_left_alone(mutation: str) -> None:
    _, model = _mutated(mutation)
    reshape = _final_reshape(model)
    after, count = apply(RULES, model, check=False)
    assert count == 0
    kept = next(n for n in after.graph.node if n.output[0] == reshape.output[0])
    assert (kept.op_type, list(kept.input)) == ("Reshape", list(reshape.input))


def test_shape_used_elsewhere_keeps_graph_correct() -> None:
    """The Shape also feeds a graph output: rewrite Y's reshape, keep the Shape for its user."""
    cfg = RnnConfig(hidden_size=4, bidirectional=True, initial_states=True)
    model = build_torchlib_model(cfg)
    shape = _chain_nodes(model)["Shape"][0]
    model.graph.output.append(
        helper.make_tensor_value_info(shape.output[0], onnx.TensorProto.INT64, [4])
    )
    after, count = apply(RULES, model)
    assert count == 1
    assert op_counts(after)["Shape"] == 1
    for batch, seq in [(2, 3), (5, 1)]:
        feeds = random_inputs(cfg, batch, seq, rng=batch)
        expected, actual = runtime.run(model, feeds), runtime.run(after, feeds)
        assert runtime.max_abs_diff(expected, actual) <= 1e-6
        np.testing.assert_array_equal(actual[-1], [seq, batch, 2, 4])


def test_failure_reason_is_reported() -> None:
    """The condition says why it did not fire (what `rnn-rewrite` shows users)."""
    from onnxscript.rewriter import MatchingTracer, MatchStatus

    _, model = _mutated("frozen_seq")
    ir_model = ir.serde.deserialize_model(model)
    tracer = MatchingTracer()
    RULES.apply_to_model(ir_model, tracer=tracer)
    reasons = [
        match.match_result.reason
        for matches in tracer.best_matches_map.values()
        for match in matches
        if match.status == MatchStatus.CONDITION_FAILED
    ]
    assert any("sequence element is the constant 3" in r for r in reasons), reasons


# near misses -----------------------------------------------------------------------


def _reshape_model(
    target_nodes: list[onnx.NodeProto],
    *,
    y: str = "y",
    directions: int = 1,
    constants: dict[str, np.ndarray] | None = None,
    inputs: tuple[onnx.ValueInfoProto, ...] = (),
    layout_attr: int = 0,
    hidden: int = H,
) -> onnx.ModelProto:
    direction = "bidirectional" if directions == 2 else "forward"
    nodes = [
        helper.make_node(
            "LSTM",
            ["x", "w", "r"],
            ["y", "y_h"],
            hidden_size=hidden,
            direction=direction,
            **({"layout": layout_attr} if layout_attr else {}),  # LSTM-14 and later
        ),
        *target_nodes,
        helper.make_node("Transpose", [y], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "target"], ["out"]),
    ]
    return rnn_model(
        nodes, inputs=inputs, outputs=("out",), constants=constants, directions=directions
    )


def _target(values: list[int]) -> dict[str, np.ndarray]:
    return {"target": np.array(values, np.int64)}


def _seq_batch_nodes() -> list[onnx.NodeProto]:
    """``seq`` and ``batch`` read from ``Shape(x)`` as 1-vectors."""
    return [
        helper.make_node("Shape", ["x"], ["sx"]),
        helper.make_node("Slice", ["sx", "i0", "i1"], ["seq"]),
        helper.make_node("Slice", ["sx", "i1", "i2"], ["batch"]),
    ]


_INDICES = {f"i{i}": np.array([i], np.int64) for i in range(3)}


def test_squeeze_fires_on_the_exact_target() -> None:
    """The positive twin of the near misses below."""
    nodes = [
        *_seq_batch_nodes(),
        helper.make_node("Concat", ["seq", "batch", "h"], ["target"], axis=0),
    ]
    model = _reshape_model(nodes, constants={**_INDICES, "h": np.array([H], np.int64)})
    assert "Squeeze" in op_types(rnn_rewrite_rules.rewrite(model, ["layer_output"]))


def test_target_refused_when_not_a_shape_computation() -> None:
    target = helper.make_tensor_value_info("target", INT64, [3])
    model = _reshape_model([], inputs=(target,))
    assert_refused(layer_output.FAMILY, model, "reshape target is not a provable shape computation")


def test_target_refused_with_four_elements() -> None:
    model = _reshape_model([], constants=_target([0, 0, 1, H]))
    assert_refused(layer_output.FAMILY, model, "reshape target has 4 elements, not 3")


def test_target_refused_when_an_element_is_unknown() -> None:
    """``batch / 2`` is not an exact size: the element is unknown."""
    nodes = [
        *_seq_batch_nodes(),
        helper.make_node("Div", ["batch", "two"], ["half"]),
        helper.make_node("Concat", ["seq", "half", "h"], ["target"], axis=0),
    ]
    constants = {**_INDICES, "h": np.array([H], np.int64), "two": np.array([2], np.int64)}
    model = _reshape_model(nodes, constants=constants)
    assert_refused(
        layer_output.FAMILY, model, "target's batch element is not a provable shape computation"
    )


def test_target_refused_when_the_minus_one_cannot_be_inferred() -> None:
    model = _reshape_model([], constants=_target([-1, 5, H]))
    assert_refused(layer_output.FAMILY, model, "cannot prove what the -1 in the target infers")


def test_target_refused_when_an_element_is_another_dimension() -> None:
    nodes = [
        *_seq_batch_nodes(),
        helper.make_node("Concat", ["seq", "seq", "h"], ["target"], axis=0),
    ]
    model = _reshape_model(nodes, constants={**_INDICES, "h": np.array([H], np.int64)})
    assert_refused(
        layer_output.FAMILY, model, "target's batch element is another dimension, not the input's"
    )


def test_target_refused_when_the_width_is_another_constant() -> None:
    model = _reshape_model([], constants=_target([0, 0, H + 1]))
    assert_refused(
        layer_output.FAMILY,
        model,
        "target's direction*hidden element is the constant 4, not the input's",
    )


def test_target_refused_with_a_negative_element() -> None:
    model = _reshape_model([], constants=_target([0, -2, H]))
    assert_refused(layer_output.FAMILY, model, "reshape target: negative target element -2")


def test_reshape_of_y_h_is_not_a_layer_output() -> None:
    model = _reshape_model([], y="y_h", constants=_target([0, 0, H]))
    assert_refused(layer_output.FAMILY, model, "transposed value is not the RNN's Y output")


def test_layer_output_of_an_rnn_with_unproven_sizes_is_refused() -> None:
    model = _reshape_model([], hidden=H + 1, constants=_target([0, 0, H + 1]))
    assert_refused(layer_output.FAMILY, model, "hidden_size=4 disagrees with R's hidden size 3")


def test_layer_output_of_a_batch_first_rnn_is_refused() -> None:
    model = _reshape_model([], layout_attr=1, constants=_target([0, 0, H]))
    assert_refused(layer_output.FAMILY, model, "layout=1 RNN: Y is [batch, seq, D, H]")


def test_bidirectional_minimal_target_is_left_alone() -> None:
    model = _reshape_model([], directions=2, constants=_target([0, 0, 2 * H]))
    assert_refused(layer_output.FAMILY, model, "target is already the constant [0, 0, D*H]")


def test_bidirectional_other_constant_target_is_rewritten() -> None:
    """[0, -1, 2H] is equivalent but not minimal: it becomes [0, 0, 2H]."""
    model = _reshape_model([], directions=2, constants=_target([0, -1, 2 * H]))
    after = rnn_rewrite_rules.rewrite(model, ["layer_output"])
    targets = [numpy_helper.to_array(i).tolist() for i in after.graph.initializer]
    assert [0, 0, 2 * H] in targets and [0, -1, 2 * H] not in targets


def _squeeze_model(opset: int) -> onnx.ModelProto:
    """A one-direction layer output whose glue becomes a Squeeze; the Reshape carries a
    name, a doc string and metadata."""
    model = _reshape_model([], constants=_target([0, 0, H]))
    reshape = model.graph.node[-1]
    reshape.name, reshape.doc_string = "glue", "layer 1 input"
    reshape.metadata_props.add(key="origin", value="exporter")
    model.opset_import[0].version = opset
    return model


def _run_both(before: onnx.ModelProto, after: onnx.ModelProto, **feeds: np.ndarray) -> None:
    x = np.random.default_rng(1).standard_normal((4, BATCH, INPUT)).astype(np.float32)
    feeds = {"x": x, **feeds}
    expected, actual = runtime.run(before, feeds), runtime.run(after, feeds)
    assert runtime.max_abs_diff(expected, actual) < 1e-6


@pytest.mark.parametrize(("opset", "inputs"), [(12, 1), (13, 2), (14, 2)])
def test_squeeze_takes_its_axes_the_way_the_opset_reads_them(opset: int, inputs: int) -> None:
    """Squeeze's axes are an attribute up to opset 12 and an input from opset 13."""
    model = _squeeze_model(opset)
    after = rnn_rewrite_rules.rewrite(model, ["layer_output"])
    (squeeze,) = [n for n in after.graph.node if n.op_type == "Squeeze"]
    assert len(squeeze.input) == inputs and bool(squeeze.attribute) == (inputs == 1)
    _run_both(model, after)  # ORT refuses the other form at each opset


def test_the_squeeze_keeps_the_reshapes_name_doc_string_and_metadata() -> None:
    after = rnn_rewrite_rules.rewrite(_squeeze_model(18), ["layer_output"])
    (squeeze,) = [n for n in after.graph.node if n.op_type == "Squeeze"]
    assert (squeeze.name, squeeze.doc_string) == ("glue", "layer 1 input")
    assert {p.key: p.value for p in squeeze.metadata_props}["origin"] == "exporter"


def test_a_layer_output_in_a_branch_gets_its_constants_as_nodes() -> None:
    """A subgraph's constants are Constant nodes: a subgraph initializer's name would
    have to be unique across the whole model, which the branch cannot see."""
    inner = _squeeze_model(18).graph
    branch = helper.make_graph(list(inner.node), "then", [], list(inner.output))
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["other"])],
        "else",
        [],
        [helper.make_empty_tensor_value_info("other")],
    )
    flag = helper.make_tensor_value_info("flag", onnx.TensorProto.BOOL, [])
    model = rnn_model(
        [helper.make_node("If", ["flag"], ["out"], then_branch=branch, else_branch=other)],
        inputs=(flag,),
        outputs=("out",),
        constants=_target([0, 0, H]),
    )
    after = rnn_rewrite_rules.rewrite(model, ["layer_output"])
    (then,) = [a.g for a in after.graph.node[0].attribute if a.name == "then_branch"]
    assert "Squeeze" in [n.op_type for n in then.node] and not then.initializer
    names = {i.name for i in model.graph.initializer}
    assert {i.name for i in after.graph.initializer} <= names  # none added to the main graph
    _run_both(model, after, flag=np.array(True))


def test_concat_directions_is_a_pattern_of_squeezed_slices() -> None:
    """``ConcatDirections`` matches ``Concat(Squeeze(Slice(.)), Squeeze(Slice(.)))`` only: a
    Concat of two Slices of a bidirectional Y not squeezed (an Identity instead) is not its
    shape, so it neither rewrites nor reports it; squeezed, it is rewritten."""
    from tests.near_misses import gru_node
    from tests.reasons import refusal_reasons

    def model(squeeze: bool) -> onnx.ModelProto:
        nodes = [gru_node(["Y"], direction="bidirectional")]  # type: ignore[arg-type]
        for i in (0, 1):
            nodes.append(helper.make_node("Slice", ["Y", f"b{i}", f"e{i}", "one"], [f"s{i}"]))
            if squeeze:
                nodes.append(helper.make_node("Squeeze", [f"s{i}", "one"], [f"q{i}"]))
            else:
                nodes.append(helper.make_node("Identity", [f"s{i}"], [f"q{i}"]))
        nodes.append(helper.make_node("Concat", ["q0", "q1"], ["y"], axis=-1))
        ints = {"b0": np.array([0]), "e0": np.array([1]), "b1": np.array([1]),
                "e1": np.array([2]), "one": np.array([1])}  # fmt: skip
        built = rnn_model(nodes, constants=ints, gates=3, directions=2)
        shape = ["s", "b", 2 * H] if squeeze else ["s", 1, "b", 2 * H]
        typed = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)
        built.graph.output[0].CopyFrom(typed)
        return built

    rule = [layer_output.ConcatDirections.rule()]
    assert refusal_reasons(rule, model(squeeze=False)) == []
    assert apply(rule, model(squeeze=False))[1] == 0
    squeezed = model(squeeze=True)
    after, count = apply(rule, squeezed)
    assert count == 1 and "Concat" not in op_types(after)
    rng = np.random.default_rng(0)
    # no seq 0: the GRU node itself fails there (ONNX Runtime aborts, onnx.reference
    # cannot stack no step), before and after alike
    for seq, batch in ((1, 1), (4, 3), (7, 2)):
        feeds = {"x": rng.standard_normal((seq, batch, INPUT)).astype(np.float32)}
        expected, actual = runtime.run(squeezed, feeds), runtime.run(after, feeds)
        assert [a.shape for a in expected] == [a.shape for a in actual]
        np.testing.assert_array_equal(expected[0], actual[0])

"""initial_state, target ``portable``: the explicit shared zero state and its guards.

The exporter forms and their equivalence are in ``test_initial_state_forms.py``; here are
the choices of the replacement (where the batch size is read, which node is shared) and
the refusals that only this target has.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnxscript.rewriter import RewriteRuleSet

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import initial_state
from rnn_rewrite_rules.testing.exporters import in_if_branches
from tests.reasons import refusal_reasons
from tests.support import apply

H, INPUT = 3, 4
RULES = initial_state.FAMILY.rules_for("portable")


def _weights(name: str, input_size: int, hidden: int, gates: int = 3) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(len(name))
    return [
        numpy_helper.from_array(
            rng.standard_normal((1, gates * hidden, size)).astype(np.float32), f"{name}_{part}"
        )
        for part, size in (("w", input_size), ("r", hidden))
    ]


def _zero_state(x: str, out: str, hidden: int, opset_shape_attrs: bool = True) -> list:
    """TorchScript's form: ConstantOfShape(Concat([1], Unsqueeze(Gather(Shape(x), 1)), [H]))."""
    return [
        helper.make_node("Shape", [x], [f"{out}_shape"]),
        helper.make_node("Gather", [f"{out}_shape", "one_scalar"], [f"{out}_b"], axis=0),
        helper.make_node("Unsqueeze", [f"{out}_b", "axes0"], [f"{out}_b1"]),
        helper.make_node("Concat", ["one", f"{out}_b1", f"h{hidden}"], [f"{out}_dims"], axis=0),
        helper.make_node("ConstantOfShape", [f"{out}_dims"], [out]),
    ]


def _stack(hiddens: tuple[int, ...], *, x_nodes: tuple = (), x: str = "x") -> onnx.ModelProto:
    """GRU layers, each with its own runtime zero state, chained through Squeeze."""
    nodes, inits = list(x_nodes), []
    source, size = x, INPUT
    for layer, hidden in enumerate(hiddens):
        nodes += _zero_state(source, f"h0_{layer}", hidden)
        nodes.append(
            helper.make_node(
                "GRU",
                [source, f"l{layer}_w", f"l{layer}_r", "", "", f"h0_{layer}"],
                [f"y{layer}"],
                hidden_size=hidden,
                name=f"gru{layer}",
            )
        )
        nodes.append(helper.make_node("Squeeze", [f"y{layer}", "axes1"], [f"seq{layer}"]))
        inits += _weights(f"l{layer}", size, hidden)
        source, size = f"seq{layer}", hidden
    consts = {"one_scalar": np.array(1), "axes0": [0], "axes1": [1], "one": [1]}
    consts.update({f"h{h}": [h] for h in hiddens})
    inits += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()]
    graph = helper.make_graph(
        nodes,
        "stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", INPUT])],
        [helper.make_tensor_value_info(source, TensorProto.FLOAT, [None] * 3)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _feeds(batch: int, seq: int, features: int = INPUT) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 10 + seq)
    return {"x": rng.standard_normal((seq, batch, features)).astype(np.float32)}


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]


def _assert_equivalent(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    """Equal in ORT at (1, 1) and (3, 5); at batch 0 in onnx.reference (ORT aborts the
    process on a GRU with batch or seq 0; onnx.reference fails at seq 0 too)."""
    for batch, seq in ((1, 1), (3, 5)):
        feeds = _feeds(batch, seq)
        assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) < 1e-6
    for batch, seq in ((0, 2),):
        feeds = _feeds(batch, seq)
        expected, actual = _reference(before, feeds), _reference(after, feeds)
        assert [a.shape for a in actual] == [e.shape for e in expected]
        assert runtime.max_abs_diff(expected, actual) < 1e-6


def _counts(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in model.graph.node)


def test_one_zero_state_per_hidden_size_read_from_the_graph_input() -> None:
    """Four layers, hidden 3, 3, 5, 3: two ConstantOfShape, both reading x's batch axis."""
    before = _stack((3, 3, 5, 3))
    after, count = apply(RULES, before)
    assert count == 4
    counts = _counts(after)
    assert counts["ConstantOfShape"] == 2 and counts["Gather"] == 0, counts
    shapes = [n for n in after.graph.node if n.op_type == "Shape"]
    assert [n.input[0] for n in shapes] == ["x"] * len(shapes)
    grus = {n.name: n for n in after.graph.node if n.op_type == "GRU"}
    assert grus["gru0"].input[5] == grus["gru1"].input[5] == grus["gru3"].input[5]
    assert grus["gru2"].input[5] != grus["gru0"].input[5]
    _assert_equivalent(before, after)


def test_a_batch_that_is_no_single_axis_is_read_from_x() -> None:
    """x doubled along the batch axis: the batch is 2 * batch, read from the layer's own X."""
    doubled = helper.make_node("Concat", ["x0", "x0"], ["x"], axis=1)
    before = _stack((3,), x_nodes=(doubled,))
    before.graph.input[0].name = "x0"
    after, count = apply(RULES, before)
    assert count == 1
    (shape,) = [n for n in after.graph.node if n.op_type == "Shape"]
    assert shape.input[0] == "x"
    for batch, seq in ((1, 2), (3, 4)):
        feeds = {"x0": _feeds(batch, seq)["x"]}
        assert runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds)) < 1e-6


def test_already_explicit_zero_state_is_left_alone() -> None:
    once, _ = apply(RULES, _stack((3, 3)))
    assert "the zero states already are an explicit ConstantOfShape of the batch size" in (
        refusal_reasons(RULES, once)
    )
    assert apply(RULES, once)[1] == 0


def test_onnxruntime_target_drops_the_explicit_form() -> None:
    """The portable output rewritten for ONNX Runtime loses its states: both targets agree."""
    portable = rnn_rewrite_rules.rewrite(_stack((3, 3)))
    minimal = rnn_rewrite_rules.rewrite(portable, target="onnxruntime")
    assert all(len(n.input) <= 5 for n in minimal.graph.node if n.op_type == "GRU")
    assert _counts(minimal)["ConstantOfShape"] == 0
    _assert_equivalent(portable, minimal)


def test_opset_8_has_no_constant_of_shape() -> None:
    """Zeros of a symbolic batch at opset 8: the portable form cannot be written; dropping
    can. With a static batch, portable drops the state too."""
    model = helper.make_model(
        helper.make_graph(
            [  # opset 8: Unsqueeze's axes are an attribute; Gather of a 1-D index instead
                helper.make_node("Shape", ["x"], ["s"]),
                helper.make_node("Gather", ["s", "one"], ["b1"], axis=0),
                helper.make_node("Concat", ["one", "b1", "hh"], ["dims"], axis=0),
                helper.make_node("Expand", ["zero", "dims"], ["h0"]),
                helper.make_node("GRU", ["x", "w", "r", "", "", "h0"], ["y"], hidden_size=H),
            ],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", INPUT])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)],
            [
                *_weights_3d(),
                numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                *_dims_constants(),
            ],
        ),
        opset_imports=[helper.make_opsetid("", 8)],
    )
    model.ir_version = 4
    assert "opset 8 has no ConstantOfShape" in refusal_reasons(RULES, model)
    assert apply(RULES, model)[1] == 0
    assert apply(initial_state.FAMILY.rules_for("onnxruntime"), model)[1] == 1
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("GRU", ["x", "w", "r", "", "", "h0"], ["y"], hidden_size=H)],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", 2, INPUT])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)],
            [*_weights_3d(), numpy_helper.from_array(np.zeros((1, 2, H), np.float32), "h0")],
        ),
        opset_imports=[helper.make_opsetid("", 8)],
    )
    model.ir_version = 4
    assert apply(RULES, model)[1] == 1
    assert apply(initial_state.FAMILY.rules_for("onnxruntime"), model)[1] == 1


def _weights_3d() -> list[onnx.TensorProto]:
    rng = np.random.default_rng(0)
    return [
        numpy_helper.from_array(rng.standard_normal((1, 3 * H, INPUT), np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((1, 3 * H, H), np.float32), "r"),
    ]


def test_zeros_dequantized_by_a_scale_that_may_be_inf_are_no_zero_state() -> None:
    """DequantizeLinear(q == zero point, scale) is 0 * scale: NaN for an inf scale fed at
    run time. Neither target may drop or replace it."""
    nodes = [
        *_zero_state("x", "q", H)[:-1],
        helper.make_node(
            "ConstantOfShape",
            ["q_dims"],
            ["q"],
            value=helper.make_tensor("value", TensorProto.INT8, [1], [0]),
        ),
        helper.make_node("DequantizeLinear", ["q", "scale"], ["h0"]),
        helper.make_node("GRU", ["x", "l_w", "l_r", "", "", "h0"], ["y"], hidden_size=H),
    ]
    consts = {"one_scalar": np.array(1), "axes0": [0], "one": [1], f"h{H}": [H]}
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", INPUT]),
                helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)],
            [
                *_weights("l", INPUT, H),
                *(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()),
            ],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 9
    for target in ("portable", "onnxruntime"):
        rules = initial_state.FAMILY.rules_for(target)
        assert "no initial state is a provable all-zero tensor" in refusal_reasons(rules, model)
        assert apply(rules, model)[1] == 0
    feeds = {**_feeds(2, 3), "scale": np.array(np.inf, np.float32)}
    assert np.isnan(runtime.run(model, feeds)[0]).all()  # what dropping the state would lose


@pytest.mark.parametrize("opset", [11, 14, 15, 21])
def test_batch_read_by_the_opset_s_form(opset: int) -> None:
    """Shape with start/end from opset 15, Gather(Shape, [axis]) before; both recognised."""
    before = _stack((3, 3))
    before.opset_import[0].version = opset
    if opset < 13:  # Squeeze and Unsqueeze take attributes
        for node in before.graph.node:
            if node.op_type in ("Squeeze", "Unsqueeze"):
                axes = {"axes0": [0], "axes1": [1]}[node.input[1]]
                del node.input[1]
                node.attribute.append(helper.make_attribute("axes", axes))
    after, count = apply(RULES, before)
    assert count == 2
    counts = _counts(after)
    assert counts["Gather"] == (1 if opset < 15 else 0) and counts["ConstantOfShape"] == 1
    assert apply(RULES, after)[1] == 0  # recognised as explicit: rewriting twice is once
    _assert_equivalent(before, after)


def _with_decoys(
    model: onnx.ModelProto, decoys: dict[str, tuple[int, list[onnx.NodeProto]]]
) -> None:
    """Put zero ConstantOfShape nodes (name -> rank, nodes computing ``{name}_dims``) before
    the first GRU, each a graph output: the shared state must not be one of them."""
    nodes = []
    for name, (rank, shape_nodes) in decoys.items():
        nodes += [*shape_nodes, helper.make_node("ConstantOfShape", [f"{name}_dims"], [name])]
        output = helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * rank)
        model.graph.output.append(output)
    for node in reversed(nodes):
        model.graph.node.insert(0, node)


def _decoy_dims(name: str, middle: list[onnx.NodeProto], read: str) -> list[onnx.NodeProto]:
    return [*middle, helper.make_node("Concat", ["one", read, f"h{H}"], [f"{name}_dims"], axis=0)]


def _state_of(model: onnx.ModelProto) -> str:
    (gru,) = [n for n in model.graph.node if n.op_type == "GRU"]
    return gru.input[5]


def test_zero_tensors_of_other_shapes_are_not_shared() -> None:
    """Earlier zeros whose shape differs from Concat([1], Shape(x)[1:2], [H]) in one detail
    each: two axes (start=1, end=3), an absent start (end=2: [seq, batch]), a Mul of the
    whole shape, a graph input, a Max instead of the Concat, a graph input as the whole
    shape, Gathers of a graph input, of two axes and at an index fed at run time. Each
    stays its own; the GRU gets a new zero state."""
    model = _stack((H,))
    model.graph.input.append(helper.make_tensor_value_info("b", TensorProto.INT64, [1]))
    model.graph.input.append(helper.make_tensor_value_info("given_dims", TensorProto.INT64, [3]))
    model.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "k1"))
    two_axes = [helper.make_node("Shape", ["x"], ["s13"], start=1, end=3)]
    no_start = [helper.make_node("Shape", ["x"], ["s02"], end=2)]
    batch = [helper.make_node("Shape", ["x"], ["sb"], start=1, end=2)]

    def gather(data: str, index: str) -> list[onnx.NodeProto]:
        return [helper.make_node("Gather", [data, index], [f"g_{data}"], axis=0)]

    sx2 = helper.make_node("Shape", ["x"], ["sx2"])
    sx3 = helper.make_node("Shape", ["x"], ["sx3"])
    for name, value in {"k0": [0], "k12": [1, 2]}.items():
        model.graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), name))
    model.graph.input.append(helper.make_tensor_value_info("i", TensorProto.INT64, [1]))
    scaled = [
        helper.make_node("Shape", ["x"], ["sx"]),
        helper.make_node("Mul", ["sx", "k1"], ["sx1"]),
    ]
    _with_decoys(
        model,
        {
            "two_axes": (4, _decoy_dims("two_axes", two_axes, "s13")),
            "no_start": (4, _decoy_dims("no_start", no_start, "s02")),
            "scaled": (5, _decoy_dims("scaled", scaled, "sx1")),
            "fed": (3, _decoy_dims("fed", [], "b")),
            "maxed": (1, [*batch, helper.make_node("Max", ["one", "sb", f"h{H}"], ["maxed_dims"])]),
            "given": (3, []),  # ConstantOfShape(graph input)
            "gathered_input": (3, _decoy_dims("gathered_input", gather("b", "k0"), "g_b")),
            "gathered_two": (4, _decoy_dims("gathered_two", [sx2, *gather("sx2", "k12")], "g_sx2")),
            "gathered_fed": (3, _decoy_dims("gathered_fed", [sx3, *gather("sx3", "i")], "g_sx3")),
        },
    )
    after, count = apply(RULES, model)
    assert count == 1
    assert _state_of(after) not in {n.output[0] for n in model.graph.node}
    for batch, seq in ((1, 1), (3, 5), (2, 4)):
        feeds = {**_feeds(batch, seq), "b": np.array([batch + 1], np.int64)}
        feeds["given_dims"] = np.array([2, batch, 3], np.int64)
        feeds["i"] = np.array([1], np.int64)
        expected, actual = runtime.run(model, feeds), runtime.run(after, feeds)
        assert runtime.max_abs_diff(expected, actual) < 1e-6


def test_a_shape_read_of_another_domain_is_not_shared() -> None:
    """A custom-domain op named Shape may mean anything: its zeros are not the batch's."""
    model = _stack((H,))
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    shape = helper.make_node("Shape", ["x"], ["sc"], domain="com.example", start=1, end=2)
    _with_decoys(model, {"custom": (3, _decoy_dims("custom", [shape], "sc"))})
    after, count = apply(RULES, model, check=False)  # the checker cannot know com.example
    assert count == 1 and _state_of(after) != "custom"


def test_a_gather_without_axis_is_an_explicit_batch_read() -> None:
    """Gather(Shape(x), [1]) with axis absent (0) is the opset-14 form already."""
    model = _stack((H,))
    model.opset_import[0].version = 14
    model.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "k1"))
    read = [
        helper.make_node("Shape", ["x"], ["sx"]),
        helper.make_node("Gather", ["sx", "k1"], ["b1"]),
    ]
    _with_decoys(model, {"state": (3, _decoy_dims("state", read, "b1"))})
    gru = next(n for n in model.graph.node if n.op_type == "GRU")
    gru.input[5] = "state"
    assert "the zero states already are an explicit ConstantOfShape of the batch size" in (
        refusal_reasons(RULES, model)
    )
    assert apply(RULES, model)[1] == 0


def test_a_static_batch_drops_the_state() -> None:
    """x declared [seq, 2, 4]: portable drops the state as onnxruntime does (every runtime
    takes a missing state when the batch is static; tract's panic needs a symbolic one)."""
    model = _stack((H,))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 2
    after, count = apply(RULES, model)
    assert count == 1
    (gru,) = [n for n in after.graph.node if n.op_type == "GRU"]
    assert list(gru.input) == ["x", "l0_w", "l0_r"]
    assert _counts(after)["ConstantOfShape"] == _counts(after)["Concat"] == 0


def test_the_zero_state_has_the_rnn_s_element_type() -> None:
    """A float64 GRU gets float64 zeros (ConstantOfShape's default fill is float32)."""
    model = _stack((H,))
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    for init in model.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            wide = numpy_helper.to_array(init).astype(np.float64)
            init.CopyFrom(numpy_helper.from_array(wide, init.name))
    zeros = next(n for n in model.graph.node if n.op_type == "ConstantOfShape")
    fill = numpy_helper.from_array(np.zeros(1, np.float64), "value")
    zeros.attribute.append(helper.make_attribute("value", fill))
    after, count = apply(RULES, model)
    assert count == 1
    for batch, seq in ((1, 1), (3, 5)):
        feeds = {"x": _feeds(batch, seq)["x"].astype(np.float64)}
        expected, actual = _reference(model, feeds), _reference(after, feeds)  # ORT: no double GRU
        assert actual[0].dtype == np.float64 and runtime.max_abs_diff(expected, actual) < 1e-12


def test_a_zero_state_defined_after_the_rnn_is_not_shared() -> None:
    """Layer 1 already has the explicit form; layer 0, before it, cannot use that node."""
    model = _stack((H, H))
    nodes = list(model.graph.node)
    read = helper.make_node("Shape", ["x"], ["x_batch"], start=1, end=2)
    concat = helper.make_node("Concat", ["one", "x_batch", f"h{H}"], ["h0_1_dims"], axis=0)
    explicit = [read, concat, helper.make_node("ConstantOfShape", ["h0_1_dims"], ["h0_1"])]
    keep = [n for n in nodes if not n.output[0].startswith("h0_1")]
    position = keep.index(next(n for n in keep if n.name == "gru1"))
    del model.graph.node[:]
    model.graph.node.extend(keep[:position] + explicit + keep[position:])
    after, count = apply(RULES, model)  # the checker rejects a use before its definition
    assert count == 1
    grus = {n.name: n for n in after.graph.node if n.op_type == "GRU"}
    assert grus["gru0"].input[5] != "h0_1" and grus["gru1"].input[5] == "h0_1"
    _assert_equivalent(model, after)


def test_constants_are_initializers_in_the_main_graph_and_nodes_in_a_branch() -> None:
    """[D] and [H] are initializers of the main graph; in an If branch, Constant nodes (a
    subgraph initializer's name would have to be unique across the model)."""
    main, count = apply(RULES, _stack((H,)))
    assert count == 1
    zeros = next(n for n in main.graph.node if n.op_type == "ConstantOfShape")
    concat = next(n for n in main.graph.node if n.output[0] == zeros.input[0])
    names = {i.name for i in main.graph.initializer}
    constants = [name for name in concat.input if name in names]
    assert len(constants) == 2 and "Constant" not in _counts(main)

    wrapped = in_if_branches(_stack((H,)), _stack((H,)))
    after, count = apply(RULES, wrapped)
    assert count == 2
    (then,) = [a.g for a in after.graph.node[0].attribute if a.name == "then_branch"]
    assert not then.initializer and "Constant" in [n.op_type for n in then.node]
    assert {i.name for i in after.graph.initializer} <= {i.name for i in wrapped.graph.initializer}
    for batch, seq in ((1, 1), (3, 5)):
        feeds = {**_feeds(batch, seq), "cond": np.array(True)}
        expected, actual = runtime.run(wrapped, feeds), runtime.run(after, feeds)
        assert runtime.max_abs_diff(expected, actual) < 1e-6


def _computed_xwr_model(
    zeros: list[onnx.NodeProto],
    state: str,
    initializers: list[onnx.TensorProto],
    *,
    elem: int = TensorProto.FLOAT,
    opset: int = 17,
    batch: int | str = 2,
) -> onnx.ModelProto:
    """A GRU (batch 2, or ``batch``) whose X, W and R are computed, so no input gives the
    states' type: only the zero state ``state`` (made by ``zeros``) can."""
    nodes = [helper.make_node("Relu", [f"{n}_in"], [n]) for n in ("x", "w", "r")]
    nodes += zeros
    nodes.append(helper.make_node("GRU", ["x", "w", "r", "", "", state], ["y"], hidden_size=H))
    inputs = [
        helper.make_tensor_value_info("x_in", elem, ["seq", batch, INPUT]),
        helper.make_tensor_value_info("w_in", elem, [1, 3 * H, INPUT]),
        helper.make_tensor_value_info("r_in", elem, [1, 3 * H, H]),
    ]
    output = helper.make_tensor_value_info("y", elem, [None] * 4)
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, [output], initializers),
        opset_imports=[helper.make_opsetid("", opset)],
    )
    model.ir_version = 9
    return model


def test_the_zeros_own_type_is_read_as_deep_as_they_are_proven() -> None:
    """X, W and R computed (nothing typed to read T from), a symbolic batch (a static one's
    state is dropped): the type comes from the zeros, a ConstantOfShape 16 Neg nodes up,
    as deep as ``is_all_zeros`` proves them."""
    zeros = [*_torchscript_dims(), helper.make_node("ConstantOfShape", ["dims"], ["z0"])]
    zeros += [helper.make_node("Neg", [f"z{i}"], [f"z{i + 1}"]) for i in range(16)]
    model = _computed_xwr_model(zeros, "z16", _dims_constants(), batch="batch")
    after, count = apply(RULES, model)
    assert count == 1
    (gru,) = [n for n in after.graph.node if n.op_type == "GRU"]
    (zeros_node,) = [n for n in after.graph.node if n.op_type == "ConstantOfShape"]
    assert gru.input[5] == zeros_node.output[0]  # float zeros (the default fill), new


@pytest.mark.parametrize(("negations", "proven"), [(15, True), (16, False)])
def test_a_dequantized_zeros_type_is_read_from_its_scale_as_deep_as_proven(
    negations: int, proven: bool
) -> None:
    """The zeros are ``DequantizeLinear(int8 zeros, scale)`` under a chain of Neg nodes:
    the type is the scale's, one level deeper, exactly as deep as ``is_all_zeros`` proves
    the scale finite (15 Negs: proven and rewritten; 16: neither)."""
    int8 = numpy_helper.from_array(np.zeros(1, np.int8), "value")
    zeros = [
        helper.make_node("ConstantOfShape", ["dims"], ["q"], value=int8),
        helper.make_node("DequantizeLinear", ["q", "scale"], ["z0"]),
    ]
    zeros += [helper.make_node("Neg", [f"z{i}"], [f"z{i + 1}"]) for i in range(negations)]
    initializers = [
        numpy_helper.from_array(np.array([1, 2, H], np.int64), "dims"),
        numpy_helper.from_array(np.array(0.5, np.float32), "scale"),
    ]
    model = _computed_xwr_model(zeros, f"z{negations}", initializers)
    after, count = apply(RULES, model)
    assert count == int(proven)
    rng = np.random.default_rng(0)
    for seq in (1, 4):
        feeds = {
            "x_in": rng.standard_normal((seq, 2, INPUT)).astype(np.float32),
            "w_in": rng.standard_normal((1, 3 * H, INPUT)).astype(np.float32),
            "r_in": rng.standard_normal((1, 3 * H, H)).astype(np.float32),
        }
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(after, feeds)) == 0


def _dims_constants() -> list[onnx.TensorProto]:
    """The constants :func:`_torchscript_dims` reads."""
    consts = {"one_scalar": np.array(1), "axes0": [0], "one": [1], "hh": [H]}
    return [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()]


def _torchscript_dims() -> list[onnx.NodeProto]:
    """``Concat([1], Unsqueeze(Gather(Shape(x), 1)), [H])``: not the shared form."""
    return [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one_scalar"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"]),
        helper.make_node("Concat", ["one", "b1", "hh"], ["dims"], axis=0),
    ]


def _double_zeros(form: str) -> list[onnx.NodeProto]:
    double = numpy_helper.from_array(np.zeros(1, np.float64), "value")
    if form == "constant":
        zeros = numpy_helper.from_array(np.zeros((1, 2, H), np.float64), "value")
        return [helper.make_node("Constant", [], ["h0"], value=zeros)]
    if form == "filled":
        return [
            *_torchscript_dims(),
            helper.make_node("ConstantOfShape", ["dims"], ["h0"], value=double),
        ]
    if form == "dequantized":
        int8 = numpy_helper.from_array(np.zeros(1, np.int8), "value")
        scale = numpy_helper.from_array(np.array(0.5, np.float64), "value")
        return [
            *_torchscript_dims(),
            helper.make_node("ConstantOfShape", ["dims"], ["h0_q"], value=int8),
            helper.make_node("Constant", [], ["h0_scale"], value=scale),
            helper.make_node("DequantizeLinear", ["h0_q", "h0_scale"], ["h0"]),
        ]
    integer = numpy_helper.from_array(np.zeros(1, np.int64), "value")
    return [
        *_torchscript_dims(),
        helper.make_node("ConstantOfShape", ["dims"], ["h0_int"], value=integer),
        helper.make_node("Cast", ["h0_int"], ["h0"], to=TensorProto.DOUBLE),
    ]


@pytest.mark.parametrize("form", ["constant", "filled", "cast", "dequantized"])
def test_the_zeros_own_type_is_read_from_their_constant_fill_or_cast(form: str) -> None:
    """X, W and R computed (nothing typed to read T from), float64: the emitted zeros take
    the type of the old ones, read from a constant, a ConstantOfShape's value, a Cast or a
    DequantizeLinear's scale (opset 19 dequantizes to double)."""
    consts = {"one_scalar": np.array(1), "axes0": [0], "one": [1], "hh": [H]}
    model = _computed_xwr_model(
        _double_zeros(form),
        "h0",
        [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()],
        elem=TensorProto.DOUBLE,
        opset=19 if form == "dequantized" else 17,
    )
    after, count = apply(RULES, model)  # the full checker: the state's type must be T
    assert count == 1
    rng = np.random.default_rng(3)
    feeds = {
        "x_in": rng.standard_normal((3, 2, INPUT)),
        "w_in": rng.standard_normal((1, 3 * H, INPUT)),
        "r_in": rng.standard_normal((1, 3 * H, H)),
    }
    expected, actual = _reference(model, feeds), _reference(after, feeds)  # ORT: no double GRU
    assert actual[0].dtype == np.float64 and runtime.max_abs_diff(expected, actual) < 1e-12


def test_a_computed_x_is_typed_by_its_producer_not_its_value_info() -> None:
    """X is Relu(x_in) annotated float64 in value_info (wrongly): T is read from W."""
    model = _stack((H,))
    model.graph.input[0].name = "x_in"
    model.graph.node.insert(0, helper.make_node("Relu", ["x_in"], ["x"]))
    model.graph.value_info.append(
        helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["seq", "batch", INPUT])
    )
    after = rnn_rewrite_rules.rewrite(model, ["initial_state"])
    zeros = next(n for n in after.graph.node if n.op_type == "ConstantOfShape")
    assert [a.t.data_type for a in zeros.attribute] == [TensorProto.FLOAT]


def test_a_state_read_by_gathering_another_op_is_rewritten() -> None:
    """Gather(Mul(Shape(x), 1), [1]) is the batch, but not the explicit form: rewritten.
    The zeros are read by the GRU alone (not a graph output, unlike the decoys): where
    they stay read elsewhere the rule declines, since a new state would remove nothing."""
    model = _stack((H,))
    model.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "k1"))
    nodes = [
        helper.make_node("Shape", ["x"], ["sx"]),
        helper.make_node("Mul", ["sx", "k1"], ["sx1"]),
        helper.make_node("Gather", ["sx1", "k1"], ["b1"], axis=0),
    ]
    _with_decoys(model, {"state": (3, _decoy_dims("state", nodes, "b1"))})
    model.graph.output.pop()  # the decoy's output: the GRU is the zeros' only reader
    gru = next(n for n in model.graph.node if n.op_type == "GRU")
    gru.input[5] = "state"
    after, count = apply(RULES, model)
    assert count == 1 and _state_of(after) != "state"
    assert "state" not in {o for n in after.graph.node for o in n.output}


def test_zeros_whose_type_reads_back_to_a_graph_input_are_refused() -> None:
    """A graph whose types do not check: ``Mul(Size(x), zeros)`` is zero (Size is a
    finite integer), but its first operand, the one the type is read from, leads back to
    the graph input ``x_in``; X, W and R are computed. With no type to give the new
    zeros, ShareZeroInitialState refuses (naming the state: ``refusal_reasons``)."""
    zeros = [
        *_torchscript_dims(),
        helper.make_node("ConstantOfShape", ["dims"], ["z"]),
        helper.make_node("Size", ["x"], ["n"]),
        helper.make_node("Mul", ["n", "z"], ["h0"]),
    ]
    model = _computed_xwr_model(zeros, "h0", _dims_constants(), batch="batch")
    assert "cannot prove the initial state's element type" in refusal_reasons(RULES, model)


def test_a_dropped_state_leaves_no_trailing_empty_inputs() -> None:
    """Applied alone (no cleanup pass after it), DropZeroInitialState emits the GRU with
    X, W and R only: the omitted B, sequence_lens and initial_h are not written as
    trailing empty inputs."""
    model = ir.serde.deserialize_model(_stack((H,)))
    rules = RewriteRuleSet(initial_state.FAMILY.rules_for("onnxruntime"))
    assert rules.apply_to_model(model) == 1
    (gru,) = [n for n in model.graph if n.op_type == "GRU"]
    assert [v.name for v in gru.inputs] == ["x", "l0_w", "l0_r"]

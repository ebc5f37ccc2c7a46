"""reroll: unrolled LSTMCell / GRUCell loops become one ONNX LSTM / GRU node."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx.reference import ReferenceEvaluator
from onnxscript.rewriter import RewriteRuleSet

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules.rules.reroll import cells as reroll_cells
from rnn_rewrite_rules.testing.unrolled import (
    CELL_MUTATIONS,
    UnrolledCellConfig,
    build_unrolled_cell,
    cell_inputs,
    cell_reference,
)
from tests.reasons import refusal_reasons
from tests.support import as_function, op_counts, running_nodes, without_output


@pytest.fixture(autouse=True)
def _cost_model_ignored(monkeypatch):
    """These tests prove the rewrite's structure at any size: the measured cost table's
    decisions are tested in tests/test_reroll_costs.py. Every rewrite here runs with a
    context that ignores the cost model (the one rules read when none is attached)."""
    monkeypatch.setattr(costs, "of", lambda model: costs.Context(ignore=True))


POSITIVE = [
    UnrolledCellConfig(),
    UnrolledCellConfig(op_type="GRU"),
    UnrolledCellConfig(reverse=True, gemm=False, read="slice", bias=False, seq=5),
    UnrolledCellConfig(op_type="GRU", reverse=True, gemm=False, read="slice", bias=False),
    UnrolledCellConfig(initial_state="constant_of_shape", opset=13),
    UnrolledCellConfig(op_type="GRU", initial_state="constant_of_shape", seq=2),
    UnrolledCellConfig(initial_state="folded", batch=2),
    UnrolledCellConfig(op_type="GRU", initial_state="folded", batch=1, bias=False),
    UnrolledCellConfig(initial_state="first_frame"),  # non-zero h_0 and c_0 from X
    UnrolledCellConfig(op_type="GRU", initial_state="first_frame", reverse=True, gemm=False),
    UnrolledCellConfig(opset=12, read="slice"),  # axes and split as attributes
    UnrolledCellConfig(op_type="GRU", opset=11, initial_state="constant_of_shape"),
    # batch-first: x[:, t] reads, torch.stack(hs, 1)
    UnrolledCellConfig(batch_first=True),
    UnrolledCellConfig(op_type="GRU", batch_first=True, reverse=True, opset=13),
    UnrolledCellConfig(batch_first=True, initial_state="constant_of_shape", opset=11),
    UnrolledCellConfig(op_type="GRU", batch_first=True, initial_state="folded", batch=2),
    UnrolledCellConfig(batch_first=True, initial_state="first_frame", gemm=False),
]


def _batches(cfg: UnrolledCellConfig) -> list[int]:
    return [cfg.batch] if cfg.batch is not None else [1, 3, 7]


@pytest.mark.parametrize("cfg", POSITIVE, ids=str)
def test_loop_becomes_one_node_with_the_same_outputs(cfg: UnrolledCellConfig) -> None:
    model = build_unrolled_cell(cfg)
    # the family alone: no other family may repair what it emits (opset < 13 Squeeze)
    alone = rnn_rewrite_rules.rewrite(model, ["reroll"])
    onnx.checker.check_model(alone, full_check=True)
    assert op_counts(alone)["Constant"] == 0  # the main graph's new constants are initializers
    feeds = cell_inputs(cfg, _batches(cfg)[-1])
    assert runtime.max_abs_diff(cell_reference(cfg, feeds["x"]), runtime.run(alone, feeds)) <= 1e-5
    result = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(result, full_check=True)
    counts = op_counts(result)
    assert counts[cfg.op_type] == 1
    assert counts["Sigmoid"] == counts["Gemm"] == counts["Split"] == 0
    # X's sequence axis is statically T: not sliced; reversed (X and Y) on portable, where
    # tract runs a reverse node forward (passes.ForwardReverseNodesPass)
    assert counts["Slice"] == (2 if cfg.reverse else 0)
    states = 1 + (cfg.op_type == "LSTM") if cfg.initial_state == "first_frame" else 0
    assert counts["MatMul"] == states  # x[0] @ P for each initial state
    (node,) = [n for n in running_nodes(result) if n.op_type == cfg.op_type]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attributes["direction"] == b"forward"
    if cfg.op_type == "GRU":
        assert attributes["linear_before_reset"] == 1
    for seed, batch in enumerate(_batches(cfg)):
        feeds = cell_inputs(cfg, batch, rng=seed)
        expected = cell_reference(cfg, feeds["x"])
        for optimize in (True, False):
            actual = runtime.run(result, feeds, optimize=optimize)
            assert runtime.max_abs_diff(expected, actual) <= 1e-5
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(result, feeds)) <= 1e-5


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_batch_zero_in_the_reference_evaluator(op_type: str) -> None:
    """ORT aborts the process on LSTM/GRU with batch 0: the reference evaluator runs it."""
    cfg = UnrolledCellConfig(op_type=op_type)
    model = build_unrolled_cell(cfg)
    result = rnn_rewrite_rules.rewrite(model)
    feeds = cell_inputs(cfg, 0)
    expected = ReferenceEvaluator(model).run(None, feeds)
    actual = ReferenceEvaluator(result).run(None, feeds)
    assert [a.shape for a in actual] == [e.shape for e in expected]


def test_longer_input_reads_the_first_steps_like_the_original() -> None:
    cfg = UnrolledCellConfig(seq=3)
    model = build_unrolled_cell(cfg)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].ClearField("dim_value")
    dims[0].dim_param = "seq"
    result = rnn_rewrite_rules.rewrite(model)
    assert op_counts(result)["Slice"] == 1
    feeds = cell_inputs(cfg, 2, seq=6)
    assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(result, feeds)) <= 1e-5


def _root(model: onnx.ModelProto) -> ir.Node:
    graph = ir.serde.deserialize_model(model).graph
    (node,) = [n for n in graph if any(u.name == "output_h_n" for u, _ in n.outputs[0].uses())]
    return node


def _rules(op_type: str) -> list:
    return [reroll_cells.RerollCell.rule(op_type)]


def _assert_refused(model: onnx.ModelProto, op_type: str, expected: str) -> None:
    """The rule refuses the loop with ``expected`` among its reasons (see :func:`_matches`),
    and the family leaves it unrolled."""
    found = refusal_reasons(_rules(op_type), model)
    assert any(_matches(reason, expected) for reason in found), "\n".join(sorted(set(found)))
    assert op_counts(rnn_rewrite_rules.rewrite(model, ["reroll"]))[op_type] == 0


def _fires(model: onnx.ModelProto, op_type: str) -> bool:
    return op_counts(rnn_rewrite_rules.rewrite(model, ["reroll"]))[op_type] == 1


def _matches(reason: str, expected: str) -> bool:
    """``reason == expected``, where ``{name}`` in ``expected`` stands for a value's name."""
    head, marker, tail = expected.partition("{name}")
    if not marker:
        return reason == expected
    return reason.startswith(head) and reason.endswith(tail) and len(reason) > len(head + tail)


REASONS = {
    "weights_at_step": "step 1 uses other weights",
    "broken_chain": "the steps read indices [0, 1, 3], not 0..2 in order or reversed",
    "step_read_twice": "the steps read indices [0, 1, 2, 2], not 0..3 in order or reversed",
    "extra_reader": "a value of step 0 ({name}) is a graph output",
    "nonconstant_weights": "{name}'s weight is not a constant matrix",
}
GATE_REASONS = {
    ("LSTM", "wrong_activation"): "c_t is not f(f) * c_(t-1) + f(i) * g(g) with o's f (LSTM)",
    ("GRU", "wrong_activation"): "the reset gate's activation is not the update gate's (GRU)",
}
#: Near misses: every mutation but a gate order, which is still a cell (see below).
NEAR_MISSES = sorted(set(CELL_MUTATIONS) - {"gate_order"})


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize("mutation", NEAR_MISSES)
def test_near_misses_are_refused_with_the_reason(op_type: str, mutation: str) -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type=op_type, seq=4, mutation=mutation))
    _assert_refused(model, op_type, REASONS.get(mutation) or GATE_REASONS[op_type, mutation])


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_a_single_step_is_left_alone(op_type: str) -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type=op_type, seq=1))
    _assert_refused(model, op_type, "a single cell step is not a loop (left alone)")
    assert op_counts(rnn_rewrite_rules.rewrite(model))[op_type] == 0


def test_zero_state_of_another_batch_is_refused() -> None:
    cfg = UnrolledCellConfig(initial_state="folded", batch=2)
    model = build_unrolled_cell(cfg)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[1].ClearField("dim_value")
    dims[1].dim_param = "batch"
    _assert_refused(model, "LSTM", "the folded first step fixes a batch X does not provably have")


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_a_folded_batch_1_first_step_serves_every_batch(op_type: str) -> None:
    """Exported at batch 1 with X's batch left dynamic: the folded first step and the zero
    ``c_0`` are [1, ...] and broadcast, so the loop runs at any batch; so must the node
    (its states are its own zeros, not the batch-1 constants)."""
    cfg = UnrolledCellConfig(op_type=op_type, initial_state="folded", batch=1)
    model = build_unrolled_cell(cfg)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[1].dim_param = "batch"  # replaces the static 1
    after = rnn_rewrite_rules.rewrite(model)
    assert op_counts(after)[op_type] == 1
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        x = rng.standard_normal((dims[0].dim_value, batch, dims[2].dim_value)).astype(np.float32)
        diff = runtime.max_abs_diff(runtime.run(model, {"x": x}), runtime.run(after, {"x": x}))
        assert diff <= 1e-5, (batch, diff)


def test_gate_order_of_the_weights_is_onnx_order() -> None:
    cfg = UnrolledCellConfig(input_size=2, hidden_size=1)
    result = rnn_rewrite_rules.rewrite(build_unrolled_cell(cfg))
    (node,) = [n for n in running_nodes(result) if n.op_type == "LSTM"]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in result.graph.initializer}
    source = build_unrolled_cell(cfg)
    pytorch = {t.name: onnx.numpy_helper.to_array(t) for t in source.graph.initializer}
    i, f, g, o = pytorch["cell.weight_ih"]
    np.testing.assert_array_equal(inits[node.input[1]][0], np.stack([i, o, f, g]))


def test_rewriting_twice_equals_once_and_keeps_names() -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type="GRU", reverse=True))
    once = rnn_rewrite_rules.rewrite(model)
    twice = rnn_rewrite_rules.rewrite(once)
    assert once.SerializeToString() == twice.SerializeToString()
    assert [o.name for o in once.graph.output] == [o.name for o in model.graph.output]
    kept = {n.name for n in model.graph.node} & {n.name for n in once.graph.node}
    assert all(n.name in kept for n in once.graph.node if n.name.startswith("node_val"))


@settings(max_examples=20, deadline=None)
@given(
    op_type=st.sampled_from(["LSTM", "GRU"]),
    hidden=st.integers(1, 5),
    inputs=st.integers(1, 4),
    seq=st.integers(2, 5),
    reverse=st.booleans(),
    bias=st.booleans(),
    gemm=st.booleans(),
    read=st.sampled_from(["gather", "slice"]),
    state=st.sampled_from(["zeros", "constant_of_shape"]),
    batch=st.integers(1, 4),
)
def test_property_builder_loops_match_the_numpy_cell(
    op_type, hidden, inputs, seq, reverse, bias, gemm, read, state, batch
) -> None:
    cfg = UnrolledCellConfig(op_type, inputs, hidden, seq, reverse, bias, gemm, read, state)
    result = rnn_rewrite_rules.rewrite(build_unrolled_cell(cfg))
    assert op_counts(result)[op_type] == 1
    feeds = cell_inputs(cfg, batch)
    assert runtime.max_abs_diff(cell_reference(cfg, feeds["x"]), runtime.run(result, feeds)) <= 1e-5


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_a_step_whose_h_feeds_the_next_is_not_the_end(op_type: str) -> None:
    cfg = UnrolledCellConfig(op_type=op_type, seq=3)
    model = without_output("y", build_unrolled_cell(cfg))
    found = refusal_reasons(_rules(op_type), model)
    assert "h_T feeds another step: not the last step" in found, found
    result = rnn_rewrite_rules.rewrite(model, ["reroll"])
    assert op_counts(result)[op_type] == 1
    for seed, batch in enumerate(_batches(cfg)):
        feeds = cell_inputs(cfg, batch, rng=seed)
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(result, feeds)) <= 1e-5


def test_a_reader_of_c_t_before_h_t_is_refused() -> None:
    """The merged node takes the place of ``h_T``'s Mul: a reader of ``c_T`` placed before
    it would read a value computed after it."""
    model = build_unrolled_cell(UnrolledCellConfig(seq=3))
    nodes = list(model.graph.node)
    (reader,) = [n for n in nodes if list(n.output) == ["c_n"]]
    (producer,) = [n for n in nodes if reader.input[0] in n.output]
    nodes.remove(reader)
    nodes.insert(nodes.index(producer) + 1, reader)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.checker.check_model(model)
    found = refusal_reasons(_rules("LSTM"), model)
    assert "a reader of c_T comes before h_T" in found, found
    assert op_counts(rnn_rewrite_rules.rewrite(model))["LSTM"] == 0


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_gates_in_another_order_are_read_by_what_they_do(op_type: str) -> None:
    """Two gates swapped in every step (LSTM i/f, GRU r/z) still make a cell: its weights
    are read by the gate's role, so the node computes what the steps do."""
    cfg = UnrolledCellConfig(op_type=op_type, seq=4, mutation="gate_order")
    _assert_rerolled(build_unrolled_cell(cfg), cfg)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_a_function_importing_another_opset_is_left_alone(op_type: str) -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type=op_type, seq=2))
    version = model.opset_import[0].version
    found = refusal_reasons(_rules(op_type), as_function(model, version - 1, ranked=True))
    reason = (
        f"function 'layer' imports opset {version - 1} of 'ai.onnx' but the model "
        f"{version}: an emitted op would be invalid in one of them"
    )
    assert reason in found, found


def _hidden_gemm(model: onnx.ModelProto) -> onnx.NodeProto:
    """The last step's ``Gemm(h_{T-1}, W_hh, b_hh)``."""
    return [n for n in model.graph.node if n.op_type == "Gemm" and n.input[1] == "cell.weight_hh"][
        -1
    ]


_NOT_V_W_B = "{name} is not v @ W + b (transA, alpha or beta)"


@pytest.mark.parametrize(
    ("attributes", "reason"),
    [
        ({"transA": 1, "transB": 1}, _NOT_V_W_B),
        ({}, "the terms of a sum have widths [3, 12]"),  # W_hh [12, 3] read as [in, out]
        ({"transB": 0}, "the terms of a sum have widths [3, 12]"),
        ({"transB": 1, "alpha": 2.0}, _NOT_V_W_B),
        ({"beta": 0.5}, _NOT_V_W_B),
    ],
    ids=str,
)
def test_a_gemm_that_is_not_v_times_w_transposed_plus_b_is_refused(
    attributes: dict, reason: str
) -> None:
    """transB defaults to 0: a Gemm without it reads W as [in, out] (the step's W^T)."""
    model = build_unrolled_cell(UnrolledCellConfig())
    gemm = _hidden_gemm(model)
    del gemm.attribute[:]
    gemm.attribute.extend(onnx.helper.make_attribute(k, v) for k, v in attributes.items())
    if "transB" not in attributes and "alpha" not in attributes and attributes:
        gemm.attribute.append(onnx.helper.make_attribute("transB", 1))
    _assert_refused(model, "LSTM", reason)


def _replace_initializer(model: onnx.ModelProto, name: str, array: np.ndarray) -> None:
    (tensor,) = [t for t in model.graph.initializer if t.name == name]
    tensor.CopyFrom(onnx.numpy_helper.from_array(array, name))


def _make_graph_input(model: onnx.ModelProto, name: str, dims: list | None = None) -> None:
    """The initializer ``name`` becomes a graph input (no longer a constant)."""
    (tensor,) = [t for t in model.graph.initializer if t.name == name]
    dims = list(tensor.dims) if dims is None else dims
    model.graph.initializer.remove(tensor)
    model.graph.input.append(onnx.helper.make_tensor_value_info(name, tensor.data_type, dims))


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ("weight_input", "{name}'s weight is not a constant matrix"),
        ("bias_input", "{name} is not a MatMul, Gemm, Add or bias"),
        ("bias_shape", "the terms of a sum have widths [12, 13]"),
        ("bias_rows", "{name}: a bias term has shape [2, 12], not [width] or [1, width]"),
        ("weight_rows", "the terms of a sum have widths [12, 13]"),
    ],
)
def test_gate_weights_that_are_not_constant_gate_blocks_are_refused(edit: str, reason) -> None:
    cfg = UnrolledCellConfig(bias=edit != "weight_rows")
    model = build_unrolled_cell(cfg)
    rng = np.random.default_rng(0)
    if edit == "weight_input":
        _make_graph_input(model, "cell.weight_ih")
    elif edit == "bias_input":
        _make_graph_input(model, "cell.bias_ih")
    elif edit == "bias_shape":
        _replace_initializer(model, "cell.bias_hh", rng.standard_normal(13, np.float32))
    elif edit == "bias_rows":  # [2, G*H]: a batch of 2 only, another bias per row
        _replace_initializer(model, "cell.bias_hh", rng.standard_normal((2, 12), np.float32))
    else:
        _replace_initializer(model, "cell.weight_hh", rng.standard_normal((13, 3), np.float32))
    _assert_refused(model, "LSTM", reason)


@pytest.mark.parametrize("gemm", [True, False], ids=["gemm", "matmul_add"])
def test_a_gate_bias_of_one_row_is_the_bias(gemm: bool) -> None:
    """A ``[1, G*H]`` bias (a 2-D Gemm C, a Keras-style row) adds the same to every row."""
    cfg = UnrolledCellConfig(gemm=gemm)
    model = build_unrolled_cell(cfg)
    for name in ("cell.bias_ih", "cell.bias_hh"):
        (tensor,) = [t for t in model.graph.initializer if t.name == name]
        _replace_initializer(model, name, onnx.numpy_helper.to_array(tensor)[np.newaxis])
    result = rnn_rewrite_rules.rewrite(model)
    assert op_counts(result)["LSTM"] == 1 and op_counts(result)["Gemm"] == 0
    for seed, batch in enumerate((1, 3)):
        feeds = cell_inputs(cfg, batch, rng=seed)
        expected = cell_reference(cfg, feeds["x"])
        assert runtime.max_abs_diff(expected, runtime.run(model, feeds)) <= 1e-5
        assert runtime.max_abs_diff(expected, runtime.run(result, feeds)) <= 1e-5


#: A folded first step at X's static batch 3, with the zero state the first step reads
#: (LSTM: ``c_0``, GRU: ``h_0``) replaced; input size 2 and hidden size 4 tell the axes apart.
_FOLDED = {"initial_state": "folded", "batch": 3, "input_size": 2, "hidden_size": 4}
_STATE_REASONS = {
    "LSTM": "cannot prove c_0 is [batch of X, H]",
    "GRU": "the folded first step's h_0 is not provably zeros of X's batch",
}


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_a_zero_state_that_broadcasts_over_the_hidden_axis_is_the_nodes_zeros(op_type) -> None:
    """``zeros [batch, 1]`` broadcast by the steps is the node's own zero state."""
    cfg = UnrolledCellConfig(op_type=op_type, **_FOLDED)
    model = build_unrolled_cell(cfg)
    _replace_initializer(model, "zeros", np.zeros((3, 1), np.float32))
    result = rnn_rewrite_rules.rewrite(model, ["reroll"])
    (node,) = [n for n in running_nodes(result) if n.op_type == op_type]
    assert list(node.input[5:]) == []  # no initial_h, initial_c: the node's own zeros
    feeds = cell_inputs(cfg, 3)
    assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(result, feeds)) <= 1e-5


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize(
    "state",
    ["ones [1, H]", "zeros [2, 1]", "zeros [3, 1, 1]", "input [1, H]"],
)
def test_a_state_not_provably_zeros_of_xs_batch_is_refused(op_type: str, state: str) -> None:
    cfg = UnrolledCellConfig(op_type=op_type, **_FOLDED)
    model = build_unrolled_cell(cfg)
    if state == "input [1, H]":
        _make_graph_input(model, "zeros", [1, 4])
    else:
        fill, shape = {
            "ones [1, H]": (1.0, (1, 4)),
            "zeros [2, 1]": (0.0, (2, 1)),
            "zeros [3, 1, 1]": (0.0, (3, 1, 1)),
        }[state]
        _replace_initializer(model, "zeros", np.full(shape, fill, np.float32))
    _assert_refused(model, op_type, _STATE_REASONS[op_type])


def _stack(model: onnx.ModelProto) -> tuple[onnx.NodeProto, list[onnx.NodeProto]]:
    """The ``Concat`` stacking the steps and its ``Unsqueeze`` nodes."""
    (concat,) = [n for n in model.graph.node if n.name.startswith("node_stack")]
    producers = {n.output[0]: n for n in model.graph.node}
    return concat, [producers[v] for v in concat.input]


def _edit_stack(model: onnx.ModelProto, edit: str) -> None:
    concat, unsqueezes = _stack(model)
    if edit == "order":
        concat.input[0], concat.input[1] = concat.input[1], concat.input[0]
    elif edit == "concat_axis":
        concat.attribute[0].i = 1
    elif edit == "concat_domain":
        concat.domain = "custom"
    elif edit == "unsqueeze_domain":
        unsqueezes[1].domain = "custom"
    elif edit == "unsqueeze_axes":
        model.graph.initializer.append(
            onnx.numpy_helper.from_array(np.array([1], np.int64), "axes_1")
        )
        unsqueezes[1].input[1] = "axes_1"
    else:
        assert edit == "unsqueeze_reader"
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(unsqueezes[1].output[0]))


@pytest.mark.parametrize(
    "edit",
    [
        "order",
        "concat_axis",
        "concat_domain",
        "unsqueeze_domain",
        "unsqueeze_axes",
        "unsqueeze_reader",
    ],
)
def test_a_stack_that_is_not_the_steps_in_order_is_not_redirected(edit: str) -> None:
    """Without the stack, the steps' ``h_t`` have readers outside the loop: refused."""
    model = build_unrolled_cell(UnrolledCellConfig(seq=3))
    assert _fires(model, "LSTM")
    _edit_stack(model, edit)
    _assert_refused(model, "LSTM", "a value of step 0 ({name}) has a reader outside the loop")


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize("named", [True, False])
def test_new_weights_are_initializers_named_after_h_t(op_type: str, named: bool) -> None:
    """Named after ``h_T``'s value (``cell`` when it has no name, as a value a rule emits)."""
    model = ir.serde.deserialize_model(build_unrolled_cell(UnrolledCellConfig(op_type=op_type)))
    h = _root(ir.serde.serialize_model(model)).outputs[0].name
    (h_value,) = [n.outputs[0] for n in model.graph if n.outputs[0].name == h]
    if not named:
        h_value.name = None
    rnn_rewrite_rules.rewrite(model, ["reroll"])
    (node,) = [n for n in model.graph.all_nodes() if n.op_type == op_type]
    prefix = f"reroll_{h if named else 'cell'}"
    assert [v.name for v in node.inputs[1:4]] == [f"{prefix}_W", f"{prefix}_R", f"{prefix}_B"]
    assert all(v.is_initializer() for v in node.inputs[1:4])


def _nodes(model: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    """The ``op_type`` nodes in graph order (the builder writes the steps in order)."""
    return [n for n in model.graph.node if n.op_type == op_type]


def _set_attribute(node: onnx.NodeProto, name: str, value) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)
    if value is not None:
        node.attribute.append(onnx.helper.make_attribute(name, value))


def _add_constant(model: onnx.ModelProto, name: str, array: np.ndarray) -> str:
    model.graph.initializer.append(onnx.numpy_helper.from_array(array, name))
    return name


_GATES_REASONS = {
    "no axis": "Split does not split axis 1",
    "axis -2": "Split does not split axis 1",
    "unequal sizes": "gate i's weights are not [I, H] and [H, H] with H = 4",
    "sizes not constant": "Split's sizes are not constant",
    "unequal split attribute": "gate i's weights are not [I, H] and [H, H] with H = 4",
    "o not from the Split": "gate o's weights are not [I, H] and [H, H] with H = 3",
}


@pytest.mark.parametrize(
    ("edit", "opset"),
    [
        ("no axis", 18),
        ("axis -2", 18),
        ("unequal sizes", 13),
        ("sizes not constant", 13),
        ("unequal split attribute", 12),
        ("o not from the Split", 18),
    ],
)
def test_gates_that_are_not_equal_parts_on_axis_1_are_refused(edit: str, opset: int) -> None:
    model = build_unrolled_cell(UnrolledCellConfig(opset=opset))
    split = _nodes(model, "Split")[-1]
    if edit == "no axis":
        _set_attribute(split, "axis", None)  # axis 0: the batch
    elif edit == "axis -2":
        _set_attribute(split, "axis", -2)
    elif edit == "unequal sizes":
        split.input[1] = _add_constant(model, "sizes", np.array([4, 4, 2, 2], np.int64))
    elif edit == "sizes not constant":
        split.input[1] = "sizes"
        model.graph.input.append(onnx.helper.make_tensor_value_info("sizes", 7, [4]))
    elif edit == "unequal split attribute":
        _set_attribute(split, "split", [4, 4, 2, 2])
    else:
        (o_gate,) = [n for n in _nodes(model, "Sigmoid") if n.input[0] == split.output[3]]
        o_gate.input[0] = split.input[0]
    _assert_refused(model, "LSTM", _GATES_REASONS[edit])


def _assert_rerolled(model: onnx.ModelProto, cfg: UnrolledCellConfig) -> None:
    result = rnn_rewrite_rules.rewrite(model, ["reroll"])
    onnx.checker.check_model(result, full_check=True)
    assert op_counts(result)[cfg.op_type] == 1
    for seed, batch in enumerate(_batches(cfg)):
        feeds = cell_inputs(cfg, batch, rng=seed)
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(result, feeds)) <= 1e-5


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize(
    "form", ["Split axis -1", "Split without sizes", "Gather without axis", "Add(b, MatMul)"]
)
def test_other_spellings_of_the_same_step_are_rerolled(op_type: str, form: str) -> None:
    cfg = UnrolledCellConfig(op_type=op_type, opset=13, gemm=form != "Add(b, MatMul)")
    model = build_unrolled_cell(cfg)
    for node in model.graph.node:
        if form == "Split axis -1" and node.op_type == "Split":
            _set_attribute(node, "axis", -1)
        elif form == "Split without sizes" and node.op_type == "Split":
            del node.input[1:]  # an even split in as many parts as outputs
        elif form == "Gather without axis" and node.op_type == "Gather":
            _set_attribute(node, "axis", None)  # the default, 0
        elif form == "Add(b, MatMul)" and node.op_type == "Add" and "bias" in node.input[1]:
            node.input[0], node.input[1] = node.input[1], node.input[0]
    _assert_rerolled(model, cfg)


_READ_REASON = "no gate reads one step of X (Gather(X, t) or Slice)"


@pytest.mark.parametrize("edit", ["axis 2", "index -1", "index [t]", "index not constant"])
def test_a_step_that_does_not_read_one_row_of_x_is_refused(edit: str) -> None:
    model = build_unrolled_cell(UnrolledCellConfig())
    gather = _nodes(model, "Gather")[-1]
    if edit == "axis 2":  # x[:, :, t]: a feature, not a step (axis 1 is a batch-first step)
        _set_attribute(gather, "axis", 2)
    elif edit == "index -1":
        gather.input[1] = _add_constant(model, "index", np.array(-1, np.int64))
    elif edit == "index [t]":
        gather.input[1] = _add_constant(model, "index", np.array([2], np.int64))
    else:
        gather.input[1] = "index"
        model.graph.input.append(onnx.helper.make_tensor_value_info("index", 7, []))
    _assert_refused(model, "LSTM", _READ_REASON)


def test_a_hidden_projection_that_is_not_a_linear_layer_is_refused() -> None:
    model = build_unrolled_cell(UnrolledCellConfig())
    _hidden_gemm(model).op_type = "Sub"
    _assert_refused(model, "LSTM", "{name} is computed by Sub, not a MatMul, Gemm, Add or bias")


class _LastStep:
    """The nodes of the last step of a :func:`build_unrolled_cell` loop, by role."""

    def __init__(self, model: onnx.ModelProto, op_type: str) -> None:
        self.model = model
        nodes = list(model.graph.node)
        self.producer = {o: n for n in nodes for o in n.output}
        self.root = self.producer[next(n for n in nodes if n.name == "output_h_n").input[0]]
        lstm = op_type == "LSTM"
        self.sigmoids = [n for n in nodes if n.op_type == "Sigmoid"][-(3 if lstm else 2) :]
        self.splits = [n for n in nodes if n.op_type == "Split"][-(1 if lstm else 2) :]
        self.gemms = [n for n in nodes if n.op_type == "Gemm"][-2:]  # x, h projections

    def of(self, value: str) -> onnx.NodeProto:
        return self.producer[value]


def _gru_edit(step: _LastStep, edit: str) -> None:
    root = step.root
    mul, n = step.of(root.input[0]), root.input[1]
    sub = step.of(mul.input[0])
    n_tanh = step.of(n)
    n_add = step.of(n_tanh.input[0])
    r_mul = step.of(n_add.input[1])
    r_sig, z_sig = step.sigmoids
    x_split, h_split = step.splits
    if edit == "n not Tanh":
        n_tanh.op_type = "Sigmoid"
    elif edit == "Sub(n, h)":
        sub.input[0], sub.input[1] = sub.input[1], sub.input[0]
    elif edit == "n's Add a Sub":
        n_add.op_type = "Sub"
    elif edit == "r not Sigmoid":
        r_sig.op_type = "Tanh"
    elif edit == "hn part 1":
        r_mul.input[0] = h_split.output[1]
    elif edit == "hn not from a Split":
        r_mul.input[0] = step.gemms[1].output[0]
    elif edit == "xn not from a Split":
        n_add.input[0] = step.gemms[0].output[0]
    elif edit == "z reads xr":
        z_add = step.of(z_sig.input[0])
        z_add.input[1] = x_split.output[0]
    elif edit == "x projection reads X on axis 2":
        gather = step.of(step.gemms[0].input[0])
        gather.attribute[0].i = 2
    elif edit == "update reads h_{t-2}":
        sub.input[0] = step.of(step.gemms[1].input[0]).input[0]  # h_{t-1}'s Sub's h_{t-2}
    else:
        assert edit == "x projection read outside"
        step.model.graph.output.append(
            onnx.helper.make_empty_tensor_value_info(step.gemms[0].output[0])
        )


def _lstm_edit(step: _LastStep, edit: str) -> None:
    o_sig, c_tanh = (step.of(v) for v in step.root.input)
    c_add = step.of(c_tanh.input[0])
    fc, ig = (step.of(v) for v in c_add.input)
    if edit == "c_t a Sub":
        c_add.op_type = "Sub"
    elif edit == "a term of c_t a Div":
        fc.op_type = "Div"
    elif edit == "g Sigmoid":
        step.of(ig.input[1]).op_type = "Sigmoid"
    elif edit == "c_t = i * g + i * g":
        c_add.input[0] = ig.output[0]
    elif edit == "f not Sigmoid":
        step.of(fc.input[0]).op_type = "Tanh"
    elif edit in ("f is part 0", "g is part 3", "o is part 2"):
        gate = {"f": step.of(fc.input[0]), "g": step.of(ig.input[1]), "o": o_sig}[edit[0]]
        gate.input[0] = step.splits[0].output[int(edit[-1])]
    elif edit == "the Split reads a Sub":
        step.of(step.splits[0].input[0]).op_type = "Sub"
    elif edit == "neither projection a linear layer":
        for gemm in step.gemms:
            gemm.op_type = "Sub"
    else:
        raise AssertionError(edit)


_NOT_GRU_UPDATE = "h_t is not z * h_(t-1) + (1 - z) * n nor (h_(t-1) - n) * z + n (GRU)"
_NOT_LSTM_STATE = "c_t is not an Add of f * c_(t-1) and i * g (LSTM)"
_NOT_LINEAR = "{name} is computed by Sub, not a MatMul, Gemm, Add or bias"
#: An edit of the last step's gates that still makes a cell (a gate reading another gate's
#: block) gives a cell of other weights than the steps before.
_STEP_REASONS = {
    ("GRU", "n not Tanh"): "step 3 uses other activations",
    ("GRU", "Sub(n, h)"): _NOT_GRU_UPDATE,
    ("GRU", "n's Add a Sub"): (
        "n is neither tanh(x_n + r * (h @ R_n + b)) nor tanh(x_n + (r * h) @ R_n + b) (GRU)"
    ),
    ("GRU", "r not Sigmoid"): "the reset gate's activation is not the update gate's (GRU)",
    ("GRU", "hn part 1"): "step 3 uses other weights",
    ("GRU", "hn not from a Split"): "gate h's weights are not [I, H] and [H, H] with H = 3",
    ("GRU", "xn not from a Split"): "gate h's weights are not [I, H] and [H, H] with H = 3",
    ("GRU", "z reads xr"): "step 3 uses other weights",
    ("GRU", "x projection reads X on axis 2"): _READ_REASON,
    ("GRU", "update reads h_{t-2}"): _NOT_GRU_UPDATE,
    ("GRU", "x projection read outside"): "a value of step 3 ({name}) is a graph output",
    ("LSTM", "c_t a Sub"): _NOT_LSTM_STATE,
    ("LSTM", "a term of c_t a Div"): _NOT_LSTM_STATE,
    ("LSTM", "g Sigmoid"): "step 3 uses other activations",
    ("LSTM", "c_t = i * g + i * g"): _NOT_LSTM_STATE,
    ("LSTM", "f not Sigmoid"): "c_t is not f(f) * c_(t-1) + f(i) * g(g) with o's f (LSTM)",
    ("LSTM", "f is part 0"): "step 3 uses other weights",
    ("LSTM", "g is part 3"): "step 3 uses other weights",
    ("LSTM", "o is part 2"): "step 3 uses other weights",
    ("LSTM", "the Split reads a Sub"): _NOT_LINEAR,
    ("LSTM", "neither projection a linear layer"): _NOT_LINEAR,
}


@pytest.mark.parametrize(("op_type", "edit"), sorted(_STEP_REASONS))
def test_a_last_step_that_is_not_the_cell_is_refused_with_the_reason(op_type, edit) -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type=op_type, seq=4))
    assert _fires(model, op_type)
    step = _LastStep(model, op_type)
    (_gru_edit if op_type == "GRU" else _lstm_edit)(step, edit)
    _assert_refused(model, op_type, _STEP_REASONS[op_type, edit])


@pytest.mark.parametrize(("op_type", "other"), [("LSTM", "GRU"), ("GRU", "LSTM")])
def test_a_loop_of_the_other_cell_is_left_to_its_rule(op_type: str, other: str) -> None:
    model = ir.serde.deserialize_model(build_unrolled_cell(UnrolledCellConfig(op_type=other)))
    RewriteRuleSet(_rules(op_type)).apply_to_model(model)
    counts = op_counts(ir.serde.serialize_model(model))
    assert counts[op_type] == counts[other] == 0


def test_a_gru_whose_h_0_is_two_equal_constants_is_rerolled() -> None:
    """The first step's hidden projection and update read equal zeros, not one value."""
    cfg = UnrolledCellConfig(op_type="GRU", batch=2)
    model = build_unrolled_cell(cfg)
    zeros = np.zeros((2, cfg.hidden_size), np.float32)
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm" and "weight_hh" in n.input[1])
    sub = next(n for n in model.graph.node if n.op_type == "Sub")
    gemm.input[0] = _add_constant(model, "h0_a", zeros)
    sub.input[0] = _add_constant(model, "h0_b", zeros)
    _assert_rerolled(model, cfg)


def _edit_loop(model: onnx.ModelProto, edit: str) -> None:
    """One near-miss edit of an LSTM loop of 4 steps (input size 4, hidden size 3)."""
    nodes = list(model.graph.node)
    producer = {o: n for n in nodes for o in n.output}
    hidden_gemms = [n for n in nodes if n.op_type == "Gemm" and n.input[1] == "cell.weight_hh"]
    rng = np.random.default_rng(4)
    if edit == "step 3 reads c_1":
        c_adds = [producer[n.input[0]] for n in nodes if n.op_type == "Tanh"][1::2]  # c_t
        fc = next(producer[v] for v in c_adds[-1].input if producer[v].op_type == "Mul")
        previous = next(v for v in fc.input if producer[v] in c_adds)
        fc.input[list(fc.input).index(previous)] = c_adds[-3].output[0]
    elif edit == "last step without b_hh":
        del hidden_gemms[-1].input[2:]
    elif edit == "last step with another b_hh":
        (bias,) = [t for t in model.graph.initializer if t.name == "cell.bias_hh"]
        other = onnx.numpy_helper.to_array(bias) + 1
        hidden_gemms[-1].input[2] = _add_constant(model, "other_bias", other)
    elif edit == "h_1 read by a node after the stack":
        h_1 = [n.output[0] for n in nodes if n.output[0].startswith("h_")][1]  # step 1's
        model.graph.node.append(onnx.helper.make_node("Identity", [h_1], ["peek"]))
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info("peek"))
    elif edit == "folded of rank 3 [batch, 4H, 1]":
        (folded,) = [t for t in model.graph.initializer if t.name == "linear"]
        array = onnx.numpy_helper.to_array(folded)[:, :, np.newaxis]
        folded.CopyFrom(onnx.numpy_helper.from_array(array, folded.name))
    elif edit == "h_0 an input of unknown width":  # [batch, 3] is broadcast: re-rolled
        hidden_gemms[0].input[0] = "h0"
        model.graph.input.append(onnx.helper.make_tensor_value_info("h0", 1, ["batch", "w"]))
    elif edit == "W_hh [12, 4]":
        _replace_initializer(model, "cell.weight_hh", rng.standard_normal((12, 4), np.float32))
    elif edit == "W_ih [16, 4]":
        _replace_initializer(model, "cell.weight_ih", rng.standard_normal((16, 4), np.float32))
        _replace_initializer(model, "cell.bias_ih", rng.standard_normal(16, np.float32))
    elif edit == "W_ih float64":
        (tensor,) = [t for t in model.graph.initializer if t.name == "cell.weight_ih"]
        array = onnx.numpy_helper.to_array(tensor).astype(np.float64)
        tensor.CopyFrom(onnx.numpy_helper.from_array(array, tensor.name))
    elif edit == "X of unknown rank":
        model.graph.input[0].type.tensor_type.ClearField("shape")
    elif edit == "a gate projection read by another node":
        x_gemm = [n for n in nodes if n.op_type == "Gemm" and n.input[1] == "cell.weight_ih"][1]
        model.graph.node.append(onnx.helper.make_node("Identity", [x_gemm.output[0]], ["peek"]))
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info("peek"))
    elif edit == "folded [1, batch, 4H]":
        (folded,) = [t for t in model.graph.initializer if t.name == "linear"]
        array = onnx.numpy_helper.to_array(folded)[np.newaxis]
        folded.CopyFrom(onnx.numpy_helper.from_array(array, folded.name))
    else:
        assert edit == "folded not b_hh"
        (folded,) = [t for t in model.graph.initializer if t.name == "linear"]
        array = onnx.numpy_helper.to_array(folded).copy()
        array[1, 5] += 1
        folded.CopyFrom(onnx.numpy_helper.from_array(array, folded.name))


_OUTSIDE = "a value of step 1 ({name}) has a reader outside the loop"
_LOOP_REASONS = {
    "step 3 reads c_1": "step 3 does not read c_3 of the step before",
    "last step without b_hh": "step 3 uses another bias",
    "last step with another b_hh": "step 3 uses another bias",
    "h_1 read by a node after the stack": _OUTSIDE,
    "folded of rank 3 [batch, 4H, 1]": (
        "the folded first step has shape [2, 12, 1], not [batch, 12]"
    ),
    "h_0 an input of unknown width": "cannot prove h_0 is [batch of X, H] or [batch, H]",
    "W_hh [12, 4]": "gate i's weights are not [I, H] and [H, H] with H = 3",
    "W_ih [16, 4]": "the terms of a sum have widths [12, 16]",
    "W_ih float64": "the weights are not all of one floating-point type",
    "X of unknown rank": "X is not provably of rank 3",
    "a gate projection read by another node": _OUTSIDE,
    "folded [1, batch, 4H]": "the folded first step has shape [1, 2, 12], not [batch, 12]",
    "folded not b_hh": "the folded first step is not b_hh (a non-zero initial state)",
}


@pytest.mark.parametrize("edit", sorted(_LOOP_REASONS))
def test_near_miss_loops_are_refused_with_the_reason(edit: str) -> None:
    folded = edit.startswith("folded")
    cfg = UnrolledCellConfig(seq=4, initial_state="folded" if folded else "zeros", batch=2)
    model = build_unrolled_cell(cfg)
    assert _fires(model, "LSTM")
    _edit_loop(model, edit)
    _assert_refused(model, "LSTM", _LOOP_REASONS[edit])


def test_a_non_zero_c_0_beside_a_folded_zero_h_0_is_kept() -> None:
    """The folded first step proves ``h_0 = 0``; ``c_0`` is a constant of X's batch that is
    not zero: the node takes it, after an empty ``initial_h``."""
    cfg = UnrolledCellConfig(initial_state="folded", batch=2)
    model = build_unrolled_cell(cfg)
    _replace_initializer(model, "zeros", np.full((2, cfg.hidden_size), 0.5, np.float32))
    _assert_rerolled(model, cfg)
    (node,) = [n for n in running_nodes(rnn_rewrite_rules.rewrite(model)) if n.op_type == "LSTM"]
    assert node.input[5] == "" and node.input[6]  # no initial_h, an initial_c


def test_a_gru_folded_first_step_with_a_runtime_zero_h_0_is_rerolled() -> None:
    """``h_0`` of the update is zeros built from ``Shape(x)`` (not a constant) while the
    first hidden projection is folded: proven zeros of X's batch all the same."""
    cfg = UnrolledCellConfig(op_type="GRU", initial_state="folded", batch=2)
    model = build_unrolled_cell(cfg)
    nodes = [
        onnx.helper.make_node("Shape", ["x"], ["x_shape"], start=1, end=2),
        onnx.helper.make_node("Concat", ["x_shape", "hidden"], ["zeros_shape"], axis=0),
        onnx.helper.make_node("ConstantOfShape", ["zeros_shape"], ["runtime_zeros"]),
    ]
    _add_constant(model, "hidden", np.array([cfg.hidden_size], np.int64))
    for node in reversed(nodes):
        model.graph.node.insert(0, node)
    (sub,) = [n for n in model.graph.node if n.op_type == "Sub" and n.input[0] == "zeros"]
    sub.input[0] = "runtime_zeros"
    _assert_rerolled(model, cfg)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize("kept", ["cell.bias_ih", "cell.bias_hh"])
def test_a_loop_with_one_of_the_biases_is_rerolled(op_type: str, kept: str) -> None:
    """The node's B is zeros beside the one reordered bias."""
    cfg = UnrolledCellConfig(op_type=op_type)
    model = build_unrolled_cell(cfg)
    for node in model.graph.node:
        if node.op_type == "Gemm" and node.input[2:] and node.input[2] != kept:
            del node.input[2:]
    _assert_rerolled(model, cfg)


def test_the_rules_are_named_after_their_cell() -> None:
    """The name tells the two rules apart in refusal reasons, traces and rule listings."""
    assert reroll_cells.RerollCell("LSTM").name == "RerollCell[LSTM]"
    assert reroll_cells.RerollCell("GRU").name == "RerollCell[GRU]"


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_a_float64_cell_loop_is_not_rerolled_into_a_node_onnxruntime_cannot_run(
    op_type: str,
) -> None:
    """A ``.double()`` LSTMCell/GRUCell loop runs in ONNX Runtime step by step; ORT has no
    float64 LSTM/GRU kernel, so the loop stays, for either target."""
    from rnn_rewrite_rules.rules import TARGETS, reroll
    from tests.support import as_float64

    cfg = UnrolledCellConfig(op_type=op_type)
    model = as_float64(build_unrolled_cell(cfg))
    feeds = {k: v.astype(np.float64) for k, v in cell_inputs(cfg, 2).items()}
    expected = runtime.run(model, feeds)  # the original runs
    for target in TARGETS:
        result = rnn_rewrite_rules.rewrite(model, ["reroll"], target=target)
        assert op_counts(result)[op_type] == 0, target
        assert runtime.max_abs_diff(expected, runtime.run(result, feeds)) == 0
    reasons = set(refusal_reasons(reroll.FAMILY.rules, model))
    kept = "re-roll kept unrolled: "  # a recurrence kept (reported), not a near miss
    assert f"{kept}onnxruntime has no float64 {op_type} kernel (target 'portable')" in reasons


def test_a_reader_of_c_t_inside_a_subgraph_before_h_t_is_refused() -> None:
    """``c_T`` read inside the branches of an ``If`` that sits between the last steps: the
    If is the reader in the graph, so it must come after ``h_T`` too (redirected, it would
    read a value the node defines after it: not topologically sorted)."""
    from onnx import TensorProto, helper

    model = build_unrolled_cell(UnrolledCellConfig(seq=3))
    nodes = list(model.graph.node)
    (reader,) = [n for n in nodes if list(n.output) == ["c_n"]]
    (producer,) = [n for n in nodes if reader.input[0] in n.output]
    c_t = reader.input[0]
    branches = {
        name: helper.make_graph(
            [helper.make_node(op, [c_t], [f"{name}_c"])],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_c", TensorProto.FLOAT, ["b", "h"])],
        )
        for name, op in (("then_branch", "Identity"), ("else_branch", "Neg"))
    }
    check = helper.make_node("If", ["flag"], ["c_checked"], **branches)
    nodes.insert(nodes.index(producer) + 1, check)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    model.graph.output.append(
        helper.make_tensor_value_info("c_checked", TensorProto.FLOAT, ["b", "h"])
    )
    onnx.checker.check_model(model)
    result = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(result, full_check=True)
    assert op_counts(result)["LSTM"] == 0
    found = refusal_reasons(_rules("LSTM"), model)
    assert "a reader of c_T comes before h_T" in found, found


@pytest.mark.parametrize(
    ("opset", "initial_state", "batch"),
    [(7, "folded", 2), (7, "first_frame", None), (9, "zeros", None), (9, "folded", 2)],
)
def test_x_is_sliced_in_the_form_of_the_opset(opset: int, initial_state: str, batch) -> None:
    """A symbolic sequence axis: X is sliced to the loop's steps, with the bounds as
    attributes before opset 10 (the checker rejects the input form there)."""
    cfg = UnrolledCellConfig(opset=opset, initial_state=initial_state, batch=batch)
    model = build_unrolled_cell(cfg)
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    dim.ClearField("dim_value")
    dim.dim_param = "seq"
    result = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(result, full_check=True)
    assert op_counts(result)["LSTM"] == 1
    (slice_node,) = [n for n in running_nodes(result) if n.op_type == "Slice"]
    assert len(slice_node.input) == 1
    for seq in (cfg.seq, cfg.seq + 2):  # the original reads the first steps of a longer x
        for seed, size in enumerate(_batches(cfg)):
            feeds = cell_inputs(cfg, size, seq=seq, rng=seed)
            diff = runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(result, feeds))
            assert diff <= 1e-5, (seq, size, diff)


@pytest.mark.parametrize(
    "cfg",
    [
        UnrolledCellConfig(shared_read=True),
        UnrolledCellConfig(op_type="GRU", reverse=True, shared_read=True),
        UnrolledCellConfig(read="slice", opset=13, shared_read=True),
    ],
    ids=str,
)
def test_step_reads_of_x_read_outside_the_loop_stay_for_their_readers(
    cfg: UnrolledCellConfig,
) -> None:
    """``x[t]`` is X's alone: another reader (a second loop, here a Sum) keeps it, and the
    loop still becomes one node; a projection read outside is refused (``extra_reader``)."""
    model = build_unrolled_cell(cfg)
    result = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(result, full_check=True)
    counts = op_counts(result)
    assert counts[cfg.op_type] == 1 and counts["Sigmoid"] == counts["Split"] == 0, counts
    assert counts["Sum"] == 1 and result.graph.output[-1].name == "x_read"
    for seed, batch in enumerate(_batches(cfg)):
        feeds = cell_inputs(cfg, batch, rng=seed)
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(result, feeds)) <= 1e-5


#: (batch of X, batch of the states): equal, or one of them 1 (the steps broadcast it).
_BROADCAST_BATCHES = ((3, 3), (1, 3), (3, 1), (2, 2), (1, 1))


@pytest.mark.parametrize(
    "cfg",
    [
        UnrolledCellConfig(initial_state="inputs"),
        UnrolledCellConfig(op_type="GRU", initial_state="inputs", reverse=True),
        UnrolledCellConfig(initial_state="inputs", read="slice", gemm=False, opset=13),
    ],
    ids=str,
)
def test_states_of_their_own_batch_are_broadcast_like_the_steps_do(
    cfg: UnrolledCellConfig,
) -> None:
    """``h_0``/``c_0`` of a batch not proven X's (an encoder's final state seeding a
    decoder): X and the states are expanded to the batch they broadcast to. Equal wherever
    the original runs; where it fails (two batches, neither 1), the rewrite fails too."""
    model = build_unrolled_cell(cfg)
    result = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(result, full_check=True)
    counts = op_counts(result)
    assert counts[cfg.op_type] == 1 and counts["Split"] == 0 and counts["Expand"] >= 2, counts
    for seed, (batch, state_batch) in enumerate(_BROADCAST_BATCHES):
        feeds = cell_inputs(cfg, batch, rng=seed, state_batch=state_batch)
        expected = runtime.run(model, feeds)
        assert expected[0].shape[1] == max(batch, state_batch)
        assert runtime.max_abs_diff(expected, runtime.run(result, feeds)) <= 1e-5
    feeds = cell_inputs(cfg, 2, state_batch=3)
    for failing in (model, result):
        with pytest.raises(Exception, match=r"(?i)broadcast|dimension|shape"):
            runtime.run(failing, feeds)


@pytest.mark.parametrize(
    ("dims", "reason"),
    [
        ([1, "state_batch", 3], "cannot prove h_0 is [batch of X, H] or [batch, H]"),
        (["state_batch", "width"], "cannot prove h_0 is [batch of X, H] or [batch, H]"),
    ],
    ids=["rank_3", "width_unknown"],
)
def test_states_not_proven_of_rank_2_and_width_h_are_refused(dims: list, reason: str) -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type="GRU", initial_state="inputs"))
    (h0,) = [v for v in model.graph.input if v.name == "h0"]
    h0.CopyFrom(onnx.helper.make_tensor_value_info("h0", onnx.TensorProto.FLOAT, dims))
    _assert_refused(model, "GRU", reason)


def _batch_first_edit(model: onnx.ModelProto, edit: str) -> None:
    gathers = [n for n in model.graph.node if n.op_type == "Gather" and n.input[0] == "x"]
    if edit == "one step reads axis 0":
        next(a for a in gathers[-1].attribute if a.name == "axis").i = 0
    elif edit == "steps read axis 2":
        for gather in gathers:
            next(a for a in gather.attribute if a.name == "axis").i = 2
    else:
        assert edit == "stacked on axis 2"
        for node in model.graph.node:
            if node.op_type == "Unsqueeze":
                axes = next(t for t in model.graph.initializer if t.name == node.input[1])
                axes.CopyFrom(onnx.numpy_helper.from_array(np.array([2], np.int64), axes.name))
            if node.op_type == "Concat" and node.output[0].startswith("stack"):
                next(a for a in node.attribute if a.name == "axis").i = 2


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ("one step reads axis 0", "the steps read X on different axes"),
        ("steps read axis 2", _READ_REASON),
        ("stacked on axis 2", "a value of step 0 ({name}) has a reader outside the loop"),
    ],
)
def test_batch_first_near_misses_are_refused(edit: str, reason: str) -> None:
    cfg = UnrolledCellConfig(batch_first=True, input_size=3, hidden_size=3, seq=3, batch=3)
    model = build_unrolled_cell(cfg)
    assert _fires(model, "LSTM")
    _batch_first_edit(model, edit)
    _assert_refused(model, "LSTM", reason)

"""Reverse LSTM/GRU/RNN nodes the rules emit are run forward over the reversed sequence
on targets with tract (``passes.ForwardReverseNodesPass``): tract 0.23.9 runs
``direction="reverse"`` as ``"forward"`` (``rules._kernels.WRONG_DIRECTIONS``)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules._api import apply_rounds
from rnn_rewrite_rules._rnn_ops import is_rule_made
from rnn_rewrite_rules.testing.exporters import ExporterSpec, build_exporter_model
from rnn_rewrite_rules.testing.loops import LoopSpec, build_loop_model, loop_inputs
from rnn_rewrite_rules.testing.unrolled import UnrolledCellConfig, build_unrolled_cell, cell_inputs
from tests.support import direction, recurrent_nodes, running_nodes

_GO_BACKWARDS = [
    LoopSpec(direction="reverse", outputs=("y", "h", "c")),
    LoopSpec(cell="GRU", direction="reverse", outputs=("y", "h")),
]
_REVERSED_CHAINS = [
    UnrolledCellConfig(op_type="GRU", reverse=True),
    UnrolledCellConfig(reverse=True, gemm=False, read="slice", bias=False, seq=5),
]


def _rewrite(model: onnx.ModelProto, target: str | None = None) -> onnx.ModelProto:
    """Whatever the cost tables say of rerolling these small chains (tested in
    tests/test_reroll_costs.py): the pass is what is tested here."""
    return rnn_rewrite_rules.rewrite(model, target=target, context=costs.Context(ignore=True))


def _directions(model: onnx.ModelProto) -> list[bytes]:
    return [direction(n) for n in recurrent_nodes(model)]


def _assert_same(before: onnx.ModelProto, after: onnx.ModelProto, feeds: dict) -> None:
    expected, actual = runtime.run(before, feeds), runtime.run(after, feeds)
    assert [a.shape for a in actual] == [e.shape for e in expected]
    assert runtime.max_abs_diff(expected, actual) <= 1e-5


@pytest.mark.parametrize("spec", _GO_BACKWARDS, ids=lambda s: s.cell)
def test_go_backwards_loop_is_a_forward_node_on_reversed_x(spec: LoopSpec) -> None:
    model = build_loop_model(spec)
    after = _rewrite(model)
    assert _directions(after) == [b"forward"]
    assert [o.name for o in after.graph.output] == [o.name for o in model.graph.output]
    onnx.checker.check_model(after, full_check=True)
    # the Loop reads the first `steps` of X (a shorter X fails in the original)
    for seed, (batch, seq) in enumerate([(1, spec.steps), (3, spec.steps), (2, spec.steps + 3)]):
        _assert_same(model, after, loop_inputs(spec, batch, seq, seed=seed))


@pytest.mark.parametrize("cfg", _REVERSED_CHAINS, ids=lambda c: c.op_type)
def test_reversed_unrolled_chain_is_a_forward_node_on_reversed_x(cfg: UnrolledCellConfig) -> None:
    model = build_unrolled_cell(cfg)
    after = _rewrite(model)
    assert _directions(after) == [b"forward"]
    assert [o.name for o in after.graph.output] == [o.name for o in model.graph.output]
    for seed, batch in enumerate([1, 3, 7]):
        _assert_same(model, after, cell_inputs(cfg, batch, rng=seed))


def test_the_mark_survives_a_rule_re_emitting_the_node() -> None:
    """loop_scan builds the reverse node (marked ``RULE_MADE``); initial_state re-emits it
    with a shared zero state (``keep_identity`` carries the mark): cleanup converts it."""
    model = ir.serde.deserialize_model(build_loop_model(_GO_BACKWARDS[1]))
    counts: collections.Counter[str] = collections.Counter()
    rule_set = rnn_rewrite_rules.rules()
    apply_rounds(model, rule_set, counts=counts, context=costs.Context(ignore=True))
    assert counts["LoopToRnn"] == 1 and counts["ShareZeroInitialState[GRU]"] == 1, counts
    (node,) = [n for n in model.graph.all_nodes() if n.op_type == "GRU"]
    assert node.attributes.get_string("direction") == "forward"
    assert is_rule_made(node)


def test_rewriting_twice_equals_once() -> None:
    model = build_loop_model(_GO_BACKWARDS[1])
    once = _rewrite(model)
    assert _rewrite(once).SerializeToString() == once.SerializeToString()


@pytest.mark.parametrize(
    "model",
    [build_loop_model(_GO_BACKWARDS[0]), build_unrolled_cell(_REVERSED_CHAINS[0])],
    ids=["loop", "unrolled"],
)
def test_target_onnxruntime_keeps_the_reverse_node(model: onnx.ModelProto) -> None:
    after = _rewrite(model, "onnxruntime")
    assert _directions(after) == [b"reverse"]
    portable = _rewrite(model)
    slices = [sum(n.op_type == "Slice" for n in m.graph.node) for m in (after, portable)]
    assert slices[1] == slices[0] + 2  # X and Y reversed


def test_a_forward_and_backward_pair_is_still_one_bidirectional_node() -> None:
    spec = LoopSpec(cell="GRU", bidirectional=True, static_seq=True)
    model = build_loop_model(spec)
    after = _rewrite(model)
    assert _directions(after) == [b"bidirectional"]
    assert not any(n.op_type == "Slice" and "reverse" in n.name for n in after.graph.node)
    for seed, batch in enumerate([1, 3]):
        _assert_same(model, after, loop_inputs(spec, batch, seed=seed))


def _reverse_gru_model() -> onnx.ModelProto:
    """A model's own reverse GRU node (no rule emitted it)."""
    rng = np.random.default_rng(0)
    weights = [
        onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        for name, shape in (("W", (1, 12, 5)), ("R", (1, 12, 4)))
    ]
    node = oh.make_node(
        "GRU", ["x", "W", "R"], ["y", "y_h"], name="own", direction="reverse", hidden_size=4
    )
    graph = oh.make_graph(
        [node],
        "own_reverse",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["T", "B", 5])],
        [
            oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None),
            oh.make_tensor_value_info("y_h", onnx.TensorProto.FLOAT, None),
        ],
        weights,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _reordered(name: str, hidden: int) -> tuple[list[onnx.NodeProto], str]:
    """``Concat(Slice(w, [H:2H]), Slice(w, [0:H]), Slice(w, [2H:3H]), axis=1)``: gate
    reordering as torchlib writes it, which ``weight_folding`` folds."""
    bounds = [(hidden, 2 * hidden), (0, hidden), (2 * hidden, 3 * hidden)]
    nodes, parts = [], []
    for index, (start, end) in enumerate(bounds):
        consts = [f"{name}_{index}_{k}" for k in ("starts", "ends", "axes")]
        for const, value in zip(consts, (start, end, 1), strict=True):
            tensor = onnx.numpy_helper.from_array(np.array([value], np.int64), const)
            nodes.append(oh.make_node("Constant", [], [const], value=tensor))
        parts.append(f"{name}_{index}")
        nodes.append(oh.make_node("Slice", [name, *consts], [parts[-1]]))
    nodes.append(oh.make_node("Concat", parts, [f"{name}_reordered"], axis=1))
    return nodes, f"{name}_reordered"


def _unnamed_reverse_gru_with_reordered_weights() -> onnx.ModelProto:
    """A model's own unnamed reverse GRU whose ``W`` and ``R`` are computed (both folded,
    so the rewrite re-emits it with neither value it read)."""
    rng = np.random.default_rng(1)
    weights = {"W": (1, 12, 5), "R": (1, 12, 4)}
    initializers = [
        onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        for name, shape in weights.items()
    ]
    (w_nodes, w), (r_nodes, r) = (_reordered(name, 4) for name in weights)
    node = oh.make_node("GRU", ["x", w, r], ["y", "y_h"], direction="reverse", hidden_size=4)
    graph = oh.make_graph(
        [*w_nodes, *r_nodes, node],
        "own_reverse_folded",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["T", "B", 5])],
        [
            oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None),
            oh.make_tensor_value_info("y_h", onnx.TensorProto.FLOAT, None),
        ],
        initializers,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=10)


def test_a_models_own_unnamed_reverse_node_re_emitted_by_weight_folding_stays_reverse() -> None:
    """``weight_folding`` re-emits the node with new ``W`` and ``R``: no name nor weight
    ties it to the original, but it carries no rule-made mark, so it stays reverse."""
    model = _unnamed_reverse_gru_with_reordered_weights()
    after = _rewrite(model)
    (node,) = [n for n in running_nodes(after) if n.op_type == "GRU"]
    assert direction(node) == b"reverse"
    assert len(after.graph.node) == 1, "weight_folding re-emitted the node"
    assert set(node.input[1:3]).isdisjoint({"W", "R", "W_reordered", "R_reordered"})
    # no size 0: ONNX Runtime aborts on a GRU there, and onnx.reference fails on the original
    for seed, (seq, batch) in enumerate([(1, 1), (4, 3), (7, 2)]):
        feeds = {"x": np.random.default_rng(seed).standard_normal((seq, batch, 5), np.float32)}
        _assert_same(model, after, feeds)


def test_a_models_own_reverse_node_is_left() -> None:
    model = _reverse_gru_model()
    after = _rewrite(model)
    assert _directions(after) == [b"reverse"]
    assert after.SerializeToString() == model.SerializeToString()


def test_tract_runs_the_rewrites_as_onnx_runtime_runs_the_originals() -> None:
    """Fails if the reverse nodes are left: tract runs them forward (or fails)."""
    pytest.importorskip("tract", reason="tract (the test extra) is not installed")
    from tests.support import in_tract

    loop_spec, chain = _GO_BACKWARDS[1], _REVERSED_CHAINS[0]
    cases = [
        (build_loop_model(loop_spec), [loop_inputs(loop_spec, b, s) for b, s in [(2, 6), (3, 9)]]),
        (build_unrolled_cell(chain), [cell_inputs(chain, b, rng=b) for b in (1, 3)]),
    ]
    for model, feeds in cases:
        after = _rewrite(model)
        (probe,) = in_tract([after], feeds)
        assert not probe.error, probe.error
        for feed, outputs in zip(feeds, probe.outputs, strict=True):
            assert outputs is not None
            assert runtime.max_abs_diff(runtime.run(model, feed), outputs) <= 1e-5


def test_a_reverse_node_in_a_guard_branch_is_made_forward() -> None:
    """The length-guarded form puts the node in an ``If`` branch: its reversals are
    ``Constant`` nodes there."""
    spec = LoopSpec(form="torch", trip_count="length", direction="reverse")
    model = build_loop_model(spec)
    after = _rewrite(model)
    onnx.checker.check_model(after, full_check=True)
    branches = [a.g for n in after.graph.node for a in n.attribute if a.g.node]
    recurrent = [n for g in branches for n in g.node if n.op_type == "LSTM"]
    assert [direction(n) for n in recurrent] == [b"forward"]
    for seed, (batch, seq) in enumerate([(1, spec.steps), (3, spec.steps + 2)]):
        _assert_same(model, after, loop_inputs(spec, batch, seq, seed=seed))


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_a_models_own_reverse_nodes_re_emitted_stay_reverse(op_type: str) -> None:
    """initial_state re-emits the model's unnamed reverse nodes without their zero states:
    they read the same ``W`` and stay reverse (the original runs them so in tract too)."""
    spec = ExporterSpec(
        initial_state="keras", op_type=op_type, style="plain", num_layers=2, direction="reverse"
    )
    model = build_exporter_model(spec)
    after = _rewrite(model)
    assert _directions(after) == [b"reverse", b"reverse"]
    assert not any("reverse" in n.name for n in after.graph.node if n.op_type == "Slice")
    assert sum(n.op_type == "Constant" for n in after.graph.node) < sum(
        n.op_type == "Constant" for n in model.graph.node
    ) or len(after.graph.node) < len(model.graph.node)  # a rule did re-emit them

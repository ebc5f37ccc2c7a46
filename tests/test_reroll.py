"""reroll: unrolled ``nn.RNN`` chains (torch dynamo form) become one ONNX ``RNN`` per direction."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import reroll
from rnn_rewrite_rules.testing.unrolled import (
    MUTATIONS,
    UnrolledRnnConfig,
    build_unrolled_rnn,
    rnn_inputs,
)
from tests.reasons import refusal_reasons
from tests.support import as_function, op_counts, without_output

POSITIVE = [
    UnrolledRnnConfig(),
    UnrolledRnnConfig(nonlinearity="relu", bias=False, seq=1),
    UnrolledRnnConfig(num_layers=2, bidirectional=True, batch_first=True, initial_state="input"),
    UnrolledRnnConfig(num_layers=3, nonlinearity="relu", initial_state="input", seq=4),
    UnrolledRnnConfig(bidirectional=True, dynamic_seq=True, seq=4),
    UnrolledRnnConfig(num_layers=2, initial_state="folded", batch=2, batch_first=True),
    UnrolledRnnConfig(bidirectional=True, initial_state="folded", batch=1, bias=False),
    UnrolledRnnConfig(num_layers=4, bidirectional=True, seq=2, opset=15),
    UnrolledRnnConfig(seq=1, initial_state="folded", batch=2),  # R is never applied
    UnrolledRnnConfig(transpose_node=True, bidirectional=True, num_layers=2),
    UnrolledRnnConfig(seq=1, initial_state="folded", batch=3, bias=False, nonlinearity="relu"),
]


def _sizes(cfg: UnrolledRnnConfig) -> list[tuple[int, int]]:
    """(batch, seq) the original accepts: a dynamic seq axis accepts any seq >= the chain."""
    batches = [cfg.batch] if cfg.batch is not None else [0, 1, 3, 7]
    seqs = [cfg.seq, cfg.seq + 3] if cfg.dynamic_seq else [cfg.seq]
    return list(itertools.product(batches, seqs))


def _assert_same(before: onnx.ModelProto, after: onnx.ModelProto, cfg, *, optimize=True):
    for seed, (batch, seq) in enumerate(_sizes(cfg)):
        feeds = rnn_inputs(cfg, batch, seq, rng=seed)
        expected = runtime.run(before, feeds, optimize=optimize)
        actual = runtime.run(after, feeds, optimize=optimize)
        diff = runtime.max_abs_diff(expected, actual)
        assert diff <= 1e-5, f"batch={batch} seq={seq}: {diff}"


@pytest.mark.parametrize("cfg", POSITIVE, ids=str)
def test_rerolls_every_layer_and_direction(cfg: UnrolledRnnConfig) -> None:
    model = build_unrolled_rnn(cfg)
    result = rnn_rewrite_rules.rewrite(model, ["reroll"])
    onnx.checker.check_model(result, full_check=True)
    counts = op_counts(result)
    assert counts["RNN"] == cfg.num_layers * cfg.num_directions
    assert counts[cfg.activation] == 0 and counts["MatMul"] == 0
    assert counts["Constant"] == 0  # the main graph's new constants are initializers
    _assert_same(model, result, cfg)
    _assert_same(model, result, cfg, optimize=False)


@pytest.mark.parametrize("cfg", POSITIVE[:3], ids=str)
def test_all_families_shrink_the_graph_and_agree(cfg: UnrolledRnnConfig) -> None:
    model = build_unrolled_rnn(cfg)
    result = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(result, full_check=True)
    assert len(result.graph.node) < len(model.graph.node)
    assert op_counts(result)[cfg.activation] == 0
    _assert_same(model, result, cfg)


def test_zero_state_is_kept_for_initial_state_and_weights_are_stored_once() -> None:
    """reroll keeps the zero h0: initial_state makes it an explicit shared zero state (the
    default, portable target) or drops it (``target="onnxruntime"``; tract 0.23.9 panics on
    an RNN without initial_h when the batch is symbolic)."""
    cfg = UnrolledRnnConfig(num_layers=2)
    model = build_unrolled_rnn(cfg)

    def rnn_nodes(result):
        return [n for n in result.graph.node if n.op_type == "RNN"]

    for names, target, has_h0 in (
        (["reroll"], "onnxruntime", True),
        (None, "portable", True),
        (None, "onnxruntime", False),
    ):
        nodes = rnn_nodes(rnn_rewrite_rules.rewrite(model, names, target=target))
        assert len(nodes) == 2
        assert all((len(n.input) > 5 and n.input[5] != "") == has_h0 for n in nodes)
    nodes = rnn_nodes(rnn_rewrite_rules.rewrite(model))
    names = [i for n in nodes for i in n.input[1:4]]
    assert len(set(names)) == len(names)
    assert {"hidden_size", "activations", "direction"} <= {a.name for a in nodes[0].attribute}


def test_gate_free_weights_are_transposed_into_onnx_layout() -> None:
    cfg = UnrolledRnnConfig(input_size=3, hidden_size=2, seq=2)
    model = build_unrolled_rnn(cfg)
    result = rnn_rewrite_rules.rewrite(model, ["reroll"])
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in result.graph.initializer}
    (node,) = [n for n in result.graph.node if n.op_type == "RNN"]
    assert inits[node.input[1]].shape == (1, 2, 3)
    assert inits[node.input[2]].shape == (1, 2, 2)
    assert inits[node.input[3]].shape == (1, 4)


def test_rewriting_twice_equals_once_and_keeps_names() -> None:
    cfg = UnrolledRnnConfig(num_layers=2, bidirectional=True, batch_first=True)
    model = build_unrolled_rnn(cfg)
    once = rnn_rewrite_rules.rewrite(model)
    twice = rnn_rewrite_rules.rewrite(once)
    assert once.SerializeToString() == twice.SerializeToString()
    kept = {n.name for n in model.graph.node} & {n.name for n in once.graph.node}
    assert {"output_y", "output_h_n"} <= kept
    assert [o.name for o in once.graph.output] == [o.name for o in model.graph.output]


def test_h0_input_with_another_batch_broadcasts_like_the_original() -> None:
    """ONNX does not enforce equal dim_params: an h0 of batch 1 broadcasts in the original.

    (ORT with optimizations assumes equal dim_params and fails on the original: the
    reference evaluator runs what the ONNX semantics say.)
    """
    cfg = UnrolledRnnConfig(initial_state="input", bidirectional=True)
    model = build_unrolled_rnn(cfg)
    result = rnn_rewrite_rules.rewrite(model, ["reroll"])
    rng = np.random.default_rng(0)
    for x_batch, h_batch in ((3, 1), (1, 4), (2, 2)):
        feeds = {
            "x": rng.standard_normal((cfg.seq, x_batch, cfg.input_size)).astype(np.float32),
            "h0": rng.standard_normal((2, h_batch, cfg.hidden_size)).astype(np.float32),
        }
        expected = ReferenceEvaluator(model).run(None, feeds)
        diff = runtime.max_abs_diff(expected, ReferenceEvaluator(result).run(None, feeds))
        assert diff <= 1e-5
        assert expected[0].shape[1] == max(x_batch, h_batch)


def test_longer_sequence_reads_the_first_or_last_steps_like_the_original() -> None:
    cfg = UnrolledRnnConfig(bidirectional=True, dynamic_seq=True, seq=3)
    model = build_unrolled_rnn(cfg)
    result = rnn_rewrite_rules.rewrite(model, ["reroll"])
    feeds = rnn_inputs(cfg, batch=2, seq=6)
    expected = runtime.run(model, feeds)
    assert expected[0].shape[0] == 3  # the chain, not the input, fixes the length
    assert runtime.max_abs_diff(expected, runtime.run(result, feeds)) <= 1e-5


def _last_activation(model: onnx.ModelProto) -> ir.Node:
    graph = ir.serde.deserialize_model(model).graph
    chain = [n for n in graph if n.op_type in ("Tanh", "Relu")]
    return chain[-1]


REASONS = {
    "weights_at_step": "step 1 uses other recurrent weights",
    "broken_chain": "reads index",
    "step_read_twice": "step 3 reads index 2 of the sequence, not 3",
    "extra_reader": "h_1 (step 0) has a reader outside the chain",
    "wrong_activation": "reads index 2 of the sequence, not 0",
    "nonconstant_weights": "the recurrent weight R^T is not a constant",
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_near_misses_are_refused_with_the_reason(mutation: str) -> None:
    cfg = UnrolledRnnConfig(seq=4, mutation=mutation)
    model = build_unrolled_rnn(cfg)
    plan = reroll.plan_chain(_last_activation(model))
    assert isinstance(plan, str)
    assert REASONS[mutation] in plan
    result = rnn_rewrite_rules.rewrite(model, ["reroll"])
    assert op_counts(result)["RNN"] == 0


def test_a_middle_step_is_not_the_end_of_the_chain() -> None:
    model = build_unrolled_rnn(UnrolledRnnConfig(seq=3))
    graph = ir.serde.deserialize_model(model).graph
    middle = [n for n in graph if n.op_type == "Tanh"][1]
    rule = reroll.RerollRnn("Tanh")
    assert isinstance(reroll.plan_chain(middle), str)  # h_2 feeds the Concat and step 3
    assert rule.name == "RerollRnn[Tanh]"


def test_input_projection_without_constant_weights_is_refused() -> None:
    cfg = UnrolledRnnConfig(seq=2)
    model = build_unrolled_rnn(cfg)
    projection = next(n for n in model.graph.node if n.op_type == "MatMul")
    weight = next(t for t in model.graph.initializer if t.name == projection.input[1])
    model.graph.input.append(
        onnx.helper.make_tensor_value_info(weight.name, weight.data_type, list(weight.dims))
    )
    assert reroll.plan_chain(_last_activation(model)) == "the input weight W^T is not a constant"


def test_a_nonzero_folded_first_step_is_refused() -> None:
    cfg = UnrolledRnnConfig(initial_state="folded", batch=2)
    model = build_unrolled_rnn(cfg)
    folded = next(t for t in model.graph.initializer if list(t.dims) == [1, 2, cfg.hidden_size])
    array = onnx.numpy_helper.to_array(folded).copy()
    array[0, 1, 0] += 1.0
    folded.CopyFrom(onnx.numpy_helper.from_array(array, folded.name))
    reason = reroll.plan_chain(_last_activation(model))
    assert reason == "the folded first step is not b_hh (a non-zero initial state)"


def test_folded_batch_that_the_input_does_not_fix_is_refused() -> None:
    cfg = UnrolledRnnConfig(initial_state="folded", batch=2)
    model = build_unrolled_rnn(cfg)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[1].ClearField("dim_value")
    dims[1].dim_param = "batch"
    reason = reroll.plan_chain(_last_activation(model))
    assert reason == "the folded first step fixes a batch X does not provably have"


def test_family_is_installed_by_default() -> None:
    from rnn_rewrite_rules.rules import families

    family = families()["reroll"]
    assert family.install_by_default
    names = list(families())
    assert names.index("reroll") < names.index("initial_state")


BIDIRECTIONAL = [
    UnrolledRnnConfig(bidirectional=True),
    UnrolledRnnConfig(num_layers=2, bidirectional=True),
    UnrolledRnnConfig(bidirectional=True, initial_state="input"),
    UnrolledRnnConfig(bidirectional=True, initial_state="input", nonlinearity="relu"),
    UnrolledRnnConfig(num_layers=2, bidirectional=True, initial_state="input", batch_first=True),
    UnrolledRnnConfig(num_layers=3, bidirectional=True, bias=False, seq=2),
]


def _reference(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]


@pytest.mark.parametrize("cfg", BIDIRECTIONAL, ids=str)
def test_bidirectional_layers_end_as_one_node_each(cfg: UnrolledRnnConfig) -> None:
    """reroll's forward and reverse node per layer read one x and h_n concatenates their
    Y_h: the bidirectional family merges them (OpenVINO 2026.4 miscomputes the pair)."""
    model = build_unrolled_rnn(cfg)
    result = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(result, full_check=True)
    nodes = [n for n in result.graph.node if n.op_type == "RNN"]
    assert len(nodes) == cfg.num_layers
    for node in nodes:
        assert {a.name: a.s for a in node.attribute}["direction"] == b"bidirectional"
    assert op_counts(result)["Split"] == 0
    _assert_same(model, result, cfg)  # batch 0 included
    if cfg.nonlinearity == "relu":
        return  # onnx.reference's RNN knows Tanh only ("Unknown activation function 'Relu'")
    feeds = rnn_inputs(cfg, 0, rng=5)
    assert runtime.max_abs_diff(_reference(model, feeds), _reference(result, feeds)) <= 1e-5
    if cfg.initial_state == "input":  # h0 of batch 1 broadcasts against x (ONNX semantics)
        feeds = rnn_inputs(cfg, 3, rng=6)
        feeds["h0"] = feeds["h0"][:, :1]
        assert runtime.max_abs_diff(_reference(model, feeds), _reference(result, feeds)) <= 1e-5


@pytest.mark.parametrize("initial_state", ["zeros", "input"])
def test_openvino_runs_the_merged_bidirectional_rnn_like_the_original(initial_state) -> None:
    ov = pytest.importorskip("openvino")
    cfg = UnrolledRnnConfig(num_layers=2, bidirectional=True, initial_state=initial_state)
    model = build_unrolled_rnn(cfg)
    result = rnn_rewrite_rules.rewrite(model)
    core = ov.Core()

    def run_openvino(m: onnx.ModelProto, feeds) -> list[np.ndarray]:
        compiled = core.compile_model(
            core.read_model(m.SerializeToString(), b""), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
        )
        outputs = compiled.create_infer_request().infer(feeds)
        return [np.asarray(outputs[o]) for o in compiled.outputs]

    for batch in (1, 3, 7):
        feeds = rnn_inputs(cfg, batch, rng=batch)
        expected = runtime.run(model, feeds)
        assert runtime.max_abs_diff(expected, run_openvino(model, feeds)) <= 1e-5
        assert runtime.max_abs_diff(expected, run_openvino(result, feeds)) <= 1e-5, batch


@pytest.mark.parametrize("seq", [2, 3])
def test_a_step_whose_h_feeds_the_next_is_not_the_end(seq: int) -> None:
    """Without ``y``, a middle step's chain is complete, but its ``h`` feeds a later step:
    refused there; the last step rerolls the whole chain."""
    cfg = UnrolledRnnConfig(seq=seq)
    model = without_output("y", build_unrolled_rnn(cfg))
    found = refusal_reasons(reroll.FAMILY.rules, model)
    assert "h_T feeds another step: not the last step" in found, found
    result = rnn_rewrite_rules.rewrite(model, ["reroll"])
    assert op_counts(result)["RNN"] == 1 and op_counts(result)["Tanh"] == 0
    _assert_same(model, result, cfg)


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_near_misses_are_refused_by_the_rule(mutation: str) -> None:
    """The plan's reason is the rule's refusal, attached to the step it concerns."""
    model = build_unrolled_rnn(UnrolledRnnConfig(seq=4, mutation=mutation))
    found = refusal_reasons(reroll.FAMILY.rules, model)
    assert any(REASONS[mutation] in reason for reason in found), found


def test_a_function_importing_another_opset_is_left_alone() -> None:
    model = build_unrolled_rnn(UnrolledRnnConfig(seq=2))
    version = model.opset_import[0].version
    found = refusal_reasons(reroll.FAMILY.rules, as_function(model, version - 1, ranked=True))
    reason = (
        f"function 'layer' imports opset {version - 1} of 'ai.onnx' but the model "
        f"{version}: an emitted op would be invalid in one of them"
    )
    assert reason in found, found

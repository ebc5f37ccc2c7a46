"""reroll: unrolled ``nn.RNN`` chains (torch dynamo form) become one ONNX ``RNN`` per direction."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import onnx
import onnx_ir as ir
import onnxscript.rewriter
import pytest
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules.rules import reroll
from rnn_rewrite_rules.testing.unrolled import (
    MUTATIONS,
    UnrolledRnnConfig,
    build_unrolled_rnn,
    rnn_inputs,
)
from tests.reasons import refusal_reasons
from tests.support import as_function, op_counts, without_output

#: nn.RNN re-rolls into RNN on target onnxruntime only (rten has no RNN op: see
#: test_reroll_costs.py for what portable does)
_rewrite = functools.partial(rnn_rewrite_rules.rewrite, target="onnxruntime")


@pytest.fixture(autouse=True)
def _cost_model_ignored(monkeypatch):
    """These tests prove the rewrite's structure at any size: the measured cost table's
    decisions are tested in tests/test_reroll_costs.py. Every rewrite here runs with a
    context that ignores the cost model (the one rules read when none is attached)."""
    monkeypatch.setattr(costs, "of", lambda model: costs.Context(ignore=True))


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
    UnrolledRnnConfig(opset=12, bidirectional=True),  # Squeeze's axes as an attribute
    UnrolledRnnConfig(opset=11, initial_state="input", dynamic_seq=True),
    UnrolledRnnConfig(opset=13, bidirectional=True, dynamic_seq=True),  # axes inputs from 13
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
    result = _rewrite(model, ["reroll"])
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
    result = _rewrite(model)
    onnx.checker.check_model(result, full_check=True)
    assert len(result.graph.node) < len(model.graph.node)
    assert op_counts(result)[cfg.activation] == 0
    _assert_same(model, result, cfg)


def test_zero_state_is_kept_for_initial_state_and_weights_are_stored_once() -> None:
    """reroll keeps the zero h0 and initial_state drops it (target ``onnxruntime``; portable
    does not re-roll nn.RNN: rten has no RNN op)."""
    cfg = UnrolledRnnConfig(num_layers=2)
    model = build_unrolled_rnn(cfg)

    def rnn_nodes(result):
        return [n for n in result.graph.node if n.op_type == "RNN"]

    for names, target, has_h0 in (
        (["reroll"], "onnxruntime", True),
        (None, "onnxruntime", False),
    ):
        nodes = rnn_nodes(_rewrite(model, names, target=target))
        assert len(nodes) == 2
        assert all((len(n.input) > 5 and n.input[5] != "") == has_h0 for n in nodes)
    nodes = rnn_nodes(_rewrite(model))
    names = [i for n in nodes for i in n.input[1:4]]
    assert len(set(names)) == len(names)
    assert {"hidden_size", "activations", "direction"} <= {a.name for a in nodes[0].attribute}


def test_gate_free_weights_are_transposed_into_onnx_layout() -> None:
    cfg = UnrolledRnnConfig(input_size=3, hidden_size=2, seq=2)
    model = build_unrolled_rnn(cfg)
    result = _rewrite(model, ["reroll"])
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in result.graph.initializer}
    (node,) = [n for n in result.graph.node if n.op_type == "RNN"]
    assert inits[node.input[1]].shape == (1, 2, 3)
    assert inits[node.input[2]].shape == (1, 2, 2)
    assert inits[node.input[3]].shape == (1, 4)


def test_rewriting_twice_equals_once_and_keeps_names() -> None:
    cfg = UnrolledRnnConfig(num_layers=2, bidirectional=True, batch_first=True)
    model = build_unrolled_rnn(cfg)
    once = _rewrite(model)
    twice = _rewrite(once)
    assert once.SerializeToString() == twice.SerializeToString()
    kept = {n.name for n in model.graph.node} & {n.name for n in once.graph.node}
    assert {"output_y", "output_h_n"} <= kept
    assert [o.name for o in once.graph.output] == [o.name for o in model.graph.output]


@pytest.mark.parametrize("h0_batch", ["batch", "h_batch"])
def test_h0_input_with_another_batch_broadcasts_like_the_original(h0_batch: str) -> None:
    """ONNX does not enforce equal dim_params: an h0 of batch 1 broadcasts in the original.

    With h0's batch named as X's, ORT assumes them equal and fails on the original: the
    reference evaluator runs what the ONNX semantics say (and broadcasts a batch-1 h0 in
    its RNN). Named apart, ORT runs both, and its RNN needs h0 of X's batch.
    """
    cfg = UnrolledRnnConfig(initial_state="input", bidirectional=True)
    model = build_unrolled_rnn(cfg)
    if h0_batch != "batch":
        for info in (model.graph.input[1], *model.graph.output):
            info.type.tensor_type.shape.dim[1].dim_param = h0_batch if info.name == "h0" else "b"
    result = _rewrite(model, ["reroll"])
    assert op_counts(result)["RNN"] == 2
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
        if h0_batch != "batch":
            for optimize in (True, False):
                actual = runtime.run(result, feeds, optimize=optimize)
                assert runtime.max_abs_diff(expected, actual) <= 1e-5


def test_longer_sequence_reads_the_first_or_last_steps_like_the_original() -> None:
    cfg = UnrolledRnnConfig(bidirectional=True, dynamic_seq=True, seq=3)
    model = build_unrolled_rnn(cfg)
    result = _rewrite(model, ["reroll"])
    feeds = rnn_inputs(cfg, batch=2, seq=6)
    expected = runtime.run(model, feeds)
    assert expected[0].shape[0] == 3  # the chain, not the input, fixes the length
    assert runtime.max_abs_diff(expected, runtime.run(result, feeds)) <= 1e-5


def _refusals(model: onnx.ModelProto) -> list[str]:
    """The reasons the re-roll rules give on ``model`` (cost model ignored)."""
    return refusal_reasons(reroll.FAMILY.rules, model, costs.Context(ignore=True))


REASONS = {
    "weights_at_step": "step 1 uses other recurrent weights than step 0",
    "broken_chain": "step 2 reads index 3 of the sequence, not 2",
    "step_read_twice": "step 3 reads index 2 of the sequence, not 3",
    "extra_reader": "h_1 (step 0) has a reader outside the chain",
    "wrong_activation": "step 0 reads index 2 of the sequence, not 0",  # the chain ends at 2
    "nonconstant_weights": "the recurrent weight R^T is not a constant",
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_near_misses_are_refused_with_the_reason(mutation: str) -> None:
    cfg = UnrolledRnnConfig(seq=4, mutation=mutation)
    model = build_unrolled_rnn(cfg)
    assert REASONS[mutation] in _refusals(model)
    result = _rewrite(model, ["reroll"])
    assert op_counts(result)["RNN"] == 0


def test_a_middle_step_is_not_the_end_of_the_chain() -> None:
    model = build_unrolled_rnn(UnrolledRnnConfig(seq=3))
    rule = reroll.RerollRnn("Tanh")
    # h_2 feeds the Concat and step 3
    assert "h_T feeds another step: not the last step" in _refusals(model)
    assert rule.name == "RerollRnn[Tanh]"


def test_input_projection_without_constant_weights_is_refused() -> None:
    cfg = UnrolledRnnConfig(seq=2)
    model = build_unrolled_rnn(cfg)
    projection = next(n for n in model.graph.node if n.op_type == "MatMul")
    weight = next(t for t in model.graph.initializer if t.name == projection.input[1])
    model.graph.input.append(
        onnx.helper.make_tensor_value_info(weight.name, weight.data_type, list(weight.dims))
    )
    assert "the input weight W^T is not a constant" in _refusals(model)


def test_a_nonzero_folded_first_step_is_refused() -> None:
    cfg = UnrolledRnnConfig(initial_state="folded", batch=2)
    model = build_unrolled_rnn(cfg)
    folded = next(t for t in model.graph.initializer if list(t.dims) == [1, 2, cfg.hidden_size])
    array = onnx.numpy_helper.to_array(folded).copy()
    array[0, 1, 0] += 1.0
    folded.CopyFrom(onnx.numpy_helper.from_array(array, folded.name))
    assert "the folded first step is not b_hh (a non-zero initial state)" in _refusals(model)


def test_folded_batch_that_the_input_does_not_fix_is_refused() -> None:
    cfg = UnrolledRnnConfig(initial_state="folded", batch=2)
    model = build_unrolled_rnn(cfg)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[1].ClearField("dim_value")
    dims[1].dim_param = "batch"
    assert "the folded first step fixes a batch X does not provably have" in _refusals(model)


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
    result = _rewrite(model)
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
    result = _rewrite(model)
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
    result = _rewrite(model, ["reroll"])
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


@pytest.mark.parametrize("name", ["node_h_9", ""])
def test_new_weights_are_initializers_named_after_the_last_step(name: str) -> None:
    cfg = UnrolledRnnConfig(seq=2)
    model = build_unrolled_rnn(cfg)
    (last,) = [n for n in model.graph.node if n.op_type == "Tanh"][-1:]
    last.name = name
    result = _rewrite(model, ["reroll"])
    (node,) = [n for n in result.graph.node if n.op_type == "RNN"]
    prefix = f"reroll_{name or 'rnn'}"
    assert list(node.input[1:4]) == [f"{prefix}_W", f"{prefix}_R", f"{prefix}_B"]
    assert {t.name for t in result.graph.initializer} >= set(node.input[1:4])


@pytest.mark.parametrize("in_function", [False, True])
def test_a_constant_h0_of_batch_1_is_expanded_to_the_batch(in_function: bool) -> None:
    """A constant ``h0 [1, 1, H]`` broadcasts in the original's Add; the RNN node needs it
    at X's batch (and in a function, the emitted constants are Constant nodes)."""
    cfg = UnrolledRnnConfig(initial_state="input", bidirectional=True, dynamic_seq=True)
    model = build_unrolled_rnn(cfg)
    (h0,) = [i for i in model.graph.input if i.name == "h0"]
    model.graph.input.remove(h0)
    array = np.random.default_rng(1).standard_normal((2, 1, cfg.hidden_size)).astype(np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(array, "h0"))
    if in_function:
        model = as_function(model, cfg.opset, ranked=True)
    result = _rewrite(model, ["reroll"])
    onnx.checker.check_model(result, full_check=True)
    nodes = [*result.graph.node, *(n for f in result.functions for n in f.node)]
    assert [n.op_type for n in nodes].count("RNN") == 2
    assert [n.op_type for n in nodes].count("Expand") == 4  # h0 to X's batch, X to h0's
    for seed, (batch, seq) in enumerate([(1, 3), (3, 3), (2, 5)]):
        feeds = {"x": rnn_inputs(cfg, batch, seq, rng=seed)["x"]}
        for optimize in (True, False):
            expected = runtime.run(model, feeds, optimize=optimize)
            actual = runtime.run(result, feeds, optimize=optimize)
            assert runtime.max_abs_diff(expected, actual) <= 1e-5, (batch, seq)


@pytest.mark.parametrize("h0", ["[2, 1, H]", "[1, 1, H+1]", "[1, H]", "input of unknown shape"])
def test_an_h0_not_provably_1_batch_h_is_refused(h0: str) -> None:
    cfg = UnrolledRnnConfig(initial_state="input", seq=2)
    model = build_unrolled_rnn(cfg)
    unsqueezed = {n.output[0] for n in model.graph.node if n.op_type == "Unsqueeze"}
    (first,) = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[0] in unsqueezed]
    first.input[0] = "h0_replaced"
    if h0 == "input of unknown shape":
        info = onnx.helper.make_tensor_value_info("h0_replaced", onnx.TensorProto.FLOAT, None)
        model.graph.input.append(info)
    else:
        h = cfg.hidden_size
        shape = {"[2, 1, H]": (2, 1, h), "[1, 1, H+1]": (1, 1, h + 1), "[1, H]": (1, h)}[h0]
        array = np.ones(shape, np.float32)
        model.graph.initializer.append(onnx.numpy_helper.from_array(array, "h0_replaced"))
    assert "cannot prove h_0 is [1, batch, H]" in _refusals(model)


def _node(model: onnx.ModelProto, prefix: str) -> onnx.NodeProto:
    """The first node whose output name starts with ``prefix``."""
    return next(n for n in model.graph.node if n.output[0].startswith(prefix))


def _constant(model: onnx.ModelProto, name: str, *values: int) -> str:
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(values, np.int64), name))
    return name


def _as_input(model: onnx.ModelProto, name: str, elem_type: int = 7) -> str:
    model.graph.input.append(onnx.helper.make_tensor_value_info(name, elem_type, None))
    return name


_NOT_A_REVERSAL = "the step source is a Slice that is not a reversal of axis 0"
_PART = "the step source reverses only part of the sequence"


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ("axis 1", _NOT_A_REVERSAL),
        ("step 1", _NOT_A_REVERSAL),
        ("starts not constant", _NOT_A_REVERSAL),
        ("start -2", _PART),
        ("end -2", _PART),
        ("end -100", _PART),  # the whole of a sequence of up to 99 steps only
    ],
)
def test_a_source_that_is_not_the_whole_sequence_reversed_is_refused(edit, reason) -> None:
    model = build_unrolled_rnn(UnrolledRnnConfig(bidirectional=True))
    flip = _node(model, "flip")
    index, value = {
        "axis 1": (3, 1),
        "step 1": (4, 1),
        "start -2": (1, -2),
        "end -2": (2, -2),
        "end -100": (2, -100),
    }.get(edit, (1, None))
    flip.input[index] = (
        _as_input(model, "starts") if value is None else _constant(model, "edited", value)
    )
    assert reason in _refusals(model)


@pytest.mark.parametrize("form", ["end INT32_MIN", "Add(b_ih, MatMul)", "Slice without axes"])
def test_other_spellings_of_the_same_chain_are_rerolled(form: str) -> None:
    cfg = UnrolledRnnConfig(bidirectional=True, dynamic_seq=True)
    model = build_unrolled_rnn(cfg)
    if form == "end INT32_MIN":  # TorchScript's end of a reversal
        for node in model.graph.node:
            if node.output[0].startswith("flip"):
                node.input[2] = _constant(model, "int32_min", -(2**31))
    elif form == "Add(b_ih, MatMul)":
        projections = {n.output[0] for n in model.graph.node if n.op_type == "MatMul"}
        for node in model.graph.node:
            if node.op_type == "Add" and node.input[0] in projections:
                node.input[0], node.input[1] = node.input[1], node.input[0]
    else:
        for node in model.graph.node:
            if node.op_type == "Slice" and not node.output[0].startswith("flip"):
                del node.input[3:]  # axes default to [0]
    result = _rewrite(model, ["reroll"])
    onnx.checker.check_model(result, full_check=True)
    assert op_counts(result)["RNN"] == 2
    _assert_same(model, result, cfg)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ("bias not constant", "the input projection's bias is not a constant"),
        ("not a MatMul", "the step source is not an input projection MatMul(X, W^T) [+ b_ih]"),
        ("no X", "the input projection has no X"),
    ],
)
def test_a_source_that_is_not_an_input_projection_is_refused(edit: str, reason: str) -> None:
    model = build_unrolled_rnn(UnrolledRnnConfig(bias=edit == "bias not constant"))
    projection = next(n for n in model.graph.node if n.op_type == "MatMul")
    if edit == "bias not constant":
        add = next(n for n in model.graph.node if projection.output[0] in n.input)
        add.input[1] = _as_input(model, "b_ih", onnx.TensorProto.FLOAT)
    elif edit == "not a MatMul":
        projection.op_type = "Gemm"
    else:
        projection.input[0] = ""
    assert reason in _refusals(model)


_NO_READ = "neither Add operand reads one step (Squeeze(Slice(P, [t], [t+1], [0]), [0]))"


@pytest.mark.parametrize("edit", ["axes [1]", "two axes", "starts not constant", "step 2"])
def test_a_last_step_that_does_not_read_one_row_is_refused(edit: str) -> None:
    model = build_unrolled_rnn(UnrolledRnnConfig(seq=3))
    last = [n for n in model.graph.node if n.op_type == "Slice"][-1]
    if edit == "axes [1]":
        last.input[3] = _constant(model, "axes", 1)
    elif edit == "two axes":
        last.input[1] = _constant(model, "starts", 2, 0)
        last.input[2] = _constant(model, "ends", 3, 5)
        last.input[3] = _constant(model, "axes", 0, 1)
    elif edit == "starts not constant":
        last.input[1] = _as_input(model, "starts")
    else:
        last.input.append(_constant(model, "steps", 2))
    assert _NO_READ in _refusals(model)


@pytest.mark.parametrize("head", ["MatMul -> Tanh", "a step with Sigmoid"])
def test_the_last_step_feeding_something_that_is_not_a_step_is_rerolled(head: str) -> None:
    """``h_T`` read by a head that looks like a step up to its activation is still ``h_T``."""
    cfg = UnrolledRnnConfig(seq=3)
    model = build_unrolled_rnn(cfg)
    h = cfg.hidden_size
    last = [n for n in model.graph.node if n.op_type == "Tanh"][-1]
    weight = np.random.default_rng(2).standard_normal((h, h)).astype(np.float32)
    nodes = [onnx.helper.make_node("MatMul", [last.output[0], "w_head"], ["head_mm"])]
    model.graph.initializer.append(onnx.numpy_helper.from_array(weight, "w_head"))
    if head == "MatMul -> Tanh":
        nodes.append(onnx.helper.make_node("Tanh", ["head_mm"], ["head"]))
    else:
        step_slice = [n for n in model.graph.node if n.op_type == "Slice"][-1]
        nodes += [
            onnx.helper.make_node("Slice", list(step_slice.input), ["head_row"]),
            onnx.helper.make_node("Squeeze", ["head_row", _constant(model, "zero", 0)], ["x_t"]),
            onnx.helper.make_node("Add", ["head_mm", "x_t"], ["head_pre"]),
            onnx.helper.make_node("Sigmoid", ["head_pre"], ["head"]),
        ]
    model.graph.node.extend(nodes)
    model.graph.output.append(onnx.helper.make_empty_tensor_value_info("head"))
    result = _rewrite(model, ["reroll"])
    assert op_counts(result)["RNN"] == 1
    _assert_same(model, result, cfg)


def test_a_stack_that_is_a_graph_output_keeps_its_name_type_and_shape() -> None:
    cfg = UnrolledRnnConfig(seq=3)
    model = build_unrolled_rnn(cfg)
    (identity,) = [n for n in model.graph.node if n.name == "output_y"]
    (concat,) = [n for n in model.graph.node if n.output[0] == identity.input[0]]
    concat.output[0] = "y"
    model.graph.node.remove(identity)
    result = _rewrite(model, ["reroll"])
    onnx.checker.check_model(result, full_check=True)
    assert op_counts(result)["RNN"] == 1
    assert result.graph.output[0] == model.graph.output[0]  # name, element type and shape
    assert op_counts(result)["Tanh"] == 0  # the output reads the RNN, not the unrolled chain
    _assert_same(model, result, cfg)


class _Chain:
    """Names in a one-layer forward chain of :func:`build_unrolled_rnn` (bias, seq 3)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        nodes = list(model.graph.node)
        matmuls = [n for n in nodes if n.op_type == "MatMul"]
        self.projection, self.steps = matmuls[0], matmuls[1:]
        self.w_t, self.r_t = self.projection.input[1], self.steps[0].input[1]
        self.bias_adds = [next(n for n in nodes if m.output[0] in n.input) for m in self.steps]
        self.b_ih = next(n for n in nodes if self.projection.output[0] in n.input).input[1]
        self.b_hh = self.bias_adds[0].input[1]
        self.slices = [n for n in nodes if n.op_type == "Slice" and n.input[0] != "h0"]
        self.acts = [n for n in nodes if n.op_type == "Tanh"]

    def replace(self, name: str, array: np.ndarray) -> None:
        (tensor,) = [t for t in self.model.graph.initializer if t.name == name]
        tensor.CopyFrom(onnx.numpy_helper.from_array(array, name))

    def add(self, name: str, array: np.ndarray) -> str:
        self.model.graph.initializer.append(onnx.numpy_helper.from_array(array, name))
        return name

    def array(self, name: str) -> np.ndarray:
        (tensor,) = [t for t in self.model.graph.initializer if t.name == name]
        return onnx.numpy_helper.to_array(tensor)


def _f32(*shape: int) -> np.ndarray:
    return np.random.default_rng(3).standard_normal(shape).astype(np.float32)


def _edit_chain(chain: _Chain, edit: str) -> None:
    """One near-miss edit of a chain of 3 steps, input size 4, hidden size 5."""
    last_slice, last_act = chain.slices[-1], chain.acts[-1]
    if edit == "R^T scalar":
        chain.replace(chain.r_t, np.float32(0.5))
    elif edit == "R^T [5, 6]":
        chain.replace(chain.r_t, _f32(5, 6))
    elif edit == "W^T [4, 6]":
        chain.replace(chain.w_t, _f32(4, 6))
    elif edit == "b_ih [6]":
        chain.replace(chain.b_ih, _f32(6))
    elif edit == "b_hh [6]":
        chain.replace(chain.b_hh, _f32(6))
    elif edit == "b_ih float64":
        chain.replace(chain.b_ih, chain.array(chain.b_ih).astype(np.float64))
    elif edit == "X of unknown rank":
        chain.model.graph.input[0].type.tensor_type.ClearField("shape")
    elif edit == "stack on axis 1":
        concat = next(n for n in chain.model.graph.node if n.output[0].startswith("cat"))
        concat.attribute[0].i = 1
    elif edit == "a step's pre-activation read outside":
        chain.model.graph.node.append(
            onnx.helper.make_node("Identity", [chain.acts[1].input[0]], ["peek"])
        )
        chain.model.graph.output.append(onnx.helper.make_empty_tensor_value_info("peek"))
    elif edit == "last step without b_hh":
        biased = chain.bias_adds[-1].output[0]
        step_add = next(n for n in chain.model.graph.node if biased in n.input)
        step_add.input[list(step_add.input).index(biased)] = chain.steps[-1].output[0]
        chain.model.graph.node.remove(chain.bias_adds[-1])
    elif edit == "last step with another b_hh":
        chain.bias_adds[-1].input[1] = chain.add("other_b_hh", chain.array(chain.b_hh) + 1)
    elif edit == "b_hh not constant":
        chain.bias_adds[-1].input[1] = _as_input(chain.model, "b_hh", onnx.TensorProto.FLOAT)
    elif edit == "recurrent term Mul(MatMul(h, R^T), b_hh)":
        chain.bias_adds[-1].op_type = "Mul"
    elif edit == "R^T Transpose with perm [0, 1]":
        transposed = chain.add("r", chain.array(chain.r_t).T.copy())
        chain.model.graph.node.insert(
            0, onnx.helper.make_node("Transpose", [transposed], ["r_t"], perm=[0, 1])
        )
        for step in chain.steps:
            step.input[1] = "r_t"
    elif edit == "R^T Transpose of an input":
        chain.model.graph.node.insert(0, onnx.helper.make_node("Transpose", ["r"], ["r_t"]))
        _as_input(chain.model, "r", onnx.TensorProto.FLOAT)
        for step in chain.steps:
            step.input[1] = "r_t"
    elif edit == "Squeeze of no Slice":
        last_slice.op_type = "Identity"
        del last_slice.input[1:]
    elif edit == "Slice [-1, 0)":
        last_slice.input[1] = _constant(chain.model, "starts", -1)
        last_slice.input[2] = _constant(chain.model, "ends", 0)
    elif edit == "Slice [t, t+2)":
        last_slice.input[2] = _constant(chain.model, "ends", 4)
    elif edit == "float starts":
        last_slice.input[1] = chain.add("starts", np.array([2.0], np.float32))
    elif edit == "2-D starts":
        last_slice.input[1] = chain.add("starts", np.array([[2]], np.int64))
    elif edit == "Squeeze without axes":
        squeeze = next(n for n in chain.model.graph.node if last_slice.output[0] in n.input)
        del squeeze.input[1:]  # every axis of size 1
    else:
        raise AssertionError(edit)
    del last_act


_REASONS_BY_EDIT = {
    "R^T scalar": "R^T has shape [], not [H, H]",
    "R^T [5, 6]": "R^T has shape [5, 6], not [H, H]",
    "W^T [4, 6]": "W^T has shape [4, 6], not [I, 5]",
    "b_ih [6]": "b_ih has shape [6], not [5]",
    "b_hh [6]": "b_hh has shape [6], not [5]",
    "b_ih float64": "weights have element types ['float32', 'float64']",
    "X of unknown rank": "X is not provably of rank 3",
    "stack on axis 1": "the Concat of the steps is not on axis 0",
    "a step's pre-activation read outside": "an intermediate value of step 1 has another reader",
    "last step without b_hh": "step 2 uses another recurrent bias",
    "last step with another b_hh": "step 2 uses another recurrent bias",
    "b_hh not constant": "the recurrent term is an Add but not MatMul(h, R^T) + constant bias",
    "recurrent term Mul(MatMul(h, R^T), b_hh)": "the recurrent term is not MatMul(h, R^T) [+ b_hh]",
    "R^T Transpose with perm [0, 1]": "the recurrent weight R^T is not a constant",
    "R^T Transpose of an input": "the recurrent weight R^T is not a constant",
    "Squeeze of no Slice": _NO_READ,
    "Slice [-1, 0)": _NO_READ,
    "Slice [t, t+2)": _NO_READ,
    "float starts": _NO_READ,
    "2-D starts": _NO_READ,
    "Squeeze without axes": _NO_READ,
}


@pytest.mark.parametrize("edit", sorted(_REASONS_BY_EDIT))
def test_near_miss_chains_are_refused_with_the_reason(edit: str) -> None:
    chain = _Chain(build_unrolled_rnn(UnrolledRnnConfig(seq=3)))
    assert op_counts(_rewrite(chain.model, ["reroll"]))["RNN"] == 1
    _edit_chain(chain, edit)
    assert _REASONS_BY_EDIT[edit] in _refusals(chain.model)


def _respell_chain(chain: _Chain, form: str) -> None:
    nodes = chain.model.graph.node
    if form == "R^T through Identity":
        nodes.insert(0, onnx.helper.make_node("Identity", [chain.r_t], ["r_t_shared"]))
        for step in chain.steps:
            step.input[1] = "r_t_shared"
    elif form == "R^T as Transpose without perm":
        weight = chain.add("weight_hh", chain.array(chain.r_t).T.copy())
        nodes.insert(0, onnx.helper.make_node("Transpose", [weight], ["r_t_node"]))
        for step in chain.steps:
            step.input[1] = "r_t_node"
    elif form == "a copy of R^T and b_hh per step":
        for t, (step, add) in enumerate(zip(chain.steps, chain.bias_adds, strict=True)):
            step.input[1] = chain.add(f"r_t_{t}", chain.array(chain.r_t))
            add.input[1] = chain.add(f"b_hh_{t}", chain.array(chain.b_hh))
    elif form == "Add(x_t, recurrent term)":
        for act in chain.acts:
            add = next(n for n in nodes if n.output[0] == act.input[0])
            add.input[0], add.input[1] = add.input[1], add.input[0]
    else:
        assert form == "stack on axis -3"
        next(n for n in nodes if n.output[0].startswith("cat")).attribute[0].i = -3


@pytest.mark.parametrize(
    "form",
    [
        "R^T through Identity",
        "R^T as Transpose without perm",
        "a copy of R^T and b_hh per step",
        "Add(x_t, recurrent term)",
        "stack on axis -3",
    ],
)
def test_other_spellings_of_the_same_steps_are_rerolled(form: str) -> None:
    cfg = UnrolledRnnConfig(seq=3)
    chain = _Chain(build_unrolled_rnn(cfg))
    _respell_chain(chain, form)
    onnx.checker.check_model(chain.model, full_check=True)
    result = _rewrite(chain.model, ["reroll"])
    assert op_counts(result)["RNN"] == 1 and op_counts(result)["Tanh"] == 0
    _assert_same(chain.model, result, cfg)


@pytest.mark.parametrize(
    ("cfg", "edit", "reason"),
    [
        (
            UnrolledRnnConfig(seq=1, initial_state="folded", batch=1),
            "folded [1, H]",
            "the folded first step has shape [1, 5]",
        ),
        (
            UnrolledRnnConfig(seq=3, initial_state="folded", batch=1),
            "folded [1, H]",
            "the folded first step has shape [1, 5], not [1, batch, H]",
        ),
        (
            UnrolledRnnConfig(seq=3, initial_state="folded", batch=1),
            "folded [2, 1, H]",
            "the folded first step has shape [2, 1, 5], not [1, batch, H]",
        ),
        (
            UnrolledRnnConfig(seq=3, initial_state="folded", batch=2, mutation="weights_at_step"),
            None,
            "step 2 uses other recurrent weights than step 1",
        ),
    ],
    ids=[
        "seq 1, folded of rank 2",
        "seq 3, folded of rank 2",
        "seq 3, folded of 2 rows",
        "folded first step, step 1's weights differ",
    ],
)
def test_near_miss_folded_chains_are_refused(cfg, edit: str | None, reason: str) -> None:
    model = build_unrolled_rnn(cfg)
    if edit is not None:
        (folded,) = [t for t in model.graph.initializer if list(t.dims) == [1, cfg.batch, 5]]
        array = onnx.numpy_helper.to_array(folded)
        array = array[0] if edit == "folded [1, H]" else np.concatenate([array, array])
        folded.CopyFrom(onnx.numpy_helper.from_array(array, folded.name))
    assert reason in _refusals(model)


def test_a_folded_step_of_batch_0_is_rerolled() -> None:
    """X of static batch 0: the folded first step ``[1, 0, H]`` holds no row of b_hh."""
    cfg = UnrolledRnnConfig(seq=1, initial_state="folded", batch=0)
    model = build_unrolled_rnn(cfg)
    result = _rewrite(model, ["reroll"])
    assert op_counts(result)["RNN"] == 1
    # b_hh is not read from an empty constant: the recurrent half of B is zero
    (rnn,) = [n for n in result.graph.node if n.op_type == "RNN"]
    bias = next(t for t in result.graph.initializer if t.name == rnn.input[3])
    assert not onnx.numpy_helper.to_array(bias)[0, cfg.hidden_size :].any()
    feeds = rnn_inputs(cfg, 0)
    expected = ReferenceEvaluator(model).run(None, feeds)
    actual = ReferenceEvaluator(result).run(None, feeds)
    assert [a.shape for a in actual] == [e.shape for e in expected]


def _ancestor_names(value: ir.Value | None) -> set[str]:
    """The names of ``value`` and of every value it is computed from."""
    names: set[str] = set()
    todo = [value]
    while todo:
        current = todo.pop()
        if current is None or current.name in names:
            continue
        names.add(current.name or "")
        producer = current.producer()
        todo.extend(producer.inputs if producer is not None else ())
    return names


def test_a_chain_seeded_by_another_chains_last_state_is_rerolled_and_then_the_other() -> None:
    """Layer 2's ``h_0`` is layer 1's ``h_T`` (an encoder seeding a decoder): layer 1 is
    not the end of a chain while layer 2's first step reads its ``h_T``; layer 2's walk
    back stops at layer 1 (another source). Layer 2 first, layer 1 in the next round."""
    cfg = UnrolledRnnConfig(num_layers=2, seq=3)
    model = build_unrolled_rnn(cfg)
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    layer_1_last = [n for n in model.graph.node if n.op_type == "Tanh"][2]
    layer_2_first = matmuls[5]  # projection 1, steps 1-3, projection 2, steps
    layer_2_first.input[0] = layer_1_last.output[0]
    # one pass of the rules: layer 2 re-rolls, seeded by layer 1's h_T; layer 1 stays
    once = ir.serde.deserialize_model(model)
    with costs.attached(once, costs.Context(ignore=True)):
        rules = reroll.FAMILY.rules_for("onnxruntime")
        onnxscript.rewriter.RewriteRuleSet(rules).apply_to_model(once)
    ir.passes.common.RemoveUnusedNodesPass()(once)  # the steps the RNN replaced
    once_counts = op_counts(once)
    assert once_counts["RNN"] == 1 and once_counts["Tanh"] == 3
    (rnn,) = [n for n in once.graph if n.op_type == "RNN"]
    assert layer_1_last.output[0] in _ancestor_names(rnn.inputs[5])
    result = _rewrite(model, ["reroll"])
    assert op_counts(result)["RNN"] == 2 and op_counts(result)["Tanh"] == 0
    _assert_same(model, result, cfg)


def test_a_first_step_reading_an_activation_that_is_no_step_is_rerolled() -> None:
    """``h_0 = Tanh(h0)``: the walk back stops at a Tanh that is not a step."""
    cfg = UnrolledRnnConfig(initial_state="input", seq=3)
    model = build_unrolled_rnn(cfg)
    unsqueezed = {n.output[0] for n in model.graph.node if n.op_type == "Unsqueeze"}
    (first,) = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[0] in unsqueezed]
    squash = onnx.helper.make_node("Tanh", [first.input[0]], ["h0_squashed"])
    model.graph.node.insert(list(model.graph.node).index(first), squash)
    first.input[0] = "h0_squashed"
    onnx.checker.check_model(model, full_check=True)
    result = _rewrite(model, ["reroll"])
    assert op_counts(result)["RNN"] == 1 and op_counts(result)["Tanh"] == 1
    _assert_same(model, result, cfg)


@pytest.mark.parametrize(
    ("existing", "expected"),
    [
        ({"W": "same"}, "reroll_node_h_9_W"),  # an equal initializer is reused
        ({"W": "other"}, "reroll_node_h_9_W_1"),
        ({"W": "other", "W_1": "other"}, "reroll_node_h_9_W_2"),
        ({"W": "other", "W_1": "same"}, "reroll_node_h_9_W_1"),
    ],
    ids=str,
)
def test_a_new_weight_never_replaces_an_initializer_of_the_same_name(existing, expected) -> None:
    cfg = UnrolledRnnConfig(seq=2)
    model = build_unrolled_rnn(cfg)
    [n for n in model.graph.node if n.op_type == "Tanh"][-1].name = "node_h_9"
    w = onnx.numpy_helper.to_array(
        next(t for t in model.graph.initializer if t.dims == [cfg.input_size, cfg.hidden_size])
    ).T[np.newaxis]
    for suffix, kind in existing.items():
        array = w if kind == "same" else w + 1
        name = f"reroll_node_h_9_{suffix}"
        model.graph.initializer.append(onnx.numpy_helper.from_array(array, name))
        # read by a graph output, so that the cleanup keeps it
        model.graph.node.append(onnx.helper.make_node("Identity", [name], [f"keep_{suffix}"]))
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(f"keep_{suffix}"))
    result = _rewrite(model, ["reroll"])
    (node,) = [n for n in result.graph.node if n.op_type == "RNN"]
    assert node.input[1] == expected
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in result.graph.initializer}
    np.testing.assert_array_equal(inits[expected], w)
    for suffix, kind in existing.items():  # the model's own are unchanged
        name = f"reroll_node_h_9_{suffix}"
        np.testing.assert_array_equal(inits[name], w if kind == "same" else w + 1)
    _assert_same(model, result, cfg)


def test_a_folded_batch_1_first_step_serves_every_batch() -> None:
    """Exported at batch 1 with X's batch left dynamic: the folded ``[1, 1, H]`` first step
    broadcasts, so the chain runs at any batch, and so must the node."""
    cfg = UnrolledRnnConfig(seq=3, initial_state="folded", batch=1)
    model = build_unrolled_rnn(cfg)
    for info in (*model.graph.input, *model.graph.output):
        info.type.tensor_type.shape.dim[1].dim_param = "batch"  # replaces the static 1
    result = _rewrite(model, ["reroll"])
    assert op_counts(result)["RNN"] == 1
    for seed, batch in enumerate((1, 3)):
        feeds = rnn_inputs(cfg, batch, rng=seed)
        assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(result, feeds)) <= 1e-5


def test_a_float64_chain_is_not_rerolled_into_a_node_onnxruntime_cannot_run() -> None:
    """An ``nn.RNN(...).double()`` export runs in ONNX Runtime step by step; ORT has no
    float64 RNN kernel, so the chain stays (for either target); float32 still rerolls."""
    from rnn_rewrite_rules.rules import TARGETS
    from rnn_rewrite_rules.rules._kernels import TARGET_RUNTIMES
    from tests.support import as_float64

    assert set(TARGET_RUNTIMES) == set(TARGETS)
    cfg = UnrolledRnnConfig()
    model = as_float64(build_unrolled_rnn(cfg))
    feeds = {k: v.astype(np.float64) for k, v in rnn_inputs(cfg, 2, cfg.seq).items()}
    expected = runtime.run(model, feeds)  # the original runs
    for target in TARGETS:
        result = rnn_rewrite_rules.rewrite(model, ["reroll"], target=target)
        assert op_counts(result)["RNN"] == 0, target
        assert runtime.max_abs_diff(expected, runtime.run(result, feeds)) == 0
    reasons = set(refusal_reasons(reroll.FAMILY.rules, model))
    prefix = "re-roll kept unrolled: "  # a recurrence kept (reported), not a near miss
    assert prefix + "onnxruntime has no float64 RNN kernel (target 'portable')" in reasons
    float32 = build_unrolled_rnn(cfg)  # portable: rten has no RNN op at all
    assert op_counts(_rewrite(float32, ["reroll"], target="portable"))["RNN"] == 0
    assert op_counts(_rewrite(float32, ["reroll"]))["RNN"] == 1

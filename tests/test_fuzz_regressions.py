"""Failures the fuzzer found (docs/fuzzing.md), each shrunk to a small model builder.

Each test names the defect class of issue 33 it shows and the oracle that fails; it is an
expected failure until the class is fixed (strict: a fix makes it pass, and then the
marker goes).
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules.testing import thirdparty, unrolled
from rnn_rewrite_rules.testing.exporters import ExporterSpec, build_exporter_model
from rnn_rewrite_rules.testing.fuzz import oracles, subgraphs, walk
from rnn_rewrite_rules.testing.fuzz.case import Case, Graph
from rnn_rewrite_rules.testing.fuzz.cores import slices_as_attributes
from rnn_rewrite_rules.testing.fuzz.oracles import check_case, plans
from rnn_rewrite_rules.testing.fuzz.surroundings import convert_element_type
from rnn_rewrite_rules.testing.loops import LoopSpec, build_loop_model, loop_inputs
from tests.reasons import refusal_reasons
from tests.support import recurrent_nodes

pytestmark = pytest.mark.fuzz

F32 = TensorProto.FLOAT


def _failures(model: onnx.ModelProto, fixed: dict[str, np.ndarray] | None = None) -> list[str]:
    return [str(f) for f in check_case(Case(model, fixed=fixed or {})).failures]


def _bidirectional(op_type: str = "LSTM", **kwargs) -> onnx.ModelProto:
    return thirdparty.hand_built_bidirectional(op_type, input_size=2, hidden=2, **kwargs)


# --- defect 1: float64 recurrences re-rolled into RNN ops ORT has no kernel for ----------


def test_float64_gru_cell_loop_runs_where_the_original_runs() -> None:
    model = unrolled.build_unrolled_cell(unrolled.UnrolledCellConfig(op_type="GRU", seq=2))
    convert_element_type(model, TensorProto.DOUBLE)
    assert _failures(model) == []


def test_float64_rnn_chain_runs_where_the_original_runs() -> None:
    model = unrolled.build_unrolled_rnn(unrolled.UnrolledRnnConfig(seq=2))
    convert_element_type(model, TensorProto.DOUBLE)
    assert _failures(model) == []


# --- defect 2: activation_alpha/beta of merged halves -----------------------------------


@pytest.mark.parametrize("reverse_node", [False, True], ids=["reversed_input", "reverse_node"])
def test_merged_halves_keep_each_activation_alpha(reverse_node: bool) -> None:
    model = _bidirectional("LSTM", reverse_node=reverse_node)
    for alphas, node in zip(
        ([0.3, 1.5, 2.0], [2.0, 1.5, 0.3]), recurrent_nodes(model), strict=True
    ):
        # one alpha per activation: ONNX Runtime gives LeakyRelu the first, the rest go unused
        node.attribute.append(
            helper.make_attribute("activations", ["Sigmoid", "LeakyRelu", "Tanh"])
        )
        node.attribute.append(helper.make_attribute("activation_alpha", alphas))
    assert _failures(model) == []


# --- defect 3: a missing bias filled from the other half ---------------------------------


def test_missing_bias_next_to_an_infinite_bias_input() -> None:
    model = _bidirectional("GRU", reverse_node=True)
    forward, backward = sorted(recurrent_nodes(model), key=lambda n: "reverse" in str(n.attribute))
    del forward.input[3:]
    bias = next(t for t in model.graph.initializer if t.name == backward.input[3])
    array = numpy_helper.to_array(bias).copy()
    array[0, 0] = np.inf
    model.graph.initializer.remove(bias)
    model.graph.input.append(helper.make_tensor_value_info(bias.name, F32, list(array.shape)))
    assert _failures(model, {bias.name: array}) == []


# --- defect 4: optional inputs present at run time read as absent -------------------------


@pytest.mark.parametrize(
    "condition",
    [
        lambda g: subgraphs.slice_axes_condition(g, [2, 3], 1),
        lambda g: subgraphs.squeeze_axes_condition(g, [2]),
        lambda g: subgraphs.split_sizes_condition(g, 4),
        lambda g: subgraphs.narrow_cast_condition(g, 1),
    ],
    ids=["slice_axes", "squeeze_axes", "split_sizes", "narrow_cast"],
)
def test_condition_on_an_optional_input_present_at_run_time(condition) -> None:
    model = _bidirectional()
    cond, fixed = condition(Graph(model))
    subgraphs.add_if(model, cond, "y", F32, 3)
    assert _failures(model, fixed) == []


# --- defect 5: a Loop body input's declared rank -----------------------------------------


def test_loop_body_input_rank_is_not_a_fact() -> None:
    model = _bidirectional()
    subgraphs.add_loop_rank_check(model, "y", F32, 3, declared=1)
    assert _failures(model) == []


# --- defect 6: one value for two If outputs ----------------------------------------------


def test_taken_branch_returning_one_value_twice() -> None:
    model = _bidirectional()
    subgraphs.add_rank_if_two_outputs(model, "x", 3, "y", F32, 3)
    assert _failures(model) == []


def test_onnxruntime_computing_the_original_wrongly_is_not_a_failure_of_the_rewrite() -> None:
    """ONNX Runtime 1.32 returns zeros for the first output of an If whose branch returns
    one value twice, from the second run of a session on: the folded result agrees with
    ``onnx.reference`` on the original, so the oracle reports a runtime fault."""
    model = thirdparty.one_dim_states(
        op_type="LSTM", steps=1, stacked=False, input_size=1, hidden=1
    )
    subgraphs.add_rank_if_two_outputs(model, "x", 2, "h_n", F32, 1)
    outcome = check_case(Case(model))
    assert outcome.failures == []
    assert outcome.fired
    assert not any(n.op_type == "If" for n in outcome.rewritten.graph.node)


# --- defect 8: an initializer that is a graph output -------------------------------------


def test_initializer_graph_output_keeps_its_type() -> None:
    model = build_exporter_model(ExporterSpec(initial_state="constant_of_shape", outputs=("y",)))
    weight = model.graph.initializer[0]
    model.graph.output.append(
        helper.make_tensor_value_info(weight.name, weight.data_type, list(weight.dims))
    )
    assert _failures(model) == []


# --- defect 7: the opset a rewrite emits into (passes on main at 2a33b52) ----------------


@pytest.mark.parametrize("opset", [7, 9])
def test_old_opset_cell_loop_with_a_symbolic_sequence(opset: int) -> None:
    cfg = unrolled.UnrolledCellConfig(opset=opset, initial_state="first_frame")
    model = slices_as_attributes(unrolled.build_unrolled_cell(cfg))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "seq"
    assert _failures(model) == []


# --- defect C: states broadcast before opset 8 -------------------------------------------


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_cell_loop_with_states_of_their_own_batch_at_opset_7(op_type: str) -> None:
    """``Expand`` is opset 8: the broadcast of states whose batch is not proven X's cannot
    be written before it, so the loop stays unrolled (the rewrite gave a checker error)."""
    cfg = unrolled.UnrolledCellConfig(op_type=op_type, initial_state="inputs", opset=7)
    model = unrolled.build_unrolled_cell(cfg)
    assert _failures(model) == []
    assert not any(n.op_type == op_type for n in rnn_rewrite_rules.rewrite(model).graph.node)


# --- defect 9: a value read inside a subgraph --------------------------------------------


def test_cell_state_read_inside_an_if_between_the_last_steps() -> None:
    model = unrolled.build_unrolled_cell(unrolled.UnrolledCellConfig(op_type="LSTM"))
    index, c = max(
        (i, n.output[0]) for i, n in enumerate(model.graph.node) if re.match(r"c_\d+$", n.output[0])
    )
    flag = Graph(model).input("flag", TensorProto.BOOL, [])
    subgraphs.add_if(model, flag, c, F32, 2, ops=("Abs", "Neg"), at=index + 1)
    assert _failures(model, {flag: np.array(True)}) == []


# --- defect 10: Cast(double -> float16) folded -------------------------------------------


def test_double_to_float16_cast_of_a_weight() -> None:
    spec = ExporterSpec(op_type="GRU", style="plain", initial_state="constant_of_shape")
    model = build_exporter_model(spec)
    convert_element_type(model, TensorProto.FLOAT16)
    recurrent = next(t for t in model.graph.initializer if t.name.startswith("R"))
    wide = numpy_helper.to_array(recurrent).astype(np.float64)
    wide.flat[0] = 65519.9999  # float16: 65504 rounded once, inf through float32
    model.graph.initializer.remove(recurrent)
    model.graph.initializer.append(numpy_helper.from_array(wide, "wide"))
    cast = helper.make_node("Cast", ["wide"], [recurrent.name], to=TensorProto.FLOAT16)
    model.graph.node.insert(0, cast)
    assert _failures(model) == []


# --- new class A: a re-rolled relu RNN that onnx.reference cannot run ---------------------


def test_relu_rnn_chain_runs_where_the_original_runs() -> None:
    """Fixed by issue 32: portable emits no RNN (rten has none); onnx.reference is not a
    runtime of target onnxruntime, where the chain re-rolls."""
    model = unrolled.build_unrolled_rnn(unrolled.UnrolledRnnConfig(nonlinearity="relu", seq=2))
    assert _failures(model) == []


# --- new class B: an overridable weight in an opset-10 bidirectional chain ---------------


def _class_b() -> tuple[onnx.ModelProto, unrolled.UnrolledRnnConfig, str]:
    cfg = unrolled.UnrolledRnnConfig(
        input_size=1, hidden_size=1, seq=2, bidirectional=True, bias=False,
        initial_state="input", dynamic_seq=True, opset=10,
    )  # fmt: skip
    model = unrolled.build_unrolled_rnn(cfg)
    weight = next(n.input[1] for n in model.graph.node if n.op_type == "MatMul")  # W_ih^T
    tensor = next(t for t in model.graph.initializer if t.name == weight)
    model.graph.input.append(helper.make_tensor_value_info(weight, F32, list(tensor.dims)))
    return model, cfg, weight


def test_opset10_bidirectional_chain_with_an_overridable_weight() -> None:
    """portable emits no RNN (issue 32): the default rewrite runs where the original does."""
    assert _failures(_class_b()[0]) == []


def test_opset10_bidirectional_chain_with_an_overridable_weight_on_onnxruntime() -> None:
    """ONNX's Slice-10 inference sizes the steps' Slices as the whole sequence, and ONNX
    Runtime reused a step's buffer for the re-rolled node's input: no re-roll at opset 10
    where the graph has Slices, with the reason."""
    model, cfg, weight = _class_b()
    ignored = costs.Context(ignore=True)
    after = rnn_rewrite_rules.rewrite(model, target="onnxruntime", context=ignored)
    feeds = unrolled.rnn_inputs(cfg, 2)
    tensor = next(t for t in model.graph.initializer if t.name == weight)
    feeds[weight] = numpy_helper.to_array(tensor)
    expected = runtime.run(model, feeds)
    assert runtime.max_abs_diff(expected, runtime.run(after, feeds)) <= 1e-5
    rules = rnn_rewrite_rules.rules(["reroll"], target="onnxruntime")
    reasons = refusal_reasons(rules, model, ignored)
    assert any("Slice-10" in reason for reason in reasons), reasons


# --- issue 41: the oracle's own faults on seeds CI had not seen ------------------------


def _every_node(model: onnx.ModelProto):
    for graph in walk.all_graphs(model.graph):
        yield from graph.node


def test_a_skipped_output_is_not_read_as_an_absent_optional_input() -> None:
    """``hand_built_bidirectional(LSTM)`` + ``subgraph_reader(LSTM_11)`` +
    ``loop_rank(declared 1, y)``: the rewrite drops unread outputs (``LSTM(...) -> Y, "",
    Y_c``), and ``onnx.reference`` 1.23 stored that skipped output under ``""``, the name
    it reads the Loop's absent trip count from: the result "failed" there (truth value of
    an array) or looped a wrong number of times. The oracle names skipped outputs for it."""
    model = thirdparty.hand_built_bidirectional("LSTM", input_size=1, hidden=1)
    g = Graph(model)
    flag = g.input(g.fresh(), TensorProto.BOOL, [])
    at = next(i for i, n in enumerate(model.graph.node) if "LSTM_11" in n.output)
    subgraphs.add_if(model, flag, "LSTM_11", F32, 3, ops=("Abs", "Neg"), at=at + 1)
    subgraphs.add_loop_rank_check(model, "y", F32, 3, declared=1)
    outcome = check_case(Case(model, fixed={flag: np.array(True)}))
    assert [str(f) for f in outcome.failures] == []
    assert outcome.rewritten is not None
    assert any("" in n.output for n in _every_node(outcome.rewritten))  # what it exercises
    # the sizes the issue names (batch 2 / seq 3, 3 / 5, 1 / 1, batch 0); not seq 0, where
    # the original's LSTM does not run on the reference
    assert outcome.compared["reference"] == len(plans(Case(model))) - 1


def test_an_unset_output_is_read_back_from_a_child_process() -> None:
    """``zeros_like_state(LSTM)`` + ``rank_if_two_outputs``: ONNX Runtime leaves an output
    of the original unset (None) at batch 0, the child saved it as a pickled object array
    and the oracle crashed reading it ("Object arrays cannot be loaded when
    allow_pickle=False"); the child now leaves it out and the parent reads it as unset."""
    model = thirdparty.zeros_like_state("zeros_like", "LSTM")
    subgraphs.add_rank_if_two_outputs(model, "x", 3, "y", F32, 3)
    case = Case(model)
    outcome = check_case(case, zero_in_child=True)
    assert [str(f) for f in outcome.failures] == []
    assert outcome.compared["onnxruntime"] > len(plans(case)) - 2  # a 0 plan was compared


def test_reference_loop_stacks_scan_outputs_as_onnxruntime_does() -> None:
    """``onnx.reference`` 1.23 ``vstack``s a Loop's scan outputs (steps ``[batch, H]``
    give ``[T * batch, H]``); ONNX Runtime and onnx's shape inference stack them
    (``[T, batch, H]``): the oracle's reference stacks too."""
    spec = LoopSpec(cell="LSTM", form="torch", trip_count="length", hidden_size=2, input_size=1)
    model = build_loop_model(spec)
    feeds = loop_inputs(spec, 2, 3)
    ours = oracles._Runner(model, "reference").run(feeds)
    assert [a.shape for a in ours] == [(3, 2, 2)]
    np.testing.assert_allclose(ours[0], runtime.run(model, feeds)[0], rtol=1e-5, atol=1e-6)


# --- issue 41: the mutators of the two defect classes, on the models they make -----------


def _signs_differ(zeros: tuple[float, float]) -> bool:
    return bool(np.signbit(zeros[0]) != np.signbit(zeros[1]))  # 0.0 == -0.0 in Python


@pytest.mark.parametrize("signs", [(0.0, -0.0), (-0.0, -0.0)], ids=["differ", "same"])
def test_signed_zero_guards(signs) -> None:
    """``signed_zeros(guards)``: ``Concat(If(Less(Div(1, z0), 0)), If(Less(Div(1, z1),
    0)))`` after an LSTM; merged into one If only when the zeros have one sign."""
    model = build_exporter_model(ExporterSpec())
    out = model.graph.output[0]
    subgraphs.add_signed_zero_guards(model, out.name, F32, 3, signs)
    outcome = check_case(Case(model))
    assert [str(f) for f in outcome.failures] == []
    assert outcome.rewritten is not None
    ifs = [n for n in outcome.rewritten.graph.node if n.op_type == "If"]
    assert len(ifs) == (2 if _signs_differ(signs) else 1)


@pytest.mark.parametrize("batch_free", [False, True], ids=["batched", "batch_free"])
@pytest.mark.parametrize("signs", [(0.0, -0.0), (-0.0, -0.0)], ids=["differ", "same"])
def test_signed_zero_halves(batch_free, signs) -> None:
    """``signed_zeros(readers)``: the two halves read ``Where(Less(Div(1, z), 0), x, -x)``
    with their own zero; one bidirectional node only when the zeros have one sign."""
    build = (
        thirdparty.batch_free_bidirectional if batch_free else thirdparty.hand_built_bidirectional
    )
    model = build("LSTM")
    readers = [n for n in model.graph.node if "x" in n.input]
    for node, zero in zip(readers[:2], signs, strict=True):
        subgraphs.signed_zero_read(model, node, "x", zero)
    outcome = check_case(Case(model))
    assert [str(f) for f in outcome.failures] == []
    assert outcome.rewritten is not None
    merged = any(a.s == b"bidirectional" for n in outcome.rewritten.graph.node for a in n.attribute)
    assert merged != _signs_differ(signs)


@pytest.mark.parametrize("where", ["main", "if", "loop"])
@pytest.mark.parametrize("declared", [None, [None, None], [None, 2]], ids=["none", "2d", "h"])
def test_zero_step_loop_declarations(declared, where) -> None:
    """``zero_step_loop``: a Loop over ``len(x)`` whose stacked output is declared
    nothing, ``[?, ?]`` or ``[?, H]``, in the main graph, an If branch or another Loop;
    compared at ``seq`` 0 on ONNX Runtime in a child process (before the zero-step
    Loop, the guard gave ``[0, 0, H]`` where the Loop gives ``(0,)``). Declared nothing or
    ``[?, ?]``, the Loop is kept (``loop_scan.zero_step``: ONNX Runtime's inference of the
    body decides its shape there) and the oracle still compares it at ``seq`` 0."""
    spec = LoopSpec(cell="LSTM", form="torch", trip_count="length", hidden_size=2, input_size=1)
    model = build_loop_model(spec)
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    body = loop.attribute[0].g
    subgraphs.declare_scan_output(body, len(body.output) - 1, declared)
    case = Case(model, zero_dims={"seq"})
    if where == "if":
        subgraphs.wrap_in_if(model, "pick")
        case.fixed["pick"] = np.array(True)
    elif where == "loop":
        subgraphs.wrap_in_loop(model)
    outcome = check_case(case)
    assert [str(f) for f in outcome.failures] == []
    assert outcome.fired
    guarded = 'op_type: "LSTM"' in str(outcome.rewritten)
    assert guarded == (declared == [None, 2])
    # the seq-0 plan ran in child processes (the batch-0 one did not, where the LSTM
    # replaced the Loop: zero_dims)
    assert outcome.compared["onnxruntime"] == len(plans(case)) - guarded


def test_an_overridable_initializer_is_fed_on_both_runtimes() -> None:
    """``unrolled_rnn`` at opset 9, ``W_hh^T`` an initializer that is also a graph input,
    + ``rank_if_two_outputs``: ONNX Runtime lists such an input apart
    (``get_overridable_initializers``), the oracle left it out of ONNX Runtime's feed, so
    ONNX Runtime ran on the initializer and ``onnx.reference`` on the feed, and ONNX
    Runtime's own fault on the If (one value for two outputs) could not be told apart:
    outputs "differed" by 0.1-0.9."""
    cfg = unrolled.UnrolledRnnConfig(
        input_size=1,
        hidden_size=1,
        seq=3,
        num_layers=2,
        batch_first=True,
        bias=False,
        initial_state="folded",
        batch=2,
        mutation="nonconstant_weights",
        opset=9,
    )
    model = slices_as_attributes(unrolled.build_unrolled_rnn(cfg))
    subgraphs.add_rank_if_two_outputs(model, "x", 3, "h_n", F32, 3)
    case = Case(model, min_sizes={"seq": 3})
    outcome = check_case(case)
    assert [str(f) for f in outcome.failures] == []
    assert outcome.compared["onnxruntime"] == outcome.compared["reference"] == 3
    feeds = oracles._feeds(case, plans(case)[0], 0)
    weight = next(i.name for i in model.graph.input if i.name != "x")
    assert weight in feeds
    on_ort = oracles._Runner(model, "onnxruntime").run(feeds)
    on_reference = oracles._Runner(model, "reference").run(feeds)
    np.testing.assert_allclose(on_ort[0], on_reference[0], rtol=1e-5, atol=1e-6)


def test_runtime_faults_are_excused_output_by_output() -> None:
    """Found by seed 1152803294 (400 examples): ``unrolled_rnn`` + ``rank_if_two_outputs``
    + ``loop_rank`` + ``overridable``. ONNX Runtime computes the If's first output wrongly
    on a session's second run (the result agrees with ``onnx.reference`` there), while
    ``onnx.reference`` computes the Loop's output differently from ONNX Runtime on the
    original and the result alike: each runtime's fault is its own, output by output."""
    cfg = unrolled.UnrolledRnnConfig(
        input_size=4,
        hidden_size=3,
        seq=4,
        batch_first=True,
        initial_state="zeros",
        batch=2,
        dynamic_seq=True,
        transpose_node=True,
        opset=11,
        seed=26,
    )
    model = slices_as_attributes(unrolled.build_unrolled_rnn(cfg))
    subgraphs.add_rank_if_two_outputs(model, "x", 3, "y", F32, 3)
    (_, second) = [o.name for o in model.graph.output][-2:]
    subgraphs.add_loop_rank_check(model, second, F32, 3, declared=1)
    weight = next(t for t in model.graph.initializer if t.name == "val_16")
    model.graph.input.append(
        helper.make_tensor_value_info(weight.name, weight.data_type, list(weight.dims))
    )
    outcome = check_case(Case(model, min_sizes={"seq": 4}))
    # (ONNX Runtime 1.32's fault on the If shows in outcome.runtime_faults; older
    # releases, which CI's lowest-versions part runs, may not have it)
    assert [str(f) for f in outcome.failures] == []


def test_a_fixed_feed_follows_a_later_element_type_conversion() -> None:
    """Oracle defect (seed 5150): ``bias`` fixed a float32 graph-input bias, then
    ``element_type(DOUBLE)`` made that input float64; onnx.reference ran the float32 feed
    in both models, whose float64 arithmetic then differed by 1e-9 (not a rewrite's
    defect). A fixed feed is given in its input's declared type."""
    model = _bidirectional()
    node = next(n for n in model.graph.node if n.op_type == "LSTM" and len(n.input) > 3)
    bias = next(t for t in model.graph.initializer if t.name == node.input[3])
    array = numpy_helper.to_array(bias).copy()
    node.input[3] = "bias_in"
    model.graph.input.append(helper.make_tensor_value_info("bias_in", F32, list(array.shape)))
    convert_element_type(model, TensorProto.DOUBLE)
    case = Case(model, fixed={"bias_in": array})
    feeds = oracles._feeds(case, plans(case)[0], 0)
    assert feeds["bias_in"].dtype == np.float64
    np.testing.assert_array_equal(feeds["bias_in"], array)
    assert [str(f) for f in check_case(case).failures] == []


def test_where_both_runtimes_compute_the_original_wrongly_the_result_keeps_the_spec() -> None:
    """Seed 777001 (150 examples): a bidirectional ``unrolled_rnn`` + ``rank_if_two_outputs``
    + ``loop_rank`` reading the If's first output. By the ONNX specification the Loop's
    output is ``Neg(y)`` (its body's rank test is false: rank 3, declared 1) and the If's
    first output is ``y``. ONNX Runtime 1.32 gives that If output partly zero already on
    a session's first run, and ``onnx.reference`` gives the Loop's output ``+y``: no
    runtime computes the original, so the oracle reports the case (a known false
    positive); the rewrite (the rank test folded) computes what the specification says,
    on every run."""
    cfg = unrolled.UnrolledRnnConfig(
        input_size=1,
        hidden_size=1,
        seq=1,
        bidirectional=True,
        bias=False,
        initial_state="input",
        batch=1,
        mutation="extra_reader",
        opset=11,
    )
    model = unrolled.build_unrolled_rnn(cfg)
    first, _ = subgraphs.add_rank_if_two_outputs(model, "x", 3, "y", F32, 3)
    looped = subgraphs.add_loop_rank_check(model, first, F32, 3, declared=1)
    after = rnn_rewrite_rules.rewrite(model)
    assert "If" not in [n.op_type for n in after.graph.node]  # fold_if took the rank test
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((1, 1, 1)).astype(np.float32),
        "h0": rng.standard_normal((2, 1, 1)).astype(np.float32),
    }
    names = [o.name for o in model.graph.output]
    y = runtime.run(model, feeds, optimize=False)[names.index("y")]
    session = runtime.session(after)
    for _ in range(3):
        outputs = dict(zip(names, session.run(None, feeds), strict=True))
        np.testing.assert_allclose(outputs[first], y, rtol=1e-6)
        np.testing.assert_allclose(outputs[looped], -y, rtol=1e-6)

"""The exact zero-step guard of a Loop that carries X around it (jax2onnx's ``lax.scan``):
``If(len(X) == 0, the Loop as written, the node)``.

Positive: each committed jax2onnx scan over X's length that the rules rewrite gives the
original's outputs, shapes included, at lengths 0, 1, 3, 7 and the export's, batches 1 and
3, and at batch 0 (lengths 0, 1, 3: ONNX Runtime aborts on its LSTM and GRU there, so an
LSTM or GRU guard runs the Loop at batch 0 too; in a child process), in ONNX Runtime with
its graph optimisations off (``ORT_DISABLE_ALL``) and on, where the original's stack of no
step differs between the two; the kept Loop is reported as such, and a second rewrite
changes nothing. Near misses: a cost table that says the guard
is slower at a length, or that it adds more at length 0 than it saves at length 1, keeps
the Loop naming why; a Loop in the then-branch of an ``If`` that does not test its trip
count against 0 is not an exact branch; initial states of a batch not proven X's keep the
guard's broadcast refusal.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import RewriteOptions, costs, runtime
from rnn_rewrite_rules.rules.loop_scan import EXACT_BRANCH
from rnn_rewrite_rules.rules.loop_scan._common import GUARD_COST_REASON
from rnn_rewrite_rules.rules.loop_scan.zero_step import (
    EXACT_BRANCH_REASON,
    EXACT_FORM,
    exact_branch_reason,
)
from tests.exporter_files import DATA
from tests.support import child_env, op_counts

FOLDER = DATA / "jax2onnx"
MODELS = {m["file"]: m for m in json.loads((FOLDER / "manifest.json").read_text())["models"]}
TARGET = "onnxruntime"
#: The scans over X's length rewritten on ONNX Runtime (the node beside the kept Loop).
REWRITTEN = [
    "hand_gru_time_major.onnx",
    "hand_lstm_batch_major.onnx",
    "hand_lstm_time_major.onnx",
    "hand_rnn_relu_batch_major.onnx",
    "hand_rnn_time_major.onnx",
    "nnx_gru_batch_major.onnx",
    "nnx_lstm_linear.onnx",
    "nnx_lstm_time_major.onnx",
    "nnx_optimized_lstm_time_major.onnx",
    "nnx_simple_time_major.onnx",
]
LENGTHS = (0, 1, 3, 7)
GRU_FILE = "nnx_gru_batch_major.onnx"


def _feeds(name: str, seq: int, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seq * 7 + batch)
    sizes = {"seq": seq, "batch": batch}
    return {
        key: rng.standard_normal([sizes.get(d, d) for d in dims]).astype(np.float32)
        for key, dims in MODELS[name]["inputs"].items()
    }


def _guards(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "If"]


@pytest.mark.parametrize("name", REWRITTEN)
def test_the_guard_gives_the_loops_outputs_at_every_length_and_both_levels(name: str) -> None:
    original = onnx.load(FOLDER / name)
    rewritten = rnn_rewrite_rules.rewrite(original, target=TARGET)
    (guard,) = _guards(rewritten)
    kept = next(a.g for a in guard.attribute if a.name == "then_branch")
    assert kept.name.endswith(EXACT_BRANCH)
    assert [n.op_type for n in kept.node].count("Loop") == 1
    assert "Loop" not in op_counts(rewritten)  # only in the branch: op_counts is the main graph
    lengths = sorted({*LENGTHS, MODELS[name]["export_sizes"]["seq"]})
    for optimize in (False, True):
        sessions = [runtime.session(m, optimize=optimize) for m in (original, rewritten)]
        for seq in lengths:
            for batch in (1, 3):
                feeds = _feeds(name, seq, batch)
                expected, actual = (s.run(None, feeds) for s in sessions)
                for want, got in zip(expected, actual, strict=True):
                    where = f"seq {seq}, batch {batch}, optimize {optimize}"
                    assert got.shape == want.shape, where
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=where)


#: Runs a model (argv 1) in ONNX Runtime on each feed of an .npz (argv 2, keys
#: ``<case>/<input>``) at both optimisation levels; saves ``<optimize>/<case>/<output>``.
_BATCH0_CHILD = """
import collections, sys, numpy as np
from rnn_rewrite_rules import runtime
cases = collections.defaultdict(dict)
with np.load(sys.argv[2]) as data:
    for key in data.files:
        case, name = key.split("/")
        cases[case][name] = data[key]
out = {}
for optimize in (False, True):
    session = runtime.session(sys.argv[1], optimize=optimize)
    for case, feeds in cases.items():
        for k, value in enumerate(session.run(None, feeds)):
            out[f"{optimize}/{case}/{k}"] = value
np.savez(sys.argv[3], **out)
"""
BATCH0_LENGTHS = (0, 1, 3)


def _run_at_batch_0(model: onnx.ModelProto, name: str, tmp_path) -> dict[str, np.ndarray]:
    """``model``'s outputs at batch 0 and :data:`BATCH0_LENGTHS`, both levels, run in a
    child process (ONNX Runtime aborts the process on an LSTM or GRU node at batch 0)."""
    paths = [tmp_path / f"{name}.{ext}" for ext in ("onnx", "in.npz", "out.npz")]
    onnx.save(model, paths[0])
    feeds = {
        f"{seq}/{key}": value
        for seq in BATCH0_LENGTHS
        for key, value in _feeds(name, seq, 0).items()
    }
    np.savez(paths[1], **feeds)
    child = subprocess.run(
        [sys.executable, "-c", _BATCH0_CHILD, *map(str, paths)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
    )
    assert child.returncode == 0, f"exit {child.returncode}: {child.stderr.strip()[-300:]}"
    with np.load(paths[2]) as out:
        return {key: out[key] for key in out.files}


@pytest.mark.parametrize("name", REWRITTEN)
def test_the_guard_gives_the_loops_outputs_at_batch_0(name: str, tmp_path) -> None:
    """At batch 0 and lengths 0, 1, 3 the rewrite runs in ONNX Runtime (both levels) and
    gives the original's outputs: the guard tests ``Size(X) == 0``, so runs the Loop at
    batch 0 (where a guard testing the length only runs the node, an LSTM or GRU node
    aborts the child process)."""
    original = onnx.load(FOLDER / name)
    rewritten = rnn_rewrite_rules.rewrite(original, target=TARGET)
    expected = _run_at_batch_0(original, name, tmp_path)
    actual = _run_at_batch_0(rewritten, name, tmp_path)
    assert sorted(actual) == sorted(expected)
    for key, want in expected.items():
        assert actual[key].shape == want.shape, key
        np.testing.assert_allclose(actual[key], want, rtol=1e-4, atol=1e-5, err_msg=key)


def test_the_premise_the_original_shapes_its_stack_of_no_step_by_optimisation_level() -> None:
    """Why only the Loop itself will do at length 0: its stack there differs by level, and
    the rewrite gives each level's."""
    original = onnx.load(FOLDER / "hand_lstm_time_major.onnx")
    rewritten = rnn_rewrite_rules.rewrite(original, target=TARGET)
    feeds = {"x": np.zeros((0, 2, 6), np.float32)}
    for model in (original, rewritten):
        shapes = {opt: runtime.run(model, feeds, optimize=opt)[0].shape for opt in (False, True)}
        assert shapes == {False: (0, 0, 0), True: (0, 0, 8)}


def test_the_kept_loop_is_reported_as_an_exact_branch_and_a_second_rewrite_keeps_it(
    tmp_path,
) -> None:
    once = rnn_rewrite_rules.rewrite(onnx.load(FOLDER / GRU_FILE), target=TARGET)
    twice = rnn_rewrite_rules.rewrite(once, target=TARGET)
    assert twice.SerializeToString() == once.SerializeToString()
    path = tmp_path / "once.onnx"
    onnx.save(once, path)
    report = rnn_rewrite_rules.rewrite_file(path, None, RewriteOptions(hazards=True))
    reasons = [r for item in report.unimproved for r in item.reasons]
    assert reasons == [f"loop_scan/LoopToRnn: {EXACT_BRANCH_REASON}"]


def _kept_reasons(change, monkeypatch) -> list[str]:
    """The reasons the GRU scan is kept with the checked-in table's points each passed
    through ``change`` (the table every rewrite then reads for this form)."""
    checked_in = costs.load(str(costs._PATH.with_name(f"{EXACT_FORM}.json")))
    table = costs.CostTable([change(p) for p in checked_in.points], {})
    original_tables = costs._checked_in
    monkeypatch.setattr(
        costs, "_checked_in", lambda form: table if form == EXACT_FORM else original_tables(form)
    )
    original = onnx.load(FOLDER / GRU_FILE)
    after = rnn_rewrite_rules.rewrite(original, target=TARGET)
    assert op_counts(after) == op_counts(original)
    options = RewriteOptions(hazards=True, target=TARGET)
    report = rnn_rewrite_rules.rewrite_file(FOLDER / GRU_FILE, None, options)
    return [r for item in report.unimproved for r in item.reasons]


def test_a_table_slower_at_one_length_keeps_the_loop_naming_it(monkeypatch) -> None:
    def slower_at_8(point: costs.Point) -> costs.Point:
        if point.seq != 8:
            return point
        return dataclasses.replace(point, ratio=1.3, low=1.25, high=1.35, repeats=())

    reasons = _kept_reasons(slower_at_8, monkeypatch)
    assert any(
        "exact zero-step guard (the Loop kept for length 0) is not no slower" in r
        and "GRU kernel is slower at hidden 8, seq 8" in r
        for r in reasons
    ), reasons


def test_a_table_where_length_0_costs_more_than_length_1_saves_keeps_the_loop(
    monkeypatch,
) -> None:
    def dear_at_0(point: costs.Point) -> costs.Point:
        return dataclasses.replace(point, ratio=2.5) if point.seq == 0 else point

    reasons = _kept_reasons(dear_at_0, monkeypatch)
    assert any("at length 0 it adds" in r and "it saves at length 1" in r for r in reasons), reasons


def _guard_and_loop(rewritten: onnx.ModelProto) -> tuple[ir.Model, ir.Node, ir.Node]:
    """The rewritten GRU scan's model (onnx_ir), its guard and the Loop the guard keeps,
    which is reported as an exact branch as written."""
    model = ir.serde.deserialize_model(rewritten)
    (guard,) = [n for n in model.graph if n.op_type == "If"]
    loop = next(iter(guard.attributes["then_branch"].as_graph()))
    assert loop.op_type == "Loop"
    assert exact_branch_reason(loop, model) is not None
    return model, guard, loop


def test_a_then_branch_that_does_not_test_the_trip_count_against_0_is_no_exact_branch() -> None:
    """Near miss: the guard's condition ``Size(X) == 1``: the Loop there runs a step, so
    it is not kept as an exact branch (the rule may rewrite it)."""
    rewritten = rnn_rewrite_rules.rewrite(onnx.load(FOLDER / GRU_FILE), target=TARGET)
    model, guard, loop = _guard_and_loop(rewritten)
    equal = guard.inputs[0].producer()
    assert [v.producer().op_type for v in equal.inputs if v.producer()] == ["Size"]
    one = ir.Value(name="one", const_value=ir.tensor(np.array([1], np.int64)))
    model.graph.initializers["one"] = one
    equal.replace_input_with(1, one)
    assert exact_branch_reason(loop, model) is None


def test_a_then_branch_testing_the_size_of_a_value_the_loop_does_not_read_is_no_exact_branch():
    """Near miss: ``Size(v) == 0`` for a ``v`` the Loop does not read (the graph input
    before its Transpose): not proven to run only where the Loop's X is empty."""
    rewritten = rnn_rewrite_rules.rewrite(onnx.load(FOLDER / GRU_FILE), target=TARGET)
    model, guard, loop = _guard_and_loop(rewritten)
    size = guard.inputs[0].producer().inputs[0].producer()
    assert size.op_type == "Size" and size.inputs[0] in loop.inputs
    size.replace_input_with(0, model.graph.inputs[0])
    assert model.graph.inputs[0] not in loop.inputs
    assert exact_branch_reason(loop, model) is None


def test_initial_states_of_another_batch_are_refused_for_their_measured_cost(tmp_path) -> None:
    """``h0`` a graph input whose batch is not proven X's: the exact guard and the
    broadcast, measured on this file (``costs/exact_broadcast.json``: at parity at length
    1, 1.3x at length 0), are refused with the measurement."""
    name = "nnx_gru_initial_state.onnx"
    report = rnn_rewrite_rules.rewrite_file(
        FOLDER / name, None, RewriteOptions(hazards=True, target=TARGET)
    )
    reasons = [r for item in report.unimproved for r in item.reasons]
    prefix = f"loop_scan/LoopToRnn: {GUARD_COST_REASON.format(why='')}"
    assert len(reasons) == 1 and reasons[0].startswith(prefix), reasons
    assert "nnx_gru_initial_state" in reasons[0] or "at length 0 it adds" in reasons[0]


def test_a_carried_x_read_at_another_index_is_refused(tmp_path) -> None:
    """Near miss: X carried unchanged over its length, but each step reads ``X[0]``, not
    ``X[t]``: not one node's steps, so no guard."""
    model = onnx.load(FOLDER / GRU_FILE)
    body = next(n for n in model.graph.node if n.op_type == "Loop").attribute[0].g
    iteration = body.input[0].name
    (gather,) = [n for n in body.node if n.op_type == "Gather" and n.input[1] == iteration]
    zero = onnx.helper.make_node(
        "Constant", [], ["step_zero"], value=onnx.numpy_helper.from_array(np.array(0, np.int64))
    )
    body.node.insert(0, zero)
    gather.input[1] = "step_zero"
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    report = rnn_rewrite_rules.rewrite_file(path, None, RewriteOptions(hazards=True))
    reasons = [r for item in report.unimproved for r in item.reasons]
    assert any(r.endswith("the index is not the iteration number") for r in reasons), reasons
    assert op_counts(rnn_rewrite_rules.rewrite(model, target=TARGET)) == op_counts(model)

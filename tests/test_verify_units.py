"""In-process unit tests of ``--verify`` (``_verify``, ``_size_plan``): planning, reference
runs, comparison.

Written for mutation testing (docs/mutation.md): every case runs in this process on tiny
models (no ``rnn-rewrite`` command, no child process: ``_run_in_child`` is replaced by an
in-process fake where a case would start one), and asserts exact values and messages, so
that a changed branch, boundary, default or message fails a test in well under a second.
The command's end-to-end behaviour is in tests/test_verify.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules import _size_plan, _verify, runtime
from rnn_rewrite_rules._report import verify_lines
from rnn_rewrite_rules._size_facts import SizeFacts
from rnn_rewrite_rules._size_plan import (
    MAX_ELEMENTS,
    InputSpec,
    SizePlan,
    _axis_key,
    _format_shape,
    _Planner,
    format_plan,
    input_specs,
    make_feeds,
    plan_runs,
    zero_unsafe,
)
from rnn_rewrite_rules._verify import (
    VerifyResult,
    _Case,
    _compare,
    _has_zero,
    _reference,
    _reference_runs,
    _time_major_equivalent,
)
from rnn_rewrite_rules.errors import CannotVerify

F32 = ir.DataType.FLOAT
Plan = dict[str, tuple[int, ...]]
Feeds = Mapping[str, np.ndarray]


# ----------------------------------------------------------------------------- builders


def _spec(name: str, *dims: int | str | None, dtype: ir.DataType = F32) -> InputSpec:
    return InputSpec(name, dtype, tuple(dims))


def _vi(name: str, dims: Sequence[int | str | None] | None, elem: int = TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def _model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    value_info: Sequence[onnx.ValueInfoProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers, value_info=value_info)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def _unary(op: str = "Relu", output: str = "y", **attrs: object) -> bytes:
    """``op(x)`` for ``x: float[n, 3]``, serialized."""
    node = helper.make_node(op, ["x"], [output], **attrs)
    return _model([node], [_vi("x", ["n", 3])], [_vi(output, None)]).SerializeToString()


def _weights(name: str, shape: tuple[int, ...], seed: int = 0) -> onnx.TensorProto:
    values = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
    return numpy_helper.from_array(values, name)


def _layout1_lstm() -> onnx.ModelProto:
    """A batch-first LSTM (hidden 2, 3 features): ONNX Runtime's CPU kernel rejects it."""
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y", "y_h"], hidden_size=2, layout=1)
    return _model(
        [node],
        [_vi("x", ["batch", "seq", 3])],
        [_vi("y", None), _vi("y_h", None)],
        [_weights("W", (1, 8, 3)), _weights("R", (1, 8, 2), seed=1)],
    )


def _dead_lstm() -> bytes:
    """``Relu(x)`` next to an unused LSTM without ``hidden_size``: ONNX Runtime rejects it
    (not for its layout), onnx.reference runs it."""
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R"], ["unused"]),
        helper.make_node("Relu", ["x"], ["y"]),
    ]
    weights = [_weights("W", (1, 8, 3)), _weights("R", (1, 8, 2))]
    model = _model(nodes, [_vi("x", ["n", "m", 3])], [_vi("y", None)], weights)
    return model.SerializeToString()


def _ort_error(source: bytes) -> str:
    """What ONNX Runtime says, shortened, when it refuses to load ``source``."""
    with pytest.raises(Exception) as error:
        runtime.ort_runner(source, optimize=False, arena=False)
    return runtime.short_error(error.value)


def _result(**changes: object) -> VerifyResult:
    result = VerifyResult(tolerance=1e-4, seed=0, runs=[], max_diff={})
    for name, value in changes.items():
        setattr(result, name, value)
    return result


def _runner(run: Callable[[Feeds], list], names: Sequence[str] = ("y",)) -> runtime.Runner:
    return runtime.Runner("fake", run, list(names))


def _in_process(feeds: Feeds) -> list:
    pytest.fail("ran in process, not in a child")


#: The result's runner, for cases that must run in a child instead.
IN_PROCESS = _runner(_in_process)


def _abort(*_: object) -> None:
    """A child that ONNX Runtime killed."""
    raise _verify._Aborted("killed by SIGABRT")


def _fake_child(monkeypatch, outcome: Callable[..., object]) -> list:
    """Replace ``_run_in_child`` by ``outcome(source, feeds, optimize)``; returns its calls."""
    calls: list = []

    def fake(source: object, feeds: Feeds, *, optimize: bool) -> object:
        calls.append((source, {k: v.shape for k, v in feeds.items()}, optimize))
        return outcome(source, feeds, optimize)

    monkeypatch.setattr(_verify, "_run_in_child", fake)
    return calls


# ----------------------------------------------------------------------------- _compare


def _case(
    expected: list | None,
    *,
    in_child: bool = False,
    aborted: str = "",
    undefined: Sequence[int] = (),
) -> _Case:
    feeds = {"x": np.zeros((2, 3), np.float32)}
    return _Case({"x": (2, 3)}, feeds, expected, in_child, aborted, set(undefined))


def _arrays(*values: list) -> list[np.ndarray]:
    return [np.array(v, np.float64) for v in values]


def test_compare_keeps_each_outputs_largest_difference_over_the_runs() -> None:
    """max_diff is the max over all runs per output (VerifyResult's contract); the run's
    plan joins ``runs``; the result runs on the case's own feeds."""
    seen: list = []
    case = _case(_arrays([1.0, 2.0], [0.0], [3.0]))

    def run(feeds: Feeds) -> list:
        seen.append(feeds)
        return [[1.25, 2.0], [-0.75], [3.25]]  # lists: converted to arrays

    result = _result(runs=[{"x": (5, 6)}], max_diff={"a": 0.5, "b": 0.1})
    _compare(case, _runner(run, "abc"), b"after", ["a", "b", "c"], result)
    assert seen == [case.feeds] and seen[0] is case.feeds
    assert result.max_diff == {"a": 0.5, "b": 0.75, "c": 0.25}
    assert result.runs == [{"x": (5, 6)}, {"x": (2, 3)}]
    assert result.notes == [] and result.failure is None


def test_compare_runs_a_child_case_in_a_child_with_the_optimizations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a child, the result runs as a user runs it (optimize=True), on the case's feeds;
    outputs undefined in either model are compared by shape only (0 if new, else kept)."""
    outputs = _arrays([1.0, 2.0], [[9.0]], [7.0])
    calls = _fake_child(monkeypatch, lambda *_: (outputs, {1}))
    case = _case(_arrays([1.0, 2.25], [[0.0]], [-2.0]), in_child=True, undefined=[2])
    result = _result(max_diff={"h": 0.5})
    _compare(case, IN_PROCESS, b"after", ["y", "h", "c"], result)
    assert calls == [(b"after", {"x": (2, 3)}, True)]
    assert result.notes == [
        "ONNX Runtime gives different values for h, c on two identical runs at x=2x3 "
        "(left undefined at this size): compared shapes only"
    ]
    assert result.max_diff == {"y": 0.25, "h": 0.5, "c": 0.0}
    assert result.runs == [{"x": (2, 3)}] and result.failure is None


def test_compare_fails_an_undefined_output_of_another_shape() -> None:
    """Undefined values are forgiven, a wrong shape is not."""
    case = _case(_arrays([1.0, 2.0]), undefined=[0])
    result = _result()
    _compare(case, _runner(lambda feeds: _arrays([1.0, 2.0, 3.0])), b"after", ["y"], result)
    assert result.failure == "run 1: output 'y' has shape (3,), expected (2,)"
    assert result.max_diff == {}


def test_compare_stops_at_the_first_output_of_another_shape() -> None:
    """The failure names the run by its number among the runs compared so far."""
    case = _case(_arrays([1.0], [[1.0], [2.0]], [0.0]))
    result = _result(runs=[{"x": (5, 6)}])
    actual = _arrays([1.5], [[1.0, 2.0]], [4.0])
    _compare(case, _runner(lambda feeds: actual, "abc"), b"after", ["a", "b", "c"], result)
    assert result.failure == "run 2: output 'b' has shape (1, 2), expected (2, 1)"
    assert result.max_diff == {"a": 0.5}
    assert result.runs == [{"x": (5, 6)}, {"x": (2, 3)}]


def test_compare_refuses_another_number_of_outputs() -> None:
    """A count mismatch is an error (strict zip), never a comparison of the first few."""
    case = _case(_arrays([1.0], [2.0]))
    with pytest.raises(ValueError):
        _compare(case, _runner(lambda feeds: _arrays([1.0])), b"after", ["a", "b"], _result())


def test_compare_fails_a_result_that_aborts_where_the_original_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_child(monkeypatch, _abort)
    result = _result()
    _compare(_case(_arrays([1.0]), in_child=True), IN_PROCESS, b"after", ["y"], result)
    assert result.failure == (
        "ONNX Runtime aborts on the rewritten model at x=2x3 (killed by SIGABRT), "
        "not on the original"
    )
    assert result.runs == [] and result.notes == [] and result.max_diff == {}


def test_compare_notes_a_size_both_models_abort_on(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_child(monkeypatch, _abort)
    result = _result()
    case = _case(None, in_child=True, aborted="killed by SIGSEGV")
    _compare(case, IN_PROCESS, b"after", ["y"], result)
    assert result.notes == ["ONNX Runtime aborts on both models at x=2x3 (not compared)"]
    assert result.failure is None and result.runs == [] and result.max_diff == {}


def test_compare_notes_a_size_only_the_original_aborts_on(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_child(monkeypatch, lambda *_: (_arrays([1.0]), set()))
    result = _result()
    case = _case(None, in_child=True, aborted="killed by SIGABRT")
    _compare(case, IN_PROCESS, b"after", ["y"], result)
    assert result.notes == [
        "ONNX Runtime aborts on the original model at x=2x3 (killed by SIGABRT); "
        "the result runs there (not compared)"
    ]
    assert result.failure is None and result.runs == [] and result.max_diff == {}


@pytest.mark.parametrize("in_child", [False, True])
def test_compare_fails_a_result_that_raises(
    monkeypatch: pytest.MonkeyPatch, in_child: bool
) -> None:
    """The error is shortened to one line (runtime.short_error), in process or in a child
    (whose errors come back as RuntimeError)."""

    def fail(*_: object) -> None:
        raise RuntimeError("bad input\n   at node 3")

    _fake_child(monkeypatch, fail)
    result = _result()
    _compare(_case(_arrays([1.0]), in_child=in_child), _runner(fail), b"after", ["y"], result)
    assert result.failure == "the rewritten model fails on x=2x3: bad input at node 3"
    assert result.runs == [] and result.max_diff == {}


# ----------------------------------------------------------------------------- _reference_runs

#: One input with one named dynamic axis: runs n=2 and n=5, alternatives n=1, 3, 4, 6, 7.
N_SPECS = [_spec("x", "n")]


def _reference_runner(
    accept: Callable[[int], bool] = lambda n: True,
) -> tuple[runtime.Runner, list]:
    """Doubles ``x``; raises ``no N`` for the sizes ``accept`` refuses. Returns the sizes run."""
    sizes: list[int] = []

    def run(feeds: Feeds) -> list:
        n = feeds["x"].shape[0]
        sizes.append(n)
        if not accept(n):
            raise RuntimeError(f"no {n}")
        return [(feeds["x"] * 2).tolist()]

    return _runner(run), sizes


def _runs(
    specs: Sequence[InputSpec],
    reference: runtime.Runner,
    *,
    overrides: Mapping[str, tuple[int, ...]] | None = None,
    child_source: bytes | None = None,
    unsafe: bool = False,
    seed: int = 0,
    result: VerifyResult | None = None,
    ticks: list | None = None,
) -> list[_Case]:
    plan = SizePlan(specs, overrides, zero_unsafe=unsafe)
    return _reference_runs(
        plan,
        reference,
        child_source,
        seed=seed,
        result=result if result is not None else _result(),
        on_run=None if ticks is None else lambda: ticks.append(1),
    )


def test_reference_runs_run_each_plan_on_seeded_inputs() -> None:
    """One case per run, on the planned sizes, with inputs from ``seed`` (one generator
    for all runs: make_feeds with the seeded generator reproduces them)."""
    reference, sizes = _reference_runner()
    ticks: list = []
    result = _result()
    cases = _runs(N_SPECS, reference, seed=7, result=result, ticks=ticks)
    rng = np.random.default_rng(7)
    assert [case.plan for case in cases] == [{"x": (2,)}, {"x": (5,)}]
    for case in cases:
        expected_x = make_feeds(N_SPECS, case.plan, rng)["x"]
        np.testing.assert_array_equal(case.feeds["x"], expected_x)
        assert len(case.expected) == 1 and isinstance(case.expected[0], np.ndarray)
        np.testing.assert_array_equal(case.expected[0], expected_x * 2)
        assert (case.in_child, case.aborted, case.undefined) == (False, "", set())
    assert sizes == [2, 5] and len(ticks) == 2 and result.notes == []


def test_reference_runs_retry_sizes_the_original_rejects_and_say_so() -> None:
    reference, sizes = _reference_runner(lambda n: n != 2)
    ticks: list = []
    result = _result()
    cases = _runs(N_SPECS, reference, result=result, ticks=ticks)
    assert [case.plan for case in cases] == [{"x": (1,)}, {"x": (5,)}]
    assert [case.feeds["x"].shape for case in cases] == [(1,), (5,)]
    assert sizes == [2, 1, 5] and len(ticks) == 2
    assert result.notes == ["the original rejects x=2 (no 2); compared x=1 instead"]


def test_reference_runs_never_repeat_a_size_and_stop_when_none_is_left() -> None:
    """Run 2 skips n=1 (run 1's), then tries the other bases and larger sizes (8, 64, 512
    times its own); none runs: one run is compared, and a note says why."""
    reference, sizes = _reference_runner(lambda n: n == 1)
    ticks: list = []
    result = _result()
    cases = _runs(N_SPECS, reference, ticks=ticks, result=result)
    assert [case.plan for case in cases] == [{"x": (1,)}]
    assert sizes == [2, 1, 5, 3, 4, 6, 7, 40, 320, 2560] and len(ticks) == 1
    assert result.notes == [
        "the original rejects x=2 (no 2); compared x=1 instead",
        "the original rejects x=5 and 7 other sizes (no 5): compared 1 run only (a frozen "
        "axis? see --check)",
    ]


def test_reference_runs_fail_when_no_size_runs() -> None:
    """CannotVerify names the first size refused, its error, how many others were refused
    and the --shape argument that would help."""
    reference, sizes = _reference_runner(lambda n: False)
    with pytest.raises(CannotVerify) as error:
        _runs(N_SPECS, reference)
    assert str(error.value) == (
        "the original model fails on x=2 in fake: no 2; 8 other sizes failed too; give sizes "
        "it runs on, e.g. --shape x=<n> (a frozen axis? see --check)"
    )
    assert sizes == [2, 1, 3, 4, 6, 7, 16, 128, 1024]


@pytest.mark.parametrize(
    ("accepted", "note", "tried"),
    [
        ((1, 3, 4, 6), "x=14x1 and 4 other sizes (no 14)", [14, 7, 112, 896, 7168]),
        ((1, 3, 4), "x=11x1 and 5 other sizes (no 11)", [11, 6, 7, 88, 704, 5632]),
    ],
)
def test_reference_runs_count_the_other_sizes_refused(
    accepted: tuple[int, ...], note: str, tried: list[int]
) -> None:
    """Five runs (seq given five times) of batch 2, 5, 8, 11, 14, each refused: runs 1-4
    take the alternatives 1, 3, 4, 6 in turn, run 5 has only its own, 7 and the larger
    sizes left; without 6, run 4 fails on its own, 6, 7 and the larger sizes."""
    reference, sizes = _reference_runner(lambda n: n in accepted)
    result = _result()
    cases = _runs(
        [_spec("x", "batch", "seq")], reference, overrides={"seq": (1,) * 5}, result=result
    )
    assert [case.plan["x"][0] for case in cases] == list(accepted)
    assert result.notes[-1] == (
        f"the original rejects {note}: compared {len(accepted)} runs only (a frozen axis? see "
        "--check)"
    )
    assert sizes == [2, 1, 5, 3, 8, 4, 11, 6, 14, 7][: 2 * len(accepted)] + tried


def test_reference_runs_stop_when_every_size_is_fixed() -> None:
    """A static input has one plan: it runs once, and the second run has nothing to try."""
    reference, sizes = _reference_runner()
    ticks: list = []
    cases = _runs([_spec("x", 3)], reference, ticks=ticks)
    assert [case.plan for case in cases] == [{"x": (3,)}]
    assert sizes == [3] and len(ticks) == 1


def test_reference_runs_try_a_fixed_size_once() -> None:
    """Every alternative of a static input is the same plan: one refusal, no others."""
    reference, sizes = _reference_runner(lambda n: False)
    with pytest.raises(CannotVerify) as error:
        _runs([_spec("x", 3)], reference)
    assert str(error.value) == (
        "the original model fails on x=3 in fake: no 3; give sizes it runs on with --shape "
        "NAME=DIMS (a frozen axis? see --check)"
    )
    assert sizes == [3]


def test_reference_runs_run_sizes_with_a_zero_in_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """With zero_unsafe and a source for the child, only plans with a 0 run in a child
    (the original without optimizations); the rest in process."""
    outputs = _arrays([0.0])
    calls = _fake_child(monkeypatch, lambda *_: (outputs, {0}))
    reference, sizes = _reference_runner()
    cases = _runs(N_SPECS, reference, overrides={"n": (0, 4)}, child_source=b"m", unsafe=True)
    assert calls == [(b"m", {"x": (0,)}, False)] and sizes == [4]
    assert [(case.plan, case.in_child, case.undefined) for case in cases] == [
        ({"x": (0,)}, True, {0}),
        ({"x": (4,)}, False, set()),
    ]
    assert cases[0].expected == outputs


@pytest.mark.parametrize(("unsafe", "child_source"), [(False, b"m"), (True, None)])
def test_reference_runs_run_zeros_in_process_unless_unsafe_with_a_source(
    monkeypatch: pytest.MonkeyPatch, unsafe: bool, child_source: bytes | None
) -> None:
    calls = _fake_child(monkeypatch, lambda *_: pytest.fail("ran in a child"))
    reference, sizes = _reference_runner()
    cases = _runs(
        N_SPECS, reference, overrides={"n": (0, 4)}, child_source=child_source, unsafe=unsafe
    )
    assert calls == [] and sizes == [0, 4]
    assert [case.in_child for case in cases] == [False, False]


def test_reference_runs_keep_a_size_the_original_aborts_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """An abort is not retried with other sizes: the case is kept, without outputs."""

    calls = _fake_child(monkeypatch, _abort)
    reference, sizes = _reference_runner()
    ticks: list = []
    result = _result()
    cases = _runs(
        N_SPECS,
        reference,
        overrides={"n": (0, 4)},
        child_source=b"m",
        unsafe=True,
        result=result,
        ticks=ticks,
    )
    assert len(calls) == 1 and sizes == [4] and len(ticks) == 2 and result.notes == []
    assert [(case.plan, case.expected, case.in_child, case.aborted) for case in cases[:1]] == [
        ({"x": (0,)}, None, True, "killed by SIGABRT")
    ]
    assert cases[0].feeds["x"].shape == (0,)  # the result runs on the same inputs
    assert cases[1].expected is not None


def test_reference_runs_cannot_verify_when_the_original_aborts_on_every_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_child(monkeypatch, _abort)
    reference, _ = _reference_runner()
    specs = [_spec("x", "n", "m")]
    with pytest.raises(CannotVerify) as error:
        _runs(specs, reference, overrides={"n": (0,)}, child_source=b"m", unsafe=True)
    assert str(error.value) == (
        "ONNX Runtime aborts on the original model at every size given (x=0x3; x=0x6): "
        "give sizes other than 0"
    )


# ----------------------------------------------------------------------------- _Planner

#: ``batch`` shared by two inputs (at different axes), ``seq`` in one, static dims.
XH = [_spec("x", "batch", "seq", 8), _spec("h", 1, "batch", 16)]


def test_planner_sizes_each_axis_from_the_runs_base() -> None:
    """Module contract: each dynamic axis takes a different size in each run, different
    axes differ within a run, a shared axis is the same in every input. The sizes are the
    run's base (2, then 5) plus the axis's index in order of first appearance."""
    planner = _Planner(XH, {}, {})
    assert planner.keys == ["batch", "seq"] and planner.runs == 2
    assert planner.fixed == {} and planner.axis_sizes == {} and planner.graph_fixed == []
    assert planner.plans() == [
        {"x": (2, 3, 8), "h": (1, 2, 16)},
        {"x": (5, 6, 8), "h": (1, 5, 16)},
    ]
    assert planner.plan(1, 10) == {"x": (10, 11, 8), "h": (1, 10, 16)}


def test_planner_alternatives_use_the_fallback_bases() -> None:
    """Fallback bases 1, 3, 4, 6, 7 change only the axes nothing fixes."""
    planner = _Planner(XH, {"seq": (9,)}, {})
    assert planner.alternatives(0) == [
        {"x": (b, 9, 8), "h": (1, b, 16)} for b in _size_plan._FALLBACK_BASES
    ]
    assert _size_plan._FALLBACK_BASES == (1, 3, 4, 6, 7)
    cycling = _Planner(XH, {"seq": (4, 9)}, {})  # the run's own axis sizes
    assert [p["x"][1] for p in cycling.alternatives(1)] == [9] * 5


def test_planner_unnamed_and_zero_dims_are_dynamic_axes_of_their_input() -> None:
    planner = _Planner([_spec("x", None, 4, 0)], {}, {})
    assert planner.keys == [("x", 0), ("x", 2)]
    assert planner.plans() == [{"x": (2, 4, 3)}, {"x": (5, 4, 6)}]


def test_planner_runs_as_many_times_as_the_longest_axis_override() -> None:
    """Runs past the two default bases use base 2 + 3 * run (8, 11, ...); axis sizes
    cycle through the given list."""
    planner = _Planner(XH, {"seq": (1, 2, 3, 4)}, {})
    assert planner.runs == 4 and planner.axis_sizes == {"seq": (1, 2, 3, 4)}
    assert [p["x"] for p in planner.plans()] == [(2, 1, 8), (5, 2, 8), (8, 3, 8), (11, 4, 8)]
    assert _Planner(XH, {"seq": (7,)}, {}).runs == 2
    cycling = _Planner(XH, {"seq": (4, 9)}, {})
    assert [cycling.plan(run, 2)["x"][1] for run in range(4)] == [4, 9, 4, 9]


def test_planner_plans_are_distinct() -> None:
    """An input's --shape fixes its axes (and the axes it shares): one plan, not two."""
    planner = _Planner(XH, {"x": (3, 7, 8)}, {})
    assert planner.fixed == {"batch": 3, "seq": 7}
    assert planner.plans() == [{"x": (3, 7, 8), "h": (1, 3, 16)}]


def test_planner_feeds_an_unranked_input_its_override() -> None:
    planner = _Planner([InputSpec("u", F32, None), _spec("x", "n")], {"u": (2, 0)}, {})
    assert planner.fixed == {} and planner.keys == ["n"]
    assert planner.plans() == [{"u": (2, 0), "x": (2,)}, {"u": (2, 0), "x": (5,)}]


def test_planner_fixes_an_unnamed_axis_an_input_override_sets() -> None:
    planner = _Planner([_spec("x", None, 4), _spec("h", "n")], {"x": (3, 4)}, {})
    assert planner.fixed == {("x", 0): 3} and planner.keys == [("x", 0), "n"]
    assert planner.plans() == [{"x": (3, 4), "h": (3,)}, {"x": (3, 4), "h": (6,)}]


def test_planner_refuses_an_unranked_input_without_an_override() -> None:
    with pytest.raises(CannotVerify) as error:
        _Planner([_spec("x", "n"), InputSpec("u", F32, None)], {}, {})
    assert str(error.value) == "input 'u' has no declared shape: give --shape u=DIMS"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"x": (2, 3)}, "--shape x: 2 dims given, the input has rank 3"),
        ({"x": (2, 3, 8, 1)}, "--shape x: 4 dims given, the input has rank 3"),
        ({"x": (2, 3, 9)}, "--shape x: axis 2 is static 8, not 9"),
        ({"h": (2, 2, 16)}, "--shape h: axis 0 is static 1, not 2"),
        ({"x": (2, 3, 8), "h": (1, 4, 16)}, "--shape h: axis 'batch' is given two sizes"),
        ({"feature": (3,)}, "--shape feature: no input or named dynamic axis has that name"),
        ({"seq": ()}, "--shape seq: give at least one size"),
        (
            {"x": (2, 3, 8), "batch": (4,)},
            "--shape batch: the axis is also fixed by an input's --shape",
        ),
    ],
)
def test_planner_refuses_inconsistent_overrides(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        _Planner(XH, overrides, {})
    assert str(error.value) == message


def test_planner_accepts_consistent_overrides_of_shared_axes() -> None:
    planner = _Planner(XH, {"x": (2, 3, 8), "h": (1, 2, 16)}, {})
    assert planner.fixed == {"batch": 2, "seq": 3} and planner.axis_sizes == {}


def test_planner_takes_the_sizes_the_weights_fix() -> None:
    """Docstring: axes the weights fix take that size, listed as "input axis N = size"."""
    specs = [_spec("x", "seq", "batch", "feature")]
    planner = _Planner(specs, {}, {("x", 2): 138})
    assert planner.graph_fixed == ["x axis 2 = 138"] and planner.fixed == {"feature": 138}
    assert planner.plans() == [{"x": (2, 3, 138)}, {"x": (5, 6, 138)}]


def test_planner_takes_weight_sizes_of_unnamed_axes_and_after_an_overridden_input() -> None:
    planner = _Planner([_spec("x", None, "f")], {}, {("x", 0): 7})
    assert planner.graph_fixed == ["x axis 0 = 7"]
    assert planner.plans() == [{"x": (7, 3)}, {"x": (7, 6)}]
    planner = _Planner([_spec("x", "n"), _spec("h", "m")], {"x": (3,)}, {("h", 0): 7})
    assert planner.graph_fixed == ["h axis 0 = 7"] and planner.plans() == [{"x": (3,), "h": (7,)}]


@pytest.mark.parametrize(
    ("specs", "overrides", "known"),
    [
        ([_spec("x", "n", 8)], {}, {("x", 1): 5}),  # a static axis
        ([_spec("x", "n", "f")], {"f": (4,)}, {("x", 1): 5}),  # an axis --shape sizes
        ([_spec("x", "n", "f")], {"x": (2, 4)}, {("x", 1): 5}),  # an input --shape sets
        ([_spec("x", "n", "f")], {}, {("y", 1): 5, ("x", 2): 5}),  # no such axis
    ],
)
def test_planner_ignores_weight_sizes_of_axes_already_decided(
    specs: list[InputSpec], overrides: dict, known: dict
) -> None:
    planner = _Planner(specs, overrides, known)
    assert planner.graph_fixed == []
    assert all(plan["x"][1] != 5 for plan in planner.plans())


def test_planner_takes_a_shared_axis_weight_size_from_its_first_input() -> None:
    planner = _Planner([_spec("x", "n"), _spec("h", "n")], {}, {("x", 0): 3, ("h", 0): 4})
    assert planner.graph_fixed == ["x axis 0 = 3"] and planner.fixed == {"n": 3}


def test_planner_refuses_an_input_over_the_element_limit() -> None:
    """MAX_ELEMENTS elements are fed; one more is a mistyped --shape."""
    assert MAX_ELEMENTS == 2**27
    assert _Planner([_spec("x", "n")], {"n": (MAX_ELEMENTS,)}, {}).plans() == [
        {"x": (MAX_ELEMENTS,)}
    ]
    planner = _Planner([_spec("x", 2, "n")], {"n": (2**26 + 1,)}, {})
    with pytest.raises(ValueError) as error:
        planner.plans()
    assert str(error.value) == (
        "--shape: input 'x' would have shape 2x67108865, over 134,217,728 elements; "
        "give smaller sizes"
    )


def test_plan_runs_takes_known_sizes_only_when_given() -> None:
    specs = [_spec("x", "n", "f")]
    assert plan_runs(specs, {}) == [{"x": (2, 3)}, {"x": (5, 6)}]
    assert plan_runs(specs, {}, known={("x", 1): 9}) == [{"x": (2, 9)}, {"x": (5, 9)}]
    assert plan_runs(specs, {"n": (4,)}) == [{"x": (4, 3)}, {"x": (4, 6)}]


# --------------------------------------------------------------------- sizes the graph fixes


def weight_fixed_sizes(model: ir.Model) -> dict[tuple[str, int], int]:
    """The input axes the size plan of ``model`` takes from its graph."""
    return SizePlan.of(model).facts.fixed


def _rnn(
    op: str,
    inputs: Sequence[str],
    graph_inputs: Sequence[onnx.ValueInfoProto],
    *,
    directions: int = 1,
    hidden: int = 5,
    features: int = 3,
    extra: Sequence[onnx.NodeProto] = (),
    domain: str = "",
    **attrs: object,
) -> ir.Model:
    """One ``op`` node reading constant W [D, G*H, I] and R [D, G*H, H]."""
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1, "DynamicQuantizeLSTM": 4}[op]
    if directions == 2:
        attrs["direction"] = "bidirectional"
    w_shape, r_shape = (directions, gates * hidden, features), (directions, gates * hidden, hidden)
    if op == "DynamicQuantizeLSTM":  # transposed: [D, I, 4H] and [D, H, 4H]
        w_shape, r_shape = (
            (directions, features, gates * hidden),
            (directions, hidden, gates * hidden),
        )
    node = helper.make_node(op, inputs, ["y"], domain=domain, hidden_size=hidden, **attrs)
    weights = [_weights("W", w_shape), _weights("R", r_shape)]
    model = _model([*extra, node], graph_inputs, [_vi("y", None)], weights)
    return ir.serde.deserialize_model(model)


X = _vi("x", ["seq", "batch", "I"])


def test_weights_fix_the_feature_axis_and_both_states_axes() -> None:
    """X's feature axis (W's last dim); initial_h/initial_c's directions (axis 0 at layout
    0) and hidden (axis 2) axes."""
    state = ["D", "batch", "H"]
    model = _rnn(
        "LSTM",
        ["x", "W", "R", "", "", "h0", "c0"],
        [X, _vi("h0", state), _vi("c0", state)],
        directions=2,
    )
    assert weight_fixed_sizes(model) == {
        ("x", 2): 3,
        ("h0", 0): 2,
        ("h0", 2): 5,
        ("c0", 0): 2,
        ("c0", 2): 5,
    }


def test_the_plan_is_read_from_the_model_and_keeps_what_it_knew() -> None:
    model = _rnn("GRU", ["x", "W", "R"], [_vi("x", ["seq", "batch", None])])
    plan = SizePlan.of(model, {"seq": (2, 4)})
    assert [spec.name for spec in plan.specs] == ["x"]
    assert plan.facts.fixed == {("x", 2): 3} and plan.zero_unsafe
    runs = plan.runs()
    assert [(shapes["x"][0], shapes["x"][2]) for shapes in runs] == [(2, 3), (4, 3)]
    other = _rnn("GRU", ["x", "W", "R"], [_vi("x", ["seq", "batch", None])], features=7)
    plan.add_rewritten(other)  # a size already known wins
    assert plan.facts.fixed == {("x", 2): 3}
    plan.facts.fixed = {}
    plan.add_rewritten(other)
    assert plan.facts.fixed == {("x", 2): 7}
    assert [shapes["x"][2] for shapes in plan.runs()] == [7, 7]
    plain = SizePlan.of(
        ir.serde.deserialize_model(
            _model(
                [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["n"])], [_vi("y", None)], []
            )
        )
    )
    assert not plain.zero_unsafe
    # a rewrite that made a recurrent op (a re-rolled loop) makes a size 0 unsafe too
    plain.add_rewritten(other)
    assert plain.zero_unsafe


def test_weights_fix_the_directions_axis_1_at_layout_1() -> None:
    model = _rnn(
        "GRU",
        ["x", "W", "R", "", "", "h0"],
        [_vi("x", ["batch", "seq", "I"]), _vi("h0", ["batch", "D", "H"])],
        layout=1,
    )
    assert weight_fixed_sizes(model) == {("x", 2): 3, ("h0", 1): 1, ("h0", 2): 5}


def test_weights_fix_an_lstm_initial_h_without_initial_c() -> None:
    """Six inputs: there is no initial_c to read."""
    model = _rnn("LSTM", ["x", "W", "R", "", "", "h0"], [X, _vi("h0", ["D", "batch", "H"])])
    assert weight_fixed_sizes(model) == {("x", 2): 3, ("h0", 0): 1, ("h0", 2): 5}


def test_weights_fix_an_lstm_initial_c_without_initial_h() -> None:
    model = _rnn("LSTM", ["x", "W", "R", "", "", "", "c0"], [X, _vi("c0", ["D", "batch", "H"])])
    assert weight_fixed_sizes(model) == {("x", 2): 3, ("c0", 0): 1, ("c0", 2): 5}


def test_weights_fix_the_axis_a_transpose_moves() -> None:
    """``xf [I, seq, batch]`` transposed by [1, 2, 0]: X's feature axis is xf's axis 0."""
    transpose = helper.make_node("Transpose", ["xf"], ["x"], perm=[1, 2, 0])
    model = _rnn("RNN", ["x", "W", "R"], [_vi("xf", ["I", "seq", "batch"])], extra=[transpose])
    assert weight_fixed_sizes(model) == {("xf", 0): 3}


def test_weights_of_a_graph_input_fix_only_the_states() -> None:
    """W is an input with a default (a caller may feed another): it fixes nothing; the
    states' batch ``b`` is tied to X's ``batch``."""
    w_input = _vi("W", [1, 20, "wi"])
    model = _rnn("LSTM", ["x", "W", "R", "", "", "h0"], [X, w_input, _vi("h0", ["D", "b", "H"])])
    plan = SizePlan.of(model)
    assert plan.facts.fixed == {("h0", 0): 1, ("h0", 2): 5}
    assert plan.facts.ties == [(("h0", 1), ("x", 1))]
    assert all(sizes["x"][1] == sizes["h0"][1] for sizes in plan.runs())


@pytest.mark.parametrize(("inputs", "known"), [(["x"], {}), (["x", "W"], {("x", 2): 3})])
def test_weights_read_what_a_short_node_has(inputs: list[str], known: dict) -> None:
    """An LSTM without R (or W), as an invalid model has it: read, never a crash."""
    node = helper.make_node("LSTM", inputs, ["y"], hidden_size=5)
    model = _model([node], [X], [_vi("y", None)], [_weights("W", (1, 20, 3))])
    assert weight_fixed_sizes(ir.serde.deserialize_model(model)) == known


def test_weights_of_a_contrib_lstm_are_read_transposed() -> None:
    """com.microsoft's DynamicQuantizeLSTM has W transposed ([D, I, 4H]): X's feature
    axis is W's axis 1."""
    model = _rnn(
        "DynamicQuantizeLSTM",
        ["x", "W", "R", "", "", "h0"],
        [X, _vi("h0", ["D", "batch", "H"])],
        domain="com.microsoft",
    )
    assert weight_fixed_sizes(model) == {("x", 2): 3, ("h0", 0): 1, ("h0", 2): 5}


def test_weights_skip_nodes_they_cannot_read_and_go_on() -> None:
    """A Relu and an LSTM whose hidden size is unknown (no attribute, R a graph input)
    come first: the RNN after them still fixes X's feature axis (its W's 7, not the
    skipped LSTM's 3)."""
    nodes = [
        helper.make_node("Relu", ["z"], ["z2"]),
        helper.make_node("LSTM", ["x", "W", "Rin"], ["unknown"]),
        helper.make_node("RNN", ["x", "W2", "R2"], ["y"], hidden_size=5),
    ]
    weights = [_weights("W", (1, 8, 3)), _weights("W2", (1, 5, 7)), _weights("R2", (1, 5, 5))]
    inputs = [_vi("x", ["seq", "batch", "f"]), _vi("z", [2]), _vi("Rin", None)]
    model = _model(nodes, inputs, [_vi("y", None)], weights)
    assert weight_fixed_sizes(ir.serde.deserialize_model(model)) == {("x", 2): 7}


# ----------------------------------------------------------------------------- _reference


@pytest.fixture
def ort_calls(monkeypatch: pytest.MonkeyPatch) -> list:
    """Records each ``runtime.ort_runner`` call as (source, keyword arguments)."""
    calls: list = []
    real = runtime.ort_runner

    def recording(source: object, **kwargs: object) -> runtime.Runner:
        calls.append((source, kwargs))
        return real(source, **kwargs)

    monkeypatch.setattr(runtime, "ort_runner", recording)
    return calls


def test_reference_is_the_original_in_ort_without_optimizations(ort_calls: list) -> None:
    before = _unary()
    result = _result()
    runner, child_source = _reference(before, b"unused", result)
    assert child_source is before and runner.name == "onnxruntime"
    assert runner.output_names == ["y"]
    assert ort_calls == [(before, {"optimize": False, "arena": False})]
    assert result.notes == [] and result.reference == "onnxruntime"


def test_reference_of_a_layout_1_model_is_its_layout_0_equivalent(ort_calls: list) -> None:
    """The equivalent model runs in ONNX Runtime (and in the children), said so."""
    before = _layout1_lstm().SerializeToString()
    result = _result()
    runner, child_source = _reference(before, b"unused", result)
    assert child_source == _time_major_equivalent(before)
    assert ort_calls == [
        (before, {"optimize": False, "arena": False}),
        (child_source, {"optimize": False, "arena": False}),
    ]
    assert result.notes == [
        "ONNX Runtime rejects the original's layout=1 RNNs; reference outputs from an "
        "equivalent layout=0 model (the layout rules alone) in ONNX Runtime"
    ]
    assert result.reference == "onnxruntime" and runner.output_names == ["y", "y_h"]


def test_reference_of_a_model_ort_rejects_is_onnx_reference(ort_calls: list) -> None:
    """The result must load in ONNX Runtime (as a user runs it) for the check to be made."""
    before, after = _dead_lstm(), _unary()
    result = _result()
    runner, child_source = _reference(before, after, result)
    assert child_source is None and runner.name == "onnx.reference"
    assert ort_calls == [(before, {"optimize": False, "arena": False}), (after, {"arena": False})]
    assert result.reference == "onnx.reference"
    assert result.notes == [
        f"ONNX Runtime rejects the original model ({_ort_error(before)}); reference outputs "
        "from onnx.reference: a partial check (it ignores sequence_lens and clip on RNNs)"
    ]


def test_reference_skips_an_equivalent_ort_rejects_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_verify, "_time_major_equivalent", lambda before: b"not a model")
    result = _result()
    runner, child_source = _reference(_dead_lstm(), _unary(), result)
    assert child_source is None and runner.name == "onnx.reference"
    assert len(result.notes) == 1 and result.notes[0].startswith("ONNX Runtime rejects the orig")


def test_reference_cannot_verify_when_ort_loads_neither_model() -> None:
    with pytest.raises(CannotVerify) as error:
        _reference(b"garbage", b"garbage too", _result())
    assert str(error.value) == (
        f"ONNX Runtime {runtime.require_onnxruntime()} does not load the original model "
        f"(nor the result): {_ort_error(b'garbage')}"
    )


def test_reference_cannot_verify_an_original_nothing_loads() -> None:
    """The result loads, but the original loads in neither runtime (nor is it layout=1)."""
    with pytest.raises(CannotVerify) as error:
        _reference(b"garbage", _unary(), _result())
    assert str(error.value) == (
        f"the original model does not load in ONNX Runtime: {_ort_error(b'garbage')}"
    )


# ------------------------------------------------------------------------ _time_major_equivalent


def _lstm_layouts(source: bytes) -> list[int]:
    model = ir.serde.deserialize_model(onnx.load_from_string(source))
    return [n.attributes.get_int("layout", 0) for n in model.graph if n.op_type == "LSTM"]


def test_time_major_equivalent_of_a_model_without_layout_1_is_none() -> None:
    assert _time_major_equivalent(_unary()) is None
    assert _time_major_equivalent(_dead_lstm()) is None  # an LSTM at layout 0


def test_time_major_equivalent_computes_the_same_outputs() -> None:
    """Docstring: the layout=1 RNNs made layout=0, an equivalent model (ONNX Runtime runs
    it; onnx.reference runs the original)."""
    from onnx.reference import ReferenceEvaluator

    before = _layout1_lstm()
    equivalent = _time_major_equivalent(before.SerializeToString())
    assert isinstance(equivalent, bytes) and _lstm_layouts(equivalent) == [0]
    x = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    expected = ReferenceEvaluator(before).run(None, {"x": x})
    actual = runtime.run(equivalent, {"x": x})
    assert runtime.max_abs_diff(expected, actual) < 1e-5


def test_time_major_equivalent_applies_the_layout_rules_alone() -> None:
    """Docstring: only the ``layout`` rules. They wrap the LSTM in Transposes (one for X,
    one per used output: rules/layout.py) and leave the Identity on W, which the other
    rules (weight folding) would fold."""
    model = _layout1_lstm()
    model.graph.initializer[0].name = "W0"
    model.graph.node.insert(0, helper.make_node("Identity", ["W0"], ["W"]))
    equivalent = _time_major_equivalent(model.SerializeToString())
    assert isinstance(equivalent, bytes)
    op_types = sorted(node.op_type for node in onnx.load_from_string(equivalent).graph.node)
    assert op_types == ["Identity", "LSTM", "Transpose", "Transpose", "Transpose"]


def test_time_major_equivalent_of_a_path_inlines_external_data(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(_layout1_lstm(), path, save_as_external_data=True, size_threshold=0)
    stored = onnx.load(path, load_external_data=False).graph.initializer
    assert {t.data_location for t in stored} == {TensorProto.EXTERNAL}
    equivalent = _time_major_equivalent(str(path))
    assert isinstance(equivalent, bytes)
    tensors = onnx.load_from_string(equivalent).graph.initializer
    assert {t.name for t in tensors} >= {"W", "R"}
    assert all(t.data_location == TensorProto.DEFAULT for t in tensors)


def test_time_major_equivalent_is_none_when_the_rnn_stays_batch_first() -> None:
    """The layout rule cannot rewrite an LSTM whose hidden size it cannot prove."""
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], layout=1)
    model = _model(
        [node],
        [_vi("x", ["b", "s", 3]), _vi("R", None)],
        [_vi("y", None)],
        [_weights("W", (1, 8, 3))],
    )
    assert _time_major_equivalent(model.SerializeToString()) is None


# ----------------------------------------------------------------------------- verify


def test_verify_compares_on_the_planned_runs(ort_calls: list) -> None:
    """Defaults: no overrides or known sizes, seed 0, tolerance 1e-4, in process. The
    original loads without optimizations, the result with them (as a user runs it)."""
    specs, before, after = [_spec("x", "n", 3)], _unary(), _unary("Relu")
    result = _verify.verify(before, after, SizePlan(specs))
    assert result == VerifyResult(1e-4, 0, [{"x": (2, 3)}, {"x": (5, 3)}], {"y": 0.0})
    assert [(source is before, source is after, kw) for source, kw in ort_calls] == [
        (True, False, {"optimize": False, "arena": False}),
        (False, True, {"arena": False}),
    ]
    assert result.ok and result.notes == [] and result.reference == "onnxruntime"


def test_verify_feeds_both_models_the_seeded_inputs() -> None:
    """Relu against Identity differs by the largest negative input: the inputs are those
    make_feeds draws from ``seed`` for the planned runs, in turn."""
    specs = [_spec("x", "n", 3)]
    result = _verify.verify(_unary(), _unary("Identity"), SizePlan(specs), seed=7, tolerance=0.5)
    rng = np.random.default_rng(7)
    worst = 0.0
    for plan in plan_runs(specs, {}):
        x = make_feeds(specs, plan, rng)["x"]
        worst = max(worst, float(-x.min()))
    assert worst > 0.5  # the seed gives a negative input beyond the tolerance
    assert result.max_diff == {"y": pytest.approx(worst)}
    assert (result.seed, result.tolerance, result.ok) == (7, 0.5, False)


def test_verify_takes_overrides_and_known_sizes_and_calls_on_run_twice_per_run() -> None:
    ticks: list = []
    specs = [_spec("x", "n", "f", "g")]
    model = helper.make_node("Relu", ["x"], ["y"])
    before = _model([model], [_vi("x", ["n", "f", "g"])], [_vi("y", None)]).SerializeToString()
    facts = SizeFacts(fixed={("x", 1): 3, ("x", 2): 1})
    plan = SizePlan(specs, {"n": (4,)}, facts)
    result = _verify.verify(before, before, plan, on_run=lambda: ticks.append(1))
    assert result.notes == ["sizes the graph fixes: x axis 1 = 3, x axis 2 = 1"]
    assert result.runs == [{"x": (4, 3, 1)}] and len(ticks) == 2 and result.ok


def test_verify_retries_sizes_the_original_rejects_and_says_so() -> None:
    """``Reshape(x, [-1, 4, 2])`` runs only where batch * seq is a multiple of 4: run 1
    takes 3x4 (after 2x3 and 1x2), run 2 takes 4x5 (after 5x6, 1x2; 3x4 was compared)."""
    shape = numpy_helper.from_array(np.array([-1, 4, 2], np.int64), "shape")
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    inputs = [_vi("x", ["batch", "seq", 2])]
    before = _model([node], inputs, [_vi("y", None)], [shape]).SerializeToString()
    runner = runtime.ort_runner(before, optimize=False, arena=False)

    def refusal(size: tuple[int, ...]) -> str:
        with pytest.raises(Exception) as error:
            runner.run({"x": np.zeros(size, np.float32)})
        return runtime.short_error(error.value)

    result = _verify.verify(before, before, SizePlan([_spec("x", "batch", "seq", 2)]))
    assert result.runs == [{"x": (3, 4, 2)}, {"x": (4, 5, 2)}] and result.ok
    assert result.notes == [
        f"the original rejects x=2x3x2 ({refusal((2, 3, 2))}); compared x=3x4x2 instead",
        f"the original rejects x=5x6x2 ({refusal((5, 6, 2))}); compared x=4x5x2 instead",
    ]


def test_verify_compares_a_layout_1_model_with_its_layout_0_equivalent() -> None:
    before = _layout1_lstm().SerializeToString()
    after = _time_major_equivalent(before)
    result = _verify.verify(before, after, SizePlan([_spec("x", "batch", "seq", 3)]))
    assert result.notes == [
        "ONNX Runtime rejects the original's layout=1 RNNs; reference outputs from an "
        "equivalent layout=0 model (the layout rules alone) in ONNX Runtime"
    ]
    assert result.runs == [{"x": (2, 3, 3)}, {"x": (5, 6, 3)}] and result.ok


def test_verify_refuses_sizes_too_large_before_loading_anything() -> None:
    with pytest.raises(ValueError, match=r"^--shape: input 'x' would have shape 67108864x3,"):
        plan = SizePlan([_spec("x", "n", 3)], {"n": (2**26,)})
        _verify.verify(b"garbage", b"garbage", plan)


def test_verify_fails_a_result_ort_does_not_load() -> None:
    result = _verify.verify(_unary(), b"garbage", SizePlan([_spec("x", "n", 3)]))
    assert result.failure == (
        f"the rewritten model does not load in ONNX Runtime: {_ort_error(b'garbage')}"
    )
    assert result.runs == [] and result.max_diff == {} and not result.ok


def test_verify_fails_a_result_with_other_outputs() -> None:
    result = _verify.verify(_unary(), _unary(output="z"), SizePlan([_spec("x", "n", 3)]))
    assert result.failure == "outputs differ: ['y'] before, ['z'] after"
    assert result.runs == []


def test_verify_stops_at_the_first_failed_run() -> None:
    """Flatten(axis=0) gives 1 x (n * 3): run 1 fails, run 2 is not compared."""
    ticks: list = []
    after = _unary("Flatten", axis=0)
    plan = SizePlan([_spec("x", "n", 3)])
    result = _verify.verify(_unary(), after, plan, on_run=lambda: ticks.append(1))
    assert result.failure == "run 1: output 'y' has shape (1, 6), expected (2, 3)"
    assert result.runs == [{"x": (2, 3)}] and len(ticks) == 2  # the original's two runs


def test_verify_runs_zero_sizes_in_children_only_when_zero_unsafe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The original (unoptimized) and the result (optimized) each run size 0 in a child."""
    calls = _fake_child(
        monkeypatch, lambda source, feeds, optimize: (runtime.run(source, feeds), set())
    )
    specs, before, after = [_spec("x", "n", 3)], _unary(), _unary()
    result = _verify.verify(before, after, SizePlan(specs, {"n": (0, 2)}, zero_unsafe=True))
    assert calls == [(before, {"x": (0, 3)}, False), (after, {"x": (0, 3)}, True)]
    assert result.runs == [{"x": (0, 3)}, {"x": (2, 3)}] and result.ok
    calls.clear()
    assert _verify.verify(before, after, SizePlan(specs, {"n": (0, 2)})).ok and calls == []


# ----------------------------------------------------------------------------- VerifyResult.lines


def test_lines_summarize_runs_notes_and_differences() -> None:
    result = VerifyResult(
        tolerance=1e-4,
        seed=3,
        runs=[{"x": (2, 3)}, {"x": (5, 6), "flag": ()}],
        max_diff={"y": 0.0, "long_name": 0.5, "edge": 1e-4},
        notes=["first", "second"],
    )
    assert verify_lines(result) == [
        "verify: 2 runs, seed 3, tolerance 0.0001",
        "  note: first",
        "  note: second",
        "  run 1: x=2x3",
        "  run 2: x=5x6, flag=scalar",
        "  max abs diff per output (onnxruntime reference):",
        "    y          0",
        "    long_name  0.5  > tolerance",
        "    edge       0.0001",
        "verify: FAILED: max abs diff 0.5 > tolerance 0.0001",
    ]


def test_lines_of_one_run_within_tolerance() -> None:
    result = VerifyResult(0.5, 0, [{"x": (1,)}], {"out": 0.25}, reference="onnx.reference")
    assert verify_lines(result) == [
        "verify: 1 run, seed 0, tolerance 0.5",
        "  run 1: x=1",
        "  max abs diff per output (onnx.reference reference):",
        "    out  0.25",
        "verify: OK",
    ]


def test_lines_of_a_failure_before_any_run() -> None:
    """The failure wins over the tolerance; no table without differences."""
    result = VerifyResult(1e-4, 0, [], {}, failure="it broke")
    assert verify_lines(result) == [
        "verify: 0 runs, seed 0, tolerance 0.0001",
        "verify: FAILED: it broke",
    ]
    result.max_diff = {"y": 2.0}
    assert verify_lines(result)[-1] == "verify: FAILED: it broke"


# ----------------------------------------------------------------------------- input_specs


def test_input_specs_are_the_inputs_to_feed() -> None:
    """Inputs with an initializer default are left out; symbolic dims keep their name (or
    None), static ones their size; no shape is None, no type UNDEFINED."""
    inputs = [
        _vi("x", ["batch", None, 3]),
        _vi("w", [2]),
        _vi("n", [], TensorProto.INT64),
        _vi("u", None),
        onnx.ValueInfoProto(name="t"),
    ]
    model = _model([helper.make_node("Identity", ["x"], ["y"])], inputs, [_vi("y", None)])
    model.graph.initializer.append(_weights("w", (2,)))
    specs = input_specs(ir.serde.deserialize_model(model))
    assert specs == [
        InputSpec("x", F32, ("batch", None, 3)),
        InputSpec("n", ir.DataType.INT64, ()),
        InputSpec("u", F32, None),
        InputSpec("t", ir.DataType.UNDEFINED, None),
    ]
    # plain values (InputSpec's contract), not onnx_ir dims that compare equal to them
    assert [type(d) for d in specs[0].dims] == [str, type(None), int]


def test_an_unnamed_input_is_specified_by_the_empty_name() -> None:
    """An input whose name is empty (invalid, but readable) keeps the empty name."""
    model = _model([helper.make_node("Identity", [""], ["y"])], [_vi("", [2])], [_vi("y", None)])
    specs = input_specs(ir.serde.deserialize_model(model))
    assert specs == [InputSpec("", F32, (2,))]


# ----------------------------------------------------------------------------- make_feeds


def test_make_feeds_draws_integers_up_to_the_smallest_positive_dim() -> None:
    """Docstring: integers in [1, smallest dim of the run]; a 0 dim does not count."""
    specs = [_spec("i", 50, dtype=ir.DataType.INT64), _spec("x", 0, 3)]
    feeds = make_feeds(specs, {"i": (50,), "x": (0, 3)}, np.random.default_rng(0))
    assert set(feeds["i"].tolist()) == {1, 2, 3}
    assert feeds["i"].dtype == np.int64 and feeds["x"].shape == (0, 3)
    assert feeds["x"].dtype == np.float32


def test_make_feeds_draws_ones_when_the_smallest_dim_is_1_or_all_are_scalars() -> None:
    specs = [_spec("i", 40, dtype=ir.DataType.INT32), _spec("x", 1)]
    feeds = make_feeds(specs, {"i": (40,), "x": (1,)}, np.random.default_rng(0))
    assert feeds["i"].tolist() == [1] * 40
    scalars = [_spec(f"s{k}", dtype=ir.DataType.INT64) for k in range(30)]
    feeds = make_feeds(scalars, {s.name: () for s in scalars}, np.random.default_rng(0))
    assert [feeds[s.name].item() for s in scalars] == [1] * 30
    assert all(feeds[s.name].shape == () for s in scalars)


def test_make_feeds_refuses_an_element_type_it_cannot_draw() -> None:
    specs = [_spec("x", 2), _spec("s", 2, dtype=ir.DataType.STRING)]
    with pytest.raises(CannotVerify) as error:
        make_feeds(specs, {"x": (2,), "s": (2,)}, np.random.default_rng(0))
    assert str(error.value) == "input 's' has element type STRING, not supported"


# ----------------------------------------------------------------------------- zero_unsafe


def _graph_of(*nodes: onnx.NodeProto) -> ir.Model:
    return ir.serde.deserialize_model(_model(nodes, [_vi("x", [1])], [_vi("y", None)]))


@pytest.mark.parametrize(
    ("op", "domain", "unsafe"),
    [
        ("LSTM", "", True),
        ("GRU", "", True),
        ("RNN", "", True),
        ("LSTM", "ai.onnx", True),
        ("DynamicQuantizeLSTM", "com.microsoft", True),
        ("Relu", "", False),
        ("LSTM", "com.example", False),
        ("GRU", "com.example", False),
        ("DynamicQuantizeLSTM", "", False),
    ],
)
def test_zero_unsafe_is_a_recurrent_op(op: str, domain: str, unsafe: bool) -> None:
    """Docstring: ONNX Runtime may end the process on a size 0 of a recurrent op."""
    assert zero_unsafe(_graph_of(helper.make_node(op, ["x"], ["y"], domain=domain))) is unsafe


def test_zero_unsafe_sees_an_lstm_in_a_subgraph() -> None:
    branch = helper.make_graph(
        [helper.make_node("LSTM", ["x"], ["z"])], "then", [], [_vi("z", None)]
    )
    other = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["w"])], "else", [], [_vi("w", None)]
    )
    node = helper.make_node("If", ["x"], ["y"], then_branch=branch, else_branch=other)
    assert zero_unsafe(_graph_of(node)) is True


# ----------------------------------------------------------------------------- small helpers


@pytest.mark.parametrize(
    ("dim", "key"),
    [
        (1, None),
        (7, None),
        (0, ("x", 2)),
        (-1, ("x", 2)),
        ("batch", "batch"),
        ("", ("x", 2)),
        (None, ("x", 2)),
    ],
)
def test_axis_key_names_dynamic_axes(dim: int | str | None, key: object) -> None:
    """Positive sizes are static; a symbolic name is shared by every input using it; an
    unnamed (or non-positive) dim is its input's own axis."""
    assert _axis_key(_spec("x", 1, 1, dim), 2, dim) == key


@pytest.mark.parametrize(
    ("shape", "text"), [((2, 3), "2x3"), ((7,), "7"), ((0, 1), "0x1"), ((), "scalar")]
)
def test_format_shape(shape: tuple[int, ...], text: str) -> None:
    assert _format_shape(shape) == text


def test_format_plan_lists_inputs_in_order() -> None:
    assert format_plan({"x": (1, 2), "flag": (), "h": (3,)}) == "x=1x2, flag=scalar, h=3"
    assert format_plan({}) == ""


@pytest.mark.parametrize(
    ("plan", "zero"),
    [
        ({"x": (2, 0)}, True),
        ({"x": (2, 3), "h": (0,)}, True),
        ({"x": (2, 3), "flag": ()}, False),
        ({"x": (1,)}, False),
        ({}, False),
    ],
)
def test_has_zero(plan: Plan, zero: bool) -> None:
    assert _has_zero(plan) is zero

"""The output comparisons: ``runtime.diff`` (``--verify``) and ``runtime.max_abs_diff`` (tests).

Written for mutation testing (docs/mutation.md): each case fails when one branch of the
comparison is changed.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import subprocess
import sys
import types
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from rnn_rewrite_rules import _verify, errors, runtime
from rnn_rewrite_rules._report import verify_lines
from rnn_rewrite_rules._size_plan import parse_shape_overrides
from rnn_rewrite_rules._verify import VerifyResult
from rnn_rewrite_rules.runtime import compare, latency, max_abs_diff
from rnn_rewrite_rules.runtime import diff as _diff


def test_equal_arrays_differ_by_zero() -> None:
    a = np.array([[1.0, -2.5], [3.0, 0.0]], np.float32)
    assert _diff(a, a.copy()) == 0.0


def test_the_largest_absolute_difference_counts() -> None:
    expected = np.array([1.0, 2.0, 3.0], np.float32)
    actual = np.array([1.5, 0.0, 3.25], np.float32)
    assert _diff(expected, actual) == pytest.approx(2.0)
    assert _diff(actual, expected) == pytest.approx(2.0)


def test_difference_is_computed_in_float64() -> None:
    """float16 overflows at 65504: the difference of two large halves must not be inf."""
    expected = np.array([60000.0], np.float16)
    actual = np.array([-60000.0], np.float16)
    assert _diff(expected, actual) == pytest.approx(120000.0, rel=1e-3)


def test_nan_on_both_sides_is_equal() -> None:
    expected = np.array([np.nan, 1.0])
    assert _diff(expected, np.array([np.nan, 1.0])) == 0.0


def test_nan_on_one_side_is_infinite() -> None:
    assert _diff(np.array([np.nan, 1.0]), np.array([0.0, 1.0])) == np.inf
    assert _diff(np.array([0.0, 1.0]), np.array([1.0, np.nan])) == np.inf


def test_inf_against_inf_is_infinite() -> None:
    """``inf - inf`` is NaN: the comparison reports it as infinite, never as 0."""
    assert _diff(np.array([np.inf]), np.array([np.inf])) == np.inf
    assert _diff(np.array([np.inf]), np.array([1.0])) == np.inf


def test_empty_outputs_differ_by_zero() -> None:
    assert _diff(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)) == 0.0


def test_booleans_differ_by_one_where_any_element_differs() -> None:
    a = np.array([True, False, True])
    assert _diff(a, a.copy()) == 0.0
    assert _diff(a, np.array([True, True, True])) == 1.0
    assert _diff(a.astype(np.float32), np.array([True, True, True])) == 1.0
    assert _diff(np.array([True, True, True]), a.astype(np.float32)) == 1.0
    # one side boolean: compared as booleans (any difference is 1), not as numbers
    assert _diff(np.array([0.25], np.float32), np.array([True])) == 1.0
    assert _diff(np.array([True]), np.array([0.25], np.float32)) == 1.0


def test_integers_differ_by_their_distance() -> None:
    big = np.array([2**40], np.int64)
    assert _diff(big, big - 3) == 3.0


def test_result_is_within_tolerance_up_to_equality() -> None:
    within = VerifyResult(tolerance=0.5, seed=0, runs=[], max_diff={"y": 0.5})
    beyond = VerifyResult(tolerance=0.5, seed=0, runs=[], max_diff={"y": 0.5000001})
    assert within.ok and not beyond.ok
    assert verify_lines(within)[-1] == "verify: OK"
    assert verify_lines(beyond)[-1].startswith("verify: FAILED: max abs diff")
    assert beyond.worst == 0.5000001


def test_max_abs_diff_is_the_largest_over_all_outputs() -> None:
    first = [np.array([1.0, 2.0], np.float32), np.array([[0.0]], np.float32)]
    second = [np.array([1.0, 2.5], np.float32), np.array([[-3.0]], np.float32)]
    assert max_abs_diff(first, second) == 3.0
    assert max_abs_diff(second, first) == 3.0
    assert max_abs_diff(first, first) == 0.0
    assert max_abs_diff([np.zeros((0, 2))], [np.zeros((0, 2))]) == 0.0


def test_max_abs_diff_is_computed_in_float64() -> None:
    half = [np.array([60000.0], np.float16)]
    assert max_abs_diff(half, [np.array([-60000.0], np.float16)]) == pytest.approx(120000.0)


def test_max_abs_diff_refuses_other_shapes_and_counts() -> None:
    with pytest.raises(ValueError, match="output shapes differ"):
        max_abs_diff([np.zeros((2, 1))], [np.zeros((1, 2))])
    with pytest.raises(ValueError, match="1 outputs vs 2"):
        max_abs_diff([np.zeros(1)], [np.zeros(1), np.zeros(1)])


def test_max_abs_diff_sees_a_nan_the_rewrite_introduced() -> None:
    """``0 * inf`` in a rewritten model is NaN: the comparison must not call that equal."""
    assert max_abs_diff([np.array([1.0, 2.0])], [np.array([np.nan, 2.0])]) == np.inf
    assert max_abs_diff([np.array([np.nan, 2.0])], [np.array([1.0, 2.0])]) == np.inf


def test_compare_is_infinite_for_a_failed_run_or_another_shape() -> None:
    """The benchmarks' comparison: a run that failed (None, or its error text) or gave
    other shapes or counts is infinitely far; otherwise it is max_abs_diff."""
    expected = [np.array([1.0, 2.0], np.float32)]
    assert compare([np.array([1.0, 2.5], np.float32)], expected) == 0.5
    assert compare(None, expected) == compare("session failed", expected) == float("inf")
    assert compare([np.zeros(3, np.float32)], expected) == float("inf")
    assert compare([], expected) == float("inf")


def _relu_model() -> onnx.ModelProto:
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "relu",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    model.ir_version = 8
    return model


def test_latency_measures_creation_and_a_run() -> None:
    """(session creation, median run) in seconds, both positive, for both settings."""
    model = _relu_model()
    feeds = {"x": np.array([-1.0, 1.0], np.float32)}
    for optimize in (True, False):
        created, median = latency(model.SerializeToString(), feeds, 3, optimize=optimize)
        assert 0 < created < 60 and 0 < median < 60


def test_latency_runs_one_thread_optimized_unless_told(monkeypatch) -> None:
    """The session latency measures: one thread, ONNX Runtime's optimizations by default."""
    made = _record_sessions(monkeypatch)
    feeds = {"x": np.array([-1.0, 1.0], np.float32)}
    latency(_relu_model().SerializeToString(), feeds, 1)
    latency(_relu_model().SerializeToString(), feeds, 1, optimize=False)
    assert made == [{"threads": 1, "optimize": True}, {"threads": 1, "optimize": False}]


@pytest.mark.parametrize("form", ["path", "bytes", "proto"])
def test_the_reference_runner_takes_a_path_bytes_or_a_model(form: str, tmp_path) -> None:
    model = _relu_model()
    source = {"bytes": model.SerializeToString(), "proto": model}.get(form)
    if source is None:
        source = str(tmp_path / "relu.onnx")
        onnx.save(model, source)
    runner = runtime.reference_runner(source)
    assert runner.name == "onnx.reference" and runner.output_names == ["y"]
    (y,) = runner.run({"x": np.array([-1.0, 1.0], np.float32)})
    assert y.tolist() == [0.0, 1.0]


def test_shape_overrides_parse_names_and_dims() -> None:
    assert parse_shape_overrides([" input = 2,7 x 8", "seq=1x9", "batch=0"]) == {
        "input": (2, 7, 8),
        "seq": (1, 9),
        "batch": (0,),
    }


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("input", "expected NAME=DIMS, e.g. input=1,7,256"),
        ("=2,3", "expected NAME=DIMS, e.g. input=1,7,256"),
        ("input=2=3", "dims must be integers"),
        ("input=2,three", "dims must be integers"),
        ("input=2,-1", "dims must not be negative"),
    ],
)
def test_shape_overrides_that_are_not_name_equals_dims_are_refused(item, message) -> None:
    with pytest.raises(ValueError) as error:
        parse_shape_overrides([item])
    assert str(error.value) == f"--shape {item!r}: {message}"


def test_a_child_imports_the_package_the_parent_runs(monkeypatch) -> None:
    """The child process finds this very package first on its path (a source tree only on
    sys.path, or mutmut's copy), ahead of what PYTHONPATH already says."""
    seen = {}

    def fake_run(*args, env, **kwargs):
        seen.update(env)
        return subprocess.CompletedProcess(args, -6, b"", b"")

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(_verify.subprocess, "run", fake_run)
    with pytest.raises(_verify._Aborted):
        _verify._run_in_child(b"model", {}, optimize=False)
    package_root = str(pathlib.Path(_verify.__file__).resolve().parent.parent)
    assert seen["PYTHONPATH"] == os.pathsep.join([package_root, "/elsewhere"])


def _child_writing(monkeypatch, outcome: object | None, returncode: int, stderr: bytes) -> None:
    """``subprocess.run`` replaced by a child that writes ``outcome`` (None: nothing) to
    the output path it is given, and exits with ``returncode`` and ``stderr``."""

    def fake_run(command, **kwargs):
        if outcome is not None:
            pathlib.Path(command[-1]).write_bytes(pickle.dumps(outcome))
        return subprocess.CompletedProcess(command, returncode, b"", stderr)

    monkeypatch.setattr(_verify.subprocess, "run", fake_run)


def test_outputs_the_two_runs_disagree_on_are_marked_unstable(monkeypatch) -> None:
    """Index 1 differs in value, 2 in shape (ONNX Runtime's uninitialized Y_h / Y_c)."""
    same, values, shape = np.ones(2, np.float32), np.zeros(3, np.float32), np.zeros((0, 2))
    first = [same, values, shape]
    second = [same.copy(), values + 1, np.zeros((1, 2))]
    _child_writing(monkeypatch, ("ok", [first, second]), 0, b"")
    outputs, unstable = _verify._run_in_child(b"model", {}, optimize=False)
    assert unstable == {1, 2}
    assert [o.shape for o in outputs] == [(2,), (3,), (0, 2)]
    assert outputs[1].tolist() == [0.0, 0.0, 0.0]


def test_a_dead_child_s_undecodable_last_words_are_reported(monkeypatch) -> None:
    """A child that died without writing its outputs: its exit code and the last line of
    its stderr, undecodable bytes replaced."""
    _child_writing(monkeypatch, None, 3, b"first line\n\xff boom\n")
    with pytest.raises(_verify._Aborted) as aborted:
        _verify._run_in_child(b"model", {}, optimize=False)
    assert str(aborted.value) == "exit code 3: \ufffd boom"


def test_a_short_error_is_one_line_without_onnxruntime_s_prefix_or_source_path() -> None:
    error = RuntimeError(
        "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status\n  code: "
        "/onnxruntime_src/onnxruntime/core/providers/cpu/rnn/lstm_base.cc:42 "
        "onnxruntime::LSTMBase::ValidateInputs(const Tensor&) Input X must have 3 dimensions"
    )
    expected = "Non-zero status code: Input X must have 3 dimensions"
    assert runtime.short_error(error) == expected


def test_an_error_without_text_is_named_by_its_type() -> None:
    assert runtime.short_error(MemoryError()) == "MemoryError"


@pytest.mark.parametrize(
    ("length", "expected"), [(300, "a" * 300), (301, "a" * 297 + "..."), (302, "a" * 297 + "...")]
)
def test_a_short_error_is_at_most_300_characters(length: int, expected: str) -> None:
    assert runtime.short_error(ValueError("a" * length)) == expected


def test_feeds_are_integers_from_one_to_high_of_the_asked_type() -> None:
    rng = np.random.default_rng(0)
    ones = runtime.make_feed(ir.DataType.INT32, (2, 50), rng)
    assert ones.dtype == np.int32 and ones.shape == (2, 50) and set(ones.flat) == {1}
    spread = runtime.make_feed(ir.DataType.INT64, (200,), rng, high=3)
    assert spread.dtype == np.int64 and set(spread.flat) == {1, 2, 3}


def test_feeds_are_booleans_of_both_values_or_normal_floats() -> None:
    rng = np.random.default_rng(0)
    flags = runtime.make_feed(ir.DataType.BOOL, (4, 50), rng)
    assert flags.dtype == np.bool_ and flags.shape == (4, 50) and set(flags.flat) == {True, False}
    scalar = runtime.make_feed(ir.DataType.FLOAT16, (), rng)
    assert isinstance(scalar, np.ndarray) and scalar.dtype == np.float16 and scalar.shape == ()


def test_a_feed_of_an_unsupported_type_is_refused() -> None:
    with pytest.raises(errors.UnsupportedInput) as error:
        runtime.make_feed(ir.DataType.STRING, (2,), np.random.default_rng(0))
    assert str(error.value) == "element type STRING is not supported"


def test_the_onnxruntime_runner_is_silent_and_optimizes_with_an_arena_unless_told(
    monkeypatch,
) -> None:
    opened = []

    class Session:
        def get_outputs(self):
            return [types.SimpleNamespace(name="y")]

        def run(self, names, feeds):
            return [feeds["x"] * 2]

    def fake_session(model, **options):
        opened.append(options)
        return Session()

    monkeypatch.setattr(runtime, "session", fake_session)
    runner = runtime.ort_runner(b"model")
    assert runner.output_names == ["y"] and runner.run({"x": np.ones(2)})[0].tolist() == [2, 2]
    runtime.ort_runner(b"model", optimize=False, arena=False)
    assert opened == [
        {"optimize": True, "log_level": 4, "arena": True},
        {"optimize": False, "log_level": 4, "arena": False},
    ]


def test_a_missing_onnxruntime_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import raises ImportError
    with pytest.raises(errors.OnnxRuntimeMissing) as error:
        runtime.require_onnxruntime()
    assert str(error.value) == "onnxruntime is not installed: pip install 'rnn-rewrite-rules[cli]'"


@pytest.mark.parametrize("given", [False, True])
def test_a_session_has_the_options_it_is_given(given: bool) -> None:
    """Defaults: optimized, one thread each way, warnings logged, with the memory arena."""
    import onnxruntime as ort

    options = {"optimize": False, "threads": 2, "log_level": 4, "arena": False}
    loaded = runtime.session(_relu_model(), **(options if given else {}))
    got = loaded.get_session_options()
    levels = ort.GraphOptimizationLevel
    level = levels.ORT_DISABLE_ALL if given else levels.ORT_ENABLE_ALL
    assert got.graph_optimization_level == level
    assert (got.intra_op_num_threads, got.inter_op_num_threads) == ((2 if given else 1), 1)
    assert got.log_severity_level == (4 if given else 3)
    assert got.enable_cpu_mem_arena is (not given)
    assert loaded.run(None, {"x": np.array([-1.0, 2.0], np.float32)})[0].tolist() == [0.0, 2.0]


def test_a_session_runs_on_the_cpu_only(monkeypatch) -> None:
    """CPU only, whatever else the installed onnxruntime offers."""
    import onnxruntime as ort

    seen = []
    monkeypatch.setattr(ort, "InferenceSession", lambda *args, **kwargs: seen.append(kwargs))
    runtime.session(_relu_model())
    assert seen == [{"providers": ["CPUExecutionProvider"]}]


def test_inf_against_inf_warns_of_nothing() -> None:
    """inf - inf is NaN: counted as infinite, without numpy's invalid-value warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _diff(np.array([np.inf]), np.array([np.inf])) == np.inf


def _record_sessions(monkeypatch) -> list[dict]:
    """``runtime.session`` made to record its options (it still opens the session)."""
    made: list[dict] = []
    real = runtime.session

    def recording(model, **options):
        made.append(options)
        return real(model, **options)

    monkeypatch.setattr(runtime, "session", recording)
    return made


@pytest.mark.parametrize("optimize", [False, True])
def test_run_passes_its_optimize_flag_on(monkeypatch, optimize: bool) -> None:
    seen = _record_sessions(monkeypatch)
    feeds = {"x": np.array([-1.0, 2.0], np.float32)}
    outputs = runtime.run(_relu_model(), feeds, optimize=optimize)
    assert seen == [{"optimize": optimize}] and outputs[0].tolist() == [0.0, 2.0]

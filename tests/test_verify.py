"""``--verify``: sizes the weights fix, retried sizes, scalar inputs, what cannot be verified.

Each case runs the real command; the planning itself is also checked in process.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import rnn_rewrite_rules
from rnn_rewrite_rules import _verify, runtime
from rnn_rewrite_rules._report import verify_lines
from rnn_rewrite_rules._size_plan import SizePlan, input_specs
from rnn_rewrite_rules.cli import ExitCode
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model
from rnn_rewrite_rules.testing.exporters import quantized_lstm_model
from tests.support import (
    assert_one_line_error,
    layout1_model,
    leftovers,
    run,
    without_a_runtime,
)

SMALL = RnnConfig(input_size=8, hidden_size=16, num_layers=2, batch_first=True)


def symbolic_feature_model(features: int = 138) -> onnx.ModelProto:
    """SMALL with 138 input features, declared as a symbolic axis ``feature``."""
    model = build_torchlib_model(RnnConfig(input_size=features, hidden_size=16, num_layers=2))
    dim = model.graph.input[0].type.tensor_type.shape.dim[2]
    dim.Clear()
    dim.dim_param = "feature"
    return model


def reshape_model() -> onnx.ModelProto:
    """``Reshape(x, [-1, 4, 8])``: only batch * seq divisible by 4 runs (not 2x3 or 5x6)."""
    shape = numpy_helper.from_array(np.array([-1, 4, 8], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="fold")],
        "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def bool_scalar_model() -> onnx.ModelProto:
    """SMALL whose output is negated or not by a boolean scalar input ``flip``."""
    model = build_torchlib_model(SMALL)
    output = model.graph.output[0].name
    model.graph.node.extend(
        [
            helper.make_node("Neg", [output], ["negated"]),
            helper.make_node("Where", ["flip", "negated", output], ["chosen"]),
        ]
    )
    model.graph.input.append(helper.make_tensor_value_info("flip", TensorProto.BOOL, []))
    model.graph.output.append(helper.make_tensor_value_info("chosen", TensorProto.FLOAT, None))
    return model


def noisy_model() -> onnx.ModelProto:
    """SMALL plus an unseeded random output: two sessions never agree on it."""
    model = build_torchlib_model(SMALL)
    model.graph.node.append(helper.make_node("RandomUniformLike", ["input"], ["noise"]))
    model.graph.output.append(helper.make_tensor_value_info("noise", TensorProto.FLOAT, None))
    return model


def unloadable_model() -> onnx.ModelProto:
    """SMALL with an op no ONNX Runtime release (nor onnx.reference) loads."""
    return without_a_runtime(build_torchlib_model(SMALL))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("verify_models")
    for name, build in {
        "feature": symbolic_feature_model,
        "reshape": reshape_model,
        "flag": bool_scalar_model,
        "noisy": noisy_model,
        "layout1": layout1_model,
        "unloadable": unloadable_model,
        "small": lambda: build_torchlib_model(SMALL),
    }.items():
        onnx.save(build(), root / f"{name}.onnx")
    return root


def runs(stdout: str) -> list[str]:
    return re.findall(r"^  run \d+: (.*)$", stdout, re.M)


@pytest.mark.command
def test_a_symbolic_feature_axis_takes_ws_size(models, tmp_path) -> None:
    proc = run(models / "feature.onnx", "-o", tmp_path / "out.onnx", "--verify", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "note: sizes the graph fixes: input axis 2 = 138" in proc.stdout
    compared = runs(proc.stdout)
    assert len(compared) == 2 and all(r.endswith("x138") for r in compared), compared
    assert "verify: OK" in proc.stdout
    # the planning alone: without the graph's size it would guess another one. torch's
    # exporter computes W at run time; the shape prover proves W's last dim from the graph
    model = ir.serde.deserialize_model(symbolic_feature_model())
    assert all(p["input"][2] == 138 for p in SizePlan.of(model).runs())
    assert all(p["input"][2] != 138 for p in SizePlan(input_specs(model)).runs())


@pytest.mark.command
def test_rejected_sizes_are_retried_and_named(models, tmp_path) -> None:
    args = ["--verify", "--allow-no-rnn"]  # no RNN: written only when asked
    proc = run(models / "reshape.onnx", "-o", tmp_path / "out.onnx", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "note: the original rejects x=2x3x8" in proc.stdout
    compared = runs(proc.stdout)
    assert len(compared) == 2, proc.stdout
    for text in compared:
        batch, seq, _ = map(int, re.fullmatch(r"x=(\d+)x(\d+)x(\d+)", text).groups())
        assert batch * seq % 4 == 0
    assert "verify: OK" in proc.stdout


@pytest.mark.command
def test_a_boolean_scalar_input_is_fed(models, tmp_path) -> None:
    proc = run(models / "flag.onnx", "-o", tmp_path / "out.onnx", "--verify", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "flip=scalar" in proc.stdout and "verify: OK" in proc.stdout
    feed = runtime.make_feed(ir.DataType.BOOL, (), np.random.default_rng(0))
    assert isinstance(feed, np.ndarray) and feed.shape == () and feed.dtype == np.bool_


@pytest.mark.command
def test_different_outputs_fail_and_write_nothing(models, tmp_path) -> None:
    (tmp_path / "out.onnx").write_bytes(b"previous contents")
    proc = run(models / "noisy.onnx", "-o", tmp_path / "out.onnx", "--verify", cwd=tmp_path)
    assert_one_line_error(proc, ExitCode.VERIFY_FAILED, "not written")
    assert re.search(r"^    noise\s+\S+  > tolerance$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^    output\s+0$", proc.stdout, re.M), proc.stdout
    assert "verify: FAILED" in proc.stdout
    assert (tmp_path / "out.onnx").read_bytes() == b"previous contents"
    assert leftovers(tmp_path) == []


@pytest.mark.command
def test_a_model_ort_cannot_load_cannot_be_verified(models, tmp_path) -> None:
    proc = run(models / "unloadable.onnx", "-o", tmp_path / "out.onnx", "--verify", cwd=tmp_path)
    assert_one_line_error(proc, ExitCode.CANNOT_VERIFY, "cannot verify", "does not load")
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.command
def test_layout1_is_compared_with_a_layout0_model_in_ort(models, tmp_path) -> None:
    args = ["--verify", "--tolerance", "0", "--shape", "seq=1,4,9"]
    proc = run(models / "layout1.onnx", "-o", tmp_path / "out.onnx", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "equivalent layout=0 model" in proc.stdout
    assert "(onnxruntime reference)" in proc.stdout and "verify: OK" in proc.stdout
    assert len(runs(proc.stdout)) == 3
    # the reference is independent of onnx.reference's shortcuts, and agrees with it here
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(1).standard_normal((3, 5, 3)).astype(np.float32)
    expected = ReferenceEvaluator(layout1_model()).run(None, {"x": x})
    actual = runtime.run(onnx.load(tmp_path / "out.onnx"), {"x": x})
    assert runtime.max_abs_diff(expected, actual) < 1e-5


@pytest.mark.command
def test_size_0_where_ort_aborts_runs_in_a_child_and_is_noted(models, tmp_path) -> None:
    """ONNX Runtime aborts the process on an LSTM with batch 0: --verify survives it."""
    args = ["--verify", "--shape", "batch=0,2"]
    proc = run(models / "small.onnx", "-o", tmp_path / "out.onnx", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "ONNX Runtime aborts on both models at input=0x3x8 (not compared)" in proc.stdout
    assert runs(proc.stdout) == ["input=2x6x8"] and "verify: 1 run," in proc.stdout
    assert (tmp_path / "out.onnx").exists()


@pytest.mark.command
def test_size_0_of_a_quantized_lstm_runs_in_a_child(tmp_path) -> None:
    """ONNX Runtime aborts on the contrib DynamicQuantizeLSTM with batch 0 too."""
    model = quantized_lstm_model(direction="forward", style="torchscript", zero_states=False)
    onnx.save(model, tmp_path / "quantized.onnx")
    args = ["--verify", "--shape", "batch=0,2"]
    proc = run(tmp_path / "quantized.onnx", "-o", tmp_path / "out.onnx", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "ONNX Runtime aborts on both models at input=" in proc.stdout, proc.stdout
    assert "verify: 1 run," in proc.stdout and (tmp_path / "out.onnx").exists()


@pytest.mark.command
def test_only_sizes_ort_aborts_on_cannot_be_verified(models, tmp_path) -> None:
    args = ["--verify", "--shape", "input=0,3,8"]
    proc = run(models / "small.onnx", "-o", tmp_path / "out.onnx", *args, cwd=tmp_path)
    assert_one_line_error(
        proc, ExitCode.CANNOT_VERIFY, "aborts on the original model", "input=0x3x8"
    )
    assert not (tmp_path / "out.onnx").exists()


def _fake_children(monkeypatch, *, abort: str = "", unstable: set[int] | None = None) -> list:
    """``_run_in_child`` in process: the model named ``abort`` aborts, ``unstable`` outputs
    of the result disagree between runs. Returns the sources run."""
    seen = []

    def fake(source, feeds, *, optimize):
        seen.append(source)
        if source == abort:
            raise _verify._Aborted("killed by SIGABRT")
        outputs = runtime.run(source, feeds, optimize=optimize)
        return outputs, (unstable or set()) if optimize else set()

    monkeypatch.setattr(_verify, "_run_in_child", fake)
    return seen


def _verify_small(models, tmp_path, shapes: dict) -> _verify.VerifyResult:
    after = tmp_path / "after.onnx"
    onnx.save(rnn_rewrite_rules.rewrite(onnx.load(models / "small.onnx")), after)
    specs = input_specs(ir.load(models / "small.onnx"))
    plan = SizePlan(specs, shapes, zero_unsafe=True)
    return _verify.verify(str(models / "small.onnx"), str(after), _verify.VerifyPlan(plan))


def test_a_result_aborting_where_the_original_runs_fails(models, tmp_path, monkeypatch) -> None:
    seen = _fake_children(monkeypatch, abort=str(tmp_path / "after.onnx"))
    result = _verify_small(models, tmp_path, {"seq": (0, 2)})
    assert not result.ok and "aborts on the rewritten model at input=2x0x8" in result.failure
    assert seen == [str(models / "small.onnx"), str(tmp_path / "after.onnx")]  # size 0 only


def test_outputs_ort_leaves_undefined_are_compared_by_shape(models, tmp_path, monkeypatch):
    _fake_children(monkeypatch, unstable={2})
    result = _verify_small(models, tmp_path, {"seq": (0, 2)})
    assert result.ok and result.runs[0]["input"] == (2, 0, 8) and len(result.runs) == 2
    assert any("different values for c_n on two identical runs" in n for n in result.notes)


@pytest.mark.command
def test_a_child_that_dies_is_reported_as_aborted(models) -> None:
    feeds = {"input": np.zeros((0, 3, 8), np.float32)}  # batch 0: ORT aborts the child
    with pytest.raises(_verify._Aborted, match="SIGABRT"):
        _verify._run_in_child(str(models / "small.onnx"), feeds, optimize=False)
    feeds = {"input": np.ones((2, 3, 8), np.float32)}
    outputs, unstable = _verify._run_in_child(str(models / "small.onnx"), feeds, optimize=False)
    expected = runtime.run(str(models / "small.onnx"), feeds)
    assert runtime.max_abs_diff(expected, outputs) == 0 and unstable == set()


@pytest.mark.parametrize(
    ("stderr", "reported"),
    [("", "?"), ("first line\nlast line", "last line"), ("x" * 300, "x" * 200)],
    ids=["nothing", "two_lines", "long_line"],
)
def test_a_child_that_exits_without_outputs_is_aborted(monkeypatch, stderr, reported) -> None:
    """A child that ends with an exit code and no outputs: the code and its last line
    of stderr, at most 200 characters (a stand-in child script)."""
    script = f"import sys; sys.stderr.write({stderr!r}); sys.exit(3)"
    monkeypatch.setattr(_verify, "_CHILD", script)
    with pytest.raises(_verify._Aborted) as raised:
        _verify._run_in_child("unused.onnx", {}, optimize=False)
    assert str(raised.value) == f"exit code 3: {reported}"


def test_an_error_in_the_child_is_raised_with_its_text(monkeypatch) -> None:
    script = (
        "import pickle, sys\n"
        "with open(sys.argv[1], 'wb') as out: pickle.dump(('error', 'no such op'), out)"
    )
    monkeypatch.setattr(_verify, "_CHILD", script)
    with pytest.raises(RuntimeError, match=r"^no such op$"):
        _verify._run_in_child("unused.onnx", {}, optimize=False)


@pytest.mark.command
def test_size_0_runs_where_ort_does_not_abort(models, tmp_path) -> None:
    """No LSTM/GRU: a zero batch is verified like any other size."""
    args = ["--verify", "--shape", "batch=0,4", "--allow-no-rnn"]
    proc = run(models / "reshape.onnx", "-o", tmp_path / "out.onnx", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert any(r.startswith("x=0x") for r in runs(proc.stdout)), proc.stdout


@pytest.mark.command
def test_one_run_is_one_run_and_the_table_is_unambiguous(models, tmp_path) -> None:
    args = ["--verify", "--shape", "input=2,3,8"]  # every axis fixed: one run
    proc = run(models / "small.onnx", "-o", tmp_path / "out.onnx", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "verify: 1 run, seed 0" in proc.stdout
    # an output named "output" is a row under the header, never read as the header
    assert "  max abs diff per output (onnxruntime reference):" in proc.stdout
    assert re.search(r"^    output\s+[0-9.e+-]+$", proc.stdout, re.M), proc.stdout


def _dead_lstm_model(last_op: str = "Relu") -> onnx.ModelProto:
    """``last_op(X)``, next to an unused LSTM without ``hidden_size``: ONNX Runtime
    refuses to load it (its LSTM requires the attribute); the rewrite drops the dead node."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((1, 8, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((1, 8, 2)).astype(np.float32), "r"),
    ]
    nodes = [
        helper.make_node("LSTM", ["X", "w", "r"], ["unused"]),
        helper.make_node(last_op, ["X"], ["y"]),
    ]
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["seq", "batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", "batch", 3])
    model = helper.make_model(
        helper.make_graph(nodes, "dead_lstm", [x], [y], weights),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    model.ir_version = 8
    return model


@pytest.mark.parametrize("result_op", ["Relu", "Neg"])
def test_an_original_ort_rejects_is_compared_in_onnx_reference(result_op: str) -> None:
    """ONNX Runtime rejects the original but loads the result: the reference outputs come
    from onnx.reference, said so, and a result that differs still fails."""
    before = _dead_lstm_model()
    after = rnn_rewrite_rules.rewrite(before)
    assert [n.op_type for n in after.graph.node] == ["Relu"]
    after.graph.node[0].op_type = result_op
    with pytest.raises(Exception, match="hidden_size"):
        runtime.ort_runner(before, optimize=False, arena=False)
    plan = SizePlan(input_specs(ir.serde.deserialize_model(before)))
    result = _verify.verify(
        before.SerializeToString(), after.SerializeToString(), _verify.VerifyPlan(plan)
    )
    assert result.reference == "onnx.reference"
    (note,) = result.notes
    assert note.startswith("ONNX Runtime rejects the original model (")
    assert note.endswith(
        "reference outputs from onnx.reference: a partial check (it ignores "
        "sequence_lens and clip on RNNs)"
    )
    assert result.ok == (result_op == "Relu") and len(result.runs) == 2
    assert "  max abs diff per output (onnx.reference reference):" in verify_lines(result)

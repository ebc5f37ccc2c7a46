"""Every option on every form of input users have.

Forms: external data next to the model (as torch's exporter writes it), in a subfolder,
named by a ``./`` location, at offsets past 2 GiB of a data file over 2 GiB (sparse: no
disk), a read-only input folder, an output folder other than the input's, paths relative
to another working directory. Options: ``--verify``, ``--benchmark``, ``--quantize int8``,
``--check``, ``--in-place``, ``--target``. Through :func:`rewrite_file` (the matrix) and
the command (the read-only folder, relative paths). A torch dynamo export with each
option is in tests/test_torch_export.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest

from rnn_rewrite_rules import RewriteOptions, errors, rewrite_file, runtime
from rnn_rewrite_rules.cli import ExitCode
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model
from tests.support import (
    LAYOUTS,
    PAST_2GB,
    assert_one_line_error,
    folder_state,
    leftovers,
    read_only,
    run,
    save_model_as,
)

pytest.importorskip("onnxruntime.quantization")

#: Two LSTM layers with state inputs: the quantizer converts both once folded.
MODEL = RnnConfig(num_layers=2, hidden_size=16, input_size=8, batch_first=True, initial_states=True)
#: --benchmark's budget per size here: the verdict is not what these tests are about.
BUDGET = 0.2


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return build_torchlib_model(MODEL)


@pytest.fixture(params=LAYOUTS)
def source(request, model, tmp_path) -> Path:
    return save_model_as(model, tmp_path / "in", request.param)


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    batch, seq = 3, 4
    states = (MODEL.num_layers, batch, MODEL.hidden_size)
    return {
        "input": rng.standard_normal((batch, seq, MODEL.input_size)).astype(np.float32),
        "h0": rng.standard_normal(states).astype(np.float32),
        "c0": rng.standard_normal(states).astype(np.float32),
    }


def _outputs(path: Path) -> list[np.ndarray]:
    return runtime.run(str(path), _feeds())


def _locations(path: Path) -> set[str]:
    proto = onnx.load(path, load_external_data=False)
    return {
        e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"
    }


def test_the_layouts_are_what_they_say(source: Path) -> None:
    """The premise: every layout keeps the weights outside the model file; past_2gb's data
    file is over 2 GiB and its tensors start past 2 GiB."""
    proto = onnx.load(source, load_external_data=False)
    external = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(external) >= 4
    (location,) = _locations(source)
    assert (source.parent / location).is_file()
    if location == "model.data" and (source.parent / location).stat().st_size > 2**31:
        offsets = [int(e.value) for t in external for e in t.external_data if e.key == "offset"]
        assert min(offsets) == PAST_2GB


def test_verify_benchmark_and_quantize_into_another_folder(source: Path, tmp_path) -> None:
    before = folder_state(source.parent)
    target = tmp_path / "out" / "int8.onnx"
    target.parent.mkdir()
    options = RewriteOptions(
        verify=True, benchmark=True, benchmark_budget=BUDGET, keep_slower=True, quantize="int8"
    )
    report = rewrite_file(source, target, options)
    assert report.written and report.verify.ok, report.lines()
    assert report.quantized.quantized["DynamicQuantizeLSTM"] == MODEL.num_layers
    assert report.benchmark.latencies and "onnxruntime" not in report.benchmark.skipped
    onnx.checker.check_model(str(target))
    assert runtime.max_abs_diff(_outputs(source), _outputs(target)) < 0.05
    assert folder_state(source.parent) == before
    assert leftovers(target.parent) == []


def test_check_with_verify_writes_nothing(source: Path, tmp_path) -> None:
    before = folder_state(source.parent)
    report = rewrite_file(source, None, RewriteOptions(hazards=True, verify=True))
    assert not report.written and report.verify.ok and report.hazards_before is not None
    assert folder_state(source.parent) == before


def test_in_place_for_onnxruntime_keeps_the_inputs_data_file(source: Path, model) -> None:
    """The model file is replaced; the data file it used stays as it was (another copy of
    the model may read it), the new one is the run's own."""
    expected = _outputs(source)
    (old,) = _locations(source)
    data = source.parent / old
    old_state = (data.stat().st_size, data.stat().st_mtime_ns)
    options = RewriteOptions(in_place=True, verify=True, target="onnxruntime")
    report = rewrite_file(source, source, options)
    assert report.written and report.verify.ok
    assert (data.stat().st_size, data.stat().st_mtime_ns) == old_state
    locations = _locations(source)
    assert locations and old not in locations
    assert runtime.max_abs_diff(expected, _outputs(source)) < 1e-5
    assert len(onnx.load(source).graph.node) < len(model.graph.node)


@pytest.mark.command
def test_a_read_only_input_folder_takes_every_option_but_in_place(model, tmp_path) -> None:
    source = save_model_as(model, tmp_path / "in", "subfolder")
    out = tmp_path / "out"
    out.mkdir()
    before = folder_state(source.parent)
    with read_only(source.parent) as run_read_only:
        proc = run_read_only(
            source, "-o", out / "fast.onnx", "--verify", "--quantize", "int8", "--benchmark",
            "--benchmark-budget", BUDGET, "--keep-slower", cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == ExitCode.OK, proc.stderr
        assert "verify: OK" in proc.stdout and "DynamicQuantizeLSTM" in proc.stdout
        proc = run_read_only(source, "--check", "--verify", "--target", "onnxruntime", cwd=tmp_path)
        assert proc.returncode == ExitCode.OK, proc.stderr
        proc = run_read_only(source, "--in-place", "--verify", cwd=tmp_path)
        assert_one_line_error(proc, ExitCode.OUTPUT_NOT_WRITABLE, str(source.parent))
    assert folder_state(source.parent) == before
    assert (out / "fast.onnx").is_file() and leftovers(out) == []


@pytest.mark.command
def test_relative_paths_from_another_folder(model, tmp_path) -> None:
    """``rnn-rewrite in/model.onnx -o out/int8.onnx`` from the folder above both, the model
    naming its data ``./model.data``."""
    save_model_as(model, tmp_path / "in", "dotted")
    (tmp_path / "out").mkdir()
    args = ["in/model.onnx", "-o", "out/int8.onnx", "--quantize", "int8", "--verify"]
    proc = run(*args, cwd=tmp_path)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "wrote out/int8.onnx" in proc.stdout and "verify: OK" in proc.stdout
    onnx.checker.check_model(str(tmp_path / "out" / "int8.onnx"))


# --- the ONNX checker on the input --------------------------------------------------------


def test_an_invalid_model_with_external_data_is_refused_as_such(model, tmp_path) -> None:
    """The checker runs on the input, its external data in place (a subfolder here); a
    graph output no node produces (paddle2onnx's nn.SimpleRNN) is not "no recurrence"."""
    invalid = onnx.ModelProto()
    invalid.CopyFrom(model)
    invalid.graph.output.append(onnx.helper.make_tensor_value_info("ghost", 1, [2]))
    source = save_model_as(invalid, tmp_path / "in", "subfolder")
    with pytest.raises(errors.InvalidModel) as raised:
        rewrite_file(source, tmp_path / "out.onnx", RewriteOptions(verify=True))
    assert str(raised.value) == (
        f"{source}: input is not a valid ONNX model: Graph output 'ghost' is not an output of "
        "any node in graph."
    )
    assert isinstance(raised.value, errors.NotOnnx)  # the command's exit code 5
    assert not (tmp_path / "out.onnx").exists()


def test_a_data_file_behind_a_symbolic_link_in_the_folder_is_read(model, tmp_path) -> None:
    """ONNX Runtime and onnx_ir follow a link inside the model's folder: the checker's own
    refusal of every link is no reason to refuse the model."""
    source = save_model_as(model, tmp_path / "in", "beside")
    (source.parent / "model.onnx.data").rename(source.parent / "0123abcd.blob")
    (source.parent / "model.onnx.data").symlink_to("0123abcd.blob")
    with pytest.raises(onnx.checker.ValidationError, match="symbolic link"):
        onnx.checker.check_model(str(source))  # the premise
    report = rewrite_file(source, tmp_path / "out.onnx", RewriteOptions(verify=True))
    assert report.written and report.verify.ok


@pytest.mark.command
def test_a_data_file_linked_from_outside_the_folder_is_refused_in_one_line(model, tmp_path):
    """A Hugging Face cache snapshot links its files to ``../../blobs``: onnx refuses to
    read data resolving outside the model's folder, so the command says so (exit 5), where
    it stopped with an internal error when writing."""
    source = save_model_as(model, tmp_path / "snapshot", "beside")
    blob = tmp_path / "blobs" / "0123abcd"
    blob.parent.mkdir()
    (source.parent / "model.onnx.data").rename(blob)
    (source.parent / "model.onnx.data").symlink_to(blob)
    proc = run(source, "-o", tmp_path / "out.onnx", cwd=tmp_path)
    assert_one_line_error(
        proc,
        ExitCode.NOT_ONNX,
        "external data file 'model.onnx.data' is a link to",
        "outside the model's folder, which onnx refuses to read",
    )
    assert not (tmp_path / "out.onnx").exists()


def test_past_the_protobuf_limit_from_the_inputs_folder(tmp_path, monkeypatch) -> None:
    """Above 2 GB (the limit lowered to 1 KiB here: which path runs is what changes) the
    quantizer and the result take external data. onnx refuses to write the quantizer's
    ``<name>.data`` when a file of that name is in the working directory: run from the
    input's folder, which holds ``model.onnx.data``."""
    wider = dataclasses.replace(MODEL, hidden_size=64)  # int8 weights of 1 KiB and more
    source = save_model_as(build_torchlib_model(wider), tmp_path / "in", "beside")
    monkeypatch.setattr("rnn_rewrite_rules._save.EMBED_LIMIT_BYTES", 1024)
    monkeypatch.chdir(source.parent)
    target = tmp_path / "out" / "model.onnx"
    target.parent.mkdir()
    report = rewrite_file("model.onnx", target, RewriteOptions(quantize="int8", verify=True))
    assert report.written and report.verify.ok
    assert report.quantized.quantized["DynamicQuantizeLSTM"] == MODEL.num_layers
    (location,) = _locations(target)
    assert (target.parent / location).stat().st_size > 1024

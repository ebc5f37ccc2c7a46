"""Big models: tensors left on disk while loading, streamed while saving, memory bounded.

The memory bound is measured on a child process (peak RSS from ``getrusage`` in a fresh
intermediate process), never as a timing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import _load, _save
from rnn_rewrite_rules.shape.constant import fold_value, preparation_nodes
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model
from tests.support import assert_equivalent

_SRC = str(Path(rnn_rewrite_rules.__file__).resolve().parent.parent)


def _write_model(model: onnx.ModelProto, path: Path, external: bool = False) -> Path:
    if external:  # onnx.save moves the tensors of what it is given: save a copy
        copy = onnx.ModelProto.FromString(model.SerializeToString())
        onnx.save(copy, path, save_as_external_data=True, location=path.name + ".data")
    else:
        onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def small() -> tuple[RnnConfig, onnx.ModelProto]:
    cfg = RnnConfig(input_size=48, hidden_size=48, num_layers=2, bidirectional=True)
    return cfg, build_torchlib_model(cfg)


# ---------------------------------------------------------------- loading lazily


def test_lazy_proto_points_into_the_file_and_loads_the_same_tensors(tmp_path, small) -> None:
    _, model = small
    path = _write_model(model, tmp_path / "m.onnx")
    assert _load.lazy_model_proto(path) is None  # small files are parsed whole
    proto = _load.lazy_model_proto(path, min_bytes=0)
    assert proto is not None and proto.ByteSize() < model.ByteSize() / 10
    lazy = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert lazy and all(t.external_data[0].value == "m.onnx" for t in lazy)
    loaded = ir.serde.deserialize_model(proto)
    ir.external_data.set_base_dir(loaded.graph, str(tmp_path))
    expected = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for name, value in loaded.graph.initializers.items():
        np.testing.assert_array_equal(value.const_value.numpy(), expected[name])
    assert sum(
        isinstance(v.const_value, ir.ExternalTensor) for v in loaded.graph.initializers.values()
    ) == len(lazy)


def test_lazy_proto_gives_up_on_a_damaged_file(tmp_path, small) -> None:
    _, model = small
    data = model.SerializeToString()
    truncated = tmp_path / "cut.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    assert _load.lazy_model_proto(truncated, min_bytes=0) is None
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x07" * 4096)
    assert _load.lazy_model_proto(garbage, min_bytes=0) is None


def test_load_model_leaves_big_embedded_tensors_in_the_file(tmp_path, monkeypatch, small):
    cfg, model = small
    path = _write_model(model, tmp_path / "m.onnx")
    monkeypatch.setattr(_load, "LAZY_MIN_BYTES", 0)
    loaded = _load.load_model(path)
    assert not loaded.external_data and loaded.data_files == frozenset()  # still embedded
    kinds = {type(v.const_value) for v in loaded.model.graph.initializers.values()}
    assert ir.ExternalTensor in kinds
    rnn_rewrite_rules.rewrite(loaded.model)
    out = tmp_path / "out.onnx"
    with _save.Staging(out) as staging:
        progress = []
        staging.write(loaded.model, on_tensor=lambda done, total: progress.append((done, total)))
        _load.check_model_file(staging.model_path)
        staging.commit()
    assert progress and progress[-1][0] == progress[-1][1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.onnx"]  # no .data
    assert_equivalent(model, onnx.load(out), cfg)


# ---------------------------------------------------------------- saving by streaming


@pytest.mark.parametrize("source", ["in memory", "lazily loaded", "external data"])
def test_streamed_file_is_what_ir_save_writes(tmp_path, small, source: str) -> None:
    _, model = small
    if source == "in memory":
        ir_model = ir.serde.deserialize_model(model)
    elif source == "lazily loaded":
        path = _write_model(model, tmp_path / "m.onnx")
        ir_model = ir.serde.deserialize_model(_load.lazy_model_proto(path, min_bytes=0))
        ir.external_data.set_base_dir(ir_model.graph, str(tmp_path))
    else:
        ir_model = ir.load(_write_model(model, tmp_path / "m.onnx", external=True))
    _save.save_embedded(ir_model, tmp_path / "streamed.onnx")
    ir.save(ir.serde.deserialize_model(model), tmp_path / "plain.onnx")
    streamed = onnx.load(tmp_path / "streamed.onnx")
    assert streamed == onnx.load(tmp_path / "plain.onnx")
    onnx.checker.check_model(streamed, full_check=True)
    mapped = [v.const_value for v in ir_model.graph.initializers.values()]
    assert all(t.raw is None for t in mapped if isinstance(t, ir.ExternalTensor))  # unmapped


def test_check_model_file_reports_what_the_checker_reports(tmp_path, small) -> None:
    _, model = small
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    broken.graph.node[0].input.append("nowhere")  # an input no one produces
    path = _write_model(broken, tmp_path / "broken.onnx")
    with pytest.raises(onnx.checker.ValidationError) as plain:
        onnx.checker.check_model(str(path))
    with pytest.raises(onnx.checker.ValidationError) as ours:
        _load.check_model_file(path)
    assert str(plain.value).splitlines()[0] == str(ours.value).splitlines()[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.onnx"]  # nothing left
    _load.check_model_file(_write_model(model, tmp_path / "fine.onnx"))


def test_folding_unmaps_each_source_once_read(tmp_path, small) -> None:
    _, model = small
    ir_model = ir.load(_write_model(model, tmp_path / "m.onnx", external=True))
    w = next(n for n in ir_model.graph if n.op_type == "LSTM").inputs[1]
    found = preparation_nodes(w)
    assert not isinstance(found, str)
    leaves = [leaf.const_value for leaf in found[1]]
    assert all(isinstance(t, ir.ExternalTensor) for t in leaves)
    assert isinstance(fold_value(w, found[0]), np.ndarray)
    assert all(t.raw is None for t in leaves)


# ---------------------------------------------------------------- peak memory, in a child

_MEASURE = textwrap.dedent(
    """
    import json, resource, subprocess, sys
    done = subprocess.run([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(json.dumps({"rc": done.returncode, "peak": peak}))
    """
)
_IMPORTS = "import rnn_rewrite_rules.cli, onnx_ir, onnxscript, onnx, numpy"
_REWRITE = (
    _IMPORTS + "\nfrom rnn_rewrite_rules import cli\nraise SystemExit(cli.main(sys.argv[1:]))"
)


def _peak(code: str, *args: str) -> int:
    env = {**os.environ, "PYTHONPATH": _SRC}
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, "import sys\n" + code, *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0, out.stderr
    return result["peak"]


@pytest.mark.parametrize("external", [False, True], ids=["embedded", "external data"])
def test_rewriting_a_big_model_adds_at_most_1_6_times_its_size(tmp_path, external: bool) -> None:
    """A 4-layer LSTM(640), 53 MB of weights: the rewrite (load, fold, write, check) adds
    at most 1.6x the model to what the interpreter with our imports takes (measured 1.2x;
    5.1x embedded and 2.0x with external data before tensors were left on disk)."""
    cfg = RnnConfig(input_size=640, hidden_size=640, num_layers=4)
    model = build_torchlib_model(cfg)
    path = _write_model(model, tmp_path / "big.onnx", external)
    size = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert 45e6 < size < 80e6
    base = _peak(_IMPORTS)
    peak = _peak(_REWRITE, str(path), "-o", str(tmp_path / "out.onnx"), "--quiet")
    assert peak - base <= 1.6 * size, (peak / 1e6, base / 1e6, size / 1e6)
    # external data goes to a name unique to the run: out.onnx.<8 hex digits>.data
    out = sorted(re.sub(r"\.[0-9a-f]{8}\.data$", ".<run>.data", p.name) for p in tmp_path.iterdir())
    assert out == sorted(
        ["big.onnx", "out.onnx"] + (["big.onnx.data", "out.onnx.<run>.data"] if external else [])
    )
    result = onnx.load(tmp_path / "out.onnx")  # its weights folded, read back and compared
    assert len(result.graph.node) < len(model.graph.node)
    assert_equivalent(model, result, cfg, ((1, 2), (3, 1)))


@pytest.mark.parametrize("external", [False, True], ids=["embedded", "external data"])
def test_verifying_a_big_model_adds_at_most_5_times_its_size(tmp_path, external: bool) -> None:
    """The same 53 MB model with ``--verify``: one model in ONNX Runtime at a time, the
    rewrite's released first (measured 3.4x to 4.2x embedded from run to run, 4.55x once
    in a full suite run, 3.4x external, mostly ONNX Runtime's fixed cost at this size;
    2.15x on a 1.07 GB model. Both sessions at once, the rewrite's model kept alive and
    the original optimized took 6.4x and 5.4x)."""
    cfg = RnnConfig(input_size=640, hidden_size=640, num_layers=4)
    path = _write_model(build_torchlib_model(cfg), tmp_path / "big.onnx", external)
    size = sum(p.stat().st_size for p in tmp_path.iterdir())
    base = _peak(_IMPORTS + ", onnxruntime")
    out = str(tmp_path / "out.onnx")
    peak = _peak(_REWRITE, str(path), "-o", out, "--quiet", "--verify")
    assert peak - base <= 5 * size, (peak / 1e6, base / 1e6, size / 1e6)
    assert (tmp_path / "out.onnx").exists()

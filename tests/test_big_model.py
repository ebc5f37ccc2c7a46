"""A model over 2 GiB through the command: out of the default run (``RNN_REWRITE_BIG=1``).

What breaks above 2 GiB is every path that holds the model in one protobuf: serializing
it (the quantizer's input and output, the staged result), the ONNX checker given a model
in memory, ONNX Runtime given bytes. The default run tests those paths cheaply: the
external-data layouts (tests/test_input_forms.py: offsets past 2 GiB of a sparse data
file) and the switch to external data at the limit (tests/test_cli.py). This test feeds
a real 2.25 GB embedding table (zeros in a sparse file: no disk, but every reader
materializes it): about a minute and 10 GB of memory at the peak, so it runs only when
asked.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules.cli import ExitCode
from tests.support import run

pytestmark = pytest.mark.skipif(
    os.environ.get("RNN_REWRITE_BIG") != "1", reason="a 2.25 GB model: set RNN_REWRITE_BIG=1"
)

VOCAB, WIDTH, HIDDEN = 1_100_000, 512, 16


def _external(name: str, dims: tuple[int, ...], offset: int, location: str) -> onnx.TensorProto:
    tensor = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    length = int(np.prod(dims)) * 4
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        tensor.external_data.add(key=key, value=str(value))
    return tensor


def big_tagger(folder) -> str:
    """``ids [batch, seq]`` -> ``Gather(table [1.1M, 512])`` -> LSTM(16): the table's
    2.25 GB of zeros as a sparse file, the LSTM's weights after it."""
    table_bytes = VOCAB * WIDTH * 4
    rng = np.random.default_rng(0)
    w = rng.uniform(-0.3, 0.3, (1, 4 * HIDDEN, WIDTH)).astype(np.float32)
    r = rng.uniform(-0.3, 0.3, (1, 4 * HIDDEN, HIDDEN)).astype(np.float32)
    with open(folder / "model.onnx.data", "wb") as data:
        data.truncate(table_bytes)
        data.seek(table_bytes)
        data.write(w.tobytes())
        data.write(r.tobytes())
    initializers = [
        _external("table", (VOCAB, WIDTH), 0, "model.onnx.data"),
        _external("W", w.shape, table_bytes, "model.onnx.data"),
        _external("R", r.shape, table_bytes + w.nbytes, "model.onnx.data"),
        numpy_helper.from_array(np.array([1, 0, 2], np.int64), "perm"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["embedded"]),
        helper.make_node("Transpose", ["embedded"], ["x"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["x", "W", "R"], ["Y", "Y_h"], hidden_size=HIDDEN),
    ]
    graph = helper.make_graph(
        nodes,
        "big_tagger",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, "batch", HIDDEN])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "model.onnx"
    onnx.save(model, path)
    return path


def test_a_model_over_2gb_is_quantized_verified_and_checked(tmp_path) -> None:
    source = big_tagger(tmp_path)
    assert (tmp_path / "model.onnx.data").stat().st_size > 2**31  # the premise
    out = tmp_path / "out"
    out.mkdir()
    proc = run(source, "--check", "--verify", cwd=tmp_path, timeout=1800)
    assert proc.returncode == ExitCode.OK, proc.stderr
    proc = run(
        source,
        "-o",
        out / "int8.onnx",
        "--quantize",
        "int8",
        "--verify",
        cwd=tmp_path,
        timeout=1800,
    )
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "1 DynamicQuantizeLSTM" in proc.stdout and "verify: OK" in proc.stdout
    onnx.checker.check_model(str(out / "int8.onnx"))

"""Declared output shapes made true: the sizes the prover proves replace refuted ones."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import rnn_rewrite_rules
from rnn_rewrite_rules import cli, diagnostics, runtime
from rnn_rewrite_rules.passes import DeclaredOutputShapesPass
from rnn_rewrite_rules.passes.declared_output_shapes import output_shape_fixes


def _declared(value: onnx.ValueInfoProto) -> list[int | str | None]:
    return [
        d.dim_value if d.HasField("dim_value") else d.dim_param or None
        for d in value.type.tensor_type.shape.dim
    ]


def _model(outputs: dict[str, list], nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", 4]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        [onnx.numpy_helper.from_array(np.array([0, -1], np.int64), "flat")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def _fixed(model: onnx.ModelProto) -> dict[str, list]:
    ir_model = ir.serde.deserialize_model(model)
    DeclaredOutputShapesPass()(ir_model)
    return {v.name: _declared(v) for v in ir.serde.serialize_model(ir_model).graph.output}


def test_refuted_sizes_are_rewritten_and_the_rest_kept() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["same"]),
        helper.make_node("Relu", ["x"], ["renamed"]),
        helper.make_node("Reshape", ["x", "flat"], ["merged"]),
        helper.make_node("Unsqueeze", ["h", "flat"], ["ranked"]),  # flat: [0, -1] as axes
        helper.make_node("Relu", ["x"], ["vague"]),
        helper.make_node("NonZero", ["x"], ["count"]),
    ]
    model = _model(
        {
            "same": ["batch", "seq", 4],  # right: untouched
            "renamed": ["batch", 17, 5],  # a traced length and a wrong static size
            "merged": ["batch", 68],  # seq * 4: no name for it
            "ranked": [1, "batch", 4],  # [1, batch, 4, 1] actually: another rank
            "vague": ["b", None, "seq"],  # "b" claims nothing; "seq" (input axis 1) is refuted
            "count": [3, 7],  # [x's rank, its own count]: neither refuted
        },
        nodes,
    )
    assert _fixed(model) == {
        "same": ["batch", "seq", 4],
        "renamed": ["batch", "seq", 4],
        "merged": ["batch", None],
        "ranked": [1, "batch", 4, 1],
        "vague": ["b", None, 4],
        "count": [3, 7],
    }
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = ""  # seq: unnamed
    assert _fixed(model)["renamed"] == ["batch", None, 4]  # refuted, with no name to give


def test_inputs_and_undeclared_outputs_are_left_alone() -> None:
    """An output that is a graph input is the input's declaration; one without a shape
    gets none."""
    model = _model({"x": ["batch", 17, 4], "y": []}, [helper.make_node("Relu", ["x"], ["y"])])
    model.graph.output[1].type.tensor_type.ClearField("shape")
    ir_model = ir.serde.deserialize_model(model)
    assert output_shape_fixes(ir_model) == []
    before = ir.serde.serialize_model(ir_model)
    assert not DeclaredOutputShapesPass()(ir_model).modified
    assert ir.serde.serialize_model(ir_model) == before


def test_check_reports_and_the_rewrite_fixes(tmp_path, capsys) -> None:
    model = _model({"y": ["batch", 17, 4]}, [helper.make_node("Relu", ["x"], ["y"])])
    hazards = diagnostics.find_hazards(ir.serde.deserialize_model(model))
    assert [str(h) for h in hazards] == [
        "[declared-output-shape] output 'y': declared [batch, 17, 4], proven [batch, seq, 4]: "
        "other input sizes contradict it"
    ]
    after = rnn_rewrite_rules.rewrite(model)
    assert _declared(after.graph.output[0]) == ["batch", "seq", 4]
    assert diagnostics.find_hazards(ir.serde.deserialize_model(after)) == []
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert cli.main([str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert "[declared-output-shape] output 'y': declared [batch, 17, 4]" in out
    assert "after the rewrite: 0 remain" in out


#: Run in a child process: torch 2.13 specialises the sequence axis of a later export of a
#: GRU once one GRU with a static sequence axis was exported in the same process, and the
#: test's premise (the input keeps ``seq``, the output declares 17) is a fresh process's.
_DYNAMO_EXPORT = """
import contextlib, io, sys, warnings
import numpy as np, torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(8, 16, batch_first=True)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, x):
        y, h = self.gru(x)
        return self.out(y), h

torch.manual_seed(0)
net = Net().eval()
dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
    warnings.simplefilter("ignore")
    program = torch.onnx.export(
        net, (torch.randn(3, 17, 8),), dynamo=True, dynamic_shapes=(dims,), input_names=["x"]
    )
with open(sys.argv[1] + "/model.onnx", "wb") as f:
    f.write(program.model_proto.SerializeToString())
expected = {}
for batch, seq in ((2, 5), (1, 30), (4, 17)):
    x = np.random.default_rng(seq).standard_normal((batch, seq, 8)).astype(np.float32)
    with torch.no_grad():
        y, h = net(torch.from_numpy(x))
    expected.update({f"x{seq}": x, f"y{seq}": y.numpy(), f"h{seq}": h.numpy()})
np.savez(sys.argv[1] + "/expected.npz", **expected)
"""


@pytest.mark.torch
def test_torch_dynamo_export_declares_the_traced_length_and_the_rewrite_fixes_it(
    tmp_path,
) -> None:
    """``torch.onnx.export(dynamo=True)`` declares the GRU's output after a Linear with
    the traced sequence length; after the rewrite every output's declared sizes agree
    with what ONNX Runtime returns at other sizes, and the values with PyTorch's."""
    pytest.importorskip("torch")
    subprocess.run(
        [sys.executable, "-c", _DYNAMO_EXPORT, str(tmp_path)], check=True, capture_output=True
    )
    model = onnx.load(tmp_path / "model.onnx")
    expected = np.load(tmp_path / "expected.npz")
    assert _declared(model.graph.input[0]) == ["batch", "seq", 8]
    assert 17 in _declared(model.graph.output[0])  # the traced length, declared
    assert [h.kind for h in diagnostics.find_hazards(ir.serde.deserialize_model(model))].count(
        "declared-output-shape"
    ) == 1

    after = rnn_rewrite_rules.rewrite(model)
    declared = [_declared(v) for v in after.graph.output]
    assert declared[0] == ["batch", "seq", 4]
    for seq in (5, 30, 17):
        x = expected[f"x{seq}"]
        names = {"batch": x.shape[0], "seq": seq}
        got = runtime.run(after, {"x": x})
        want = [expected[f"y{seq}"], expected[f"h{seq}"]]
        for shape, array, value in zip(declared, got, want, strict=True):
            assert [names.get(d, d) if isinstance(d, str) else d for d in shape] == list(
                array.shape
            )
            np.testing.assert_allclose(array, value, rtol=1e-4, atol=1e-5)

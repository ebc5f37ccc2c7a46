"""``--check`` gives a reason for every RNN it leaves: hand-built bidirectional halves whose
states are per-direction 1-D graph inputs and outputs (a 3-layer stack with peepholes)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules.cli import main


def _hand_built_bidirectional(
    layers: int = 3, features: int = 4, hidden: int = 3
) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes: list[onnx.NodeProto] = []
    inits = [
        numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        numpy_helper.from_array(np.array([0, 1], np.int64), "ax01"),
        numpy_helper.from_array(np.array([-1], np.int64), "rev_start"),
        numpy_helper.from_array(np.array([np.iinfo(np.int64).min], np.int64), "rev_end"),
        numpy_helper.from_array(np.array([0], np.int64), "ax0"),
        numpy_helper.from_array(np.array([-1], np.int64), "rev_step"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", features])]
    outputs = []
    nodes.append(helper.make_node("Unsqueeze", ["x", "ax1"], ["x3"], name="unsqueeze_x"))
    layer_in, size = "x3", features

    def rev(src: str, dst: str, name: str) -> None:
        nodes.append(
            helper.make_node(
                "Slice", [src, "rev_start", "rev_end", "ax0", "rev_step"], [dst], name=name
            )
        )

    for layer in range(layers):
        halves = []
        for d in ("f", "b"):
            p = f"l{layer}_{d}"
            for w, shape in (
                ("W", [1, 4 * hidden, size]),
                ("R", [1, 4 * hidden, hidden]),
                ("B", [1, 8 * hidden]),
                ("P", [1, 3 * hidden]),
            ):
                inits.append(
                    numpy_helper.from_array(
                        (rng.standard_normal(shape) * 0.3).astype(np.float32), f"{p}_{w}"
                    )
                )
            states = []
            for s in ("h", "c"):
                inputs.append(
                    helper.make_tensor_value_info(f"{p}_{s}", TensorProto.FLOAT, [hidden])
                )
                nodes.append(helper.make_node("Unsqueeze", [f"{p}_{s}", "ax01"], [f"{p}_{s}3"]))
                states.append(f"{p}_{s}3")
            x = layer_in
            if d == "b":
                rev(layer_in, f"{p}_xrev", f"{p}_reverse_input")
                x = f"{p}_xrev"
            nodes.append(
                helper.make_node(
                    "LSTM",
                    [x, f"{p}_W", f"{p}_R", f"{p}_B", "", *states, f"{p}_P"],
                    [f"{p}_Y", f"{p}_Yh", f"{p}_Yc"],
                    name=f"{p}_lstm",
                    hidden_size=hidden,
                )
            )
            for s, y in (("h", "Yh"), ("c", "Yc")):
                nodes.append(helper.make_node("Squeeze", [f"{p}_{y}", "ax01"], [f"{p}_{s}_out"]))
                outputs.append(
                    helper.make_tensor_value_info(f"{p}_{s}_out", TensorProto.FLOAT, [hidden])
                )
            y = f"{p}_Y"
            if d == "b":
                rev(y, f"{p}_Yback", f"{p}_reverse_output")
                y = f"{p}_Yback"
            nodes.append(helper.make_node("Squeeze", [y, "ax1"], [f"{p}_y3"]))
            halves.append(f"{p}_y3")
        nodes.append(helper.make_node("Concat", halves, [f"l{layer}_out"], axis=2))
        layer_in, size = f"l{layer}_out", 2 * hidden
    nodes.append(helper.make_node("Squeeze", [layer_in, "ax1"], ["y"]))
    outputs.insert(0, helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 2 * hidden]))
    graph = helper.make_graph(nodes, "hand_bidirectional", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_the_built_stack_runs() -> None:
    model = _hand_built_bidirectional()
    session = ort.InferenceSession(model.SerializeToString())
    feeds = {i.name: np.zeros([3], np.float32) for i in model.graph.input[1:]}
    feeds["x"] = np.ones([5, 4], np.float32)
    assert session.run(["y"], feeds)[0].shape == (5, 6)


def test_check_gives_a_reason_for_every_half(tmp_path, capsys) -> None:
    path = tmp_path / "hand_bidirectional.onnx"
    onnx.save(_hand_built_bidirectional(), path)
    before = path.read_bytes()
    assert main([str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert path.read_bytes() == before
    assert "RNN nodes not improved (6 of 6)" in out, out
    section = out.split("RNN nodes not improved")[1].split("\nhazards")[0]
    blocks = re.split(r"\n  (?=LSTM ')", section)[1:]
    names = [block.split("\n")[0] for block in blocks]
    assert names == [f"LSTM 'l{i}_{d}_lstm'" for i in range(3) for d in "fb"], names
    for block in blocks:
        whys = [line for line in block.splitlines() if line.strip().startswith("why:")]
        specific = [w for w in whys if "no rule matched" not in w]
        assert specific, block  # what stopped the merge, not only that nothing matched
    assert "reverse half LSTM 'l0_b_lstm'" in blocks[0] and "Y_h or Y_c is read" in blocks[0]

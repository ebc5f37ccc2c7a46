"""``--check`` names axes unrolled to the traced length (torch dynamo's nn.RNN, cell loops),
proven from per-step reads, never from value_info; Tensordot and step reshapes are not."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules import diagnostics
from rnn_rewrite_rules.cli import main
from tests.exporter_files import DATA

DYNAMO = DATA / "torch_dynamo"


def _frozen(model: onnx.ModelProto) -> list[diagnostics.Hazard]:
    hazards = diagnostics.find_hazards(ir.serde.deserialize_model(model))
    return [h for h in hazards if h.kind == "frozen-axis"]


@pytest.mark.parametrize(
    ("name", "reader"),
    [
        ("rnn_tanh", "SequenceAt x5"),
        ("rnn_relu_2layer", "SequenceAt x5"),
        ("lstmcell_loop", "Gather x5"),
        ("grucell_loop", "Gather x5"),
    ],
)
def test_torch_dynamo_unrolled_sequence_axis_is_named(name: str, reader: str) -> None:
    unrolled = [h for h in _frozen(onnx.load(DYNAMO / f"{name}.onnx")) if h.unrolled]
    assert len(unrolled) == 1, unrolled
    hazard = unrolled[0]
    assert hazard.unrolled == "s77" and reader in hazard.node
    assert "unrolled to the traced length 5" in hazard.message
    assert "'s77' is axis 0 of input 'x'" in hazard.message


def test_the_hazard_is_real_at_a_longer_input() -> None:
    """What the hazard claims: 7 steps in, 5 out, silently."""
    session = ort.InferenceSession(str(DYNAMO / "lstmcell_loop.onnx"))
    x = np.random.default_rng(0).standard_normal((7, 2, 6)).astype(np.float32)
    assert session.run(None, {"x": x})[0].shape[0] == 5


@pytest.mark.parametrize(
    "path",
    [
        DATA / "tf2onnx" / "lstm_dense.onnx",
        DATA / "tf2onnx" / "encoder_decoder_lstm.onnx",
        DYNAMO / "lstm_step.onnx",
        DYNAMO / "gru_step.onnx",
        DATA / "torch_script" / "lstm_step.onnx",
        DATA / "torch_script" / "gru_step.onnx",
    ],
    ids=lambda p: f"{p.parent.name}/{p.stem}",
)
def test_tensordot_and_step_reshapes_freeze_nothing(path, capsys) -> None:
    """Keras Dense's ``Reshape [-1, 8]`` and a step's ``Reshape [-1, 1, 8]`` (after the
    rewrite, on ``Y [1, 1, batch, 8]``): the -1 takes every symbolic axis, the constant axes
    around it kept. Checked before and after the rewrite."""
    assert _frozen(onnx.load(path)) == []
    assert main([str(path), "--check"]) == 0
    assert "[frozen-axis]" not in capsys.readouterr().out


# --- built near misses ----------------------------------------------------------------


def _reads(op: str, indices: list[int], seq: str | int = "seq") -> onnx.ModelProto:
    """``x [seq, 3]`` read one step at a time by ``op`` at ``indices``, the reads summed."""
    nodes, inits, outs = [], [], []
    for i, index in enumerate(indices):
        if op == "Gather":
            inits.append(numpy_helper.from_array(np.array(index, np.int64), f"i{i}"))
            nodes.append(helper.make_node("Gather", ["x", f"i{i}"], [f"r{i}"], axis=0))
        else:
            for part, value in (("s", index), ("e", index + 1), ("a", 0)):
                inits.append(numpy_helper.from_array(np.array([value], np.int64), f"{part}{i}"))
            nodes.append(helper.make_node("Slice", ["x", f"s{i}", f"e{i}", f"a{i}"], [f"r{i}"]))
        outs.append(f"r{i}")
    nodes.append(helper.make_node("Sum", outs, ["y"]))
    graph = helper.make_graph(
        nodes,
        "reads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("op", ["Gather", "Slice"])
def test_built_chain_of_reads_is_found(op: str) -> None:
    hazards = _frozen(_reads(op, [0, 1, 2]))
    assert [h.unrolled for h in hazards] == ["seq"]
    assert "traced length 3" in hazards[0].message


@pytest.mark.parametrize(
    ("indices", "seq"),
    [
        ([0], "seq"),  # one read: the first frame, not an unroll
        ([0, 2], "seq"),  # not every step
        ([0, -1], "seq"),  # first and last: right at every length
        ([0, 1, 2], 3),  # a static axis
    ],
)
@pytest.mark.parametrize("op", ["Gather", "Slice"])
def test_near_miss_reads_are_not_unrolls(op: str, indices: list[int], seq) -> None:
    assert _frozen(_reads(op, indices, seq)) == []


def test_value_info_does_not_make_an_unroll() -> None:
    model = _reads("Gather", [0])
    model.graph.value_info.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3]))
    assert _frozen(model) == []


def _split(sizes: list[int] | None, squeeze: bool) -> onnx.ModelProto:
    count = 3
    inputs = ["x"]
    inits = []
    if sizes is not None:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        inputs.append("sizes")
    attrs = {} if sizes is not None else {"num_outputs": count}
    parts = [f"p{i}" for i in range(count)]
    nodes = [helper.make_node("Split", inputs, parts, axis=0, **attrs)]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "zero"))
    if squeeze:
        nodes += [helper.make_node("Squeeze", [p, "zero"], [f"q{p}"]) for p in parts]
        parts = [f"q{p}" for p in parts]
    nodes.append(helper.make_node("Concat", parts, ["y"], axis=0))
    graph = helper.make_graph(
        nodes,
        "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_split_into_single_steps_is_an_unroll() -> None:
    assert [h.unrolled for h in _frozen(_split([1, 1, 1], squeeze=False))] == ["seq"]
    assert [h.unrolled for h in _frozen(_split(None, squeeze=True))] == ["seq"]


def test_split_into_thirds_is_not() -> None:
    """``num_outputs=3`` without per-step squeezes: thirds of any multiple of 3."""
    assert _frozen(_split(None, squeeze=False)) == []
    assert _frozen(_split([2, 2, 2], squeeze=False)) == []


# --- the CLI --------------------------------------------------------------------------


def test_check_names_the_unroll_and_the_window_the_reroll_keeps(capsys) -> None:
    """The re-rolled LSTM reads ``Slice(x, 0, 5)``: equal to the original, which gives 5
    steps at a longer input, so the axis stays frozen and the report must not call it
    dynamic (it did: the window was not a hazard)."""
    # target onnxruntime: the portable table keeps this chain unrolled (OpenVINO's LSTM at
    # its nearest measured cell is not clearly no slower)
    assert main([str(DYNAMO / "lstmcell_loop.onnx"), "--check", "--target", "onnxruntime"]) == 0
    out = capsys.readouterr().out
    found = [line for line in out.splitlines() if "[frozen-axis]" in line]
    assert len(found) == 2, out
    assert "Gather" in found[0] and "'s77'" in found[0] and "traced length 5" in found[0]
    assert "Slice" in found[1] and "window 0..4" in found[1] and "'s77'" in found[1]
    assert "now truly dynamic" not in out


def test_check_keeps_the_hazard_where_nothing_rerolls(capsys) -> None:
    assert main([str(DYNAMO / "rnn_tanh.onnx"), "--check", "--target", "portable"]) == 0
    out = capsys.readouterr().out
    assert "traced length 5" in out and "now truly dynamic" not in out

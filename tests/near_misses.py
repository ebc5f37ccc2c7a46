"""Near-miss tests' models: one RNN on tiny weights, and the assertion that a family
refuses such a model for one exact reason (and leaves it as it was)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import rnn_rewrite_rules
from tests.reasons import refusal_reasons

H, INPUT, BATCH = 3, 2, 2
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def weights(directions: int = 1, gates: int = 4) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(0)
    return [
        numpy_helper.from_array(
            rng.standard_normal((directions, gates * H, INPUT)).astype(np.float32), "w"
        ),
        numpy_helper.from_array(
            rng.standard_normal((directions, gates * H, H)).astype(np.float32), "r"
        ),
    ]


def rnn_model(
    nodes: list[onnx.NodeProto],
    *,
    x_shape: list | None = ("seq", "batch", INPUT),  # type: ignore[assignment]
    inputs: tuple[onnx.ValueInfoProto, ...] = (),
    outputs: tuple[str, ...] = ("y",),
    constants: dict[str, np.ndarray] | None = None,
    directions: int = 1,
    gates: int = 4,
) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", FLOAT, None if x_shape is None else list(x_shape))
    graph = helper.make_graph(
        nodes,
        "g",
        [x, *inputs],
        [helper.make_empty_tensor_value_info(name) for name in outputs],
        [
            *weights(directions, gates),
            *(numpy_helper.from_array(a, n) for n, a in (constants or {}).items()),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def kept(model: onnx.ModelProto) -> list[tuple[str, list[str], list[str]]]:
    """The RNN nodes' inputs and the producers of graph outputs (what the rules replace;
    unused outputs may go), trailing empty names dropped (serialization drops them too)."""
    outputs = {o.name for o in model.graph.output}

    def strip(names: Iterable[str]) -> list[str]:
        names = list(names)
        while names and not names[-1]:
            names.pop()
        return names

    return [
        (n.op_type, strip(n.input), [o for o in n.output if o in outputs])
        for n in model.graph.node
        if n.op_type in ("LSTM", "GRU", "RNN") or outputs & set(n.output)
    ]


def assert_refused(family, model: onnx.ModelProto, reason: str) -> None:
    after = rnn_rewrite_rules.rewrite(model, [family.name])
    assert kept(after) == kept(model)
    reasons = refusal_reasons(family.rules, model)
    assert reason in reasons, reasons  # the whole reason, not a part of it


def zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


def gru_node(outputs: list[str], **attrs: int) -> onnx.NodeProto:
    return helper.make_node("GRU", ["x", "w", "r"], outputs, hidden_size=H, **attrs)

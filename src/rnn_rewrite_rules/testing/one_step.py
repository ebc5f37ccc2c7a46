"""Build one streaming step as torch 2.13 ``dynamo=True`` writes ``nn.LSTMCell`` /
``nn.GRUCell`` / ``nn.RNNCell`` called once, the state in and out as graph inputs and
outputs.

* LSTM: ``Split(Gemm(h, W_hh, b_hh) + Gemm(x, W_ih, b_ih), 4)`` in PyTorch's gate order
  ``i, f, g, o``; ``c_out = sigmoid(f) * c + sigmoid(i) * tanh(g)``,
  ``h_out = sigmoid(o) * tanh(c_out)``;
* GRU: ``Split(Gemm(x, ...), 3)``, ``Split(Gemm(h, ...), 3)`` (order ``r, z, n``),
  ``n = tanh(xn + r * hn)``, ``h_out = (h - n) * z + n``;
* RNN: ``h_out = act(Gemm(x, ...) + Gemm(h, ...))``.

``batch``: a number or a name, every input's and output's first axis (torch writes one
``dim_param`` for all: ONNX does not tie equal names, so the rules do not take them as one
size). :data:`STEP_MUTATIONS` make near misses.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["STEP_MUTATIONS", "StepConfig", "build_step", "step_feeds"]

#: Near misses: ``peephole`` (LSTM: ``P * c`` added to the f gate's pre-activation),
#: ``clip`` (a Clip on the cell state), ``leaky`` (RNN: LeakyRelu, an activation with a
#: parameter), ``gate_read_outside`` (a gate is also a graph output), ``float64``.
STEP_MUTATIONS = ("peephole", "clip", "leaky", "gate_read_outside", "float64")
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


@dataclasses.dataclass(frozen=True)
class StepConfig:
    op_type: str = "LSTM"
    input_size: int = 6
    hidden_size: int = 8
    batch: int | str = "batch"
    activation: str = "Tanh"  # RNN only
    mutation: str | None = None
    seed: int = 0
    opset: int = 20
    #: False: each projection ``MatMul(v, W^T) + b`` (two nodes, as jax2onnx's and
    #: hand-written steps spell it) instead of one ``Gemm``
    gemm: bool = True


def _weights(cfg: StepConfig) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(cfg.seed)
    gates, hidden = _GATES[cfg.op_type], cfg.hidden_size
    scale = 1 / np.sqrt(hidden)
    dtype = np.float64 if cfg.mutation == "float64" else np.float32

    def draw(*shape: int) -> np.ndarray:
        return rng.uniform(-scale, scale, shape).astype(dtype)

    return {
        "weight_ih": draw(gates * hidden, cfg.input_size),
        "weight_hh": draw(gates * hidden, hidden),
        "bias_ih": draw(gates * hidden),
        "bias_hh": draw(gates * hidden),
        "peephole": draw(hidden),
    }


class _Nodes(list):
    """The step's nodes, each named for its position and op; projections by ``Gemm`` or
    by ``MatMul`` + ``Add`` (``gemm``)."""

    def __init__(self, gemm: bool = True) -> None:
        super().__init__()
        self.use_gemm = gemm

    def add(self, op: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        self.append(helper.make_node(op, inputs, outputs, name=f"n{len(self)}_{op}", **attrs))

    def gemm(self, v: str, kind: str, out: str) -> None:
        if self.use_gemm:
            self.add("Gemm", [v, f"weight_{kind}", f"bias_{kind}"], [out], transB=1)
            return
        self.add("MatMul", [v, f"weight_{kind}_t"], [f"{out}_mm"])
        self.add("Add", [f"{out}_mm", f"bias_{kind}"], [out])


def _lstm_step(nodes: _Nodes, cfg: StepConfig) -> list[str]:
    """An ``nn.LSTMCell`` step; the gate values read outside it (a mutation)."""
    nodes.gemm("h", "hh", "gh")
    nodes.gemm("x", "ih", "gx")
    nodes.add("Add", ["gh", "gx"], ["gates"])
    nodes.add("Split", ["gates"], ["i", "f", "g", "o"], axis=1, num_outputs=4)
    f_pre = "f"
    if cfg.mutation == "peephole":
        nodes.add("Mul", ["peephole", "c"], ["pc"])
        nodes.add("Add", ["f", "pc"], ["f_peep"])
        f_pre = "f_peep"
    nodes.add("Sigmoid", ["i"], ["si"])
    nodes.add("Sigmoid", [f_pre], ["sf"])
    nodes.add("Tanh", ["g"], ["tg"])
    nodes.add("Sigmoid", ["o"], ["so"])
    nodes.add("Mul", ["sf", "c"], ["fc"])
    nodes.add("Mul", ["si", "tg"], ["ig"])
    c_out = "c_sum" if cfg.mutation == "clip" else "c_out"
    nodes.add("Add", ["fc", "ig"], [c_out])
    if cfg.mutation == "clip":
        nodes.add("Clip", ["c_sum", "lo", "hi"], ["c_out"])
    nodes.add("Tanh", ["c_out"], ["tc"])
    nodes.add("Mul", ["so", "tc"], ["h_out"])
    return ["sf"] if cfg.mutation == "gate_read_outside" else []


def _gru_step(nodes: _Nodes, cfg: StepConfig) -> list[str]:
    """An ``nn.GRUCell`` step; the gate values read outside it (a mutation)."""
    nodes.gemm("x", "ih", "gx")
    nodes.add("Split", ["gx"], ["xr", "xz", "xn"], axis=1, num_outputs=3)
    nodes.gemm("h", "hh", "gh")
    nodes.add("Split", ["gh"], ["hr", "hz", "hn"], axis=1, num_outputs=3)
    nodes.add("Add", ["hr", "xr"], ["r_pre"])
    nodes.add("Sigmoid", ["r_pre"], ["r"])
    nodes.add("Add", ["hz", "xz"], ["z_pre"])
    nodes.add("Sigmoid", ["z_pre"], ["z"])
    nodes.add("Mul", ["hn", "r"], ["rhn"])
    nodes.add("Add", ["xn", "rhn"], ["n_pre"])
    nodes.add("Tanh", ["n_pre"], ["n"])
    nodes.add("Sub", ["h", "n"], ["hmn"])
    nodes.add("Mul", ["hmn", "z"], ["zh"])
    nodes.add("Add", ["zh", "n"], ["h_out"])
    return ["z"] if cfg.mutation == "gate_read_outside" else []


def _rnn_step(nodes: _Nodes, cfg: StepConfig) -> list[str]:
    """An ``nn.RNNCell`` step; the values read outside it (a mutation)."""
    nodes.gemm("x", "ih", "gx")
    nodes.gemm("h", "hh", "gh")
    nodes.add("Add", ["gx", "gh"], ["pre"])
    if cfg.mutation == "leaky":
        nodes.add("LeakyRelu", ["pre"], ["h_out"], alpha=0.1)
    else:
        nodes.add(cfg.activation, ["pre"], ["h_out"])
    return ["gh"] if cfg.mutation == "gate_read_outside" else []


def _step_initializers(cfg: StepConfig, w: dict[str, np.ndarray]) -> list[onnx.TensorProto]:
    weights = [
        (w[k], k) if cfg.gemm else (w[k].T.copy(), f"{k}_t") for k in ("weight_ih", "weight_hh")
    ]
    biases = [(w[k], k) for k in ("bias_ih", "bias_hh")]
    initializers = [numpy_helper.from_array(array, name) for array, name in weights + biases]
    if cfg.mutation == "peephole":
        initializers.append(numpy_helper.from_array(w["peephole"], "peephole"))
    if cfg.mutation == "clip":
        dtype = np.float64 if cfg.mutation == "float64" else np.float32
        initializers += [
            numpy_helper.from_array(np.array(-1.0, dtype), "lo"),
            numpy_helper.from_array(np.array(1.0, dtype), "hi"),
        ]
    return initializers


def build_step(cfg: StepConfig) -> onnx.ModelProto:
    """The step model: inputs ``x``, ``h`` (, ``c``), outputs ``h_out`` (, ``c_out``)."""
    w = _weights(cfg)
    elem = TensorProto.DOUBLE if cfg.mutation == "float64" else TensorProto.FLOAT
    nodes = _Nodes(cfg.gemm)
    op, hidden = cfg.op_type, cfg.hidden_size
    state_names = ["h", "c"] if op == "LSTM" else ["h"]
    step = {"LSTM": _lstm_step, "GRU": _gru_step}.get(op, _rnn_step)
    extra_outputs = step(nodes, cfg)
    batch = cfg.batch

    def info(name: str, width: int | str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, [batch, width])

    graph = helper.make_graph(
        list(nodes),
        f"{op.lower()}_step",
        [info("x", cfg.input_size)] + [info(s, hidden) for s in state_names],
        [info(f"{s}_out", hidden) for s in state_names] + [info(v, hidden) for v in extra_outputs],
        _step_initializers(cfg, w),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", cfg.opset)])
    model.ir_version = 10
    return model


def step_feeds(model: onnx.ModelProto, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds for one call at ``batch`` (every symbolic axis)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        kind = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else batch for d in kind.shape.dim]
        dtype = np.float64 if kind.elem_type == TensorProto.DOUBLE else np.float32
        feeds[value.name] = rng.standard_normal(dims).astype(dtype)
    return feeds

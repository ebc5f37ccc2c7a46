"""Build a chain of one-step RNN nodes: a layer called once per step, as torch exports it.

``nn.GRU(I, H, batch_first=True)`` called on ``x[:, t:t+1]`` for each ``t`` with the
state it returned (a seq2seq encoder): per step ``Slice(x, [t], [t+1], [1])``, a
``Transpose`` to time-major, the node, ``Squeeze(Y, [1])`` and a ``Transpose`` back,
the steps' outputs stacked by ``Concat(axis=1)``. The mutations make near misses.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["MUTATIONS", "Seq1ChainConfig", "build_seq1_chain", "seq1_chain_feeds"]

_GATES = {"GRU": 3, "RNN": 1, "LSTM": 4}
#: What makes a near miss: ``weights``: the last step reads other weights; ``depends``:
#: the last step's X is a row of ``x`` plus the first step's output (input size = hidden);
#: ``state``: the state is doubled between the first two steps; ``reverse``: the last step
#: runs in reverse; ``late_reader``: a step's Y is read before the last step runs;
#: ``shuffled``: the steps read rows 0, 2, 1, ... of x (a Concat of the rows, not one Slice).
MUTATIONS = ("weights", "depends", "state", "reverse", "late_reader", "shuffled")


@dataclasses.dataclass(frozen=True)
class Seq1ChainConfig:
    op_type: Literal["GRU", "RNN", "LSTM"] = "GRU"
    input_size: int = 6
    hidden_size: int = 8
    steps: int = 4
    #: ``input``: h0 (and c0) are graph inputs ``[1, batch, H]``; ``none``: absent
    initial_state: Literal["input", "none"] = "input"
    #: the traced length of x's sequence axis: None keeps it symbolic
    seq: int | None = None
    mutation: str | None = None
    opset: int = 17
    seed: int = 0


def _weights(cfg: Seq1ChainConfig, rng: np.random.Generator, tag: str) -> list[onnx.TensorProto]:
    rows = _GATES[cfg.op_type] * cfg.hidden_size
    shapes = {"W": (1, rows, cfg.input_size), "R": (1, rows, cfg.hidden_size), "B": (1, 2 * rows)}
    bound = 1 / np.sqrt(cfg.hidden_size)  # torch's initialisation: U(-1/sqrt(H), 1/sqrt(H))
    return [
        numpy_helper.from_array(
            rng.uniform(-bound, bound, shape).astype(np.float32), f"{name}{tag}"
        )
        for name, shape in shapes.items()
    ]


def _graph_io(
    cfg: Seq1ChainConfig, nodes: list[onnx.NodeProto]
) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """The graph's inputs and outputs; the ``late_reader`` mutation's early reader of step
    0's ``Y`` is inserted into ``nodes`` here."""
    lstm = cfg.op_type == "LSTM"
    seq = cfg.seq if cfg.seq is not None else "seq"
    graph_inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", seq, cfg.input_size])
    ]
    states = (["h0"] + (["c0"] if lstm else [])) if cfg.initial_state == "input" else []
    graph_inputs += [
        helper.make_tensor_value_info(s, TensorProto.FLOAT, [1, "batch", cfg.hidden_size])
        for s in states
    ]
    graph_outputs = [
        helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["batch", cfg.steps, cfg.hidden_size]
        ),
        helper.make_tensor_value_info("h_n", TensorProto.FLOAT, [1, "batch", cfg.hidden_size]),
    ]
    if cfg.mutation == "late_reader":
        graph_outputs.append(
            helper.make_tensor_value_info("y0", TensorProto.FLOAT, [1, 1, "batch", cfg.hidden_size])
        )
        # the reader of y0 (the graph output) is fine; a node reading it before the last step
        # is the near miss: an Identity right after step 0
        index = next(i for i, n in enumerate(nodes) if n.name == "step0") + 1
        nodes.insert(index, helper.make_node("Identity", ["y0"], ["y0_early"]))
        graph_outputs.append(
            helper.make_tensor_value_info(
                "y0_early", TensorProto.FLOAT, [1, 1, "batch", cfg.hidden_size]
            )
        )
    return graph_inputs, graph_outputs


def build_seq1_chain(cfg: Seq1ChainConfig) -> onnx.ModelProto:
    """The model for ``cfg`` (inputs ``x [batch, seq, I]``, ``h0``/``c0``; outputs ``y
    [batch, steps, H]`` and ``h_n``)."""
    rng = np.random.default_rng(cfg.seed)
    lstm = cfg.op_type == "LSTM"
    inits = _weights(cfg, rng, "")
    nodes: list[onnx.NodeProto] = []
    ints = {}

    def const(*values: int) -> str:
        name = "c_" + "_".join(str(v).replace("-", "m") for v in values)
        if name not in ints:
            ints[name] = numpy_helper.from_array(np.array(values, np.int64), name)
        return name

    def squeeze1(value: str, out: str) -> onnx.NodeProto:
        if cfg.opset < 13:
            return helper.make_node("Squeeze", [value], [out], axes=[1])
        return helper.make_node("Squeeze", [value, const(1)], [out])

    h = "h0" if cfg.initial_state == "input" else ""
    c = "c0" if cfg.initial_state == "input" and lstm else ""
    rows = list(range(cfg.steps))
    if cfg.mutation == "shuffled" and cfg.steps >= 3:
        rows[1], rows[2] = rows[2], rows[1]
    outs, first_y = [], ""
    for t in range(cfg.steps):
        nodes.append(
            helper.make_node(
                "Slice", ["x", const(rows[t]), const(rows[t] + 1), const(1)], [f"s{t}"]
            )
        )
        x_t = f"x{t}"
        nodes.append(helper.make_node("Transpose", [f"s{t}"], [x_t], perm=[1, 0, 2]))
        last = t == cfg.steps - 1
        if cfg.mutation == "depends" and last:  # row t of x + step 0's Y (I == H)
            nodes.append(squeeze1(first_y, "y0_row"))
            nodes.append(helper.make_node("Transpose", ["y0_row"], ["y0_bf"], perm=[1, 0, 2]))
            nodes.append(helper.make_node("Add", ["x", "y0_bf"], ["x_dep"]))
            nodes.append(
                helper.make_node(
                    "Slice", ["x_dep", const(rows[t]), const(rows[t] + 1), const(1)], ["s_dep"]
                )
            )
            x_t = "x_dep_t"
            nodes.append(helper.make_node("Transpose", ["s_dep"], [x_t], perm=[1, 0, 2]))
        tag = ""
        if cfg.mutation == "weights" and last:
            inits += _weights(cfg, rng, "_other")
            tag = "_other"
        attrs: dict = {"hidden_size": cfg.hidden_size}
        if cfg.op_type == "GRU":
            attrs["linear_before_reset"] = 1
        if cfg.mutation == "reverse" and last:
            attrs["direction"] = "reverse"
        inputs = [x_t, f"W{tag}", f"R{tag}", f"B{tag}", "", h] + ([c] if lstm else [])
        outputs = [f"y{t}", f"hs{t}"] + ([f"cs{t}"] if lstm else [])
        nodes.append(helper.make_node(cfg.op_type, inputs, outputs, name=f"step{t}", **attrs))
        first_y = first_y or f"y{t}"
        h, c = f"hs{t}", (f"cs{t}" if lstm else "")
        if cfg.mutation == "state" and t == 0:
            nodes.append(helper.make_node("Add", [h, h], ["h_twice"]))
            h = "h_twice"
        nodes.append(squeeze1(f"y{t}", f"q{t}"))
        nodes.append(helper.make_node("Transpose", [f"q{t}"], [f"o{t}"], perm=[1, 0, 2]))
        outs.append(f"o{t}")
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=1))
    nodes.append(helper.make_node("Identity", [h], ["h_n"]))
    graph_inputs, graph_outputs = _graph_io(cfg, nodes)
    graph = helper.make_graph(
        nodes, "seq1_chain", graph_inputs, graph_outputs, initializer=inits + list(ints.values())
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", cfg.opset)])
    model.ir_version = 10
    return model


def seq1_chain_feeds(
    model: onnx.ModelProto, batch: int, seq: int, seed: int = 0
) -> dict[str, np.ndarray]:
    """Random feeds: ``batch`` and ``seq`` for the symbolic sizes of ``x``, ``h0``, ``c0``."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dims = []
        for d in value.type.tensor_type.shape.dim:
            dims.append(
                d.dim_value if d.HasField("dim_value") else {"batch": batch}.get(d.dim_param, seq)
            )
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds

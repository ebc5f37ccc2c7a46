"""Build recurrent layers written as ONNX ``Loop`` / ``Scan`` nodes, as converters write them.

Forms (:attr:`LoopSpec.form`):

* ``"keras"``: tf2onnx on a Keras 3 ``LSTM``/``GRU``/``SimpleRNN`` (the
  ``mk8dx-table-reader`` model): a ``Loop`` with a constant trip count ``T``, an int32
  counter carried beside the iteration number, the condition
  ``Less(float(iteration), T) And Less(float(counter + 1), T)``, the step input
  ``Gather(X, counter)`` of the sequence outside the body, the kernel, recurrent kernel
  and bias carried as loop invariants, ``Split`` into gates in Keras order (``i, f, c, o``;
  GRU ``z, r, h``) and the recurrent kernel ``Slice``-d per gate, every weight ``Cast``
  each step when the cell computes in float16, and ``h_t`` stacked as a scan output;
* ``"torch"``: a ``torch.export`` ``while_loop``-style ``Loop``: ``Gather(X, iteration)``,
  one ``MatMul`` per operand, ``Split`` of the sum in PyTorch gate order (``i, f, g, o``;
  GRU ``r, z, n`` with ``(h - n) * z + n``), the condition passed through;
* ``"tf1"``: tf2onnx on TF 1's ``BasicLSTMCell`` / ``GRUCell`` / ``BasicRNNCell`` in a
  ``while_loop`` (the Keras form's loop): one ``MatMul(Concat(x_t, h_(t-1), axis=1),
  kernel)`` and bias, ``Split`` in TF's order ``i, j, f, o`` and ``forget_bias`` 1 added
  to ``f``; the GRU's gates ``Split(Sigmoid(...))`` into ``r, u``, its candidate
  ``Tanh(MatMul(Concat(x_t, r * h), kernel) + bias)``;
* ``"scan"``: an older converter's ``Scan`` with the states carried and ``X`` the scan
  input (``Gemm`` projections, ONNX gate order ``i, o, f, c``).

``direction="reverse"`` reverses ``X`` before the node (``ReverseSequence`` with every
length the sequence's, the Keras ``go_backwards`` form; a Scan reads it backwards) and
the stacked output back. :data:`NEAR_MISSES` are the twins a rule must refuse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["GATES", "NEAR_MISSES", "LoopSpec", "build_loop_model", "loop_inputs"]

#: Gates per cell.
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}

#: Near-miss twins: what each breaks.
NEAR_MISSES = {
    "early_exit": "the condition turns false two steps before the trip count",
    "not_the_state": "the carried h is h_t * 0.5, not h_t",
    "shifted_step": "the step input is X[t + 1] (runs when X has a step more than T)",
    "side_output": "the body also stacks c_t (or h_(t-1)), read as a graph output",
    "wrong_gate": "the forget gate multiplies the Tanh candidate instead of c_(t-1)",
    "state_not_hidden": "the initial c is [batch, 1], broadcast over H by the body",
}


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    """One recurrent layer as a Loop or Scan (see the module docstring)."""

    cell: Literal["LSTM", "GRU", "RNN"] = "LSTM"
    form: Literal["keras", "tf1", "torch", "scan"] = "keras"
    input_size: int = 5
    hidden_size: int = 4
    steps: int = 6  # the Loop's constant trip count (the sequence length it reads)
    direction: Literal["forward", "reverse"] = "forward"
    float16: bool = False
    activation: Literal["Tanh", "Relu"] = "Tanh"  # RNN's; LSTM's g and h, GRU's n (Keras')
    linear_before_reset: int = 1  # GRU (Keras reset_after)
    near_miss: str | None = None
    opset: int = 13
    outputs: tuple[str, ...] = ("y",)  # "y" (stacked h_t), "h", "c" (final states)
    trip_count: Literal["constant", "length"] = "constant"  # "length": Gather(Shape(X), 0)
    bidirectional: bool = False  # a forward and a backward layer, Concat on axis 2 ("y" only)
    static_seq: bool = False  # x declared [steps, batch, I] (a fixed-length export)
    state_inputs: bool = False  # h0 (and c0) graph inputs [state_batch, H], not zeros
    seed: int = 0

    @property
    def dtype(self) -> type:
        return np.float16 if self.float16 else np.float32


def _const(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.asarray(array), name)
    )


class _Body:
    """Nodes of a body, with fresh names."""

    def __init__(self, prefix: str, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.prefix = prefix
        self.count = 0

    def add(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs) -> list[str]:
        if op_type == "Split" and self.opset >= 18:
            attrs["num_outputs"] = outputs  # opset 18 wants the count said
        names = []
        for _ in range(outputs):
            self.count += 1
            names.append(f"{self.prefix}{op_type.lower()}_{self.count}")
        self.nodes.append(helper.make_node(op_type, inputs, names, **attrs))
        return names

    def one(self, op_type: str, inputs: list[str], **attrs) -> str:
        return self.add(op_type, inputs, 1, **attrs)[0]

    def const(self, array: np.ndarray) -> str:
        self.count += 1
        name = f"{self.prefix}const_{self.count}"
        self.nodes.append(_const(name, array))
        return name


@dataclasses.dataclass(frozen=True)
class _Layer:
    """What the Loop or Scan of one layer reads, and where its nodes go."""

    nodes: list  # the outer graph's, appended to
    body: _Body
    x: str
    h0: str
    c0: str | None
    weights: dict[str, np.ndarray]
    elem: int


def _weights(spec: LoopSpec) -> dict[str, np.ndarray]:
    """Keras layout: kernel ``[I, G*H]``, recurrent kernel ``[H, G*H]``, bias ``[G*H]``
    (GRU with ``reset_after``: ``[2, G*H]``), gate blocks in the form's order."""
    rng = np.random.default_rng(spec.seed)
    gates, hidden = GATES[spec.cell], spec.hidden_size
    scale = 1 / np.sqrt(hidden)
    weights = {
        "kernel": rng.uniform(-scale, scale, (spec.input_size, gates * hidden)),
        "recurrent": rng.uniform(-scale, scale, (hidden, gates * hidden)),
        "bias": rng.uniform(-scale, scale, (gates * hidden,)),
        "recurrent_bias": rng.uniform(-scale, scale, (gates * hidden,)),
    }
    if spec.form == "tf1":  # one kernel for the concatenation [x_t, h_(t-1)]
        joined = np.concatenate([weights["kernel"], weights["recurrent"]])
        weights = {"kernel": joined, "bias": weights["bias"]}
        if spec.cell == "GRU":  # the gates r, u; the candidate's own kernel and bias
            weights = {
                "kernel": joined[:, : 2 * hidden],
                "bias": weights["bias"][: 2 * hidden],
                "candidate": joined[:, 2 * hidden :],
                "candidate_bias": weights["bias"][2 * hidden :],
            }
    return {k: v.astype(np.float32) for k, v in weights.items()}


def _gate_names(spec: LoopSpec) -> tuple[str, ...]:
    if spec.cell == "LSTM":
        return {
            "keras": ("i", "f", "c", "o"),
            "tf1": ("i", "c", "f", "o"),
            "torch": ("i", "f", "c", "o"),
            "scan": ("i", "o", "f", "c"),
        }[spec.form]
    if spec.cell == "GRU":
        return ("z", "r", "h") if spec.form != "torch" else ("r", "z", "h")
    return ("h",)


#: Gate name -> (the x part with its bias, the h part with its bias or None when the
#: parts are summed already).
_Pre = dict[str, tuple[str, str | None]]


def _cell(
    spec: LoopSpec, body: _Body, x_t: str, h: str, c: str | None, w: dict[str, str]
) -> tuple[str, str | None]:
    """Emit one cell step; ``w`` names the weights as the body reads them. (h_t, c_t)."""
    if spec.form == "tf1" and spec.cell == "GRU":
        return _tf1_gru_cell(spec, body, x_t, h, w), None
    if spec.form == "tf1":
        pre = _tf1_pre(spec, body, x_t, h, w)
    elif spec.form == "keras":
        pre = _keras_pre(spec, body, x_t, h, w)
    else:
        pre = _projected_pre(spec, body, x_t, h, w)
    if spec.cell == "RNN":
        return body.one(spec.activation, [_summed(body, pre, "h")]), None
    if spec.cell == "LSTM":
        assert c is not None
        return _lstm_state(spec, body, pre, c)
    return _gru_state(spec, body, pre, h), None


def _tf1_gru_cell(spec: LoopSpec, body: _Body, x_t: str, h: str, w: dict[str, str]) -> str:
    """TF 1's GRUCell: gates r, u from ``[x_t, h]``; the candidate from ``[x_t, r * h]``."""
    one = body.const(np.array(1, spec.dtype))
    joined = body.one("Concat", [x_t, h], axis=1)
    gate_sum = body.one("Add", [body.one("MatMul", [joined, w["kernel"]]), w["bias"]])
    r, u = body.add("Split", [body.one("Sigmoid", [gate_sum])], 2, axis=1)
    reset = body.one("Concat", [x_t, body.one("Mul", [r, h])], axis=1)
    candidate_sum = body.one("MatMul", [reset, w["candidate"]])
    candidate_sum = body.one("Add", [candidate_sum, w["candidate_bias"]])
    candidate = body.one(spec.activation, [candidate_sum])
    keep = body.one("Mul", [u, h])
    return body.one("Add", [keep, body.one("Mul", [body.one("Sub", [one, u]), candidate])])


def _tf1_pre(spec: LoopSpec, body: _Body, x_t: str, h: str, w: dict[str, str]) -> _Pre:
    """One kernel over ``[x_t, h]``, split per gate (TF's forget_bias added to f)."""
    names = _gate_names(spec)
    gates = len(names)
    joined = body.one("Concat", [x_t, h], axis=1)
    summed_all = body.one("Add", [body.one("MatMul", [joined, w["kernel"]]), w["bias"]])
    parts = body.add("Split", [summed_all], gates, axis=1) if gates > 1 else [summed_all]
    pre: _Pre = {name: (parts[k], None) for k, name in enumerate(names)}
    if spec.cell == "LSTM":  # TF's forget_bias
        forget_bias = body.const(np.array(1.0, spec.dtype))
        pre["f"] = (body.one("Add", [pre["f"][0], forget_bias]), None)
    return pre


def _keras_pre(spec: LoopSpec, body: _Body, x_t: str, h: str, w: dict[str, str]) -> _Pre:
    """Keras: the kernels and biases split per gate, the recurrent kernel sliced."""
    hidden, names = spec.hidden_size, _gate_names(spec)
    gates = len(names)
    kernels = body.add("Split", [w["kernel"]], gates, axis=1)
    biases = body.add("Split", [w["bias"]], gates, axis=0)
    rbiases: Sequence[str | None] = [None] * gates
    if spec.cell == "GRU" and spec.linear_before_reset:
        rbiases = body.add("Split", [w["recurrent_bias"]], gates, axis=0)
    pre: _Pre = {}
    for k, name in enumerate(names):
        starts = body.const(np.array([0, k * hidden], np.int64))
        ends = body.const(np.array([hidden, (k + 1) * hidden], np.int64))
        axes = body.const(np.array([0, 1], np.int64))
        r_k = body.one("Slice", [w["recurrent"], starts, ends, axes])
        x_part = body.one("Add", [body.one("MatMul", [x_t, kernels[k]]), biases[k]])
        h_part = body.one("MatMul", [h, r_k])
        rbias = rbiases[k]
        if rbias is not None:
            h_part = body.one("Add", [h_part, rbias])
        pre[name] = (x_part, h_part)
    return pre


def _projected_pre(spec: LoopSpec, body: _Body, x_t: str, h: str, w: dict[str, str]) -> _Pre:
    """torch and Scan: both projections whole (Gemm in a Scan), split per gate."""
    names = _gate_names(spec)
    gates = len(names)
    if spec.form == "scan":
        xs = body.one("Gemm", [x_t, w["kernel"], w["bias"]])
        hs = body.one(
            "Gemm", [h, w["recurrent"]] + ([w["recurrent_bias"]] if spec.cell == "GRU" else [])
        )
    else:
        xs = body.one("Add", [body.one("MatMul", [x_t, w["kernel"]]), w["bias"]])
        hs = body.one("MatMul", [h, w["recurrent"]])
        if spec.cell == "GRU":
            hs = body.one("Add", [hs, w["recurrent_bias"]])
    if spec.cell == "GRU":
        x_parts = body.add("Split", [xs], gates, axis=1)
        h_parts = body.add("Split", [hs], gates, axis=1)
        return {name: (x_parts[k], h_parts[k]) for k, name in enumerate(names)}
    parts = body.add("Split", [body.one("Add", [xs, hs])], gates, axis=1)
    return {name: (parts[k], None) for k, name in enumerate(names)}


def _summed(body: _Body, pre: _Pre, name: str) -> str:
    x_part, h_part = pre[name]
    return x_part if h_part is None else body.one("Add", [x_part, h_part])


def _lstm_state(spec: LoopSpec, body: _Body, pre: _Pre, c: str) -> tuple[str, str]:
    i = body.one("Sigmoid", [_summed(body, pre, "i")])
    f = body.one("Sigmoid", [_summed(body, pre, "f")])
    g = body.one(spec.activation, [_summed(body, pre, "c")])
    o = body.one("Sigmoid", [_summed(body, pre, "o")])
    if spec.near_miss == "wrong_gate":
        c_t = body.one("Add", [body.one("Mul", [f, g]), body.one("Mul", [i, g])])
    else:
        c_t = body.one("Add", [body.one("Mul", [f, c]), body.one("Mul", [i, g])])
    return body.one("Mul", [o, body.one(spec.activation, [c_t])]), c_t


def _gru_state(spec: LoopSpec, body: _Body, pre: _Pre, h: str) -> str:
    z = body.one("Sigmoid", [_summed(body, pre, "z")])
    r = body.one("Sigmoid", [_summed(body, pre, "r")])
    x_n, h_n = pre["h"]
    if spec.linear_before_reset:
        if h_n is None:
            raise ValueError("linear_before_reset needs the recurrent part of the new gate")
        n = body.one(spec.activation, [body.one("Add", [x_n, body.one("Mul", [r, h_n])])])
    else:
        # (r * h) @ R_n: the recurrent kernel's n block read again
        assert spec.form == "keras", "linear_before_reset=0 is built in the keras form"
        rh = body.one("Mul", [r, h])
        r_n = body.nodes[[i for i, nd in enumerate(body.nodes) if nd.op_type == "Slice"][2]].output[
            0
        ]
        n = body.one(spec.activation, [body.one("Add", [x_n, body.one("MatMul", [rh, r_n])])])
    if spec.form == "keras":
        one = body.const(np.array(1, spec.dtype))
        keep = body.one("Mul", [z, h])
        new = body.one("Mul", [body.one("Sub", [one, z]), n])
        return body.one("Add", [keep, new])
    return body.one("Add", [body.one("Mul", [body.one("Sub", [h, n]), z]), n])


def _zeros_state(
    graph_nodes: list, x: str, hidden: int, dtype: type, name: str, near_miss: bool
) -> str:
    """``Expand(0, Concat(Shape(X)[1:2], [H]))`` (tf2onnx's zeros of the batch); the
    ``state_not_hidden`` twin: ``[batch, 1]``."""
    if near_miss:
        hidden = 1
    graph_nodes += [
        helper.make_node("Shape", [x], [f"{name}_shape"]),
        _const(f"{name}_b0", np.array([1], np.int64)),
        _const(f"{name}_b1", np.array([2], np.int64)),
        helper.make_node("Slice", [f"{name}_shape", f"{name}_b0", f"{name}_b1"], [f"{name}_batch"]),
        _const(f"{name}_h", np.array([hidden], np.int64)),
        helper.make_node("Concat", [f"{name}_batch", f"{name}_h"], [f"{name}_dims"], axis=0),
        _const(f"{name}_zero", np.array(0, dtype)),
        helper.make_node("Expand", [f"{name}_zero", f"{name}_dims"], [name]),
    ]
    return name


def _reverse(nodes: list, source: str, name: str) -> str:
    """``ReverseSequence(source, Expand(Shape(source)[0:1], Shape(source)[1:2]))``."""
    nodes += [
        helper.make_node("Shape", [source], [f"{name}_shape"]),
        _const(f"{name}_0", np.array([0], np.int64)),
        _const(f"{name}_1", np.array([1], np.int64)),
        helper.make_node("Gather", [f"{name}_shape", f"{name}_0"], [f"{name}_time"]),
        helper.make_node("Gather", [f"{name}_shape", f"{name}_1"], [f"{name}_batch"]),
        helper.make_node("Expand", [f"{name}_time", f"{name}_batch"], [f"{name}_lengths"]),
        helper.make_node(
            "ReverseSequence", [source, f"{name}_lengths"], [name], batch_axis=1, time_axis=0
        ),
    ]
    return name


def build_loop_model(spec: LoopSpec) -> onnx.ModelProto:
    """The model: input ``x`` ``[seq, batch, I]`` (time-major, ``seq`` symbolic), outputs
    ``spec.outputs`` (``y`` ``[T, batch, H]``, ``h``/``c`` ``[batch, H]``); a
    bidirectional one: ``y`` ``[T, batch, 2H]``, Keras ``Bidirectional``'s concatenation
    of a forward layer and a backward one (other weights) on the same ``x``."""
    if spec.bidirectional:
        return _bidirectional(spec)
    _check_loop_spec(spec)
    hidden = spec.hidden_size
    elem = TensorProto.FLOAT16 if spec.float16 else TensorProto.FLOAT
    weights = _weights(spec)
    nodes: list[onnx.NodeProto] = []
    initializers = [numpy_helper.from_array(v, f"{k}") for k, v in weights.items()]
    x = "x"
    if spec.direction == "reverse" and spec.form != "scan":
        x = _reverse(nodes, "x", "x_reversed")
    h0, c0 = _initial_states(spec, nodes)
    layer = _Layer(nodes, _Body("body_", spec.opset), x, h0, c0, weights, elem)
    if spec.form == "scan":
        stacked, finals, side = _scan(spec, layer)
    else:
        stacked, finals, side = _loop(spec, layer)
        if spec.direction == "reverse":
            # the stacked output reversed back, through tf2onnx's two Transposes
            nodes.append(
                helper.make_node("Transpose", [stacked], ["y_batch_major"], perm=[1, 0, 2])
            )
            nodes.append(
                helper.make_node("Transpose", ["y_batch_major"], ["y_time_major"], perm=[1, 0, 2])
            )
            stacked = _reverse(nodes, "y_time_major", "y_reversed")
    graph_outputs = _graph_outputs(spec, nodes, stacked, finals, side, elem)
    graph = helper.make_graph(
        nodes,
        f"{spec.form}_{spec.cell.lower()}",
        [
            helper.make_tensor_value_info(
                "x", elem, [spec.steps if spec.static_seq else "seq", "batch", spec.input_size]
            ),
            *(
                helper.make_tensor_value_info(name, elem, ["state_batch", hidden])
                for name in ((h0, c0) if spec.state_inputs else ())
                if name is not None
            ),
        ],
        graph_outputs,
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", spec.opset)])
    model.ir_version = 8
    model.producer_name = "rnn_rewrite_rules.testing.loops"
    return model


def _check_loop_spec(spec: LoopSpec) -> None:
    if spec.near_miss is not None and spec.near_miss not in NEAR_MISSES:
        raise ValueError(f"unknown near miss {spec.near_miss!r}")
    if spec.near_miss == "wrong_gate" and spec.cell != "LSTM":
        raise ValueError("only an LSTM has a forget gate to misplace")
    if spec.near_miss == "state_not_hidden" and spec.cell != "LSTM":
        raise ValueError("only an LSTM's c is read by a product that broadcasts it")
    if spec.form == "scan" and spec.near_miss in ("early_exit", "shifted_step"):
        raise ValueError(f"a Scan has no {spec.near_miss} twin (no condition, no index)")


def _initial_states(spec: LoopSpec, nodes: list) -> tuple[str, str | None]:
    """``(h0, c0)``: graph inputs, or zeros of the batch (``c0`` None but for an LSTM)."""
    if spec.state_inputs:
        return "h0", ("c0" if spec.cell == "LSTM" else None)
    dtype, hidden = spec.dtype, spec.hidden_size
    h0 = _zeros_state(nodes, "x", hidden, dtype, "h0", False)
    c0 = None
    if spec.cell == "LSTM":
        c0 = _zeros_state(nodes, "x", hidden, dtype, "c0", spec.near_miss == "state_not_hidden")
    return h0, c0


def _scan(spec: LoopSpec, layer: _Layer):
    """The Scan node; (stacked output, final states, side output)."""
    nodes, body, x, weights, elem = layer.nodes, layer.body, layer.x, layer.weights, layer.elem
    h0, c0 = layer.h0, layer.c0
    hidden = spec.hidden_size
    state_type = helper.make_tensor_value_info
    body_inputs = [state_type("h_in", elem, ["batch", hidden])]
    if c0 is not None:
        body_inputs.append(state_type("c_in", elem, ["batch", hidden]))
    body_inputs.append(state_type("x_t", elem, ["batch", spec.input_size]))
    w = {}
    for key in weights:
        w[key] = body.one("Cast", [key], to=elem) if spec.float16 else key
    h_t, c_t = _cell(spec, body, "x_t", "h_in", "c_in" if c0 else None, w)
    h_out = _carried_h(spec, body, h_t)
    body_outputs = [h_out] + ([c_t] if c_t else []) + [body.one("Identity", [h_t])]
    if spec.near_miss == "side_output":
        body_outputs.append(body.one("Identity", [c_t or "h_in"]))
    body_graph = helper.make_graph(
        body.nodes,
        "scan_body",
        body_inputs,
        [state_type(n, elem, ["batch", hidden]) for n in body_outputs],
    )
    states = [h0] + ([c0] if c0 else [])
    scan_outputs = [f"scan_{i}" for i in range(len(body_outputs))]
    direction = 1 if spec.direction == "reverse" else 0
    nodes.append(
        helper.make_node(
            "Scan",
            [*states, x],
            scan_outputs,
            body=body_graph,
            num_scan_inputs=1,
            scan_input_directions=[direction],
            scan_output_directions=[direction] * (len(body_outputs) - len(states)),
        )
    )
    finals = {"h": scan_outputs[0], "c": scan_outputs[1] if c0 else None}
    stacked = scan_outputs[len(states)]
    side = scan_outputs[len(states) + 1] if spec.near_miss == "side_output" else None
    return stacked, finals, side


def _graph_outputs(
    spec: LoopSpec,
    nodes: list,
    stacked: str,
    finals: dict[str, str | None],
    side: str | None,
    elem: int,
) -> list[onnx.ValueInfoProto]:
    """``spec.outputs`` (and the side output of that near miss), each an Identity."""
    hidden = spec.hidden_size
    graph_outputs = []
    for name in spec.outputs:
        source = stacked if name == "y" else finals[name]
        if source is None:
            raise ValueError(f"{spec.cell} has no output {name!r}")
        nodes.append(helper.make_node("Identity", [source], [name]))
        dims: list[str | int] = ["steps", "batch", hidden] if name == "y" else ["batch", hidden]
        graph_outputs.append(helper.make_tensor_value_info(name, elem, dims))
    if side is not None:
        nodes.append(helper.make_node("Identity", [side], ["side"]))
        graph_outputs.append(
            helper.make_tensor_value_info("side", elem, ["steps", "batch", hidden])
        )
    return graph_outputs


def _bidirectional(spec: LoopSpec) -> onnx.ModelProto:
    if spec.outputs != ("y",):
        raise ValueError("a bidirectional model has the one output y")
    halves = []
    directions: tuple[tuple[str, Literal["forward", "reverse"], int], ...] = (
        ("f_", "forward", spec.seed),
        ("b_", "reverse", spec.seed + 1),
    )
    for prefix, direction, seed in directions:
        half = dataclasses.replace(spec, bidirectional=False, direction=direction, seed=seed)
        halves.append(_prefixed(build_loop_model(half), prefix))
    forward, backward = (half.graph for half in halves)
    concat = helper.make_node("Concat", ["f_y", "b_y"], ["y"], axis=2)
    elem = forward.output[0].type.tensor_type.elem_type
    output = helper.make_tensor_value_info("y", elem, ["steps", "batch", 2 * spec.hidden_size])
    graph = helper.make_graph(
        [*forward.node, *backward.node, concat],
        f"{spec.form}_bidirectional_{spec.cell.lower()}",
        list(forward.input),
        [output],
        [*forward.initializer, *backward.initializer],
    )
    model = helper.make_model(graph, opset_imports=list(halves[0].opset_import))
    model.ir_version = halves[0].ir_version
    model.producer_name = halves[0].producer_name
    return model


def _prefixed(model: onnx.ModelProto, prefix: str) -> onnx.ModelProto:
    """Every value name but the input ``x`` prefixed, subgraphs included (a body reads
    outer names, which ``onnx.compose.add_prefix`` leaves as they were)."""

    def name(old: str) -> str:
        return old if old in ("", "x") else prefix + old

    def graph(g: onnx.GraphProto) -> None:
        for info in [*g.input, *g.output, *g.value_info]:
            info.name = name(info.name)
        for tensor in g.initializer:
            tensor.name = name(tensor.name)
        for node in g.node:
            node.input[:] = [name(v) for v in node.input]
            node.output[:] = [name(v) for v in node.output]
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    graph(attribute.g)

    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    graph(renamed.graph)
    return renamed


def _carried_h(spec: LoopSpec, body: _Body, h_t: str) -> str:
    if spec.near_miss == "not_the_state":
        return body.one("Mul", [h_t, body.const(np.array(0.5, spec.dtype))])
    return body.one("Identity", [h_t])


def _loop(spec: LoopSpec, layer: _Layer):
    """The Loop node (keras or torch form); (stacked output, final states, side output)."""
    nodes, body, x, weights, elem = layer.nodes, layer.body, layer.x, layer.weights, layer.elem
    h0, c0 = layer.h0, layer.c0
    keras = spec.form in ("keras", "tf1")  # tf2onnx's while_loop
    inputs, w = _loop_body_inputs(spec, body, weights, elem, bool(c0))
    index = "counter" if keras else "iteration"
    if spec.near_miss == "shifted_step":
        one = body.const(np.array(1, np.int32 if keras else np.int64))
        index = body.one("Add", [index, one])
    x_t = body.one("Gather", [x, index], axis=0)
    h_t, c_t = _cell(spec, body, x_t, "h_in", "c_in" if c0 else None, w)
    outputs = _loop_conditions(spec, body)
    outputs.append((_carried_h(spec, body, h_t), elem))
    if c0 and c_t is not None:  # the cell has a c_t exactly when it is given c0
        outputs.append((body.one("Identity", [c_t]), elem))
    if keras:
        outputs += [(f"{key}_in", TensorProto.FLOAT) for key in weights]
    outputs.append((body.one("Identity", [h_t]), elem))
    if spec.near_miss == "side_output":
        outputs.append((body.one("Identity", [c_t or "h_in"]), elem))
    shapes: dict[int, list[str | int]] = {
        TensorProto.BOOL: [],
        TensorProto.INT32: [],
        elem: ["batch", spec.hidden_size],
    }
    body_outputs = [
        helper.make_tensor_value_info(
            name, kind, list(weights[name[:-3]].shape) if name.endswith("_in") else shapes[kind]
        )
        for name, kind in outputs
    ]
    graph = helper.make_graph(body.nodes, "loop_body", inputs, body_outputs)
    loop_outputs = [f"loop_{i}" for i in range(len(outputs) - 1)]
    carried = _loop_node(spec, nodes, x, [h0, *([c0] if c0 else [])], weights, graph, loop_outputs)
    offset = 1 if keras else 0
    finals = {"h": loop_outputs[offset], "c": loop_outputs[offset + 1] if c0 else None}
    stacked_index = len(carried)
    side = loop_outputs[stacked_index + 1] if spec.near_miss == "side_output" else None
    return loop_outputs[stacked_index], finals, side


def _loop_body_inputs(
    spec: LoopSpec, body: _Body, weights: dict, elem: int, has_c: bool
) -> tuple[list[onnx.ValueInfoProto], dict[str, str]]:
    """The body's inputs, and the names it reads the weights by (keras: carried as loop
    invariants; torch: the outer values; Cast every step in float16)."""
    vi = helper.make_tensor_value_info
    keras = spec.form in ("keras", "tf1")
    inputs = [vi("iteration", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, [])]
    if keras:
        inputs.append(vi("counter", TensorProto.INT32, []))
    inputs.append(vi("h_in", elem, ["batch", spec.hidden_size]))
    if has_c:
        inputs.append(vi("c_in", elem, ["batch", spec.hidden_size]))
    w: dict[str, str] = {}
    for key, array in weights.items():
        if keras:  # weights carried as loop invariants, Cast every step
            inputs.append(vi(f"{key}_in", TensorProto.FLOAT, list(array.shape)))
            w[key] = body.one("Cast", [f"{key}_in"], to=elem) if spec.float16 else f"{key}_in"
        else:
            w[key] = body.one("Cast", [key], to=elem) if spec.float16 else key
    return inputs, w


def _loop_conditions(spec: LoopSpec, body: _Body) -> list[tuple[str, int]]:
    """The body's first outputs: the condition (keras: both counters below the limit;
    torch: the condition in), and keras' next counter."""
    steps = spec.steps
    if spec.form in ("keras", "tf1"):
        next_counter = body.one("Add", ["counter", body.const(np.array(1, np.int32))])
        limit = body.const(
            np.array(steps - 2 if spec.near_miss == "early_exit" else steps, np.float32)
        )
        first = body.one("Less", [body.one("Cast", ["iteration"], to=TensorProto.FLOAT), limit])
        second = body.one("Less", [body.one("Cast", [next_counter], to=TensorProto.FLOAT), limit])
        return [
            (body.one("And", [first, second]), TensorProto.BOOL),
            (next_counter, TensorProto.INT32),
        ]
    cond = body.one("Identity", ["cond_in"])
    if spec.near_miss == "early_exit":
        cond = body.one("Less", ["iteration", body.const(np.array(steps - 3, np.int64))])
    return [(cond, TensorProto.BOOL)]


def _loop_node(
    spec: LoopSpec,
    nodes: list,
    x: str,
    states: list[str],
    weights: dict,
    graph: onnx.GraphProto,
    loop_outputs: list[str],
) -> list[str]:
    """Append the trip count, the condition and the Loop node; its carried values."""
    keras = spec.form in ("keras", "tf1")
    trips = "trips"
    if spec.trip_count == "length":  # torch.export's while_loop over the sequence
        nodes.append(helper.make_node("Shape", [x], ["x_shape"]))
        nodes.append(_const("time_axis", np.array(0, np.int64)))
        nodes.append(helper.make_node("Gather", ["x_shape", "time_axis"], [trips], axis=0))
    else:
        nodes.append(_const(trips, np.array(spec.steps, np.int64)))
    nodes.append(_const("cond0", np.array(True)))
    carried = []
    if keras:
        nodes.append(_const("counter0", np.array(0, np.int32)))
        carried.append("counter0")
    carried += states
    if keras:
        carried += list(weights)
    nodes.append(helper.make_node("Loop", [trips, "cond0", *carried], loop_outputs, body=graph))
    return carried


def loop_inputs(
    spec: LoopSpec,
    batch: int,
    seq: int | None = None,
    seed: int = 1,
    state_batch: int | None = None,
) -> dict[str, np.ndarray]:
    """A feed: ``x`` of ``seq`` steps (the trip count by default); with state inputs,
    ``h0`` (and ``c0``) of ``state_batch`` rows (``batch`` by default; 1 broadcasts)."""
    rng = np.random.default_rng(seed)
    seq = spec.steps if seq is None else seq
    feeds: dict[str, np.ndarray] = {
        "x": rng.standard_normal((seq, batch, spec.input_size)).astype(spec.dtype)
    }
    if spec.state_inputs:
        rows = batch if state_batch is None else state_batch
        for name in ("h0", "c0") if spec.cell == "LSTM" else ("h0",):
            feeds[name] = rng.standard_normal((rows, spec.hidden_size)).astype(spec.dtype)
    return feeds

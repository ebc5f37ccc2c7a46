"""Build ONNX models shaped like torch 2.13's unrolled ``nn.RNN`` export (dynamo=True).

``torch.onnx.export(..., dynamo=True)`` with onnxscript 0.7.2 has no lowering for
``nn.RNN``; per layer and direction it writes

* the input projection ``P = MatMul(X, W_ih^T) [+ b_ih]`` over the whole sequence,
  reversed for the reverse direction by ``Slice(P, [-1], [-2**63+1], [0], [-1])``;
* per step ``x_t = Squeeze(Slice(P, [t], [t+1], [0]), [0])``, then
  ``h_t = act(Add(MatMul(h_{t-1}, W_hh^T) [+ b_hh], x_t))`` with ``h`` of shape
  ``[1, batch, H]``;
* ``Concat(h_1, ..., h_T, axis=0)`` (reverse: ``h_T, ..., h_1``), ``Concat(axis=2)`` of
  the directions, and the final states ``Concat(Unsqueeze(Squeeze(h_T, 0), 0), ...)``.

The initial state is a graph input ``h0``, torchlib's runtime zeros
(``Expand(0, Concat([L*D], Shape(x)[batch], [H]))``), or, for a static batch, the
folded first step: the exporter's constant folder turns ``MatMul(0, W_hh^T) + b_hh``
into a constant ``[1, batch, H]``. :class:`UnrolledRnnConfig.mutation` makes the
near-miss twins the rule must refuse.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "CELL_MUTATIONS",
    "MUTATIONS",
    "UnrolledCellConfig",
    "UnrolledRnnConfig",
    "build_unrolled_cell",
    "build_unrolled_rnn",
    "cell_inputs",
    "cell_reference",
    "rnn_inputs",
]

#: Near-miss variants: what each breaks.
MUTATIONS = {
    "weights_at_step": "step 1 uses a recurrent weight that differs in one element",
    "broken_chain": "the last step reads h_{T-2} instead of h_{T-1}",
    "step_read_twice": "the last step reads the same index as the step before",
    "extra_reader": "h_1 is also a graph output",
    "wrong_activation": "step 1 uses the other activation",
    "nonconstant_weights": "W_hh^T is an initializer that is also a graph input",
}

_REVERSE_END = -(2**63) + 1


@dataclasses.dataclass(frozen=True)
class UnrolledRnnConfig:
    """One ``nn.RNN`` module as torch 2.13 unrolls it."""

    input_size: int = 4
    hidden_size: int = 5
    seq: int = 3
    num_layers: int = 1
    bidirectional: bool = False
    batch_first: bool = False
    bias: bool = True
    nonlinearity: Literal["tanh", "relu"] = "tanh"
    #: "input": h0 is a graph input; "zeros": torchlib's runtime zeros; "folded": a
    #: static batch whose zero first step the exporter folded (needs ``batch``).
    initial_state: Literal["input", "zeros", "folded"] = "zeros"
    #: a static batch (declared on the inputs), or None for a symbolic ``batch``.
    batch: int | None = None
    #: declare the sequence axis symbolic (the exported chain keeps ``seq`` steps).
    dynamic_seq: bool = False
    #: ``W_hh^T`` as ``Transpose(weight_hh)``, as torch leaves it above onnxscript's
    #: constant-folding limit (8192 elements, hidden >= 91).
    transpose_node: bool = False
    mutation: str | None = None
    opset: int = 18
    seed: int = 0

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def activation(self) -> str:
        return "Tanh" if self.nonlinearity == "tanh" else "Relu"


class _Writer:
    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._ids = itertools.count()
        self._ints: dict[tuple[int, ...], str] = {}

    def fresh(self, prefix: str = "val") -> str:
        return f"{prefix}_{next(self._ids)}"

    def constant(self, array: np.ndarray, name: str | None = None) -> str:
        name = name or self.fresh()
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def ints(self, *values: int) -> str:
        if values not in self._ints:
            self._ints[values] = self.constant(np.array(values, dtype=np.int64))
        return self._ints[values]

    def node(self, op_type: str, inputs: list[str], prefix: str = "val", **attrs) -> str:
        output = self.fresh(prefix)
        self.nodes.append(
            helper.make_node(op_type, inputs, [output], name=f"node_{output}", **attrs)
        )
        return output

    def squeeze0(self, value: str) -> str:
        if self.opset < 13:  # axes became an input in opset 13
            return self.node("Squeeze", [value], axes=[0])
        return self.node("Squeeze", [value, self.ints(0)])

    def unsqueeze0(self, value: str, axis: int = 0) -> str:
        if self.opset < 13:
            return self.node("Unsqueeze", [value], axes=[axis])
        return self.node("Unsqueeze", [value, self.ints(axis)])

    def model(
        self,
        name: str,
        nodes: list[onnx.NodeProto],
        inputs: list[onnx.ValueInfoProto],
        outputs: list[onnx.ValueInfoProto],
        graph_weights: list[onnx.TensorProto],
    ) -> onnx.ModelProto:
        """The model of ``nodes``: ``graph_weights`` are graph inputs too (initializers
        that are inputs), and only the initializers a node reads are kept."""
        inputs = inputs + [
            helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in graph_weights
        ]
        used = {name for node in nodes for name in node.input}
        initializers = [t for t in self.initializers if t.name in used]
        graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", self.opset)],
            producer_name="rnn_rewrite_rules.testing",
        )
        model.ir_version = 8 if self.opset <= 18 else 10
        return model

    def dim(self, value: str, axis: int) -> str:
        """``Shape(value)[axis:axis+1]`` (``Shape``'s start/end are opset 15)."""
        if self.opset >= 15:
            return self.node("Shape", [value], start=axis, end=axis + 1)
        index = self.constant(np.array(axis, np.int64))
        return self.unsqueeze0(self.node("Gather", [self.node("Shape", [value]), index], axis=0))


def _parameters(cfg: UnrolledRnnConfig) -> list[dict[str, np.ndarray]]:
    """Per (layer, direction): PyTorch's weight_ih, weight_hh, bias_ih, bias_hh."""
    rng = np.random.default_rng(cfg.seed)
    bound = 1.0 / np.sqrt(cfg.hidden_size)
    h, d = cfg.hidden_size, cfg.num_directions
    result = []
    for layer in range(cfg.num_layers):
        size = cfg.input_size if layer == 0 else h * d
        for _ in range(d):
            params = {
                "weight_ih": rng.uniform(-bound, bound, (h, size)),
                "weight_hh": rng.uniform(-bound, bound, (h, h)),
                "bias_ih": rng.uniform(-bound, bound, (h,)),
                "bias_hh": rng.uniform(-bound, bound, (h,)),
            }
            result.append({k: v.astype(np.float32) for k, v in params.items()})
    return result


def _chain(
    w: _Writer,
    cfg: UnrolledRnnConfig,
    x: str,
    params: dict[str, np.ndarray],
    h0: str | None,
    reverse: bool,
    extra_outputs: list[str],
    graph_weights: list[onnx.TensorProto],
    first: bool,
) -> tuple[str, str]:
    """One layer and direction; returns (stacked sequence, last state)."""
    (projection,) = [w.node("MatMul", [x, w.constant(params["weight_ih"].T.copy())])]
    if cfg.bias:
        projection = w.node("Add", [projection, w.constant(params["bias_ih"])], prefix="linear")
    if reverse:
        projection = w.node(
            "Slice",
            [projection, w.ints(-1), w.ints(_REVERSE_END), w.ints(0), w.ints(-1)],
            prefix="flip",
        )
    mutation = cfg.mutation if first else None
    weight_hh_t = params["weight_hh"].T.copy()
    recurrent = w.constant(weight_hh_t)
    if mutation == "nonconstant_weights":
        graph_weights.append(next(t for t in w.initializers if t.name == recurrent))
    if cfg.transpose_node:
        recurrent = w.node("Transpose", [w.constant(params["weight_hh"])], perm=[1, 0])
    other = w.constant(
        weight_hh_t
        + np.float32(1e-3) * (np.arange(weight_hh_t.size) == 0).reshape(weight_hh_t.shape)
    )
    bias_hh = w.constant(params["bias_hh"]) if cfg.bias else None
    states: list[str] = []
    h = h0
    for t in range(cfg.seq):
        index = t
        if mutation == "step_read_twice" and t == cfg.seq - 1:
            index = t - 1
        step = w.squeeze0(
            w.node("Slice", [projection, w.ints(index), w.ints(index + 1), w.ints(0)])
        )
        if h is None:  # the folded zero first step: MatMul(0, W_hh^T) + b_hh
            assert cfg.batch is not None
            base = params["bias_hh"] if cfg.bias else np.zeros(cfg.hidden_size, np.float32)
            folded = np.broadcast_to(base, (1, cfg.batch, cfg.hidden_size)).copy()
            term = w.constant(folded, w.fresh("linear"))
        else:
            prev = h
            if mutation == "broken_chain" and t == cfg.seq - 1 and len(states) >= 2:
                prev = states[-2]
            weight = other if mutation == "weights_at_step" and t == 1 else recurrent
            term = w.node("MatMul", [prev, weight])
            if bias_hh is not None:
                term = w.node("Add", [term, bias_hh], prefix="linear")
        activation = cfg.activation
        if mutation == "wrong_activation" and t == 1:
            activation = "Relu" if activation == "Tanh" else "Tanh"
        h = w.node(activation, [w.node("Add", [term, step], prefix="add")], prefix="h")
        states.append(h)
        if mutation == "extra_reader" and t == 0:
            extra_outputs.append(h)
    if h is None:
        raise ValueError("an unrolled chain needs at least one step")
    stacked = states[::-1] if reverse else states
    return w.node("Concat", stacked, prefix="cat", axis=0), h


def build_unrolled_rnn(cfg: UnrolledRnnConfig) -> onnx.ModelProto:
    """The model ``torch.onnx.export(nn.RNN(...), dynamo=True)`` writes for ``cfg``."""
    if cfg.mutation is not None and cfg.mutation not in MUTATIONS:
        raise ValueError(f"unknown mutation {cfg.mutation!r}")
    if cfg.initial_state == "folded" and cfg.batch is None:
        raise ValueError("a folded first step needs a static batch")
    w = _Writer(cfg.opset)
    h, d, layers = cfg.hidden_size, cfg.num_directions, cfg.num_layers
    batch: int | str = "batch" if cfg.batch is None else cfg.batch
    seq: int | str = "seq" if cfg.dynamic_seq else cfg.seq
    x_dims = [batch, seq, cfg.input_size] if cfg.batch_first else [seq, batch, cfg.input_size]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)]
    stacked_states = None
    if cfg.initial_state == "input":
        inputs.append(
            helper.make_tensor_value_info("h0", TensorProto.FLOAT, [layers * d, batch, h])
        )
        stacked_states = "h0"
    elif cfg.initial_state == "zeros":
        shape = w.dim("x", 0 if cfg.batch_first else 1)
        target = w.node("Concat", [w.ints(layers * d), shape, w.ints(h)], axis=0)
        stacked_states = w.node("Expand", [w.constant(np.array(0.0, np.float32)), target])
    current = w.node("Transpose", ["x"], perm=[1, 0, 2]) if cfg.batch_first else "x"
    extra_outputs: list[str] = []
    graph_weights: list[onnx.TensorProto] = []
    lasts = []
    params = _parameters(cfg)
    for layer in range(layers):
        sequences = []
        for direction in range(d):
            k = layer * d + direction
            h0 = None
            if stacked_states is not None:
                sliced = w.node("Slice", [stacked_states, w.ints(k), w.ints(k + 1), w.ints(0)])
                h0 = w.unsqueeze0(w.squeeze0(sliced))
            sequence, last = _chain(
                w,
                cfg,
                current,
                params[k],
                h0,
                direction == 1,
                extra_outputs,
                graph_weights,
                first=k == 0,
            )
            sequences.append(sequence)
            lasts.append(last)
        current = sequences[0] if d == 1 else w.node("Concat", sequences, prefix="cat", axis=2)
    if cfg.batch_first:
        current = w.node("Transpose", [current], perm=[1, 0, 2])
    finals = [w.unsqueeze0(w.squeeze0(last)) for last in lasts]
    final = finals[0] if len(finals) == 1 else w.node("Concat", finals, axis=0)
    nodes = [
        *w.nodes,
        helper.make_node("Identity", [current], ["y"], name="output_y"),
        helper.make_node("Identity", [final], ["h_n"], name="output_h_n"),
    ]
    y_dims = [batch, seq, d * h] if cfg.batch_first else [seq, batch, d * h]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, y_dims),
        helper.make_tensor_value_info("h_n", TensorProto.FLOAT, [layers * d, batch, h]),
    ] + [helper.make_tensor_value_info(v, TensorProto.FLOAT, [1, batch, h]) for v in extra_outputs]
    return w.model("unrolled_rnn", nodes, inputs, outputs, graph_weights)


def rnn_inputs(
    cfg: UnrolledRnnConfig, batch: int, seq: int | None = None, rng: np.random.Generator | int = 0
) -> dict[str, np.ndarray]:
    """Feeds for a model built from ``cfg`` (``seq`` defaults to the chain's length)."""
    rng = np.random.default_rng(rng)
    seq = cfg.seq if seq is None else seq
    x_shape = (batch, seq, cfg.input_size) if cfg.batch_first else (seq, batch, cfg.input_size)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    if cfg.initial_state == "input":
        shape = (cfg.num_layers * cfg.num_directions, batch, cfg.hidden_size)
        feeds["h0"] = rng.standard_normal(shape).astype(np.float32)
    return feeds


#: Near-miss variants of a cell loop: what each breaks.
CELL_MUTATIONS = {
    "weights_at_step": "step 1 uses a hidden weight that differs in one element",
    "broken_chain": "the last step reads h_{T-2} instead of h_{T-1}",
    "step_read_twice": "the last step reads the same index as the step before",
    "extra_reader": "h_1 is also a graph output",
    "gate_order": "two gates are swapped (LSTM i/f, GRU r/z) in every step",
    "wrong_activation": "the output gate (LSTM) / update gate (GRU) uses Tanh in every step",
    "nonconstant_weights": "W_hh is an initializer that is also a graph input",
}


@dataclasses.dataclass(frozen=True)
class UnrolledCellConfig:
    """A Python loop over ``nn.LSTMCell`` / ``nn.GRUCell`` as torch 2.13 exports it."""

    op_type: Literal["LSTM", "GRU"] = "LSTM"
    input_size: int = 4
    hidden_size: int = 3
    seq: int = 3
    #: the loop runs ``for t in reversed(range(seq))`` and stacks in time order.
    reverse: bool = False
    bias: bool = True
    #: ``Gemm(v, W, b, transB=1)`` (both exporters) or ``MatMul(v, W^T) + b``.
    gemm: bool = True
    #: ``Gather(x, t)`` (``x[t]``) or ``Squeeze(Slice(x, [t], [t+1]), [0])``.
    read: Literal["gather", "slice"] = "gather"
    #: "zeros": ``Expand(0, Concat(Shape(x)[1:2], [H]))``; "constant_of_shape": the
    #: TorchScript form; "folded": static batch, the first hidden projection folded;
    #: "first_frame": non-zero states computed from ``x[0]`` (``h_0 = tanh(x[0] @ P_h)``,
    #: ``c_0 = x[0] @ P_c``), as an encoder seeds a decoder loop.
    #: "inputs": graph inputs ``h0`` (and ``c0``) ``[state_batch, H]`` of a batch of their
    #: own, as an encoder's final state seeds a decoder (the steps broadcast it against X's).
    initial_state: Literal["zeros", "constant_of_shape", "folded", "first_frame", "inputs"] = (
        "zeros"
    )
    batch: int | None = None
    #: ``x`` is ``[batch, seq, I]``, step ``t`` reads ``x[:, t]`` (``Gather`` on axis 1) and
    #: the steps are stacked on axis 1 (``torch.stack(hs, 1)``: ``y [batch, seq, H]``).
    batch_first: bool = False
    #: every step's ``x[t]`` is also read outside the loop (output ``x_read``: their sum),
    #: as dynamo shares one Gather between a forward and a reversed loop over ``x``.
    shared_read: bool = False
    mutation: str | None = None
    opset: int = 18
    seed: int = 0

    @property
    def gates(self) -> int:
        return 4 if self.op_type == "LSTM" else 3


def _cell_parameters(cfg: UnrolledCellConfig) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(cfg.seed)
    bound = 1.0 / np.sqrt(cfg.hidden_size)
    rows = cfg.gates * cfg.hidden_size
    params = {
        "weight_ih": rng.uniform(-bound, bound, (rows, cfg.input_size)),
        "weight_hh": rng.uniform(-bound, bound, (rows, cfg.hidden_size)),
        "bias_ih": rng.uniform(-bound, bound, (rows,)),
        "bias_hh": rng.uniform(-bound, bound, (rows,)),
    }
    # drawn last: the weights above do not depend on the initial state
    params["init_h"] = rng.uniform(-1, 1, (cfg.input_size, cfg.hidden_size))
    params["init_c"] = rng.uniform(-1, 1, (cfg.input_size, cfg.hidden_size))
    return {k: v.astype(np.float32) for k, v in params.items()}


class _CellWriter(_Writer):
    """A :class:`_Writer` with the linear maps and gate splits of one cell config."""

    def __init__(self, cfg: UnrolledCellConfig) -> None:
        super().__init__(cfg.opset)
        self.cfg = cfg
        self._transposed: dict[str, str] = {}

    def linear(self, v: str, weight: str, bias: str | None) -> str:
        if self.cfg.gemm:
            return self.node("Gemm", [v, weight] + ([bias] if bias else []), transB=1)
        if weight not in self._transposed:
            array = next(numpy_helper.to_array(t) for t in self.initializers if t.name == weight)
            self._transposed[weight] = self.constant(array.T.copy(), f"{weight}_t")
        out = self.node("MatMul", [v, self._transposed[weight]])
        return self.node("Add", [out, bias]) if bias else out

    def split(self, value: str, parts: list[str]) -> None:
        """dynamo: ``num_outputs`` (opset 18); TorchScript: constant sizes (opset 13-17), the
        ``split`` attribute before."""
        opset, h = self.cfg.opset, self.cfg.hidden_size
        if opset >= 18:
            node = helper.make_node("Split", [value], parts, axis=1, num_outputs=len(parts))
        elif opset < 13:
            node = helper.make_node("Split", [value], parts, axis=1, split=[h] * len(parts))
        else:
            sizes = self.constant(np.full(len(parts), h, np.int64))
            node = helper.make_node("Split", [value, sizes], parts, axis=1)
        self.nodes.append(node)


@dataclasses.dataclass
class _CellWeights:
    """The initializer names of one cell's weights (``other_hh``: ``weight_hh`` changed in
    one element, for the ``weights_at_step`` mutation)."""

    weight_ih: str
    weight_hh: str
    other_hh: str
    bias_ih: str | None
    bias_hh: str | None


def _check_cell_config(cfg: UnrolledCellConfig) -> None:
    if cfg.mutation is not None and cfg.mutation not in CELL_MUTATIONS:
        raise ValueError(f"unknown mutation {cfg.mutation!r}")
    if cfg.initial_state == "folded" and cfg.batch is None:
        raise ValueError("a folded first step needs a static batch")
    if cfg.batch_first and cfg.read != "gather":
        raise ValueError("a batch-first loop reads x[:, t] with a Gather")


def _cell_weights(w: _CellWriter, params: dict[str, np.ndarray]) -> _CellWeights:
    weight_ih = w.constant(params["weight_ih"], "cell.weight_ih")
    weight_hh = w.constant(params["weight_hh"], "cell.weight_hh")
    changed = params["weight_hh"].copy()
    changed[0, 0] += np.float32(1e-3)
    other_hh = w.constant(changed, "cell.weight_hh_changed")
    bias = w.cfg.bias
    bias_ih = w.constant(params["bias_ih"], "cell.bias_ih") if bias else None
    bias_hh = w.constant(params["bias_hh"], "cell.bias_hh") if bias else None
    return _CellWeights(weight_ih, weight_hh, other_hh, bias_ih, bias_hh)


def _initial_cell_state(
    w: _CellWriter, params: dict[str, np.ndarray], inputs: list[onnx.ValueInfoProto]
) -> tuple[str, str]:
    """``(h_0, c_0)`` of ``cfg.initial_state`` (``c_0`` "" for a GRU); state inputs are
    appended to ``inputs``."""
    cfg, h = w.cfg, w.cfg.hidden_size
    time_axis, batch_axis = (1, 0) if cfg.batch_first else (0, 1)
    if cfg.initial_state == "zeros":
        shape = w.dim("x", batch_axis)
        target = w.node("Concat", [shape, w.ints(h)], axis=0)
        zeros = w.node("Expand", [w.constant(np.array(0.0, np.float32)), target], prefix="zeros")
    elif cfg.initial_state == "constant_of_shape":
        axis = w.constant(np.array(batch_axis, np.int64))
        dim = w.node("Gather", [w.node("Shape", ["x"]), axis], axis=0)
        target = w.node("Concat", [w.unsqueeze0(dim), w.ints(h)], axis=0)
        zeros = w.node("ConstantOfShape", [target], prefix="zeros")
    elif cfg.initial_state == "first_frame":
        frame = w.node("Gather", ["x", w.constant(np.array(0, np.int64))], axis=time_axis)
        h_prev = w.node("Tanh", [w.node("MatMul", [frame, w.constant(params["init_h"])])])
        c_prev = ""  # GRU: no cell state
        if cfg.op_type == "LSTM":
            c_prev = w.node("MatMul", [frame, w.constant(params["init_c"])])
        return h_prev, c_prev
    elif cfg.initial_state == "inputs":
        for name in ("h0", "c0")[: 1 + (cfg.op_type == "LSTM")]:
            dims: list[str | int] = ["state_batch", h]
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
        return "h0", "c0" if cfg.op_type == "LSTM" else ""
    else:
        assert cfg.batch is not None
        zeros = w.constant(np.zeros((cfg.batch, h), np.float32), "zeros")
    return zeros, zeros


def _lstm_gates(w: _CellWriter, gx: str, gh: str, c_prev: str) -> tuple[str, str]:
    """``(h_t, c_t)`` of an ``nn.LSTMCell`` step from its two projections."""
    swap, squash = _gate_mutations(w.cfg)
    parts = [w.fresh("split") for _ in range(4)]
    total = w.node("Add", [gh, gx])
    w.split(total, parts)
    i_part, f_part = (parts[1], parts[0]) if swap else (parts[0], parts[1])
    i, f = w.node("Sigmoid", [i_part]), w.node("Sigmoid", [f_part])
    g, o = w.node("Tanh", [parts[2]]), w.node(squash, [parts[3]])
    c = w.node("Add", [w.node("Mul", [f, c_prev]), w.node("Mul", [i, g])], prefix="c")
    return w.node("Mul", [o, w.node("Tanh", [c])], prefix="h"), c


def _gru_gates(w: _CellWriter, gx: str, gh: str, h_prev: str) -> str:
    """``h_t`` of an ``nn.GRUCell`` step from its two projections."""
    swap, squash = _gate_mutations(w.cfg)
    xs = [w.fresh("split") for _ in range(3)]
    hs = [w.fresh("split") for _ in range(3)]
    w.split(gx, xs)
    w.split(gh, hs)
    r_index, z_index = (1, 0) if swap else (0, 1)
    r = w.node("Sigmoid", [w.node("Add", [hs[r_index], xs[r_index]])])
    z = w.node(squash, [w.node("Add", [hs[z_index], xs[z_index]])])
    n = w.node("Tanh", [w.node("Add", [xs[2], w.node("Mul", [hs[2], r])])])
    return w.node("Add", [w.node("Mul", [w.node("Sub", [h_prev, n]), z]), n], prefix="h")


def _gate_mutations(cfg: UnrolledCellConfig) -> tuple[bool, str]:
    """Whether two gates are swapped, and the squashing op of the output / update gate."""
    return cfg.mutation == "gate_order", "Tanh" if cfg.mutation == "wrong_activation" else "Sigmoid"


def _read_step(w: _CellWriter, step: int, t: int) -> str:
    """``x[t]`` (of the step before, for the last step of ``step_read_twice``)."""
    cfg = w.cfg
    index = t
    if cfg.mutation == "step_read_twice" and step == cfg.seq - 1:
        index = t + 1 if cfg.reverse else t - 1
    if cfg.read == "gather":
        time_axis = 1 if cfg.batch_first else 0
        return w.node("Gather", ["x", w.constant(np.array(index, np.int64))], axis=time_axis)
    return w.squeeze0(w.node("Slice", ["x", w.ints(index), w.ints(index + 1), w.ints(0)]))


def _hidden_projection(
    w: _CellWriter, weights: _CellWeights, params: dict[str, np.ndarray], step: int, h_prev: str
) -> str:
    """``h_{t-1} W_hh^T + b_hh`` (folded to ``b_hh`` rows at a folded first step)."""
    cfg = w.cfg
    if step == 0 and cfg.initial_state == "folded":
        assert cfg.batch is not None  # checked where the model is built
        width = cfg.gates * cfg.hidden_size
        base = params["bias_hh"] if cfg.bias else np.zeros(width, np.float32)
        return w.constant(np.broadcast_to(base, (cfg.batch, width)).copy(), "linear")
    hh = weights.other_hh if cfg.mutation == "weights_at_step" and step == 1 else weights.weight_hh
    return w.linear(h_prev, hh, weights.bias_hh)


def _cell_steps(
    w: _CellWriter, weights: _CellWeights, params: dict[str, np.ndarray], h_prev: str, c_prev: str
) -> tuple[list[str], list[str], str]:
    """Every step's ``h_t`` (in step order), every step's read of ``x``, the last ``c_t``."""
    cfg = w.cfg
    states: list[str] = []
    reads: list[str] = []
    order = range(cfg.seq - 1, -1, -1) if cfg.reverse else range(cfg.seq)
    for step, t in enumerate(order):
        x_t = _read_step(w, step, t)
        reads.append(x_t)
        if cfg.mutation == "broken_chain" and step == cfg.seq - 1 and len(states) >= 2:
            h_prev = states[-2]
        gx = w.linear(x_t, weights.weight_ih, weights.bias_ih)
        gh = _hidden_projection(w, weights, params, step, h_prev)
        if cfg.op_type == "LSTM":
            h_t, c_prev = _lstm_gates(w, gx, gh, c_prev)
        else:
            h_t = _gru_gates(w, gx, gh, h_prev)
        states.append(h_t)
        h_prev = h_t
    return states, reads, c_prev


def build_unrolled_cell(cfg: UnrolledCellConfig) -> onnx.ModelProto:
    """The model torch 2.13 exports for a loop over ``nn.LSTMCell`` / ``nn.GRUCell``."""
    _check_cell_config(cfg)
    w = _CellWriter(cfg)
    h = cfg.hidden_size
    batch: int | str = "batch" if cfg.batch is None else cfg.batch
    time_axis = 1 if cfg.batch_first else 0
    x_dims = [batch, cfg.seq] if cfg.batch_first else [cfg.seq, batch]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*x_dims, cfg.input_size])]
    params = _cell_parameters(cfg)
    weights = _cell_weights(w, params)
    graph_weights = []
    if cfg.mutation == "nonconstant_weights":
        graph_weights.append(next(t for t in w.initializers if t.name == weights.weight_hh))
    h_prev, c_prev = _initial_cell_state(w, params, inputs)
    states, reads, c_prev = _cell_steps(w, weights, params, h_prev, c_prev)
    stacked = states[::-1] if cfg.reverse else states
    stacks = [w.unsqueeze0(s, time_axis) for s in stacked]
    y = w.node("Concat", stacks, prefix="stack", axis=time_axis)
    finals = [states[-1]] + ([c_prev] if cfg.op_type == "LSTM" else [])
    names = ["y", "h_n", "c_n"][: 1 + len(finals)]
    nodes = [
        *w.nodes,
        *(
            helper.make_node("Identity", [v], [n], name=f"output_{n}")
            for v, n in zip([y, *finals], names, strict=True)
        ),
    ]
    if cfg.shared_read:
        nodes.append(helper.make_node("Sum", reads, ["x_read"], name="output_x_read"))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*x_dims, h])] + [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, h]) for n in names[1:]
    ]
    if cfg.shared_read:
        read_dims = [batch, cfg.input_size]
        outputs.append(helper.make_tensor_value_info("x_read", TensorProto.FLOAT, read_dims))
    if cfg.mutation == "extra_reader":
        outputs.append(helper.make_tensor_value_info(states[0], TensorProto.FLOAT, [batch, h]))
    return w.model("unrolled_cell", nodes, inputs, outputs, graph_weights)


def cell_inputs(
    cfg: UnrolledCellConfig,
    batch: int,
    seq: int | None = None,
    rng: np.random.Generator | int = 0,
    state_batch: int | None = None,
) -> dict[str, np.ndarray]:
    """Feeds for a model built from ``cfg`` (``state_batch``: the batch of the ``inputs``
    states, ``batch`` by default)."""
    rng = np.random.default_rng(rng)
    seq = cfg.seq if seq is None else seq
    dims = (batch, seq) if cfg.batch_first else (seq, batch)
    feeds = {"x": rng.standard_normal((*dims, cfg.input_size)).astype(np.float32)}
    if cfg.initial_state == "inputs":
        shape = (batch if state_batch is None else state_batch, cfg.hidden_size)
        for name in ("h0", "c0")[: 1 + (cfg.op_type == "LSTM")]:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def cell_reference(cfg: UnrolledCellConfig, x: np.ndarray) -> list[np.ndarray]:
    """What the PyTorch loop computes (numpy), without mutations: ``[y, h_n(, c_n)]``."""
    if cfg.batch_first:
        y, *states = cell_reference(dataclasses.replace(cfg, batch_first=False), x.swapaxes(0, 1))
        return [y.swapaxes(0, 1), *states]
    p = _cell_parameters(cfg)
    b_ih = p["bias_ih"] if cfg.bias else 0.0
    b_hh = p["bias_hh"] if cfg.bias else 0.0

    def sigmoid(v):
        return 1.0 / (1.0 + np.exp(-v))

    h = np.zeros((x.shape[1], cfg.hidden_size), np.float32)
    c = h.copy()
    if cfg.initial_state == "first_frame":
        h, c = np.tanh(x[0] @ p["init_h"]), x[0] @ p["init_c"]
    ys = {}
    order = range(cfg.seq - 1, -1, -1) if cfg.reverse else range(cfg.seq)
    for t in order:
        gx = x[t] @ p["weight_ih"].T + b_ih
        gh = h @ p["weight_hh"].T + b_hh
        if cfg.op_type == "LSTM":
            i, f, g, o = np.split(gx + gh, 4, axis=1)
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
        else:
            xr, xz, xn = np.split(gx, 3, axis=1)
            hr, hz, hn = np.split(gh, 3, axis=1)
            r, z = sigmoid(xr + hr), sigmoid(xz + hz)
            n = np.tanh(xn + r * hn)
            h = (1 - z) * n + z * h
        ys[t] = h
    y = np.stack([ys[t] for t in range(cfg.seq)])
    return [y, h] + ([c] if cfg.op_type == "LSTM" else [])

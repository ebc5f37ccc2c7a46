"""Build ONNX models shaped exactly like torchlib 0.7.2's ``aten_lstm`` / ``aten_gru`` export.

``torch.onnx.export(..., dynamo=True)`` with onnxscript 0.7.x emits, per layer:

* weight preparation: ``Slice`` x4 (LSTM) or x3 (GRU) of each PyTorch weight, a
  ``Concat`` into ONNX gate order (LSTM ``iofc`` from ``ifgo``, GRU ``zrh`` from
  ``rzn``), ``Unsqueeze`` of the direction axis and, for bidirectional layers, a
  ``Concat`` across directions; biases the same plus ``Concat(b_ih, b_hh)``;
* the RNN node itself;
* the output glue ``Transpose(0,2,1,3) -> Shape -> 4x Slice -> Mul -> Reshape(-1)
  -> Concat -> Reshape`` turning ``Y`` into the next layer's input.

The exporter's optimize step folds only the preparation whose inputs are at most
8192 elements (onnxscript's constant-folding limit); ``fold_limit`` reproduces that.
Missing initial states become ``Expand(0, Concat([L*D], Shape(x)[batch], [H]))``,
sliced per layer, as torchlib writes them.

The builder needs neither torch nor onnxscript and takes about a millisecond, so
property tests can build hundreds of models.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["RnnConfig", "build_torchlib_model", "random_inputs"]

#: onnxscript's DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT / _OUTPUT_SIZE_LIMIT.
TORCHLIB_FOLD_INPUT_LIMIT = 8192
TORCHLIB_FOLD_OUTPUT_LIMIT = 512 * 512

#: Gate order of the ONNX op, as indices into PyTorch's gate blocks.
_GATE_ORDER = {"LSTM": (0, 3, 1, 2), "GRU": (1, 0, 2)}


@dataclasses.dataclass(frozen=True)
class RnnConfig:
    """One ``nn.LSTM`` / ``nn.GRU`` module as torchlib exports it."""

    op_type: Literal["LSTM", "GRU"] = "LSTM"
    input_size: int = 8
    hidden_size: int = 16
    num_layers: int = 1
    bidirectional: bool = False
    batch_first: bool = False
    bias: bool = True
    #: ``True``: h0 (and c0) are graph inputs; ``False``: torchlib's runtime zeros.
    initial_states: bool = False
    opset: int = 18
    #: Preparation nodes whose inputs are all constant and at most this many
    #: elements are pre-folded, as the exporter's constant folder does.
    fold_limit: int = TORCHLIB_FOLD_INPUT_LIMIT
    seed: int = 0
    #: GRU only: ``0`` writes the GRU as onnxscript 0.5.7 to 0.7.0 did (onnxscript #2852),
    #: which is not PyTorch's GRU.
    linear_before_reset: int = 1

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def num_gates(self) -> int:
        return 4 if self.op_type == "LSTM" else 3


class _GraphWriter:
    """Emits nodes, or folds them with numpy where the exporter would have."""

    def __init__(self, fold_limit: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.constants: dict[str, np.ndarray] = {}
        self._fold_limit = fold_limit
        self._ids = itertools.count()
        self._int_cache: dict[tuple[int, ...], str] = {}

    def fresh(self, prefix: str = "val") -> str:
        return f"{prefix}_{next(self._ids)}"

    def constant(self, array: np.ndarray, name: str | None = None) -> str:
        name = name or self.fresh()
        self.initializers.append(numpy_helper.from_array(array, name))
        self.constants[name] = array
        return name

    def ints(self, *values: int) -> str:
        """A shared int64 1-D initializer, as the exporter deduplicates them."""
        if values not in self._int_cache:
            self._int_cache[values] = self.constant(np.array(values, dtype=np.int64))
        return self._int_cache[values]

    def node(self, op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs) -> list[str]:
        outputs = [self.fresh() for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, **attrs))
        return outputs

    def prep(self, op_type: str, inputs: Sequence[str], **attrs) -> str:
        """A weight-preparation node, folded when the constant folder would fold it."""
        arrays = [a for name in inputs if (a := self.constants.get(name)) is not None]
        if len(arrays) == len(inputs) and all(a.size <= self._fold_limit for a in arrays):
            result = _evaluate_prep(op_type, arrays, attrs)
            if result.size <= TORCHLIB_FOLD_OUTPUT_LIMIT:
                return self.constant(result)
        return self.node(op_type, inputs, **attrs)[0]


def _evaluate_prep(op_type: str, arrays: list[np.ndarray], attrs: dict) -> np.ndarray:
    if op_type == "Slice":
        data, starts, ends, axes = arrays
        index = [slice(None)] * data.ndim
        for start, end, axis in zip(starts, ends, axes, strict=True):
            index[int(axis)] = slice(int(start), int(end))
        return data[tuple(index)]
    if op_type == "Concat":
        return np.concatenate(arrays, axis=attrs["axis"])
    if op_type == "Unsqueeze":
        axes = attrs["axes"] if "axes" in attrs else arrays[1]
        return np.expand_dims(arrays[0], tuple(int(a) for a in axes))
    raise ValueError(op_type)


def _pytorch_parameters(cfg: RnnConfig, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """Per (layer, direction): weight_ih, weight_hh, bias_ih, bias_hh in PyTorch layout."""
    bound = 1.0 / np.sqrt(cfg.hidden_size)
    gates_h = cfg.num_gates * cfg.hidden_size
    params = []
    for layer in range(cfg.num_layers):
        layer_input = cfg.input_size if layer == 0 else cfg.hidden_size * cfg.num_directions
        for _ in range(cfg.num_directions):
            shapes: dict[str, tuple[int, ...]] = {
                "weight_ih": (gates_h, layer_input),
                "weight_hh": (gates_h, cfg.hidden_size),
            }
            if cfg.bias:
                shapes |= {"bias_ih": (gates_h,), "bias_hh": (gates_h,)}
            params.append(
                {k: rng.uniform(-bound, bound, s).astype(np.float32) for k, s in shapes.items()}
            )
    return params


def _reorder_gates(w: _GraphWriter, cfg: RnnConfig, name: str) -> str:
    h = cfg.hidden_size
    blocks = [
        w.prep("Slice", [name, w.ints(g * h), w.ints((g + 1) * h), w.ints(0)])
        for g in range(cfg.num_gates)
    ]
    return w.prep("Concat", [blocks[g] for g in _GATE_ORDER[cfg.op_type]], axis=0)


def _unsqueeze0(w: _GraphWriter, cfg: RnnConfig, value: str) -> str:
    if cfg.opset >= 13:
        return w.prep("Unsqueeze", [value, w.ints(0)])
    return w.prep("Unsqueeze", [value], axes=[0])


def _layer_weights(
    w: _GraphWriter, cfg: RnnConfig, layer_params: list[dict[str, str]]
) -> tuple[str, str, str | None]:
    per_direction: dict[str, list[str]] = {"W": [], "R": [], "B": []}
    for p in layer_params:
        per_direction["W"].append(_unsqueeze0(w, cfg, _reorder_gates(w, cfg, p["weight_ih"])))
        per_direction["R"].append(_unsqueeze0(w, cfg, _reorder_gates(w, cfg, p["weight_hh"])))
        if cfg.bias:
            both = w.prep(
                "Concat",
                [_reorder_gates(w, cfg, p["bias_ih"]), _reorder_gates(w, cfg, p["bias_hh"])],
                axis=0,
            )
            per_direction["B"].append(_unsqueeze0(w, cfg, both))

    def across_directions(values: list[str]) -> str:
        return values[0] if len(values) == 1 else w.prep("Concat", values, axis=0)

    return (
        across_directions(per_direction["W"]),
        across_directions(per_direction["R"]),
        across_directions(per_direction["B"]) if cfg.bias else None,
    )


def _shape(w: _GraphWriter, opset: int, value: str, start: int = 0, end: int | None = None) -> str:
    """``Shape(value, start, end)``; before opset 15 (no start/end) a Shape then a Slice."""
    if opset >= 15:
        attrs = {"start": start} if end is None else {"start": start, "end": end}
        return w.node("Shape", [value], **attrs)[0]
    (shape,) = w.node("Shape", [value])
    if start == 0 and end is None:
        return shape
    stop = np.iinfo(np.int64).max if end is None else end  # Shape's end: the last axis
    return w.node("Slice", [shape, w.ints(start), w.ints(int(stop))])[0]


def _layer_output(w: _GraphWriter, y: str, opset: int) -> str:
    """torchlib's ``[seq, D, batch, H] -> [seq, batch, D*H]`` runtime chain."""
    (transposed,) = w.node("Transpose", [y], perm=[0, 2, 1, 3])
    shape = _shape(w, opset, transposed)
    dims = [w.node("Slice", [shape, w.ints(i), w.ints(i + 1)])[0] for i in range(4)]
    (product,) = w.node("Mul", [dims[2], dims[3]])
    allowzero = {"allowzero": 0} if opset >= 14 else {}  # the attribute exists from opset 14
    (product,) = w.node("Reshape", [product, w.ints(-1)], **allowzero)
    (target,) = w.node("Concat", [dims[0], dims[1], product], axis=0)
    return w.node("Reshape", [transposed, target], **allowzero)[0]


def build_torchlib_model(cfg: RnnConfig) -> onnx.ModelProto:
    """The model ``torch.onnx.export(dynamo=True)`` writes for ``cfg`` (onnxscript 0.7.2)."""
    rng = np.random.default_rng(cfg.seed)
    w = _GraphWriter(cfg.fold_limit)
    states = ["h0", "c0"] if cfg.op_type == "LSTM" else ["h0"]
    inputs, zeros = _inputs_and_zeros(w, cfg, states)
    params = _pytorch_parameters(cfg, rng)
    named_params = []
    for index, p in enumerate(params):
        layer, reverse = divmod(index, cfg.num_directions)
        suffix = f"_l{layer}" + ("_reverse" if reverse else "")
        named_params.append({k: w.constant(v, k + suffix) for k, v in p.items()})

    current = "input"
    if cfg.batch_first:
        (current,) = w.node("Transpose", ["input"], perm=[1, 0, 2])
    final_states: dict[str, list[str]] = {s: [] for s in states}
    for layer in range(cfg.num_layers):
        d = cfg.num_directions
        start, end = w.ints(layer * d), w.ints((layer + 1) * d)
        if zeros is None:
            layer_states = {s: w.node("Slice", [s, start, end, w.ints(0)])[0] for s in states}
        else:  # torchlib slices the shared zeros once per layer, for h and c alike
            (zeros_slice,) = w.node("Slice", [zeros, start, end, w.ints(0)])
            layer_states = dict.fromkeys(states, zeros_slice)
        wt, rt, bt = _layer_weights(w, cfg, named_params[layer * d : (layer + 1) * d])
        rnn_inputs = [current, wt, rt, bt or "", "", *(layer_states[s] for s in states)]
        y, *finals = _rnn_node(w, cfg, rnn_inputs)
        for state, final in zip(states, finals, strict=True):
            final_states[state].append(final)
        current = _layer_output(w, y, cfg.opset)
    if cfg.batch_first:
        (current,) = w.node("Transpose", [current], perm=[1, 0, 2])
    return _torchlib_model(w, cfg, inputs, current, [final_states[s] for s in states])


def _inputs_and_zeros(
    w: _GraphWriter, cfg: RnnConfig, states: list[str]
) -> tuple[list[onnx.ValueInfoProto], str | None]:
    """The graph inputs, and the zeros torchlib builds for every layer's state when the
    states are no inputs (None when they are)."""
    stacked, h = cfg.num_layers * cfg.num_directions, cfg.hidden_size
    x_dims: list[str | int] = (
        ["batch", "seq", cfg.input_size] if cfg.batch_first else ["seq", "batch", cfg.input_size]
    )
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, x_dims)]
    if cfg.initial_states:
        inputs += [
            helper.make_tensor_value_info(s, TensorProto.FLOAT, [stacked, "batch", h])
            for s in states
        ]
        return inputs, None
    batch_axis = 0 if cfg.batch_first else 1
    batch = _shape(w, cfg.opset, "input", batch_axis, batch_axis + 1)
    (zeros_shape,) = w.node("Concat", [w.ints(stacked), batch, w.ints(h)], axis=0)
    zero = w.constant(np.array(0.0, dtype=np.float32))
    (zeros,) = w.node("Expand", [zero, zeros_shape])
    return inputs, zeros


def _rnn_node(w: _GraphWriter, cfg: RnnConfig, rnn_inputs: list[str]) -> list[str]:
    """One layer's LSTM (``Y``, ``Y_h``, ``Y_c``) or GRU (``Y``, ``Y_h``) node."""
    direction = "bidirectional" if cfg.bidirectional else "forward"
    layout = {"layout": 0} if cfg.opset >= 14 else {}  # the attribute exists from opset 14
    h = cfg.hidden_size
    if cfg.op_type == "LSTM":
        return w.node(
            "LSTM", rnn_inputs, 3, hidden_size=h, direction=direction, input_forget=0, **layout
        )
    return w.node(
        "GRU",
        rnn_inputs,
        2,
        hidden_size=h,
        direction=direction,
        linear_before_reset=cfg.linear_before_reset,
        **layout,
    )


def _torchlib_model(
    w: _GraphWriter,
    cfg: RnnConfig,
    inputs: list[onnx.ValueInfoProto],
    current: str,
    final_states: list[list[str]],
) -> onnx.ModelProto:
    """The model of ``w``'s nodes, its outputs the last layer's ``current`` and each state's
    per-layer finals concatenated."""
    stacked, h, d = cfg.num_layers * cfg.num_directions, cfg.hidden_size, cfg.num_directions

    def graph_output(values: list[str]) -> str:
        return values[0] if len(values) == 1 else w.node("Concat", values, axis=0)[0]

    out_names = ["output", "h_n", "c_n"][: 1 + len(final_states)]
    sources = [current] + [graph_output(finals) for finals in final_states]
    for name, source in zip(out_names, sources, strict=True):
        w.nodes.append(helper.make_node("Identity", [source], [name]))
    y_dims: list[str | int] = (
        ["batch", "seq", d * h] if cfg.batch_first else ["seq", "batch", d * h]
    )
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, y_dims)] + [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [stacked, "batch", h])
        for n in out_names[1:]
    ]
    used = {name for node in w.nodes for name in node.input}
    initializers = [t for t in w.initializers if t.name in used]
    graph = helper.make_graph(w.nodes, "torchlib_rnn", inputs, outputs, initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", cfg.opset)],
        producer_name="rnn_rewrite_rules.testing",
    )
    model.ir_version = 8 if cfg.opset <= 18 else 10
    _rename_outputs(model)
    return model


def _rename_outputs(model: onnx.ModelProto) -> None:
    """Drop the Identity nodes: the exporter names the producing values directly."""
    graph = model.graph
    renames = {}
    keep = []
    for node in graph.node:
        if node.op_type == "Identity" and node.output[0] in {"output", "h_n", "c_n"}:
            renames[node.input[0]] = node.output[0]
        else:
            keep.append(node)
    produced_twice = {src for src, dst in renames.items() if list(renames.values()).count(dst) > 1}
    assert not produced_twice
    for node in keep:
        node.output[:] = [renames.get(o, o) for o in node.output]
        node.input[:] = [renames.get(i, i) for i in node.input]
    del graph.node[:]
    graph.node.extend(keep)


def random_inputs(
    cfg: RnnConfig, batch: int, seq: int, rng: np.random.Generator | int = 0
) -> dict[str, np.ndarray]:
    """Feeds for a model built from ``cfg`` at the given batch and sequence sizes."""
    rng = np.random.default_rng(rng)
    x_shape = (batch, seq, cfg.input_size) if cfg.batch_first else (seq, batch, cfg.input_size)
    feeds = {"input": rng.standard_normal(x_shape).astype(np.float32)}
    if cfg.initial_states:
        stacked = cfg.num_layers * cfg.num_directions
        for s in ["h0", "c0"] if cfg.op_type == "LSTM" else ["h0"]:
            feeds[s] = rng.standard_normal((stacked, batch, cfg.hidden_size)).astype(np.float32)
    return feeds

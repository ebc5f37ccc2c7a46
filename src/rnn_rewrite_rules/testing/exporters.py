"""Build RNN models the way exporters other than torchlib write them.

One :class:`ExporterSpec` describes a stack of ``LSTM``/``GRU``/``RNN`` layers and how
the graph around it looks:

* ``style="torchscript"``: ``torch.onnx.export(..., dynamo=False)`` (checked against
  torch 2.13 at opsets 9, 11, 14 and 17): shape constants as ``Constant`` nodes, zero
  states ``ConstantOfShape(Concat([L*D], Unsqueeze(Gather(Shape(x), b)), [H]))`` sliced
  per layer, ``Squeeze(Y, 1)`` after a unidirectional layer and
  ``Reshape(Transpose(Y, [0,2,1,3]), [0,0,-1])`` after a bidirectional one, one
  ``Transpose(1,0,2)`` at each end for ``batch_first``;
* ``style="tf2onnx"``: keras layers converted by tf2onnx, whose tensors are batch-major
  between layers: ``Transpose(2,1,0,3) -> Squeeze(1)`` (uni) or
  ``Transpose(2,0,1,3) -> Reshape([0,0,-1])`` (bi) after each layer, ``Transpose(1,0,2)``
  before each, keras zero states ``Unsqueeze(ConstantOfShape([batch, H]), 0)``;
* ``style="plain"``: hand-written (spox-like) graphs, the only style with ``layout=1``
  nodes (``Reshape(Y, [0,0,-1])`` between batch-first layers).

Independently: the initial-state form (see :data:`STATE_FORMS`, near misses included),
weights as initializers or ``Constant`` nodes, the opset (9-21; Squeeze/Unsqueeze axes
and Slice bounds as attributes where the opset wants them), and whether the whole stack
sits inside an ``If`` (one stack per branch), ``Loop`` or ``Scan`` body.

Nothing here needs torch or onnxscript; a model takes about a millisecond.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "NEAR_MISS_STATE_FORMS",
    "STATE_FORMS",
    "ZERO_STATE_FORMS",
    "ExporterSpec",
    "build_exporter_model",
    "exporter_inputs",
    "exporter_specs",
    "in_if_branches",
    "initializers_as_constants",
    "quantized_lstm_model",
]

Style = Literal["torchscript", "tf2onnx", "plain"]

#: Initial states that are provably all zeros, each as some exporter writes them.
ZERO_STATE_FORMS = (
    "constant_of_shape",  # TorchScript: ConstantOfShape(Concat(...Shape(x)...)), value 0
    "constant_of_shape_default",  # the same without a value attribute (float 0)
    "keras",  # tf2onnx: Unsqueeze(ConstantOfShape(Concat(Unsqueeze(Squeeze(Slice(Shape)))...)))
    "expand",  # Expand(0.0, shape)
    "mul",  # Mul(Expand(1.0, shape), 0.0): finite times zero
    "torchlib",  # Slice(Expand(0.0, Concat([L*D], Shape(x)[b], [H])))
    "zero_constant",  # a zero initializer of exactly [D, batch, H] (static batch only)
)
#: States that look zero-ish but are not provably zeros of the right shape: never dropped.
NEAR_MISS_STATE_FORMS = (
    "nonzero_constant_of_shape",  # ConstantOfShape(value=0.25)
    "wrong_shape_constant",  # zeros [D, 1, H] while the batch axis is dynamic
    "mul_input",  # Mul(h0, 0.0) with h0 a graph input: NaN for inf / NaN inputs
    "half_zero",  # Concat(zeros, ones) over directions
)
#: Every form: ``absent`` (no state input), ``input`` (graph inputs h0/c0) and the above.
STATE_FORMS = ("absent", "input", *ZERO_STATE_FORMS, *NEAR_MISS_STATE_FORMS)

_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


@dataclasses.dataclass(frozen=True)
class ExporterSpec:
    """A stack of RNN layers and the exporter style of the graph around it."""

    op_type: Literal["LSTM", "GRU", "RNN"] = "LSTM"
    style: Style = "torchscript"
    input_size: int = 4
    hidden_size: int = 5
    num_layers: int = 1
    direction: Literal["forward", "reverse", "bidirectional"] = "forward"
    #: The graph's input and ``y`` output are [batch, seq, ...] (else [seq, batch, ...]).
    batch_first: bool = False
    #: The RNN nodes' ``layout`` attribute (1 needs opset >= 14 and ``style="plain"``).
    layout: int = 0
    initial_state: str = "absent"
    #: W, R, B as ``Constant`` nodes instead of initializers.
    constant_weights: bool = False
    opset: int = 17
    #: Declare the batch axis of the graph input with this static size (None: dynamic).
    static_batch: int | None = None
    #: Graph outputs: ``y`` (last layer's sequence), ``h`` / ``c`` (final states).
    outputs: tuple[str, ...] = ("y", "h")
    #: Put the stack in a subgraph: ``if`` (a different stack per branch), ``loop``, ``scan``.
    wrap: Literal["if", "loop", "scan"] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.layout == 1 and (self.opset < 14 or self.style != "plain"):
            raise ValueError("layout=1 needs opset >= 14 and style='plain'")
        if self.initial_state not in STATE_FORMS:
            raise ValueError(f"unknown initial_state {self.initial_state!r}")
        if self.initial_state == "zero_constant" and self.static_batch is None:
            raise ValueError("a zero constant state has a static batch: set static_batch")
        if self.initial_state == "wrong_shape_constant" and self.static_batch is not None:
            raise ValueError("zeros of batch 1 against a static batch: a model that never runs")
        if "c" in self.outputs and self.op_type != "LSTM":
            raise ValueError("only an LSTM has a 'c' output")
        if not self.outputs:
            raise ValueError("at least one graph output")
        if self.wrap == "loop" and self.opset < 11:
            raise ValueError("a Loop without loop-carried values needs opset >= 11")
        if self.wrap == "scan" and self.state_inputs:
            raise ValueError("a Scan body reads no outer state inputs in this builder")

    @property
    def num_directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    @property
    def state_names(self) -> list[str]:
        return ["h0", "c0"] if self.op_type == "LSTM" else ["h0"]

    @property
    def state_inputs(self) -> bool:
        return self.initial_state in ("input", "mul_input")


class _Writer:
    """Nodes and initializers of one graph; constants as Constant nodes or initializers."""

    def __init__(self, spec: ExporterSpec, prefix: str, constant_nodes: bool) -> None:
        self.spec = spec
        self.opset = spec.opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._prefix = prefix
        self._constant_nodes = constant_nodes
        self._ids = itertools.count()

    def fresh(self, hint: str = "v") -> str:
        return f"{self._prefix}{hint}_{next(self._ids)}"

    def node(self, op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs) -> list[str]:
        outputs = [self.fresh(op_type) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, **attrs))
        return outputs

    def const(self, array: np.ndarray, *, as_node: bool | None = None, hint: str = "c") -> str:
        name = self.fresh(hint)
        if self._constant_nodes if as_node is None else as_node:
            tensor = numpy_helper.from_array(np.asarray(array), name + "_value")
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        else:
            self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, dtype=np.int64))

    def squeeze(self, x: str, axes: list[int]) -> str:
        if self.opset < 13:
            return self.node("Squeeze", [x], axes=axes)[0]
        return self.node("Squeeze", [x, self.ints(*axes)])[0]

    def unsqueeze(self, x: str, axes: list[int]) -> str:
        if self.opset < 13:
            return self.node("Unsqueeze", [x], axes=axes)[0]
        return self.node("Unsqueeze", [x, self.ints(*axes)])[0]

    def slice(self, x: str, start: int, end: int, axis: int) -> str:
        if self.opset < 10:
            return self.node("Slice", [x], starts=[start], ends=[end], axes=[axis])[0]
        return self.node("Slice", [x, self.ints(start), self.ints(end), self.ints(axis)])[0]

    def transpose(self, x: str, perm: list[int]) -> str:
        return self.node("Transpose", [x], perm=perm)[0]


def _weights(spec: ExporterSpec, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """ONNX-layout W [D, G*H, I], R [D, G*H, H], B [D, 2*G*H] per layer."""
    h, d, g = spec.hidden_size, spec.num_directions, _GATES[spec.op_type]
    bound = 1.0 / np.sqrt(h)
    layers = []
    for layer in range(spec.num_layers):
        width = spec.input_size if layer == 0 else d * h
        shapes = {"W": (d, g * h, width), "R": (d, g * h, h), "B": (d, 2 * g * h)}
        layers.append(
            {k: rng.uniform(-bound, bound, s).astype(np.float32) for k, s in shapes.items()}
        )
    return layers


def _batch_of(w: _Writer, source: str, axis: int, keras: bool) -> str:
    """A 1-element int64 tensor holding ``source``'s size along ``axis``, exporter-style."""
    (shape,) = w.node("Shape", [source])
    if keras:  # tf2onnx's StridedSlice(shrink_axis) -> Slice + Squeeze, then Pack -> Unsqueeze
        return w.unsqueeze(w.squeeze(w.slice(shape, axis, axis + 1, 0), [0]), [0])
    (batch,) = w.node("Gather", [shape, w.const(np.array(axis, dtype=np.int64))], axis=0)
    return w.unsqueeze(batch, [0])


def _stacked_shape(w: _Writer, batch: str, stacked: int) -> str:
    """[L*D, batch, H] (layout 0) or [batch, L*D, H] (layout 1) as an int64 tensor."""
    spec = w.spec
    parts = [w.ints(stacked), batch, w.ints(spec.hidden_size)]
    if spec.layout == 1:
        parts = [batch, w.ints(stacked), w.ints(spec.hidden_size)]
    return w.node("Concat", parts, axis=0)[0]


def _zero_states(
    w: _Writer, source: str, batch_axis: int, inputs: list[onnx.ValueInfoProto]
) -> dict[str, list[str | None]]:
    """Per state name, per layer: the value to feed the RNN node ('' for none)."""
    spec = w.spec
    form = spec.initial_state
    d, h, layers = spec.num_directions, spec.hidden_size, spec.num_layers
    stacked = d * layers
    state_axis = 1 if spec.layout == 1 else 0
    batch_dim = spec.static_batch if spec.static_batch is not None else "batch"

    def per_layer(value: str) -> list[str | None]:
        if layers == 1 and form != "torchlib":
            return [value]
        return [w.slice(value, i * d, (i + 1) * d, state_axis) for i in range(layers)]

    def stacked_dims(batch) -> list:
        return [batch, stacked, h] if spec.layout == 1 else [stacked, batch, h]

    if form == "absent":
        return {s: [None] * layers for s in spec.state_names}
    if form in ("input", "mul_input"):
        result = {}
        for s in spec.state_names:
            inputs.append(
                helper.make_tensor_value_info(s, TensorProto.FLOAT, stacked_dims(batch_dim))
            )
            value = s
            if form == "mul_input":
                (value,) = w.node("Mul", [s, w.const(np.array(0.0, dtype=np.float32))])
            result[s] = per_layer(value)
        return result
    if form in ("zero_constant", "wrong_shape_constant"):
        rows = spec.static_batch if form == "zero_constant" else 1
        zeros = w.const(np.zeros(stacked_dims(rows), dtype=np.float32), as_node=False)
        return {s: per_layer(zeros) for s in spec.state_names}
    if form == "half_zero":
        # zeros for every direction but the last, which starts from ones
        batch = _batch_of(w, source, batch_axis, keras=False)
        shape = _stacked_shape(w, batch, 1)
        parts = []
        for fill in [0.0] * (stacked - 1) + [1.0]:
            value = helper.make_tensor("value", TensorProto.FLOAT, [1], [fill])
            parts.append(w.node("ConstantOfShape", [shape], value=value)[0])
        (value,) = w.node("Concat", parts, axis=state_axis) if len(parts) > 1 else parts
        return {s: per_layer(value) for s in spec.state_names}
    if form == "keras":
        # keras zeros [batch, H] per direction, Unsqueeze'd (tf2onnx) and concatenated.
        batch = _batch_of(w, source, batch_axis, keras=True)
        (shape,) = w.node("Concat", [batch, w.ints(h)], axis=0)
        value = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0])
        (flat,) = w.node("ConstantOfShape", [shape], value=value)
        one = w.unsqueeze(flat, [state_axis])
        states = [w.node("Concat", [one] * d, axis=state_axis)[0] if d > 1 else one]
        layer_states: list[str | None] = [*states] * layers
        return dict.fromkeys(spec.state_names, layer_states)

    batch = _batch_of(w, source, batch_axis, keras=False)
    shape = _stacked_shape(w, batch, stacked)
    if form in ("constant_of_shape", "nonzero_constant_of_shape"):
        fill = 0.25 if form.startswith("nonzero") else 0.0
        value = helper.make_tensor("value", TensorProto.FLOAT, [1], [fill])
        (zeros,) = w.node("ConstantOfShape", [shape], value=value)
    elif form == "constant_of_shape_default":
        (zeros,) = w.node("ConstantOfShape", [shape])
    elif form in ("expand", "torchlib"):
        (zeros,) = w.node("Expand", [w.const(np.array(0.0, dtype=np.float32)), shape])
    elif form == "mul":
        (ones,) = w.node("Expand", [w.const(np.array(1.0, dtype=np.float32)), shape])
        (zeros,) = w.node("Mul", [ones, w.const(np.array(0.0, dtype=np.float32))])
    else:  # pragma: no cover - guarded by ExporterSpec
        raise ValueError(form)
    return {s: per_layer(zeros) for s in spec.state_names}  # TorchScript slices h and c apart


def _glue(w: _Writer, y: str, last: bool) -> str:
    """The exporter's chain from Y to the next layer's X (or to the graph's ``y``)."""
    spec = w.spec
    d = spec.num_directions
    if spec.layout == 1:  # Y [batch, seq, D, H] -> [batch, seq, D*H]
        return w.node("Reshape", [y, w.ints(0, 0, -1)])[0]
    if spec.style == "tf2onnx":
        if d == 1:
            out = w.squeeze(w.transpose(y, [2, 1, 0, 3]), [1])
        else:
            out = w.node("Reshape", [w.transpose(y, [2, 0, 1, 3]), w.ints(0, 0, -1)])[0]
        # keras tensors are batch-major; the next layer transposes them back itself
        return out if not last or spec.batch_first else w.transpose(out, [1, 0, 2])
    if d == 1:
        out = w.squeeze(y, [1])
    else:
        out = w.node("Reshape", [w.transpose(y, [0, 2, 1, 3]), w.ints(0, 0, -1)])[0]
    if last and spec.batch_first:
        out = w.transpose(out, [1, 0, 2])
    return out


def _stack(
    w: _Writer,
    source: str,
    weights: list[dict[str, np.ndarray]],
    inputs: list[onnx.ValueInfoProto],
) -> dict[str, str]:
    """Emit the RNN stack reading ``source``; return the values of ``y``, ``h``, ``c``."""
    spec = w.spec
    batch_axis = 0 if spec.batch_first else 1
    states = _zero_states(w, source, batch_axis, inputs)
    current = source
    if spec.layout == 0 and spec.batch_first and spec.style != "tf2onnx":
        current = w.transpose(source, [1, 0, 2])
    if spec.layout == 1 and not spec.batch_first:
        current = w.transpose(source, [1, 0, 2])
    finals: dict[str, list[str]] = {"h": [], "c": []}
    attrs = {"hidden_size": spec.hidden_size, "direction": spec.direction}
    if spec.layout == 1:
        attrs["layout"] = 1
    if spec.op_type == "GRU":
        attrs["linear_before_reset"] = 1
    n_out = 3 if spec.op_type == "LSTM" else 2
    for layer, params in enumerate(weights):
        if spec.style == "tf2onnx" and (layer > 0 or spec.batch_first):
            current = w.transpose(current, [1, 0, 2])
        names = [w.const(params[k], as_node=spec.constant_weights, hint=k) for k in "WRB"]
        rnn_inputs = [current, *names, ""] + [states[s][layer] or "" for s in spec.state_names]
        while rnn_inputs[-1] == "":
            rnn_inputs.pop()
        outs = w.node(spec.op_type, rnn_inputs, n_out, **attrs)
        finals["h"].append(outs[1])
        if n_out == 3:
            finals["c"].append(outs[2])
        last = layer == len(weights) - 1
        if not last or "y" in spec.outputs:  # no dead glue after a Y nobody reads
            current = _glue(w, outs[0], last=last)
    if spec.layout == 1 and not spec.batch_first and "y" in spec.outputs:
        current = w.transpose(current, [1, 0, 2])
    state_axis = 1 if spec.layout == 1 else 0

    def joined(values: list[str]) -> str:
        if len(values) == 1:
            return w.node("Identity", values)[0]
        return w.node("Concat", values, axis=state_axis)[0]

    result = {"y": current}
    for name in ("h", "c"):
        if name in spec.outputs:  # no dead nodes: the rules must see true consumers
            result[name] = joined(finals[name])
    return result


def _output_dims(spec: ExporterSpec, name: str) -> list:
    batch = spec.static_batch if spec.static_batch is not None else "batch"
    stacked = spec.num_layers * spec.num_directions
    if name == "y":
        width = spec.num_directions * spec.hidden_size
        return [batch, "seq", width] if spec.batch_first else ["seq", batch, width]
    if spec.layout == 1:
        return [batch, stacked, spec.hidden_size]
    return [stacked, batch, spec.hidden_size]


def _model(spec: ExporterSpec, graph: onnx.GraphProto) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", spec.opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name=f"builders.{spec.style}")
    model.ir_version = max(helper.find_min_ir_version_for(opsets), 7)
    onnx.checker.check_model(model, full_check=True)
    return model


def build_exporter_model(spec: ExporterSpec) -> onnx.ModelProto:
    """The model ``spec`` describes; it passes ``onnx.checker`` with ``full_check``."""
    rng = np.random.default_rng(spec.seed)
    batch = spec.static_batch if spec.static_batch is not None else "batch"
    x_dims = (
        [batch, "seq", spec.input_size] if spec.batch_first else ["seq", batch, spec.input_size]
    )
    inputs: list[onnx.ValueInfoProto] = []
    if spec.wrap is None:
        w = _Writer(spec, "", constant_nodes=spec.style == "torchscript")
        inputs.append(helper.make_tensor_value_info("input", TensorProto.FLOAT, x_dims))
        values = _stack(w, "input", _weights(spec, rng), inputs)
        outputs = []
        for name in spec.outputs:
            w.nodes.append(helper.make_node("Identity", [values[name]], [name]))
            dims = _output_dims(spec, name)
            outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
        graph = helper.make_graph(w.nodes, "rnn", inputs, outputs, w.initializers)
        return _model(spec, graph)
    return _build_wrapped(spec, rng, x_dims)


def _body(
    spec: ExporterSpec, rng: np.random.Generator, prefix: str, source: str, inputs: list
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], dict[str, str]]:
    # Subgraph weights are Constant nodes unless asked otherwise: initializers in a
    # subgraph are legal but ORT lifts them; both are covered by constant_weights.
    w = _Writer(spec, prefix, constant_nodes=True)
    values = _stack(w, source, _weights(spec, rng), inputs)
    return w.nodes, w.initializers, values


def _build_wrapped(spec: ExporterSpec, rng: np.random.Generator, x_dims: list) -> onnx.ModelProto:
    if spec.wrap is None:
        raise ValueError("a wrapped model needs spec.wrap")
    leads: dict[str, list[str | int]] = {"if": [], "loop": [2], "scan": ["chunks"]}
    lead = leads[spec.wrap]
    outputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, lead + _output_dims(spec, name))
        for name in spec.outputs
    ]
    wrap = {"if": _in_if, "loop": _in_loop, "scan": _in_scan}[spec.wrap]
    node, inputs, initializers = wrap(spec, rng, x_dims)
    graph = helper.make_graph([node], f"rnn_in_{spec.wrap}", inputs, outputs, initializers)
    return _model(spec, graph)


#: A wrapper's node, the outer graph's inputs and initializers.
_Wrapped = tuple[onnx.NodeProto, list[onnx.ValueInfoProto], list[onnx.TensorProto]]


def _body_outputs(spec: ExporterSpec, prefix: str) -> list[onnx.ValueInfoProto]:
    return [
        helper.make_tensor_value_info(f"{prefix}{n}", TensorProto.FLOAT, _output_dims(spec, n))
        for n in spec.outputs
    ]


def _in_if(spec: ExporterSpec, rng: np.random.Generator, x_dims: list) -> _Wrapped:
    """An If whose branches hold two stacks (other weights) reading the outer input."""
    outer_inputs = [
        helper.make_tensor_value_info("input", TensorProto.FLOAT, x_dims),
        helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
    ]
    branches = []
    state_inputs: list = []
    for branch in ("then", "else"):
        state_inputs = []
        body_nodes, inits, values = _body(spec, rng, f"{branch}_", "input", state_inputs)
        body_nodes += [
            helper.make_node("Identity", [values[n]], [f"{branch}_{n}"]) for n in spec.outputs
        ]
        outs = _body_outputs(spec, f"{branch}_")
        branches.append(helper.make_graph(body_nodes, f"{branch}_branch", [], outs, inits))
    outer_inputs += state_inputs  # graph inputs h0 / c0 read from the outer scope
    node = helper.make_node(
        "If", ["cond"], list(spec.outputs), then_branch=branches[0], else_branch=branches[1]
    )
    return node, outer_inputs, []


def _in_loop(spec: ExporterSpec, rng: np.random.Generator, x_dims: list) -> _Wrapped:
    """Loop(M=2): each iteration runs the stack on the outer input; scan outputs stack them."""
    outer_inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, x_dims)]
    state_inputs: list = []
    body_nodes, inits, values = _body(spec, rng, "body_", "input", state_inputs)
    outer_inputs += state_inputs
    body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    body_nodes += [helper.make_node("Identity", [values[n]], [f"body_{n}"]) for n in spec.outputs]
    body = helper.make_graph(
        body_nodes,
        "loop_body",
        [
            helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            *_body_outputs(spec, "body_"),
        ],
        inits,
    )
    trip = numpy_helper.from_array(np.array(2, dtype=np.int64), "trip_count")
    keep_going = numpy_helper.from_array(np.array(True), "keep_going")
    node = helper.make_node("Loop", ["trip_count", "keep_going"], list(spec.outputs), body=body)
    return node, outer_inputs, [trip, keep_going]


def _in_scan(spec: ExporterSpec, rng: np.random.Generator, x_dims: list) -> _Wrapped:
    """Scan over a leading chunk axis: each chunk [seq, batch, I] runs through the stack."""
    outer_inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["chunks", *x_dims])]
    state_inputs: list = []
    body_nodes, inits, values = _body(spec, rng, "body_", "chunk", state_inputs)
    body_nodes += [helper.make_node("Identity", [values[n]], [f"body_{n}"]) for n in spec.outputs]
    body = helper.make_graph(
        body_nodes,
        "scan_body",
        [helper.make_tensor_value_info("chunk", TensorProto.FLOAT, x_dims)],
        _body_outputs(spec, "body_"),
        inits,
    )
    node = helper.make_node("Scan", ["input"], list(spec.outputs), body=body, num_scan_inputs=1)
    return node, outer_inputs, []


def exporter_inputs(
    spec: ExporterSpec,
    batch: int,
    seq: int,
    rng: np.random.Generator | int = 0,
    *,
    cond: bool = True,
) -> dict[str, np.ndarray]:
    """Feeds for a model built from ``spec`` at the given batch and sequence sizes."""
    rng = np.random.default_rng(rng)
    if spec.static_batch is not None:
        batch = spec.static_batch
    x_shape: tuple[int, ...] = (
        (batch, seq, spec.input_size) if spec.batch_first else (seq, batch, spec.input_size)
    )
    if spec.wrap == "scan":
        x_shape = (2, *x_shape)
    feeds = {"input": rng.standard_normal(x_shape).astype(np.float32)}
    if spec.wrap == "if":
        feeds["cond"] = np.array(cond)
    if spec.state_inputs:
        stacked = spec.num_layers * spec.num_directions
        dims = (
            (batch, stacked, spec.hidden_size)
            if spec.layout == 1
            else (stacked, batch, spec.hidden_size)
        )
        for s in spec.state_names:
            feeds[s] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def quantized_lstm_model(
    *,
    input_size: int = 4,
    hidden_size: int = 5,
    direction: Literal["forward", "reverse", "bidirectional"] = "forward",
    outputs: tuple[str, ...] = ("y",),
    zero_states: bool = True,
    style: Style = "torchscript",
    seed: int = 0,
) -> onnx.ModelProto:
    """onnxruntime's quantizer output: ``com.microsoft.DynamicQuantizeLSTM`` plus glue.

    Weights are uint8 ``[D, I, 4H]`` / ``[D, H, 4H]`` (transposed against ``LSTM``'s) with
    per-direction scales and zero points. With ``zero_states`` the states are
    TorchScript's ``ConstantOfShape`` zeros; the output goes through the exporter glue
    of ``style`` (TorchScript's ``Squeeze(Y, 1)`` / ``Reshape(Transpose(Y), [0,0,-1])`` or
    tf2onnx's chains), so the output is ``[seq, batch, D*H]`` either way.
    """
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    h = hidden_size
    spec = ExporterSpec(
        opset=14, input_size=input_size, hidden_size=h, direction=direction, style=style
    )
    w = _Writer(spec, "", constant_nodes=False)
    inputs = [
        helper.make_tensor_value_info("input", TensorProto.FLOAT, ["seq", "batch", input_size])
    ]
    qw = w.const(rng.integers(0, 256, (d, input_size, 4 * h)).astype(np.uint8), hint="W")
    qr = w.const(rng.integers(0, 256, (d, h, 4 * h)).astype(np.uint8), hint="R")
    bias = w.const(rng.uniform(-0.1, 0.1, (d, 8 * h)).astype(np.float32), hint="B")
    state = ""
    if zero_states:
        batch = _batch_of(w, "input", 1, keras=False)
        shape = w.node("Concat", [w.ints(d), batch, w.ints(h)], axis=0)[0]
        value = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0])
        (state,) = w.node("ConstantOfShape", [shape], value=value)
    scale = lambda: w.const(np.full((d,), 0.02, dtype=np.float32))  # noqa: E731
    zero_point = lambda: w.const(np.full((d,), 128, dtype=np.uint8))  # noqa: E731
    node_inputs = [
        "input",
        qw,
        qr,
        bias,
        "",
        state,
        state,
        "",
        scale(),
        zero_point(),
        scale(),
        zero_point(),
    ]
    y, y_h, y_c = (w.fresh(n) for n in ("Y", "Y_h", "Y_c"))
    w.nodes.append(
        helper.make_node(
            "DynamicQuantizeLSTM",
            node_inputs,
            [y, y_h, y_c],
            domain="com.microsoft",
            hidden_size=h,
            direction=direction,
        )
    )
    values = {"y": _glue(w, y, last=True), "h": y_h, "c": y_c}
    dims: dict[str, list[str | int]] = {
        "y": ["seq", "batch", d * h],
        "h": [d, "batch", h],
        "c": [d, "batch", h],
    }
    graph_outputs = []
    for name in outputs:
        w.nodes.append(helper.make_node("Identity", [values[name]], [name]))
        graph_outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims[name]))
    graph = helper.make_graph(w.nodes, "quantized_lstm", inputs, graph_outputs, w.initializers)
    opsets = [helper.make_opsetid("", 14), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="builders.ort_quantizer")
    model.ir_version = 8
    return model


def exporter_specs(**fixed):
    """A hypothesis strategy over :class:`ExporterSpec` (hypothesis is a test dependency).

    Keyword arguments pin fields (a value) or restrict them (a hypothesis strategy).
    """
    from hypothesis import strategies as st

    def field(name: str, default):
        value = fixed.get(name, default)
        return (
            value
            if isinstance(value, st.SearchStrategy)
            else st.just(value)
            if name in fixed
            else default
        )

    @st.composite
    def build(draw) -> ExporterSpec:
        style = draw(field("style", st.sampled_from(["torchscript", "tf2onnx", "plain"])))
        opset = draw(field("opset", st.integers(9, 21)))
        layout = draw(
            field(
                "layout",
                st.sampled_from([0, 1]) if style == "plain" and opset >= 14 else st.just(0),
            )
        )
        op_type = draw(field("op_type", st.sampled_from(["LSTM", "GRU", "RNN"])))
        static_batch = draw(field("static_batch", st.none()))
        initial_state = draw(field("initial_state", st.sampled_from(STATE_FORMS)))
        if initial_state == "zero_constant" and static_batch is None:
            static_batch = 2  # a zero constant has the batch it was exported with
        if initial_state == "wrong_shape_constant":
            static_batch = None  # its batch 1 only mismatches a dynamic batch
        wrap = draw(field("wrap", st.none()))
        if (wrap == "scan" and initial_state in ("input", "mul_input")) or (
            wrap == "loop" and opset < 11
        ):
            wrap = None  # combinations the builder does not make
        outputs = ["y", "h"] + (["c"] if op_type == "LSTM" else [])
        chosen = draw(
            field("outputs", st.lists(st.sampled_from(outputs), min_size=1, unique=True).map(tuple))
        )
        return ExporterSpec(
            op_type=op_type,
            style=style,
            input_size=draw(field("input_size", st.integers(1, 6))),
            hidden_size=draw(field("hidden_size", st.integers(1, 6))),
            num_layers=draw(field("num_layers", st.integers(1, 3))),
            direction=draw(
                field("direction", st.sampled_from(["forward", "reverse", "bidirectional"]))
            ),
            batch_first=draw(field("batch_first", st.booleans())),
            layout=layout,
            initial_state=initial_state,
            constant_weights=draw(field("constant_weights", st.booleans())),
            opset=opset,
            static_batch=static_batch,
            outputs=chosen,
            wrap=wrap,
            seed=draw(field("seed", st.integers(0, 2**16))),
        )

    return build()


def initializers_as_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with every initializer turned into a ``Constant`` node (TorchScript
    with ``do_constant_folding=False``, tf2onnx and hand-written graphs do this)."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    constants = [helper.make_node("Constant", [], [t.name], value=t) for t in graph.initializer]
    del graph.initializer[:]
    nodes = constants + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(result, full_check=True)
    return result


def _branch(model: onnx.ModelProto, prefix: str) -> onnx.GraphProto:
    """``model``'s graph as an If branch: inputs read from the outer scope, weights as
    ``Constant`` nodes, every inner name prefixed."""
    outer = {i.name for i in model.graph.input}

    def rename(name: str) -> str:
        return name if not name or name in outer else prefix + name

    graph = initializers_as_constants(model).graph
    nodes = []
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [rename(n) for n in node.input]
        copy.output[:] = [rename(n) for n in node.output]
        nodes.append(copy)
    outputs = []
    for value in graph.output:
        copy = onnx.ValueInfoProto()
        copy.CopyFrom(value)
        copy.name = rename(value.name)
        outputs.append(copy)
    return helper.make_graph(nodes, prefix + "branch", [], outputs)


def in_if_branches(then_model: onnx.ModelProto, else_model: onnx.ModelProto) -> onnx.ModelProto:
    """One model per ``If`` branch (same inputs and outputs), selected by a ``cond`` input:
    a streaming model that keeps one RNN stack per branch."""
    graph = then_model.graph
    node = helper.make_node(
        "If",
        ["cond"],
        [o.name for o in graph.output],
        then_branch=_branch(then_model, "then_"),
        else_branch=_branch(else_model, "else_"),
    )
    inputs = [*graph.input, helper.make_tensor_value_info("cond", TensorProto.BOOL, [])]
    main = helper.make_graph([node], "rnn_in_if", inputs, list(graph.output))
    model = helper.make_model(main, opset_imports=list(then_model.opset_import))
    model.ir_version = then_model.ir_version
    onnx.checker.check_model(model, full_check=True)
    return model

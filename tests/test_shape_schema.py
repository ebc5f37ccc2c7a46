"""The prover's fallback to ONNX's own shape functions, against ``onnx.reference``.

For ops without a hand-written transfer function (Einsum, Conv, ConvTranspose, Pad,
Resize, pooling, ...) every size the prover states must be the size the runtime
computes, at random sizes with zero included; and each test asserts that something is
proven (the output's rank), so a fallback that proves nothing fails.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from rnn_rewrite_rules.shape import Dim, ShapeProver
from rnn_rewrite_rules.shape.ops import TRANSFER
from rnn_rewrite_rules.shape.schema import infer
from tests.test_shape_prover import _const, _feed, _input, _model, check, sizes

onnxruntime.set_default_logger_severity(3)  # declared outputs are empty: no warnings

FALLBACK_OPS = (
    "Einsum",
    "Conv",
    "ConvTranspose",
    "Pad",
    "Resize",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "MaxPool",
    "AveragePool",
    "DepthToSpace",
    "SpaceToDepth",
    "TopK",
    "CumSum",
    "Trilu",
    "NonZero",
    "SplitToSequence",
    "SequenceAt",
    "Range",
    "OneHot",
)


UNARY = {
    "Hardmax": {"axis": -1},
    "LpNormalization": {"axis": -1},
    "Shrink": {},
    "ThresholdedRelu": {},
    "Celu": {},
    "Mish": {},
    "LRN": {"size": 3},
    "EyeLike": {},
    "Det": {},
}


def test_these_ops_have_no_hand_written_function() -> None:
    """Otherwise the tests below would test the hand-written one."""
    assert not [op for op in (*FALLBACK_OPS, *UNARY) if ("", op) in TRANSFER]


def _proven_rank(model: onnx.ModelProto, output: str) -> int | None:
    ir_model = ir.serde.deserialize_model(model)
    value = next(v for n in ir_model.graph for v in n.outputs if v.name == output)
    return ShapeProver(ir_model.graph).rank(value)


def _check_with_rank(model: onnx.ModelProto, feeds, outputs: dict[str, int], **kw) -> int:
    """:func:`check`, and each output in ``outputs`` has that proven rank."""
    checked = check(model, feeds, **kw)
    for name, rank in outputs.items():
        assert _proven_rank(model, name) == rank, name
    return checked


# ---------------------------------------------------------------- Einsum

EQUATIONS = [
    "btgi,gih->btgh",  # DeepFilterNet's grouped linear
    "bij,bjk->bik",
    "ij->ji",
    "ij->i",
    "ii->i",
    "i,i->",
    "...ij,jk->...ik",
    "bhqd,bhkd->bhqk",
    "ij,jk",  # implicit output: the labels used once, sorted (ik)
    "ba",  # implicit: ab, a transpose
    "...ij,jk",
]


@given(data=st.data(), equation=st.sampled_from(EQUATIONS))
def test_einsum(data, equation) -> None:
    """Labels shared between operands at one size each (or 1 somewhere: broadcasting
    then decides), ellipses of any rank, zero sizes."""
    lhs, _, rhs = equation.partition("->")
    if "->" not in equation:
        once = sorted(k for k in set(lhs) - {".", ","} if lhs.count(k) == 1)
        rhs = ("..." if "..." in lhs else "") + "".join(once)
    label_size = {label: data.draw(sizes) for label in set(lhs) - {".", ","}}
    ellipsis = data.draw(st.lists(sizes, max_size=2))
    shapes = []
    for term in lhs.split(","):
        shape = list(ellipsis) if term.startswith("...") else []
        for label in term.removeprefix("..."):
            one = data.draw(st.integers(0, 7)) == 0  # sometimes 1 in one operand
            shape.append(1 if one else label_size[label])
        shapes.append(shape)
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["out"], equation=equation)
    inputs = [_input(n, s) for n, s in zip(names, shapes, strict=True)]
    feeds = {n: _feed(s, seed=i) for i, (n, s) in enumerate(zip(names, shapes, strict=True))}
    rank = len(rhs.removeprefix("...")) + (len(ellipsis) if rhs.startswith("...") else 0)
    _check_with_rank(
        _model([node], inputs, ["out"], opset=12 + data.draw(st.integers(0, 9))),
        feeds,
        {"out": rank},
    )


# ---------------------------------------------------------------- convolutions and pooling


@given(
    data=st.data(),
    spatial=st.integers(1, 2),
    batch=sizes,
    group=st.sampled_from([1, 2]),
    static=st.booleans(),
    transpose=st.booleans(),
)
def test_conv_and_conv_transpose(data, spatial, batch, group, static, transpose) -> None:
    """Batch passed through symbolically; spatial sizes computed when declared static
    (strides, dilations, pads, auto_pad, output_padding, output_shape)."""
    channels = group * data.draw(st.integers(1, 2))
    out_channels = group * data.draw(st.integers(1, 2))
    size = [data.draw(st.integers(0, 6)) for _ in range(spatial)]
    kernel = [data.draw(st.integers(1, 3)) for _ in range(spatial)]
    attrs: dict = {"group": group}
    if data.draw(st.booleans()):
        attrs["strides"] = [data.draw(st.integers(1, 3)) for _ in range(spatial)]
    if data.draw(st.booleans()):
        attrs["dilations"] = [data.draw(st.integers(1, 2)) for _ in range(spatial)]
    mode = data.draw(st.sampled_from(["pads", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if mode == "pads":
        attrs["pads"] = [data.draw(st.integers(0, 2)) for _ in range(2 * spatial)]
    else:
        attrs["auto_pad"] = mode
    if transpose:
        w_shape = [channels, out_channels // group, *kernel]
        if data.draw(st.booleans()):
            strides = attrs.get("strides", [1] * spatial)
            attrs["output_padding"] = [data.draw(st.integers(0, s - 1)) for s in strides]
        if data.draw(st.integers(0, 3)) == 0:
            attrs["output_shape"] = [data.draw(st.integers(0, 8)) for _ in range(spatial)]
    else:
        w_shape = [out_channels, channels // group, *kernel]
    x_shape = [batch, channels, *size]
    op = "ConvTranspose" if transpose else "Conv"
    node = helper.make_node(op, ["x", "w"], ["out"], **attrs)
    static_axes = {1, *range(2, 2 + spatial)} if static else {1}
    inputs = [_input("x", x_shape, static=static_axes)]
    inits = [_const("w", np.ones(w_shape, np.float32) * 0.1, np.float32)]
    model = _model([node], inputs, ["out"], inits, opset=data.draw(st.sampled_from([11, 18, 21])))
    if "output_shape" in attrs:  # ONNX's shape function is wrong then: not used
        check(model, {"x": _feed(x_shape)}, ort=True)
        return
    checked = _check_with_rank(model, {"x": _feed(x_shape)}, {"out": 2 + spatial}, ort=True)
    every_window_fits = min(size) >= 5  # the widest window: kernel 3, dilation 2
    # SAME padding with output_padding: ONNX adds the padding, ONNX Runtime does not, so the
    # prover leaves those sizes uncomputed (shape/schema.py)
    runtimes_agree = not (mode.startswith("SAME") and any(attrs.get("output_padding", [])))
    computed = static and every_window_fits and runtimes_agree
    assert checked >= 2 + (spatial if computed else 0)


@given(
    data=st.data(),
    shape=st.lists(sizes, min_size=3, max_size=4),
    op=st.sampled_from(["GlobalAveragePool", "GlobalMaxPool", "MaxPool", "AveragePool"]),
    static=st.booleans(),
)
def test_pooling(data, shape, op, static) -> None:
    spatial = len(shape) - 2
    attrs: dict = {}
    if op in ("MaxPool", "AveragePool"):
        attrs["kernel_shape"] = [data.draw(st.integers(1, 3)) for _ in range(spatial)]
        if data.draw(st.booleans()):
            attrs["strides"] = [data.draw(st.integers(1, 3)) for _ in range(spatial)]
        if data.draw(st.booleans()):
            attrs["pads"] = [data.draw(st.integers(0, 1)) for _ in range(2 * spatial)]
        attrs["ceil_mode"] = data.draw(st.sampled_from([0, 1]))
    node = helper.make_node(op, ["x"], ["out"], **attrs)
    static_axes = set(range(len(shape))) if static else {1}
    model = _model([node], [_input("x", shape, static=static_axes)], ["out"])
    assert _check_with_rank(model, {"x": _feed(shape)}, {"out": len(shape)}, ort=True) >= 2


# ---------------------------------------------------------------- pads, sizes, axes from constants


@given(
    data=st.data(),
    shape=st.lists(sizes, min_size=1, max_size=4),
    mode=st.sampled_from(["constant", "edge", "reflect"]),
    opset=st.sampled_from([11, 13, 18, 21]),
    static=st.booleans(),
)
def test_pad(data, shape, mode, opset, static) -> None:
    """Constant pads (negative too), axes as an input (opset 18), the pads from a
    Concat the prover evaluates, and pads only known at run time (rank only)."""
    rank = len(shape)
    axes = list(range(rank))
    if opset >= 18 and data.draw(st.booleans()):
        axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, unique=True))
        assume(len({a % rank for a in axes}) == len(axes))
    pads = [data.draw(st.integers(-2, 3)) for _ in range(2 * len(axes))]
    inits = [_const("pads_a", pads[: len(axes)]), _const("pads_b", pads[len(axes) :])]
    nodes = [helper.make_node("Concat", ["pads_a", "pads_b"], ["pads"], axis=0)]
    inputs = ["x", "pads"]
    if len(axes) != rank:
        inits += [_const("axes", axes)]
        inputs += ["", "axes"]
    nodes.append(helper.make_node("Pad", inputs, ["out"], mode=mode))
    nodes.append(helper.make_node("Pad", ["x", "dyn"], ["dyn_out"], mode="constant"))
    static_axes = set(range(rank)) if static else set()
    model = _model(
        nodes,
        [_input("x", shape, static=static_axes), _input("dyn", [2 * rank], TensorProto.INT64)],
        ["out", "dyn_out"],
        inits,
        opset=opset,
    )
    feeds = {"x": _feed(shape), "dyn": np.zeros(2 * rank, np.int64)}
    checked = _check_with_rank(model, feeds, {"out": rank, "dyn_out": rank}, ort=True)
    assert checked >= (rank if static else 0)


@given(
    data=st.data(),
    shape=st.lists(st.integers(0, 4), min_size=3, max_size=4),
    by=st.sampled_from(["scales", "sizes"]),
    static=st.booleans(),
)
def test_resize(data, shape, by, static) -> None:
    rank = len(shape)
    if by == "scales":
        scales = [1.0, 1.0, *(data.draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])) for _ in shape[2:])]
        extra = [_const("roi", [], np.float32), _const("scales", scales, np.float32)]
        inputs = ["x", "roi", "scales"]
    else:
        out = [*shape[:2], *(data.draw(st.integers(0, 6)) for _ in shape[2:])]
        extra = [_const("sizes", out)]
        inputs = ["x", "", "", "sizes"]
    node = helper.make_node("Resize", inputs, ["out"], mode="nearest")
    static_axes = set(range(rank)) if static else set()
    model = _model([node], [_input("x", shape, static=static_axes)], ["out"], extra, opset=18)
    _check_with_rank(model, {"x": _feed(shape)}, {"out": rank}, ort=True)


# ---------------------------------------------------------------- other ops


@given(data=st.data(), shape=st.lists(sizes, min_size=1, max_size=4))
def test_other_ops(data, shape) -> None:
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1))
    k = data.draw(st.integers(0, 3))
    assume(k <= shape[axis])
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis),
        helper.make_node("CumSum", ["x", "axis"], ["cumsum"]),
        helper.make_node("NonZero", ["x"], ["nz"]),
        helper.make_node("OneHot", ["ids", "depth", "onoff"], ["onehot"], axis=-1),
        helper.make_node("Range", ["zero", "stop", "one"], ["range"]),
    ]
    outputs = {"values": rank, "indices": rank, "cumsum": rank, "nz": 2, "onehot": rank + 1}
    if rank >= 2:
        nodes.append(helper.make_node("Trilu", ["x"], ["trilu"]))
        outputs["trilu"] = rank
    inits = [
        _const("k", [k]),
        _const("axis", axis),
        _const("depth", 3),
        _const("onoff", [0.0, 1.0], np.float32),
        _const("zero", 0),
        _const("stop", 4),
        _const("one", 1),
    ]
    model = _model(
        nodes,
        [_input("x", shape), _input("ids", shape, TensorProto.INT64)],
        [*outputs, "range"],
        inits,
    )
    feeds = {"x": _feed(shape), "ids": np.zeros(shape, np.int64)}
    assert _check_with_rank(model, feeds, outputs, ort=True) >= 3 * rank


@given(batch=sizes, height=sizes, width=sizes, block=st.sampled_from([1, 2]))
def test_depth_space(batch, height, width, block) -> None:
    x_shape = [batch, block * block * 2, height, width]
    nodes = [
        helper.make_node("DepthToSpace", ["x"], ["d2s"], blocksize=block),
        helper.make_node("SpaceToDepth", ["d2s"], ["s2d"], blocksize=block),
    ]
    model = _model(nodes, [_input("x", x_shape, static={1, 2, 3})], ["d2s", "s2d"])
    assert _check_with_rank(model, {"x": _feed(x_shape)}, {"d2s": 4, "s2d": 4}) >= 6


# ---------------------------------------------------------------- what stays unknown


def _graph_value(text: str, name: str) -> tuple[ir.Model, ir.Value]:
    model = ir.from_onnx_text(text)
    for node in model.graph.all_nodes():
        for value in node.outputs:
            if value.name == name:
                return model, value
    raise KeyError(name)


def test_sequences_do_not_break_anything() -> None:
    """SplitToSequence -> SequenceAt: the sequence has no sizes of its own, its elements'
    are known and come back out."""
    model, value = _graph_value(
        """
        <ir_version: 9, opset_import: ["" : 18]>
        g (float[T, 4] x) => (float[?] y) <int64 zero = {0}> {
            seq = SplitToSequence <axis=0> (x)
            at = SequenceAt (seq, zero)
            y = Relu (at)
        }
        """,
        "y",
    )
    prover = ShapeProver(model.graph)
    seq = model.graph.node(0).outputs[0]
    assert prover.dims(seq) is None and prover.fact(seq).sequence is not None
    assert prover.dims(value) == (Dim.const(1), Dim.const(4))


@given(
    data=st.data(),
    shape=st.lists(sizes, min_size=1, max_size=3),
    keepdims=st.sampled_from([0, 1]),
    split=st.sampled_from(["none", "scalar", "list"]),
)
def test_sequence_ops(data, shape, keepdims, split) -> None:
    """SplitToSequence (no split, a chunk size, a list), SequenceAt, ConcatFromSequence,
    SequenceLength; the sizes not split pass through as the input's symbols."""
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1))
    inputs, inits = ["x"], []
    if split == "scalar":
        inits.append(_const("split", data.draw(st.integers(1, 3))))
        inputs.append("split")
    elif split == "list":
        n = shape[axis]
        cut = data.draw(st.integers(0, n))
        inits.append(_const("split", [cut, n - cut]))
        inputs.append("split")
    assume(shape[axis] > 0 or split == "list")
    attrs = {"axis": axis} | ({"keepdims": keepdims} if split == "none" else {})
    nodes = [
        helper.make_node("SplitToSequence", inputs, ["seq"], **attrs),
        helper.make_node("SequenceAt", ["seq", "zero"], ["first"]),
        helper.make_node("ConcatFromSequence", ["seq"], ["joined"], axis=axis),
        helper.make_node("SequenceLength", ["seq"], ["count"]),
    ]
    inits.append(_const("zero", 0))
    model = _model(nodes, [_input("x", shape)], ["first", "joined", "count"], inits)
    squeezed = split == "none" and keepdims == 0
    ranks = {"first": rank - squeezed, "joined": rank - squeezed, "count": 0}
    if squeezed:  # ConcatFromSequence on the axis the elements lost: not the input's rank
        del ranks["joined"]
    checked = _check_with_rank(model, {"x": _feed(shape)}, ranks, ort=True)
    assert checked >= rank - 1 - squeezed


@pytest.mark.parametrize(
    ("text", "name"),
    [
        # a custom domain has no schema
        (
            """<ir_version: 9, opset_import: ["" : 18, "custom" : 1]>
            g (float[T, 4] x) => (float[T, 4] y) { y = custom.Thing (x) }""",
            "y",
        ),
        # an inconsistent node: ONNX's inference raises, the prover does not
        (
            """<ir_version: 9, opset_import: ["" : 18]>
            g (float[T, 4, 3] x) => (float y) { y = Einsum <equation="ij->ji"> (x) }""",
            "y",
        ),
        # a Loop carries a subgraph: unknown (its body is not evaluated here)
        (
            """<ir_version: 9, opset_import: ["" : 18]>
            g (float[T, 4] x, int64 n) => (float[T, 4] y) {
                y = Loop (n, , x) <body = b (int64 i, bool c, float[T, 4] s) => (bool co, float o) {
                    co = Identity (c)
                    o = Relu (s)
                }>
            }""",
            "y",
        ),
    ],
)
def test_unknown_where_onnx_cannot_say(text: str, name: str) -> None:
    model, value = _graph_value(text, name)
    assert ShapeProver(model.graph).dims(value) is None


def test_a_subgraph_node_runs_at_the_main_graph_s_opset() -> None:
    """A Loop body has no imports of its own (or onnxscript's placeholder "": 1 after a
    rewrite there): its Conv runs at the main graph's opset; without the main graph it is
    unknown."""
    model, value = _graph_value(
        """<ir_version: 9, opset_import: ["" : 18]>
        g (float[N, 2, 5] x, int64 n) => (float[N, 2, 5] y) <float[2, 2, 1] w = {1., 0., 0., 1.}> {
            y = Loop (n, , x) <body = b (int64 i, bool c, float[N, 2, 5] s) => (bool co, float so) {
                co = Identity (c)
                so = Conv (x, w)
            }>
        }""",
        "so",
    )
    conv = value.producer()  # reads x of the main graph (a body input's shape is no fact)
    assert conv is not None and not conv.graph.opset_imports
    assert ShapeProver(model.graph).rank(value) == 3
    assert ShapeProver().rank(value) is None
    conv.graph.opset_imports[""] = 1  # what onnxscript writes after a rewrite there
    assert ShapeProver(model.graph).rank(value) == 3
    assert ShapeProver().rank(value) is None


def test_dims_map_back_to_the_same_symbols() -> None:
    """Einsum's labels come back as the very Dims that went in; an unknown size is the
    output's own axis, equal to nothing else."""
    model, value = _graph_value(
        """<ir_version: 9, opset_import: ["" : 18]>
        g (float[B, T, 128] x, float[8, 16, 32] w) => (float y) <int64[4] shp = {0, 0, 8, 16}> {
            xr = Reshape (x, shp)
            y = Einsum <equation="btgi,gih->btgh"> (xr, w)
        }""",
        "y",
    )
    x = model.graph.inputs[0]
    prover = ShapeProver(model.graph)
    assert prover.dims(value) == (Dim.sym(x, 0), Dim.sym(x, 1), Dim.const(8), Dim.const(32))
    node = value.producer()
    assert node is not None
    facts = infer(node, [prover.fact(v) for v in node.inputs], model.graph)
    assert facts[0].dims == prover.dims(value)


def test_untrusted_shape_functions_are_not_used() -> None:
    """ONNX's ConvTranspose inference with ``output_shape=[1]`` says rank 2 (found by
    :func:`test_conv_and_conv_transpose`); the prover says nothing then."""
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], output_shape=[1])
    x = helper.make_tensor_type_proto(TensorProto.FLOAT, ["N", 1, 2])
    w = helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 1, 1])
    schema = onnx.defs.get_schema("ConvTranspose", 18)
    wrong = onnx.shape_inference.infer_node_outputs(schema, node, {"x": x, "w": w})["y"]
    assert len(wrong.tensor_type.shape.dim) == 2  # the real output has rank 3
    model = _model([node], [_input("x", [0, 1, 2], static={1, 2})], ["y"])
    model.graph.initializer.append(_const("w", np.ones((1, 1, 1), np.float32), np.float32))
    assert _proven_rank(model, "y") is None


# ---------------------------------------------------------------- a DeepFilterNet-style path

_DEEPFILTERNET_LIKE = """
<ir_version: 9, opset_import: ["" : 17]>
enc (float[B, T, 32] x) => (float[?, ?, ?, ?] y, float[?, ?, ?] y_h)
<int64[4] groups = {0, 0, 4, 8}, float[4, 8, 8] w_group = {{w_group}},
 int64[1] one = {1}, float[4, 1, 1, 3] w_conv = {{w_conv}},
 int64[1] zero = {0}, int64[1] two = {2}, int64[1] minus_one = {-1},
 float[1, 48, 128] w_gru = {{w_gru}}, float[1, 48, 16] r_gru = {{r_gru}},
 int64[1] directions = {1}, int64[1] hidden = {16}, float zero_f = {0.0}>
{
    x_shape = Shape (x)
    bt = Slice (x_shape, zero, two)
    batch = Gather <axis = 0> (x_shape, zero)
    xg = Reshape (x, groups)
    lin = Einsum <equation = "btgi,gih->btgh"> (xg, w_group)
    flat_shape = Concat <axis = 0> (bt, minus_one)
    flat = Reshape (lin, flat_shape)
    img = Unsqueeze (flat, one)
    conv = Conv <pads = [0, 1, 0, 1]> (img, w_conv)
    btcf = Transpose <perm = [0, 2, 1, 3]> (conv)
    own_shape = Shape (btcf)
    own_bt = Slice (own_shape, zero, two)
    target = Concat <axis = 0> (own_bt, minus_one)
    seq_in = Reshape (btcf, target)
    xt = Transpose <perm = [1, 0, 2]> (seq_in)
    h0_shape = Concat <axis = 0> (directions, batch, hidden)
    h0 = Expand (zero_f, h0_shape)
    y, y_h = GRU <hidden_size = 16, linear_before_reset = 1> (xt, w_gru, r_gru, , , h0)
}
"""


def _deepfilternet_like() -> onnx.ModelProto:
    """Grouped linear (Einsum) -> Conv -> Reshape by its own Shape -> GRU whose zero
    initial state is ``Expand(0, [1, batch, 16])``, as DeepFilterNet's TorchScript
    encoder is written."""
    rng = np.random.default_rng(0)

    def values(*shape: int) -> str:
        return ", ".join(f"{v:.4f}" for v in rng.uniform(-0.3, 0.3, shape).reshape(-1))

    text = _DEEPFILTERNET_LIKE
    weights = {"w_group": (4, 8, 8), "w_conv": (4, 1, 1, 3), "w_gru": (1, 48, 128)}
    for name, shape in (*weights.items(), ("r_gru", (1, 48, 16))):
        text = text.replace(f"{{{{{name}}}}}", "{" + values(*shape) + "}")
    model = onnx.parser.parse_model(text)
    model.ir_version = 9
    return model


def test_deepfilternet_like_path_proves_x_and_the_zero_state_goes(monkeypatch) -> None:
    """Without the fallback the Conv's output has no rank, so neither has the GRU's X and
    ``initial_state`` refuses ("the rank of X is not proven"); with it, X is
    ``[conv's T, B, 128]`` and the zero state is shared, outputs unchanged."""
    import rnn_rewrite_rules
    from rnn_rewrite_rules.shape import prover as prover_module
    from tests.reasons import refusal_reasons

    model = _deepfilternet_like()
    onnx.checker.check_model(model, full_check=True)
    rules = rnn_rewrite_rules.rules(["initial_state"]).rules
    ir_model = ir.serde.deserialize_model(model)
    gru = next(n for n in ir_model.graph if n.op_type == "GRU")

    with monkeypatch.context() as patch:  # the prover as it was: no fallback
        patch.setattr(prover_module, "infer", lambda node, ins, main_graph: [])
        assert ShapeProver(ir_model.graph).rank(gru.inputs[0]) is None
        assert "the rank of X is not proven" in refusal_reasons(rules, model)
        assert _ops(rnn_rewrite_rules.rewrite(model, ["initial_state"])) == _ops(model)

    x = ShapeProver(ir_model.graph).dims(gru.inputs[0])
    assert x is not None and len(x) == 3 and x[2] == Dim.const(128)
    batch = x[1].symbol  # the graph input's batch, through Einsum, Conv and two Reshapes
    assert batch is not None and batch.value.name == "x" and batch.axis == 0
    assert "the rank of X is not proven" not in refusal_reasons(rules, model)
    after = rnn_rewrite_rules.rewrite(model, ["initial_state"])
    assert "Expand" in _ops(model) and "Expand" not in _ops(after)  # the shared zero state

    def run(m: onnx.ModelProto, feed: np.ndarray) -> list[np.ndarray]:
        options = ["CPUExecutionProvider"]
        session = onnxruntime.InferenceSession(m.SerializeToString(), providers=options)
        return session.run(None, {"x": feed})

    for b, t in ((1, 5), (3, 2), (2, 7), (4, 1)):
        feed = np.random.default_rng(b * 10 + t).standard_normal((b, t, 32)).astype(np.float32)
        for got, want in zip(run(after, feed), run(model, feed), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _ops(model: onnx.ModelProto) -> list[str]:
    return sorted(node.op_type for node in model.graph.node)


@given(data=st.data(), op=st.sampled_from(sorted(UNARY)), shape=st.lists(sizes, max_size=4))
def test_one_input_ops(data, op, shape) -> None:
    """Ops with one input and attributes only: the rank is proven (Det drops two axes),
    and every size stated holds."""
    node = helper.make_node(op, ["x"], ["out"], **UNARY[op])
    static = set(range(len(shape))) if data.draw(st.booleans()) else set()
    model = _model([node], [_input("x", shape, static=static)], ["out"], opset=18)
    rank = len(shape) - 2 if op == "Det" else len(shape)
    _check_with_rank(model, {"x": _feed(shape)}, {"out": rank}, ort=True)


@pytest.mark.parametrize(
    ("imports", "version", "rank"),
    [
        ({"": 18}, None, 3),
        ({"ai.onnx": 18}, None, 3),  # the default domain under its long name
        ({"": 7}, None, 3),  # the oldest opset ONNX Runtime loads
        ({"": 6}, None, None),  # below it: onnxscript's placeholder, not a real opset
        ({}, 18, 3),  # the node's own version
        ({}, None, None),
    ],
)
def test_the_opset_the_node_runs_at(imports: dict, version: int | None, rank: int | None) -> None:
    x = ir.Value(name="x", shape=ir.Shape(["N", 2, 5]), type=ir.TensorType(ir.DataType.FLOAT))
    w = ir.Value(name="w", shape=ir.Shape([4, 2, 3]), type=ir.TensorType(ir.DataType.FLOAT))
    node = ir.Node("", "Conv", [x, w], version=version)
    graph = ir.Graph([x, w], node.outputs, nodes=[node], opset_imports=imports)
    assert graph.opset_imports == imports
    assert ShapeProver(graph).rank(node.outputs[0]) == rank


def test_a_negative_size_is_unknown() -> None:
    """Pad [2] by -3 at the start: ONNX's shape function says -1; the runtime fails."""
    model, value = _graph_value(
        """<ir_version: 9, opset_import: ["" : 18]>
        g (float[2] x) => (float y) <int64[2] pads = {-3, 0}> { y = Pad (x, pads) }""",
        "y",
    )
    assert ShapeProver(model.graph).dims(value) == (Dim.sym(value, 0),)


def test_einsum_label_of_size_1_broadcasts() -> None:
    """``g`` is 1 in the first operand and ``G`` in the second: ONNX Runtime's output has
    ``G`` there (ONNX's shape function says 1, the first operand's)."""
    model, value = _graph_value(
        """<ir_version: 9, opset_import: ["" : 18]>
        g (float[B, T, 1, 4] x, float[G, 4, 8] w) => (float y) {
            y = Einsum <equation="btgi,gih->btgh"> (x, w)
        }""",
        "y",
    )
    x, w = model.graph.inputs
    node = value.producer()
    assert node is not None
    x_type = helper.make_tensor_type_proto(TensorProto.FLOAT, ["B", "T", 1, 4])
    w_type = helper.make_tensor_type_proto(TensorProto.FLOAT, ["G", 4, 8])
    proto = helper.make_node("Einsum", ["x", "w"], ["y"], equation="btgi,gih->btgh")
    schema = onnx.defs.get_schema("Einsum", 18)
    onnx_says = onnx.shape_inference.infer_node_outputs(schema, proto, {"x": x_type, "w": w_type})
    assert onnx_says["y"].tensor_type.shape.dim[2].dim_value == 1
    dims = ShapeProver(model.graph).dims(value)
    assert dims == (Dim.sym(x, 0), Dim.sym(x, 1), Dim.sym(w, 0), Dim.const(8))
    feeds = {"x": np.ones((2, 3, 1, 4), np.float32), "w": np.ones((5, 4, 8), np.float32)}
    assert onnxruntime.InferenceSession(
        ir.serde.serialize_model(model).SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)[0].shape == (2, 3, 5, 8)


@pytest.mark.parametrize(
    ("node", "x_shape", "runtime", "onnx_says"),
    [
        # ceil_mode: ONNX's shape function says 4, ONNX Runtime computes 3
        (
            helper.make_node(
                "MaxPool", ["x"], ["y"], kernel_shape=[2], strides=[2], pads=[1, 1], ceil_mode=1
            ),
            [1, 1, 5],
            3,
            4,
        ),
        # a window wider than the axis: ONNX says 1, onnx.reference (the spec's floor) 0
        (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2], strides=[2]), [1, 1, 1], 0, 1),
        # SAME with output_padding: ONNX adds it, ONNX Runtime does not
        (
            helper.make_node(
                "ConvTranspose",
                ["x", "w"],
                ["y"],
                strides=[2],
                auto_pad="SAME_UPPER",
                output_padding=[1],
            ),
            [1, 1, 1],
            2,
            3,
        ),
    ],
)
def test_windows_where_onnx_is_wrong(node, x_shape, runtime: int, onnx_says: int) -> None:
    """The spatial size is unknown (the output's own axis); batch and channels stay."""
    model = _model([node], [_input("x", x_shape, static={1, 2})], ["y"])
    model.graph.initializer.append(_const("w", np.ones((1, 1, 2), np.float32), np.float32))
    types = {"x": helper.make_tensor_type_proto(TensorProto.FLOAT, x_shape)}
    types["w"] = helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 1, 2])
    schema = onnx.defs.get_schema(node.op_type, 18)
    inferred = onnx.shape_inference.infer_node_outputs(schema, node, types)["y"]
    assert inferred.tensor_type.shape.dim[2].dim_value == onnx_says
    feeds = {"x": _feed(x_shape)}
    if runtime == 0:  # ONNX Runtime fails there; onnx.reference follows the spec
        actual = ReferenceEvaluator(model).run(None, feeds)[0].shape
    else:
        options = ["CPUExecutionProvider"]
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=options)
        actual = session.run(None, feeds)[0].shape
    assert actual[2] == runtime
    ir_model = ir.serde.deserialize_model(model)
    (value,) = ir_model.graph.outputs
    dims = ShapeProver(ir_model.graph).dims(value)
    assert dims is not None and dims[1] == Dim.const(1) and dims[2] == Dim.sym(value, 2)

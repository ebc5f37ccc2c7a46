"""The shape prover against ``onnx.reference``: every fact it states holds at run time.

Each test builds a small graph whose inputs declare symbolic sizes, draws the actual
sizes with hypothesis (zero-sized axes included), runs ``onnx.reference`` and checks,
for every value the prover has a fact about, that its sizes (and, for shape tensors, its
elements) evaluate to what the runtime computed. Sizes the prover names by the value's
own axis (unknown) are skipped; everything else must match exactly.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from rnn_rewrite_rules.shape import Dim, ShapeProver, Sym

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
sizes = st.integers(0, 4)
shapes = st.lists(sizes, min_size=1, max_size=4)


def _model(nodes, inputs, outputs, initializers=(), opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_empty_tensor_value_info(name) for name in outputs],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _input(name: str, shape: list[int], dtype=TensorProto.FLOAT, static=()) -> onnx.ValueInfoProto:
    dims = [d if i in static else f"{name}_{i}" for i, d in enumerate(shape)]
    return helper.make_tensor_value_info(name, dtype, dims)


def _const(name: str, values, dtype=np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=dtype), name)


def _evaluate(dim: Dim, env: dict[tuple[int, int], int]) -> int | None:
    total = 0
    for monomial, coef in dim.terms:
        term = coef
        for sym in monomial:
            if sym.key not in env:
                return None
            term *= env[sym.key]
        total += term
    return total


def _run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ReferenceEvaluator(model).run(None, feeds)


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, ort: bool = False) -> int:
    """Run the model (``onnx.reference``, or ORT); assert every proven fact; return how
    many sizes were checked."""
    try:
        results = (_run_ort if ort else _run_reference)(model, feeds)
    except Exception:  # the runtime rejects this input: the prover promises nothing
        assume(False)
    actual = dict(zip([o.name for o in model.graph.output], results, strict=True))
    ir_model = ir.serde.deserialize_model(model)
    env = {
        Sym.of(v, axis).key: feeds[v.name].shape[axis]
        for v in ir_model.graph.inputs
        if v.name in feeds
        for axis in range(feeds[v.name].ndim)
    }
    prover = ShapeProver(ir_model.graph)
    checked = 0
    for node in ir_model.graph:
        for value in node.outputs:
            if value.name not in actual:
                continue
            array = np.asarray(actual[value.name])
            fact = prover.fact(value)
            if fact.dims is None:
                continue
            assert len(fact.dims) == array.ndim, (node.op_type, value.name, fact.dims)
            for axis, dim in enumerate(fact.dims):
                got = _evaluate(dim, env)
                if got is not None:
                    assert got == array.shape[axis], (node.op_type, axis, str(dim), array.shape)
                    checked += 1
            if fact.elements is not None:
                flat = array.reshape(-1)
                assert len(fact.elements) == flat.size, (node.op_type, fact.elements)
                for element, real in zip(fact.elements, flat.tolist(), strict=True):
                    got = None if element is None else _evaluate(element, env)
                    if got is not None:
                        assert got == int(real), (node.op_type, str(element), flat)
    return checked


def _feed(shape, dtype=np.float32, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _broadcastable(shape: list[int], draw) -> list[int]:
    out = [1 if draw(st.booleans()) else d for d in shape]
    return out[draw(st.integers(0, len(out) - 1)) :]


@given(data=st.data(), shape=shapes)
def test_elementwise_broadcast(data, shape) -> None:
    other = _broadcastable(shape, data.draw)
    op = data.draw(st.sampled_from(["Add", "Mul", "Where", "Relu", "Equal", "PRelu"]))
    if op == "Where":
        node = helper.make_node("Where", ["c", "x", "y"], ["out"])
        inputs = [_input("c", other, TensorProto.BOOL), _input("x", shape), _input("y", other)]
        feeds = {"c": np.ones(other, bool), "x": _feed(shape), "y": _feed(other)}
    elif op == "Relu":
        node = helper.make_node("Relu", ["x"], ["out"])
        inputs, feeds = [_input("x", shape)], {"x": _feed(shape)}
    else:
        node = helper.make_node(op, ["y", "x"], ["out"])
        inputs = [_input("x", shape), _input("y", other)]
        feeds = {"x": _feed(shape), "y": _feed(other)}
    check(_model([node], inputs, ["out"]), feeds)


@given(data=st.data(), shape=shapes, allowzero=st.sampled_from([0, 1]))
def test_reshape(data, shape, allowzero) -> None:
    """Constant targets with 0 and -1, and targets computed from Shape, at zero sizes too."""
    rank = len(shape)
    target = data.draw(
        st.lists(st.sampled_from([0, -1, 1, 2, 3, 4, 6, "copy", "shape"]), min_size=1, max_size=4)
    )
    nodes = [helper.make_node("Shape", ["x"], ["s"])]
    parts = []
    for i, element in enumerate(target):
        name = f"t{i}"
        if element in ("copy", "shape"):
            axis = i if element == "copy" and i < rank else data.draw(st.integers(0, rank - 1))
            nodes.append(helper.make_node("Gather", ["s", f"i{i}"], [name], axis=0))
            parts.append((name, _const(f"i{i}", [axis])))
        else:
            parts.append((name, _const(name, [element])))
    inits = [c for _, c in parts]
    nodes.append(helper.make_node("Concat", [n for n, _ in parts], ["target"], axis=0))
    nodes.append(helper.make_node("Reshape", ["x", "target"], ["out"], allowzero=allowzero))
    outputs = ["s", "target", "out"]
    check(_model(nodes, [_input("x", shape)], outputs, inits), {"x": _feed(shape)})


bounds = st.sampled_from([INT64_MIN, -5, -3, -2, -1, 0, 1, 2, 3, 5, INT64_MAX])


@given(
    shape=shapes,
    data=st.data(),
    start=bounds,
    end=bounds,
    step=st.sampled_from([-3, -2, -1, 1, 2, 3]),
)
def test_slice_data_and_shape(shape, data, start, end, step) -> None:
    """Slice of a tensor along one axis, and of its shape tensor (negative steps, clamping)."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    inits = [
        _const("starts", [start]),
        _const("ends", [end]),
        _const("axes", [axis]),
        _const("steps", [step]),
        _const("zero", [0]),
    ]
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["out"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "starts", "ends", "zero", "steps"], ["s_out"]),
    ]
    check(_model(nodes, [_input("x", shape)], ["out", "s", "s_out"], inits), {"x": _feed(shape)})


@given(shape=shapes, data=st.data())
def test_gather_on_data_and_shape(shape, data) -> None:
    """Gather with scalar and 1-D, negative indices; an embedding lookup keeps ids' sizes."""
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1))
    size = shape[axis]
    assume(size > 0)
    scalar = data.draw(st.booleans())
    picks = data.draw(st.lists(st.integers(-size, size - 1), min_size=1, max_size=3))
    index = _const("idx", picks[0] if scalar else picks)
    shape_index = _const("sidx", data.draw(st.integers(-rank, rank - 1)))
    ids_shape = data.draw(st.lists(sizes, min_size=1, max_size=2))
    nodes = [
        helper.make_node("Gather", ["x", "idx"], ["out"], axis=axis),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "sidx"], ["s_out"], axis=0),
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
        helper.make_node("Transpose", ["emb"], ["emb_t"]),
    ]
    table = _const("table", np.ones((5, 3), np.float32), np.float32)
    ids = np.zeros(ids_shape, np.int64)
    model = _model(
        nodes,
        [_input("x", shape), _input("ids", ids_shape, TensorProto.INT64)],
        ["out", "s", "s_out", "emb", "emb_t"],
        [index, shape_index, table],
    )
    assert check(model, {"x": _feed(shape), "ids": ids}) >= len(ids_shape)


@given(shape=shapes, start=st.integers(-5, 5), end=st.integers(-5, 5) | st.none())
def test_shape_start_end_and_size(shape, start, end) -> None:
    attrs = {"start": start} | ({} if end is None else {"end": end})
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], **attrs),
        helper.make_node("Size", ["x"], ["n"]),
        helper.make_node("Shape", ["s"], ["ss"]),
    ]
    # ORT: onnx.reference does not clamp an ``end`` below -rank (ONNX clamps it to 0)
    check(_model(nodes, [_input("x", shape)], ["s", "n", "ss"]), {"x": _feed(shape)}, ort=True)


@given(
    shape=shapes,
    data=st.data(),
    op=st.sampled_from(["ReduceMean", "ReduceSum", "ReduceMax", "ArgMax"]),
    opset=st.sampled_from([11, 13, 18]),
    keepdims=st.sampled_from([0, 1, None]),
)
def test_reductions(shape, data, op, opset, keepdims) -> None:
    """Axes as attribute or input (by op and opset), none (every axis), keepdims either way."""
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), max_size=rank, unique=True))
    attrs = {} if keepdims is None else {"keepdims": keepdims}
    inputs, inits = ["x"], []
    if op == "ArgMax":
        attrs["axis"] = axes[0] if axes else 0
    elif axes and (opset >= 18 or (op == "ReduceSum" and opset >= 13)):
        inits.append(_const("axes", axes))
        inputs.append("axes")
    elif axes:
        attrs["axes"] = axes
    nodes = [helper.make_node(op, inputs, ["r"], **attrs)]
    check(_model(nodes, [_input("x", shape)], ["r"], inits, opset=opset), {"x": _feed(shape)})


@given(shape=shapes, data=st.data(), opset=st.sampled_from([11, 13, 18]))
def test_squeeze_unsqueeze(shape, data, opset) -> None:
    """Both the attribute (opset < 13) and the input form; unit axes declared static."""
    rank = len(shape)
    ones = [i for i, d in enumerate(shape) if d == 1]
    squeeze = data.draw(st.lists(st.sampled_from(ones), unique=True)) if ones else []
    unsqueeze = data.draw(st.lists(st.integers(-rank - 2, rank + 1), min_size=1, max_size=2))
    nodes, inits = [], []
    for op, axes, name in (("Squeeze", squeeze, "sq"), ("Unsqueeze", unsqueeze, "unsq")):
        if op == "Squeeze" and not axes:
            continue
        if opset >= 13:
            inits.append(_const(f"{name}_axes", axes))
            nodes.append(helper.make_node(op, ["x", f"{name}_axes"], [name]))
        else:
            nodes.append(helper.make_node(op, ["x"], [name], axes=axes))
    outputs = [n.output[0] for n in nodes]
    x = _input("x", shape, static=set(ones))
    # ORT: onnx.reference inserts unsorted Unsqueeze axes one by one (ONNX: order is free)
    check(_model(nodes, [x], outputs, inits, opset=opset), {"x": _feed(shape)}, ort=True)


@given(shape=shapes, data=st.data())
def test_concat_split_tile_expand_flatten_transpose(shape, data) -> None:
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1))
    other = list(shape)
    other[axis] = data.draw(sizes)
    perm = data.draw(st.permutations(range(rank)))
    repeats = data.draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank))
    expand_to = [data.draw(st.sampled_from([d, 1])) for d in shape]
    flat_axis = data.draw(st.integers(-rank, rank))
    nodes = [
        helper.make_node("Concat", ["x", "y"], ["cat"], axis=axis),
        helper.make_node("Transpose", ["cat"], ["tr"], perm=list(perm)),
        helper.make_node("Tile", ["x", "reps"], ["tile"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Expand", ["e", "s"], ["exp"]),
        helper.make_node("Flatten", ["x"], ["flat"], axis=flat_axis),
        helper.make_node("Split", ["cat"], ["p0", "p1"], axis=axis, num_outputs=2),
        helper.make_node("ConstantOfShape", ["s"], ["zeros"]),
    ]
    inits = [_const("reps", repeats)]
    model = _model(
        nodes,
        [_input("x", shape), _input("y", other), _input("e", expand_to)],
        ["cat", "tr", "tile", "s", "exp", "flat", "p0", "p1", "zeros"],
        inits,
    )
    feeds = {"x": _feed(shape), "y": _feed(other), "e": _feed(expand_to)}
    check(model, feeds)


@given(data=st.data(), m=sizes, k=sizes, n=sizes, batch=st.lists(sizes, max_size=2))
def test_matmul_gemm(data, m, k, n, batch) -> None:
    trans_a, trans_b = data.draw(st.booleans()), data.draw(st.booleans())
    a_shape = [k, m] if trans_a else [m, k]
    b_shape = [n, k] if trans_b else [k, n]
    nodes = [
        helper.make_node("MatMul", ["xa", "xb"], ["mm"]),
        helper.make_node("Gemm", ["a", "b"], ["gemm"], transA=int(trans_a), transB=int(trans_b)),
        helper.make_node("MatMul", ["v", "xb"], ["vm"]),
    ]
    inputs = [
        _input("xa", [*batch, m, k]),
        _input("xb", [k, n]),
        _input("a", a_shape),
        _input("b", b_shape),
        _input("v", [k]),
    ]
    feeds = {
        "xa": _feed([*batch, m, k]),
        "xb": _feed([k, n]),
        "a": _feed(a_shape),
        "b": _feed(b_shape),
        "v": _feed([k]),
    }
    check(_model(nodes, inputs, ["mm", "gemm", "vm"]), feeds)


@given(shape=shapes, data=st.data())
def test_shape_arithmetic_and_if(shape, data) -> None:
    """Add/Sub/Mul/Div on shape values, Equal/Not/Where, and an If on the rank."""
    rank = len(shape)
    k = data.draw(st.integers(1, 5))
    then_branch = helper.make_graph(
        [helper.make_node("Unsqueeze", ["x", "zero"], ["t_out"])],
        "then",
        [],
        [helper.make_empty_tensor_value_info("t_out")],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e_out"])],
        "else",
        [],
        [helper.make_empty_tensor_value_info("e_out")],
    )
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Mul", ["s", "k"], ["sk"]),
        helper.make_node("Add", ["sk", "k"], ["ska"]),
        helper.make_node("Sub", ["ska", "k"], ["sks"]),
        helper.make_node("Div", ["sks", "k"], ["back"]),
        helper.make_node("Equal", ["back", "s"], ["same"]),
        helper.make_node("Not", ["same"], ["differ"]),
        helper.make_node("Where", ["same", "s", "k"], ["picked"]),
        helper.make_node("Size", ["s"], ["r"]),
        helper.make_node("Equal", ["r", "two"], ["is2"]),
        helper.make_node(
            "If", ["is2"], ["lifted"], then_branch=then_branch, else_branch=else_branch
        ),
        helper.make_node("Shape", ["lifted"], ["lifted_shape"]),
    ]
    inits = [_const("k", [k]), _const("two", 2), _const("zero", [0])]
    outputs = ["s", "sk", "ska", "sks", "back", "same", "differ", "picked", "r", "is2", "lifted"]
    outputs.append("lifted_shape")
    model = _model(nodes, [_input("x", shape)], outputs, inits)
    assert check(model, {"x": _feed(shape)}) >= 3 * rank


@given(
    op_type=st.sampled_from(["LSTM", "GRU", "RNN"]),
    direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
    layout=st.sampled_from([0, 1]),
    seq=sizes,
    batch=st.integers(1, 3),
    hidden=st.integers(1, 3),
)
def test_rnn_outputs(op_type, direction, layout, seq, batch, hidden) -> None:
    """Y, Y_h, Y_c from X's sizes and the weights; Dequantize keeps its input's sizes."""
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op_type]
    d = 2 if direction == "bidirectional" else 1
    outputs = ["y", "y_h", "y_c"][: 3 if op_type == "LSTM" else 2]
    x_shape = [batch, seq, 2] if layout else [seq, batch, 2]
    nodes = [
        helper.make_node("DequantizeLinear", ["xq", "scale"], ["x"]),
        helper.make_node(
            op_type,
            ["x", "w", "r"],
            outputs,
            hidden_size=hidden,
            direction=direction,
            layout=layout,
        ),
    ]
    inits = [
        _const("w", np.ones((d, gates * hidden, 2), np.float32) * 0.1, np.float32),
        _const("r", np.ones((d, gates * hidden, hidden), np.float32) * 0.1, np.float32),
        _const("scale", 0.5, np.float32),
    ]
    model = _model(nodes, [_input("xq", x_shape, TensorProto.INT8)], ["x", *outputs], inits, 21)
    feeds = {"xq": np.ones(x_shape, np.int8)}
    assert check(model, feeds) >= 3 + 4 + 3


def test_declared_output_shapes_are_not_read() -> None:
    """A value_info (or output declaration) of a computed value is never a fact."""
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Shape", ["y"], ["s"])],
        [_input("x", [2, 3], static={0})],
        ["s"],
    )
    model.graph.value_info.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 9, 9]))
    ir_model = ir.serde.deserialize_model(model)
    y = ir_model.graph.node(0).outputs[0]
    assert y.shape is not None and len(y.shape) == 3  # the annotation is there...
    prover = ShapeProver(ir_model.graph)
    dims = prover.dims(y)
    assert dims is not None and len(dims) == 2  # ...and ignored
    assert dims[0] == Dim.const(2) and dims[1] == Dim.sym(ir_model.graph.inputs[0], 1)
    s = prover.elements(ir_model.graph.node(1).outputs[0])
    assert s == dims


def test_unknown_is_never_guessed() -> None:
    """An op no schema describes gives no facts; a size no fact fixes is its own (NonZero's
    rank comes from ONNX's shape function, its count is unknown)."""
    model = _model(
        [
            helper.make_node("NonZero", ["x"], ["nz"]),
            helper.make_node("Shape", ["nz"], ["s"]),
            helper.make_node("Add", ["x", "y"], ["sum"]),
            helper.make_node("Thing", ["x"], ["thing"], domain="custom"),
        ],
        [_input("x", [2, 3]), _input("y", [4, 1])],
        ["nz", "s", "sum", "thing"],
    )
    model.opset_import.append(helper.make_opsetid("custom", 1))
    ir_model = ir.serde.deserialize_model(model)
    prover = ShapeProver(ir_model.graph)
    nz, s, total, thing = (ir_model.graph.node(i).outputs[0] for i in range(4))
    assert prover.dims(nz) == (Dim.const(2), Dim.sym(nz, 1))
    assert prover.elements(s) == prover.dims(nz)
    assert prover.dims(thing) is None
    dims = prover.dims(total)  # broadcasting x_0 with 4 cannot be proven: the output's own
    assert dims is not None and dims[0] == Dim.sym(total, 0) and dims[0] != Dim.const(4)


@pytest.mark.parametrize("allowzero", [0, 1])
def test_reshape_zero_element_semantics(allowzero) -> None:
    """A computed 0 copies (allowzero=0); -1 beside a zero-sized element is not inferred."""
    from rnn_rewrite_rules.shape import reshape

    x = ir.Value(name="x")
    seq, batch = Dim.sym(x, 0), Dim.sym(x, 1)
    dims = (seq, batch, Dim.const(4))
    out = reshape(dims, (Dim.const(0), Dim.const(-1)), allowzero)
    if allowzero:
        assert out == (Dim.const(0), None)
    else:
        assert out == (seq, batch * 4)
    # a computed element that may be 0 and differs from the copied size is unknown
    assert reshape(dims, (batch, Dim.const(-1)), 0)[0] is None
    assert reshape(dims, (seq, Dim.const(-1)), 0) == (seq, batch * 4)
    assert reshape(dims, (Dim.const(-1), Dim.const(-1)), 0) == "more than one -1 in the target"


# ---------------------------------------------------------------- present but not constant


def _runtime_operand_model(op: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``op`` whose optional operand (Slice axes, Squeeze axes, Split sizes) is a graph
    input, fed a value that differs from what the operand's absence would mean."""
    if op == "Slice":  # absent axes: axis 0; fed [1]
        nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"])]
        inits = [_const("starts", [0]), _const("ends", [1])]
        x_shape, operand = [3, 4], np.array([1], np.int64)
    elif op == "Squeeze":  # absent axes: every size-1 axis; fed [0]
        nodes = [helper.make_node("Squeeze", ["x", "axes"], ["y"])]
        inits, x_shape, operand = [], [1, 1], np.array([0], np.int64)
    else:  # absent sizes: an even split; fed [2, 4]
        nodes = [helper.make_node("Split", ["x", "axes"], ["y", "y2"])]
        inits, x_shape, operand = [], [6], np.array([2, 4], np.int64)
    inputs = [
        _input("x", x_shape, static=set(range(len(x_shape)))),
        helper.make_tensor_value_info("axes", TensorProto.INT64, [len(operand)]),
    ]
    outputs = [*nodes[0].output]
    nodes += [helper.make_node("Shape", [o], [f"{o}_shape"]) for o in nodes[0].output]
    outputs += [f"{o}_shape" for o in nodes[0].output]
    model = _model(nodes, inputs, outputs, inits)
    return model, {"x": _feed(x_shape), "axes": operand}


@pytest.mark.parametrize("op", ["Slice", "Squeeze", "Split"])
@pytest.mark.parametrize("ort", [False, True])
def test_a_runtime_operand_is_not_read_as_absent(op: str, ort: bool) -> None:
    """An optional operand that is present but not constant is unknown, not absent."""
    model, feeds = _runtime_operand_model(op)
    check(model, feeds, ort=ort)
    ir_model = ir.serde.deserialize_model(model)
    node = ir_model.graph.node(0)
    prover = ShapeProver(ir_model.graph)
    for value in node.outputs:
        dims = prover.dims(value)
        assert dims is None or all(not d.is_const for d in dims), (op, dims)


@pytest.mark.parametrize("ort", [False, True])
def test_a_narrowing_cast_wraps(ort: bool) -> None:
    """``Cast(int64 -> int32)`` of ``5 * 2**32`` is 0 at run time: the unwrapped value is
    not a fact; a value within the target's range stays one, and so does a widening cast."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Mul", ["s", "big"], ["scaled"]),
        helper.make_node("Cast", ["scaled"], ["narrow"], to=TensorProto.INT32),
        helper.make_node("Cast", ["s"], ["small"], to=TensorProto.INT32),
        helper.make_node("Cast", ["small"], ["wide"], to=TensorProto.INT64),
        helper.make_node("Mul", ["s", "s"], ["square"]),
        helper.make_node("Cast", ["square"], ["square32"], to=TensorProto.INT32),
    ]
    inputs = [_input("x", [5], static={0}), _input("z", [2])]
    model = _model(nodes, inputs, [n.output[0] for n in nodes], [_const("big", [2**32])])
    check(model, {"x": _feed([5]), "z": _feed([2])}, ort=ort)
    graph = ir.serde.deserialize_model(model).graph
    prover = ShapeProver(graph)
    values = {n.outputs[0].name: n.outputs[0] for n in graph}
    assert prover.ints(values["narrow"]) is None
    assert prover.ints(values["small"]) == [5] and prover.ints(values["wide"]) == [5]
    assert prover.ints(values["square32"]) == [25]


def test_a_subgraph_input_declaration_is_not_a_fact() -> None:
    """A Loop body input's declared shape is not checked by ONNX Runtime: no rank, no
    size from it; the main graph's inputs' declarations are facts."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Shape", ["v"], ["s"]),
            helper.make_node("Neg", ["v"], ["v_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, ["a", 4, "c"]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, ["a", 4, "c"]),
        ],
    )
    nodes = [helper.make_node("Loop", ["trip", "", "x"], ["y"], body=body)]
    inits = [_const("trip", 1)]
    model = _model(nodes, [_input("x", [2, 4, 3], static={1})], ["y"], inits)
    graph = ir.serde.deserialize_model(model).graph
    prover = ShapeProver(graph)
    x = graph.inputs[0]
    assert prover.dims(x) == (Dim.sym(x, 0), Dim.const(4), Dim.sym(x, 2))
    body_graph = graph.node(0).attributes["body"].as_graph()
    v = body_graph.inputs[2]
    shape = body_graph.node(1).outputs[0]
    assert prover.rank(v) is None and prover.elements(shape) is None
    assert ShapeProver().rank(x) is None  # no main graph given: no declaration is a fact


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_a_scan_body_input_is_a_slice_of_the_scan_input(axis: int) -> None:
    """A Scan body's scan input has the sizes of the Scan's input without the scanned
    axis (the body declares only its rank)."""
    body = helper.make_graph(
        [helper.make_node("Shape", ["v"], ["s"]), helper.make_node("Identity", ["s"], ["s_out"])],
        "body",
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, ["p", "q"])],
        [helper.make_tensor_value_info("s_out", TensorProto.INT64, [2])],
    )
    scan = helper.make_node(
        "Scan", ["x"], ["y"], body=body, num_scan_inputs=1, scan_input_axes=[axis]
    )
    model = _model([scan], [_input("x", [2, 4, 3], static={1})], ["y"])
    graph = ir.serde.deserialize_model(model).graph
    prover = ShapeProver(graph)
    x = graph.inputs[0]
    v = graph.node(0).attributes["body"].as_graph().inputs[0]
    sizes = [Dim.sym(x, 0), Dim.const(4), Dim.sym(x, 2)]
    del sizes[axis]
    assert prover.dims(v) == tuple(sizes)
    body_shape = graph.node(0).attributes["body"].as_graph().node(0).outputs[0]
    empty = [0, 4, 3] if axis % 3 != 0 else [2, 4, 0]  # a size 0, not the scanned axis
    for feed in ([2, 4, 3], empty, [1, 4, 5]):
        (stacked,) = _run_ort(model, {"x": _feed(feed)})
        env = {Sym.of(x, i).key: feed[i] for i in range(3)}
        elements = prover.elements(body_shape)
        assert elements is not None
        assert all(list(row) == [_evaluate(e, env) for e in elements] for row in stacked)

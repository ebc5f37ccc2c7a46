"""The transfer functions of ``shape/ops.py``, one exact answer per branch.

Written from mutation testing (docs/mutation.md). Each case calls the op's transfer
function on input facts (no model, no runtime) and asserts the output facts whole:
what is proven, and what must stay unknown. ``test_shape_prover.py`` checks the same
functions for soundness against ``onnx.reference``.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from rnn_rewrite_rules.shape import Dim
from rnn_rewrite_rules.shape.fact import MAX_ELEMENTS, UNKNOWN, Fact
from rnn_rewrite_rules.shape.ops import TRANSFER

_ANCHOR = ir.Value(name="v")
S, T = Dim.sym(_ANCHOR, 0), Dim.sym(_ANCHOR, 1)  # two unknown sizes


def c(*values: int) -> tuple[Dim, ...]:
    return tuple(Dim.const(v) for v in values)


def dims(*sizes: int | Dim | None) -> Fact:
    return Fact(tuple(Dim.const(s) if isinstance(s, int) else s for s in sizes))


def vec(*elements: int | Dim | None) -> Fact:
    return Fact.vector(tuple(Dim.const(e) if isinstance(e, int) else e for e in elements))


def run(op: str, *ins: Fact | None, outputs: int = 1, domain: str = "", **attrs) -> list[Fact]:
    attributes = []
    for name, value in attrs.items():
        if isinstance(value, np.ndarray):
            attributes.append(ir.AttrTensor(name, ir.tensor(value)))
        else:
            attributes.append(ir.convenience.convert_attribute(name, value))
    node = ir.Node(domain, op, [None] * len(ins), attributes, num_outputs=outputs)
    return TRANSFER[(domain, op)](node, list(ins))


def one(op: str, *ins: Fact | None, **attrs) -> Fact:
    (fact,) = run(op, *ins, **attrs)
    return fact


# ------------------------------------------------------------------ data movement


def test_identity_keeps_elements_other_unary_ops_keep_sizes() -> None:
    assert one("Identity", vec(3, 4)) == vec(3, 4)
    assert one("Neg", vec(3, None)) == Fact(c(2), (Dim.const(-3), None))
    assert one("Neg", dims(S, 2)) == dims(S, 2)
    assert one("Relu", vec(3, 4)) == dims(2)
    assert one("Identity", None) == UNKNOWN
    assert one("Dropout", vec(1, 2)) == dims(2)
    assert one("QuantizeLinear", vec(1, 2)) == dims(2)


def test_only_an_integer_cast_keeps_elements() -> None:
    """A constant within the target's range, a symbolic size only into int64: a narrowing
    cast wraps (``5 * 2**32`` to int32 is 0), and so may a size the prover cannot bound:
    that element becomes a narrowed symbol, never the size itself."""
    assert one("Cast", vec(3, S), to=ir.DataType.INT64) == vec(3, S)
    for to in (ir.DataType.INT32, ir.DataType.UINT8):
        narrowed = one("Cast", vec(3, S), to=to)
        assert narrowed.elements is not None
        # a constant is kept in int32 only: arithmetic in int8 or uint8 wraps elsewhere
        assert narrowed.elements[0] == (Dim.const(3) if to == ir.DataType.INT32 else None)
        element = narrowed.elements[1]
        assert element is not None and element != S and element.narrowed
    assert one("Cast", vec(-1, 256), to=ir.DataType.UINT8) == vec(None, None)
    assert one("Cast", vec(-128, 127), to=ir.DataType.INT8) == vec(None, None)
    assert one("Cast", vec(5 * 2**32), to=ir.DataType.INT32) == vec(None)
    assert one("Cast", vec(3, S), to=ir.DataType.FLOAT) == dims(2)
    assert one("Cast", vec(3, S), to=ir.DataType.BOOL) == dims(2)
    assert one("Cast", vec(3, S)) == dims(2)
    assert one("CastLike", vec(3, S), dims(0)) == dims(2)


def test_dynamic_quantize_outputs_two_scalars() -> None:
    assert run("DynamicQuantizeLinear", vec(1, 2), outputs=3) == [dims(2), Fact(()), Fact(())]


def test_transpose() -> None:
    # an input of unknown rank: perm proves none (ONNX Runtime cancels Transpose pairs
    # unchecked: tests/test_hostile_shape_proofs.py)
    x_value = ir.Value(name="x")
    node = ir.Node("", "Transpose", [x_value], [ir.AttrInt64s("perm", [1, 0, 2])])
    assert TRANSFER[("", "Transpose")](node, [UNKNOWN]) == [UNKNOWN]
    data = dims(S, 3, T)
    assert one("Transpose", data, perm=[1, 0, 2]) == dims(3, S, T)
    assert one("Transpose", data) == dims(T, 3, S)  # no perm: reversed
    assert one("Transpose", data, perm=[0, 1]) == UNKNOWN
    assert one("Transpose", data, perm=[0, 1, 1]) == UNKNOWN
    assert one("Transpose", vec(5, 6)) == vec(5, 6)
    assert one("Transpose", Fact(c(1, 2), (Dim.const(1),))).elements is None
    assert one("Transpose", UNKNOWN) == UNKNOWN


def test_reshape() -> None:
    assert one("Reshape", dims(S, 2, 3), vec(0, -1)) == dims(S, 6)
    assert one("Reshape", dims(S, 2, 3), vec(0, -1), allowzero=1) == dims(0, None)
    assert one("Reshape", dims(S, 2), dims(3)) == dims(None, None, None)  # target of 3
    assert one("Reshape", dims(S, 2), UNKNOWN) == UNKNOWN
    # an input of unknown rank: a positive element is the size, a 0 or -1 is not known
    assert one("Reshape", UNKNOWN, vec(4, -1)) == dims(4, None)
    assert one("Reshape", UNKNOWN, vec(0, 1, 8)) == dims(None, 1, 8)
    assert one("Reshape", UNKNOWN, vec(S, 2)) == dims(None, 2)  # S may be 0 or -1
    assert one("Reshape", dims(2, 3), vec(4, -1)) == dims(4, None)  # 6 is not 4 * k
    assert one("Reshape", vec(7, 8), vec(-1)) == vec(7, 8)
    assert one("Reshape", Fact(c(1, 2), (None, None)), vec(1, 2)).elements is None
    assert one("Reshape", dims(S, 2), None, shape=[2, -1]) == dims(2, S)  # Reshape-1
    assert one("Reshape", dims(S, 2), None) == UNKNOWN


def test_flatten() -> None:
    assert one("Flatten", dims(S, 2, 3)) == dims(S, 6)
    assert one("Flatten", dims(S, 2, 3), axis=0) == dims(1, S * 6)
    assert one("Flatten", dims(S, 2, 3), axis=3) == dims(S * 6, 1)
    assert one("Flatten", dims(S, 2, 3), axis=-1) == dims(S * 2, 3)
    assert one("Flatten", dims(S, 2, 3), axis=-3) == dims(1, S * 6)
    assert one("Flatten", dims(S, 2, 3), axis=4) == UNKNOWN
    assert one("Flatten", dims(S, 2, 3), axis=-4) == UNKNOWN
    assert one("Flatten", dims(None, 2)) == dims(None, None)
    assert one("Flatten", UNKNOWN) == dims(None, None)


def test_unsqueeze() -> None:
    assert one("Unsqueeze", dims(S, 2), vec(0, -1)) == dims(1, S, 2, 1)
    assert one("Unsqueeze", dims(S, 2), axes=[1]) == dims(S, 1, 2)
    assert one("Unsqueeze", Fact((), (S,)), vec(0)) == Fact(c(1), (S,))
    assert one("Unsqueeze", vec(3), vec(0)).elements is None  # rank 2
    assert one("Unsqueeze", dims(S), vec(3)) == UNKNOWN
    assert one("Unsqueeze", dims(S), vec(None)) == UNKNOWN
    assert one("Unsqueeze", dims(S), None) == UNKNOWN
    assert one("Unsqueeze", UNKNOWN, vec(0)) == UNKNOWN


def test_squeeze() -> None:
    assert one("Squeeze", dims(1, S, 1), vec(0)) == dims(S, 1)
    assert one("Squeeze", dims(1, S, 1), vec(-1)) == dims(1, S)
    assert one("Squeeze", dims(1, S, 1), axes=[0, 2]) == dims(S)
    assert one("Squeeze", dims(1, S, 1), vec(1)) == UNKNOWN  # S need not be 1
    assert one("Squeeze", dims(1, 3), vec(1)) == UNKNOWN
    assert one("Squeeze", dims(1, None), vec(1)) == dims(1)  # the runtime proves it 1
    assert one("Squeeze", dims(1, 3, 1)) == dims(3)  # no axes: the sizes 1
    assert one("Squeeze", dims(1, S)) == UNKNOWN  # no axes, a size not known
    assert one("Squeeze", dims(1, None)) == UNKNOWN
    assert one("Squeeze", dims(1, 2), vec(2)) == UNKNOWN
    assert one("Squeeze", Fact(c(1), (S,)), vec(0)) == Fact((), (S,))
    assert one("Squeeze", Fact(c(1, 1, 2), (S,)), vec(0)).elements is None
    assert one("Squeeze", UNKNOWN, vec(0)) == UNKNOWN


def test_squeeze_with_empty_axes() -> None:
    """An empty axes list: ONNX Runtime squeezes every size-1 axis, onnx.reference none
    (see test_empty_squeeze_axes_split_the_runtimes): proven only where no size can be 1."""
    three = Fact(c(3), (Dim.const(5), Dim.const(2), S))
    assert one("Squeeze", three, vec()) == three  # rank 1: its elements stay known
    assert one("Squeeze", dims(2, 3), vec()) == dims(2, 3)
    assert one("Squeeze", dims(1, 3), vec()) == UNKNOWN
    assert one("Squeeze", dims(S, 3), vec()) == UNKNOWN  # S may be 1
    assert one("Squeeze", dims(None, 3), vec()) == UNKNOWN


def test_empty_squeeze_axes_split_the_runtimes() -> None:
    """Why the prover proves nothing for empty axes where a size may be 1."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = helper.make_graph(
        [helper.make_node("Squeeze", ["x", "axes"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.zeros(0, np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    x = np.ones((1, 3), np.float32)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    assert session.run(None, {"x": x})[0].shape == (3,)
    assert ReferenceEvaluator(model).run(None, {"x": x})[0].shape == (1, 3)


def test_concat() -> None:
    assert one("Concat", dims(S, 2), dims(T, 2), axis=0) == dims(S + T, 2)
    assert one("Concat", dims(2, S), dims(2, 3), axis=-1) == dims(2, S + 3)
    assert one("Concat", dims(S, 2), dims(None, 2), axis=0) == dims(None, 2)
    assert one("Concat", dims(S, 2), dims(3, 2), axis=1) == dims(3, 4)  # the constant
    assert one("Concat", dims(S, 2), dims(3, 2), axis=1) == one(
        "Concat", dims(3, 2), dims(S, 2), axis=1
    )
    assert one("Concat", dims(S, 2), dims(T, 2), axis=1) == dims(S, 4)  # the first known
    assert one("Concat", dims(None, 2), dims(T, 2), axis=1) == dims(T, 4)
    assert one("Concat", dims(None, 2), UNKNOWN, axis=1) == dims(None, None)
    assert one("Concat", dims(S, 2), dims(2), axis=0) == UNKNOWN  # ranks differ
    assert one("Concat", UNKNOWN, UNKNOWN, axis=0) == UNKNOWN
    assert one("Concat", dims(S, 2), dims(S, 2), axis=2) == UNKNOWN
    assert one("Concat", dims(S, 2), dims(S, 2), axis=-3) == UNKNOWN
    assert one("Concat", vec(1, S), vec(3)) == vec(1, S, 3)
    assert one("Concat", vec(1, S), dims(1)) == dims(3)
    assert one("Concat", Fact(c(1, 1), (S,)), Fact(c(1, 1), (S,)), axis=0).elements is None


def test_slice() -> None:
    data = dims(S, 10)
    assert one("Slice", data, vec(2), vec(8), vec(1)) == dims(S, 6)
    assert one("Slice", data, vec(0), vec(8), vec(-1), vec(2)) == dims(S, 4)
    assert one("Slice", dims(7, 10), vec(0, 1), vec(2, 3)) == dims(2, 2)
    assert one("Slice", data, vec(0), vec(8), vec(1), vec(0)) == UNKNOWN
    assert one("Slice", data, vec(0), vec(8), vec(1), None) == dims(S, 8)
    assert one("Slice", data, vec(0), vec(8), vec(1), vec(None)) == dims(None, None)
    assert one("Slice", data, vec(0), vec(8), vec(1, 0)) == UNKNOWN
    assert one("Slice", data, vec(0), vec(8), vec(1, 0), vec(1, 1)) == UNKNOWN
    assert one("Slice", data, vec(0), vec(8), vec(5)) == UNKNOWN
    # starts or ends computed at run time: only the axes they slice are unknown
    assert one("Slice", data, vec(None), vec(8)) == dims(None, 10)
    assert one("Slice", dims(S, T, 6), vec(0), vec(None), vec(0)) == dims(None, T, 6)
    assert one("Slice", dims(S, T, 6), vec(0), vec(None), vec(-2)) == dims(S, None, 6)
    assert one("Slice", dims(S, T, 6), vec(0), vec(None), vec(0), vec(None)) == dims(
        None, None, None
    )
    assert one("Slice", dims(S, T, 6), vec(0), vec(None), vec(0, 1)) == UNKNOWN
    assert one("Slice", dims(S, T, 6), vec(0), vec(None), vec(0), vec(0)) == UNKNOWN
    assert one("Slice", dims(S, T), Fact((None,)), vec(None)) == dims(None, None)
    assert one("Slice", data, vec(0), None) == dims(None, None)
    assert one("Slice", dims(None, 4), vec(1), vec(3), vec(1)) == dims(None, 2)
    assert one("Slice", dims(4, None), vec(1), vec(3), vec(1)) == dims(4, None)
    assert one("Slice", dims(4, None), vec(1), vec(3)) == dims(2, None)
    assert one("Slice", vec(5, 6, 7, 8), vec(1), vec(10), vec(0), vec(2)) == vec(6, 8)
    assert one("Slice", Fact(c(1, 4), (S,)), vec(0), vec(1)).elements is None
    assert one("Slice", UNKNOWN, vec(0), vec(1)) == UNKNOWN
    # Slice-1: starts, ends, axes attributes, steps 1
    assert one("Slice", data, starts=[1], ends=[4], axes=[1]) == dims(S, 3)
    assert one("Slice", dims(5, 10), starts=[1, 1], ends=[4, 3]) == dims(3, 2)
    assert one("Slice", data, ends=[4]) == dims(None, None)
    assert one("Slice", data, starts=[1]) == dims(None, None)


def test_gather() -> None:
    assert one("Gather", dims(S, 3, 4), dims(T, 2), axis=1) == dims(S, T, 2, 4)
    assert one("Gather", dims(S, 3, 4), Fact(()), axis=-1) == dims(S, 3)
    assert one("Gather", dims(S, 3), Fact(())) == dims(3)
    assert one("Gather", dims(S, 3), Fact(()), axis=2) == UNKNOWN
    assert one("Gather", dims(S, 3), Fact(()), axis=-3) == UNKNOWN
    assert one("Gather", dims(S, 3), UNKNOWN) == UNKNOWN
    assert one("Gather", UNKNOWN, Fact(())) == UNKNOWN
    assert one("Gather", vec(5, S, 7), vec(-1, 1)) == Fact(c(2), (Dim.const(7), S))
    assert one("Gather", vec(5, S, 7), Fact((), (Dim.const(0),))) == Fact((), (Dim.const(5),))
    assert one("Gather", vec(5, S, 7), vec(-3)).elements == c(5)
    assert one("Gather", vec(5, S, 7), vec(3)).elements is None
    assert one("Gather", vec(5, S, 7), vec(-4)).elements is None
    assert one("Gather", vec(5, S, 7), vec(None)).elements is None
    assert one("Gather", Fact(c(1, 1), (S,)), vec(0)).elements is None


def test_shape_and_size() -> None:
    data = dims(S, 3, T)
    assert one("Shape", data) == vec(S, 3, T)
    assert one("Shape", data, start=1) == vec(3, T)
    assert one("Shape", data, start=-1) == vec(T)
    assert one("Shape", data, end=-1) == vec(S, 3)
    assert one("Shape", data, start=-5, end=9) == vec(S, 3, T)
    assert one("Shape", data, start=2, end=1) == vec()
    assert one("Shape", UNKNOWN) == dims(None)
    assert one("Size", data) == Fact.scalar(S * T * 3)
    assert one("Size", dims(S, None)) == Fact.scalar(None)
    assert one("Size", UNKNOWN) == Fact.scalar(None)


def test_constant_of_shape() -> None:
    assert one("ConstantOfShape", vec(S, 3)) == dims(S, 3)
    assert one("ConstantOfShape", vec(-S, 3)) == dims(None, 3)  # a negative size fails
    assert one("ConstantOfShape", vec(None)) == dims(None)
    assert one("ConstantOfShape", vec(3)) == Fact(c(3), c(0, 0, 0))
    assert one("ConstantOfShape", vec(2), value=np.array([7], np.int64)) == Fact(c(2), c(7, 7))
    assert one("ConstantOfShape", vec(2), value=np.array([0.5], np.float32)) == dims(2)
    assert one("ConstantOfShape", vec()) == Fact((), c(0))
    assert one("ConstantOfShape", vec(S)).elements is None
    assert one("ConstantOfShape", vec(MAX_ELEMENTS)).elements == c(0) * MAX_ELEMENTS
    assert one("ConstantOfShape", vec(MAX_ELEMENTS + 1)).elements is None
    assert one("ConstantOfShape", vec(1, 2)).elements is None
    assert one("ConstantOfShape", dims(2)) == dims(None, None)
    assert one("ConstantOfShape", UNKNOWN) == UNKNOWN


def test_expand_and_tile() -> None:
    assert one("Expand", dims(S, 1), vec(1, 4)) == dims(S, 4)
    assert one("Expand", dims(3), vec(S, 1)) == dims(S, 3)
    assert one("Expand", dims(None), vec(2, 3)) == dims(None, None)
    assert one("Expand", dims(3), vec(None)) == dims(None)
    assert one("Expand", dims(3), vec(-S)) == dims(None)
    # a target of unknown elements but known length: the rank alone
    assert one("Expand", dims(3), dims(2)) == dims(None, None)
    assert one("Expand", dims(S, 3, 1), dims(2)) == dims(None, None, None)
    assert one("Expand", dims(3), dims(S)) == UNKNOWN
    assert one("Expand", dims(3), dims(2, 1)) == UNKNOWN
    assert one("Expand", dims(3), UNKNOWN) == UNKNOWN
    assert one("Expand", UNKNOWN, vec(2)) == UNKNOWN
    assert one("Expand", UNKNOWN, dims(2)) == UNKNOWN
    assert one("Tile", dims(S, 3), vec(2, 1)) == dims(S * 2, 3)
    assert one("Tile", dims(S, None), vec(2, 1)) == dims(S * 2, None)
    assert one("Tile", dims(S, 3), vec(None, -S)) == dims(None, None)
    assert one("Tile", dims(S, 3), vec(2)) == UNKNOWN
    assert one("Tile", dims(S, 3), dims(2)) == dims(None, None)
    assert one("Tile", UNKNOWN, vec(2)) == UNKNOWN


def test_split() -> None:
    data = dims(S, 6)
    assert run("Split", data, vec(2, 4), outputs=2, axis=1) == [dims(S, 2), dims(S, 4)]
    assert run("Split", data, None, outputs=2, axis=1, split=[1, 5]) == [dims(S, 1), dims(S, 5)]
    assert run("Split", data, outputs=3, axis=-1) == [dims(S, 2)] * 3
    assert run("Split", dims(S * 2, 6), outputs=2) == [dims(S, 6)] * 2
    assert run("Split", dims(S, 6), outputs=2) == [dims(None, 6)] * 2
    assert run("Split", dims(7), outputs=3, num_outputs=3) == [dims(3), dims(3), dims(1)]
    assert run("Split", dims(S), outputs=2, num_outputs=2) == [dims(None)] * 2
    assert run("Split", data, outputs=2, axis=2) == [UNKNOWN] * 2
    assert run("Split", data, outputs=2, axis=-3) == [UNKNOWN] * 2
    assert run("Split", UNKNOWN, outputs=2) == [UNKNOWN] * 2


def test_reduce() -> None:
    data = dims(S, 3, T)
    assert one("ReduceSum", data, vec(1)) == dims(S, 1, T)
    assert one("ReduceSum", data, vec(-1), keepdims=0) == dims(S, 3)
    assert one("ReduceMean", data, axes=[0, 2]) == dims(1, 3, 1)
    assert one("ReduceMean", data) == dims(1, 1, 1)
    assert one("ReduceMean", data, keepdims=0) == dims()
    assert one("ReduceMean", data, vec(), noop_with_empty_axes=1) == data
    assert one("ReduceMean", vec(1, 2), noop_with_empty_axes=1) == dims(2)
    assert one("ReduceMax", data, vec(None)) == dims(None, None, None)
    assert one("ReduceMax", data, vec(None), keepdims=0) == UNKNOWN
    assert one("ReduceMax", data, vec(3)) == UNKNOWN
    assert one("ArgMax", data, axis=1, keepdims=0) == dims(S, T)
    assert one("ArgMin", data) == dims(1, 3, T)
    assert one("ReduceMin", UNKNOWN) == UNKNOWN


# ------------------------------------------------------------------ arithmetic


@pytest.mark.parametrize(
    ("op", "a", "b", "expected"),
    [
        ("Add", 6, 3, 9),
        ("Sub", 6, 3, 3),
        ("Mul", 6, 3, 18),
        ("Div", 7, 2, 3),
        ("Div", 0, 3, 0),
        ("Div", 2**62 + 1, 1, 2**62 + 1),  # exact: no float division
        ("Div", 6, 0, None),
        ("Div", -6, 2, None),
        ("Div", 6, -2, None),
        ("Max", 6, 3, 6),
        ("Max", 3, 6, 6),
        ("Min", 6, 3, 3),
        ("Min", 3, 6, 3),
        ("Equal", 3, 3, 1),
        ("Equal", 3, 4, 0),
        ("And", 1, 0, 0),
        ("And", 1, 1, 1),
        ("Or", 1, 0, 1),
        ("Or", 0, 0, 0),
        ("And", 2, 1, None),
        ("Or", 0, 2, None),
        ("Pow", 2, 3, None),
    ],
)
def test_element_arithmetic_on_constants(op: str, a: int, b: int, expected: int | None) -> None:
    out = one(op, vec(a), vec(b))
    assert out == Fact(c(1), (None if expected is None else Dim.const(expected),))


def test_element_arithmetic_on_symbols() -> None:
    assert one("Mul", vec(S, 2), vec(3)) == Fact(c(2), (S * 3, Dim.const(6)))
    assert one("Add", vec(S), vec(T)).elements == (S + T,)
    assert one("Sub", vec(S), vec(S)).elements == (Dim(),)
    assert one("Div", vec(S * 4), vec(2)).elements == (S * 2,)
    assert one("Div", vec(S), vec(2)).elements == (None,)
    assert one("Equal", vec(S), vec(S)).elements == c(1)
    assert one("Equal", vec(S), vec(T)).elements == (None,)
    assert one("Max", vec(S), vec(1)).elements == (None,)
    assert one("Add", vec(None), vec(1)).elements == (None,)
    assert one("Add", vec(1), vec(None)).elements == (None,)


def test_elementwise_broadcasting() -> None:
    assert one("Add", dims(S, 1), dims(3)) == dims(S, 3)
    assert one("Add", dims(S, None), dims(3)) == dims(None, None)
    assert one("Add", dims(3), dims(S, None)) == dims(None, None)
    assert one("Add", dims(3), UNKNOWN) == UNKNOWN
    assert one("Add", vec(1, 2), vec(10)) == vec(11, 12)
    assert one("Add", vec(10), vec(1, 2)) == vec(11, 12)
    assert one("Add", vec(1, 2), vec(1, 2, 3)).elements is None
    assert one("Add", vec(1, 2), dims(2)) == dims(2)
    assert one("Add", Fact(c(1, 1), (S,)), Fact(c(1, 1), (S,))).elements is None
    assert one("Mean") == UNKNOWN


def test_not_and_where() -> None:
    assert one("Not", vec(0, 1, 2, None)) == Fact(c(4), (Dim.const(1), Dim(), None, None))
    assert one("Not", vec(S)).elements == (None,)
    assert one("Not", dims(S)) == dims(S)
    assert one("Where", vec(1, 1), vec(5, 6), vec(7, 8)) == vec(5, 6)
    assert one("Where", vec(0, 0), vec(5, 6), vec(7, 8)) == vec(7, 8)
    assert one("Where", vec(1, 0), vec(5, 6), vec(7, 8)) == dims(2)
    assert one("Where", vec(None, 1), vec(5, 6), vec(7, 8)) == dims(2)
    assert one("Where", vec(1), vec(5, 6), vec(7)) == vec(5, 6)
    assert one("Where", vec(1), vec(5), vec(7, 8)) == dims(2)  # the pick is broadcast
    assert one("Where", vec(1), dims(2), vec(7, 8)) == dims(2)
    assert one("Where", dims(2), UNKNOWN, dims(2)) == UNKNOWN


def test_matmul_and_gemm() -> None:
    assert one("MatMul", dims(S, 2, 3), dims(3, 4)) == dims(S, 2, 4)
    assert one("MatMul", dims(2, 3), dims(T, 3, 4)) == dims(T, 2, 4)
    assert one("MatMul", dims(None, 2, 3), dims(3, 4)) == dims(None, 2, 4)
    assert one("MatMul", dims(3), dims(S, 3, 4)) == dims(S, 4)
    assert one("MatMul", dims(S, 2, 3), dims(3)) == dims(S, 2)
    assert one("MatMul", dims(3), dims(3)) == dims()
    assert one("MatMul", dims(3), dims()) == UNKNOWN
    assert one("MatMul", dims(), dims(3)) == UNKNOWN
    assert one("MatMul", UNKNOWN, dims(3)) == UNKNOWN
    assert one("MatMulInteger", dims(2, 3), dims(3, S)) == dims(2, S)
    assert one("Gemm", dims(2, 3), dims(3, S)) == dims(2, S)
    assert one("Gemm", dims(3, 2), dims(S, 3), transA=1, transB=1) == dims(2, S)
    assert one("Gemm", dims(2, 3), dims(3)) == dims(None, None)
    assert one("Gemm", dims(2), dims(3, 4)) == dims(None, None)


# ------------------------------------------------------------------ recurrent ops


def _rnn(op: str, x: Fact | None, w: Fact, r: Fact, domain: str = "", **attrs) -> list[Fact]:
    x_value = ir.Value(name="x")
    attributes = [ir.convenience.convert_attribute(k, v) for k, v in attrs.items()]
    node = ir.Node(domain, op, [x_value, None, None], attributes, num_outputs=3)
    return TRANSFER[(domain, op)](node, [x, w, r])


def test_rnn_outputs_by_layout() -> None:
    w, r = dims(1, 12, 2), dims(1, 12, 3)
    y, h, c_ = _rnn("LSTM", dims(S, T, 2), w, r)
    assert y == dims(S, 1, T, 3) and h == c_ == dims(1, T, 3)
    y, h, _ = _rnn("LSTM", dims(S, T, 2), w, r, layout=1)
    assert y == dims(S, T, 1, 3) and h == dims(S, 1, 3)
    y, h = _rnn("GRU", dims(S, T, 2), dims(2, 9, 2), dims(2, 9, 3), direction="bidirectional")[:2]
    assert y == dims(S, 2, T, 3) and h == dims(2, T, 3)


def test_rnn_outputs_of_an_x_of_unknown_rank_are_named_by_its_axes() -> None:
    x_value = ir.Value(name="x")
    node = ir.Node("", "RNN", [x_value, None, None], [], num_outputs=2)
    y, h, _ = TRANSFER[("", "RNN")](node, [UNKNOWN, dims(1, 3, 2), dims(1, 3, 3)])
    seq, batch = Dim.sym(x_value, 0), Dim.sym(x_value, 1)
    assert y == dims(seq, 1, batch, 3) and h == dims(1, batch, 3)


def test_rnn_outputs_unknown_for_a_bad_x_or_sizes() -> None:
    w, r = dims(1, 12, 2), dims(1, 12, 3)
    assert _rnn("LSTM", dims(S, 2), w, r) == []
    assert _rnn("LSTM", dims(S, T, 2), w, r, direction="sideways") == []
    assert _rnn("LSTM", dims(S, T, 2), dims(2, 12, 2), r) == []  # W of 2 directions
    node = ir.Node("", "LSTM", [], [], num_outputs=3)
    assert TRANSFER[("", "LSTM")](node, []) == []


def test_rnn_hidden_size_of_dynamic_quantize_lstm_is_r_axis_1() -> None:
    """DynamicQuantizeLSTM's R is [D, H, 4H]: the hidden size is its axis 1."""
    w, r = dims(1, 2, 12), dims(1, 3, 12)
    y, _, _ = _rnn("DynamicQuantizeLSTM", dims(S, T, 2), w, r, domain="com.microsoft")
    assert y == dims(S, 1, T, 3)
    assert _rnn("LSTM", dims(S, T, 2), dims(1, 12, 2), dims(1, 12, None)) == []
    y, _, _ = _rnn("LSTM", dims(S, T, 2), dims(1, 12, 2), dims(1, 12, None), hidden_size=3)
    assert y == dims(S, 1, T, 3)
    assert _rnn("LSTM", dims(S, T, 2), w, r, hidden_size=0) == []
    # W of two directions (its gate axis unknown) against a forward node
    assert _rnn("LSTM", dims(S, T, 2), dims(2, None, 2), dims(1, 12, 3), hidden_size=3) == []

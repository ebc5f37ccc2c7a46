"""shape.constant's evaluator against ONNX Runtime, one op (or one short chain) at a time.

Each case is a graph of constants. Where ONNX Runtime computes it, ``fold_value`` gives
the same array (values, dtype and shape), or refuses a case listed as a conservative
refusal; where ONNX Runtime rejects it, ``fold_value`` refuses with a reason, never an
array. The cases walk each op's guards: attribute and input forms by opset, negative and
out-of-range axes, copied (``0``) and inferred (``-1``) Reshape dims, uneven Splits,
Gather indices, lazy ``Concat`` followed by ``Transpose``/``Unsqueeze``/``Squeeze``,
and the casts ONNX Runtime computes in two steps.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.shape import constant
from rnn_rewrite_rules.shape.constant import fold_value


@dataclasses.dataclass(frozen=True)
class Case:
    """``nodes`` over the initializers ``constants``; every output of the last node is
    checked. ``refused``: ONNX Runtime computes it, the evaluator declines (conservative).
    ``aborts``: ONNX Runtime aborts the process on it (not run); the ONNX checker rejects it."""

    nodes: tuple[onnx.NodeProto, ...]
    constants: dict
    opset: int = 18
    refused: bool = False
    aborts: bool = False


def _data(*shape: int, dtype=np.float32) -> np.ndarray:
    return (np.arange(int(np.prod(shape))) - 3).astype(dtype).reshape(shape)


def _one(op: str, constants: dict, outputs: int = 1, opset: int = 18, refused=False, **attrs):
    node = helper.make_node(
        op, list(constants), [f"out{i}" for i in range(outputs)], name=op, **attrs
    )
    return Case((node,), constants, opset, refused)


def _ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _reshape(shape, target, opset=18, **attrs) -> Case:
    return _one("Reshape", {"data": _data(*shape), "shape": _ints(*target)}, opset=opset, **attrs)


def _split(shape, outputs, sizes=None, opset=18, **attrs) -> Case:
    """``sizes``: the ``split`` input (opset 13+); ``split=`` in ``attrs``: the attribute."""
    constants = {"data": _data(*shape)}
    if sizes is not None:
        constants["split"] = _ints(*sizes)
    return _one("Split", constants, outputs, opset, **attrs)


def _slice(shape, starts, ends, axes=None, steps=None) -> Case:
    constants = {"data": _data(*shape), "starts": _ints(*starts), "ends": _ints(*ends)}
    if axes is not None:
        constants["axes"] = _ints(*axes)
    if steps is not None:
        constants["steps"] = _ints(*steps)
    return _one("Slice", constants)


def _gather(shape, indices, axis=None) -> Case:
    attrs = {} if axis is None else {"axis": axis}
    return _one("Gather", {"data": _data(*shape), "indices": np.array(indices, np.int64)}, **attrs)


def _axes_op(op, shape, axes, opset=18) -> Case:
    """Squeeze/Unsqueeze with ``axes`` as the attribute (opset < 13) or the input."""
    constants = {"data": _data(*shape)}
    if axes is None:
        return _one(op, constants, opset=opset)
    if opset < 13:
        return _one(op, constants, opset=opset, axes=list(axes))
    return _one(op, constants | {"axes": _ints(*axes)}, opset=opset)


def _cast(array: np.ndarray, to: int, refused: bool = False) -> Case:
    return _one("Cast", {"data": array}, refused=refused, to=to)


def _after_concat(op: str, **attrs) -> Case:
    """``op`` of a ``Concat`` (kept lazy by the evaluator) of two [1, 2, 3] tensors."""
    constants = {"a": _data(1, 2, 3), "b": _data(1, 2, 3) * 10}
    nodes = [helper.make_node("Concat", ["a", "b"], ["joined"], axis=1)]
    inputs = ["joined"]
    if op in ("Unsqueeze", "Squeeze"):
        constants["axes"] = _ints(*attrs.pop("axes"))
        inputs.append("axes")
    nodes.append(helper.make_node(op, inputs, ["out0"], **attrs))
    return Case(tuple(nodes), constants)


def _squeeze_concat(a: tuple[int, ...], b: tuple[int, ...], axis: int, axes: list[int]) -> Case:
    """``Squeeze(Concat(a, b), axes)``: of the lazy Concat's own axis (a size-1 axis, so
    the other piece is empty), or of axes before it with other size-1 axes left alone."""
    constants = {"a": _data(*a), "b": _data(*b) * 10, "axes": _ints(*axes)}
    nodes = (
        helper.make_node("Concat", ["a", "b"], ["joined"], axis=axis),
        helper.make_node("Squeeze", ["joined", "axes"], ["out0"]),
    )
    return Case(nodes, constants)


F16, F32, F64 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE
I8, I32, I64, U8, BOOL = (
    onnx.TensorProto.INT8,
    onnx.TensorProto.INT32,
    onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.BOOL,
)

CASES = {
    # Reshape: inferred (-1) and copied (0) dims, allowzero, and the shapes it cannot take
    "reshape -1": _reshape((2, 3, 4), (4, -1)),
    "reshape copies dim 0": _reshape((2, 3, 4), (0, -1)),
    "reshape copies two dims": _reshape((2, 3, 4), (0, 0, -1)),
    "reshape flat": _reshape((2, 3, 4), (24,)),
    "reshape copies a dim it lacks": _reshape((2, 3, 4), (0, 0, 0, 0)),
    "reshape two -1": _reshape((2, 3, 4), (-1, -1)),
    "reshape -2": _reshape((2, 3, 4), (-2, 12)),
    "reshape without shape": _one("Reshape", {"data": _data(2, 3)}),
    "reshape -1 does not divide": _reshape((2, 3, 4), (5, -1)),
    "reshape wrong size": _reshape((2, 3, 4), (5, 5)),
    "reshape empty with -1": _reshape((2, 0, 4), (0, -1)),
    "reshape allowzero keeps 0": _reshape((0, 3), (0, 3), allowzero=1),
    "reshape allowzero 0 is not a copy": _reshape((2, 3, 4), (0, 24), allowzero=1),
    "reshape opset 13": _reshape((2, 3, 4), (4, 0, -1), opset=13),
    "reshape allowzero keeps a 0 a copy would fill": _reshape((2, 3, 4), (0, 12), allowzero=1),
    "reshape -1 next to a copied 0": _reshape((2, 0, 4), (-1, 0)),
    "reshape 2-D shape": _one(
        "Reshape", {"data": _data(2, 3), "shape": np.array([[3, 2]], np.int64)}
    ),
    # Split: sizes as input (13+), attribute (11), equal parts, opset 18's num_outputs
    "split equal": _split((6, 4), 3, opset=13),
    "split unequal without sizes": _split((7, 4), 3, opset=13),
    "split num_outputs uneven": _split((7, 4), 3, num_outputs=3),
    "split num_outputs even": _split((6, 4), 2, axis=0, num_outputs=2),
    "split sizes on the last axis": _split((6, 4), 2, sizes=(1, 3), opset=13, axis=-1),
    "split sizes not summing": _split((6, 4), 2, sizes=(1, 2), opset=13, axis=1),
    "split negative size": _split((6, 4), 2, sizes=(-1, 5), opset=13, axis=1),
    "split empty part": _split((6, 4), 2, sizes=(0, 4), opset=13, axis=1),
    "split axis out of range": _split((6, 4), 2, opset=13, axis=2),
    "split axis -rank": _split((6, 4), 2, opset=13, axis=-2),
    "split without input": Case(
        (helper.make_node("Split", [], ["out0", "out1"], axis=0, num_outputs=2),), {}
    ),
    "split num_outputs disagrees": dataclasses.replace(
        _split((6, 4), 3, num_outputs=2), aborts=True
    ),
    "split attribute sizes": _split((6, 4), 2, opset=11, axis=0, split=[2, 4]),
    # Slice: negative starts and steps, omitted axes, clamped ends, its refusals
    "slice reversed": _slice((4, 3), (-1,), (-(2**62),), (0,), (-1,)),
    "slice every other": _slice((5, 3), (0, 1), (5, 3), (0, 1), (2, 1)),
    "slice without axes": _slice((4, 3), (1, 0), (3, 2)),
    "slice clamped": _slice((4, 3), (-100,), (100,), (1,)),
    "slice negative axis": _slice((4, 3), (1,), (-1,), (-1,)),
    "slice step 0": _slice((4, 3), (0,), (2,), (0,), (0,)),
    "slice repeated axis": _slice((4, 3), (0, 1), (2, 2), (0, 0)),
    "slice axis out of range": _slice((4, 3), (0,), (2,), (2,)),
    "slice empty": _slice((4, 3), (2,), (1,), (0,)),
    "slice ends before the start": _slice((4, 3), (0,), (-100,), (0,)),
    "slice starts past the end": _slice((4, 3), (5,), (10,), (0,)),
    "slice reversed, clamped both ways": _slice((4, 3), (100,), (-100,), (0,), (-1,)),
    "slice reversed to the first": _slice((4, 3), (2,), (0,), (0,), (-1,)),
    "slice reversed below the first": _slice((4, 3), (-100,), (-200,), (0,), (-1,)),
    "slice reversed from before the end": _slice((4, 3), (1,), (100,), (0,), (-1,)),
    "slice reversed from the last to itself": _slice((4, 3), (3,), (3,), (0,), (-1,)),
    "slice reversed by two": _slice((5, 3), (-1,), (-(2**62),), (0,), (-2,)),
    "slice empty axis": _slice((0, 3), (0,), (1,), (0,)),
    "slice empty axis reversed": _slice((0, 3), (-1,), (-(2**62),), (0,), (-1,)),
    "slice ends shorter than starts": _slice((4, 3), (0, 0), (1,)),
    "slice axes of another length": _slice((4, 3), (0,), (1,), (0, 1)),
    "slice steps of another length": _slice((4, 3), (0,), (1,), (0,), (1, 1)),
    "slice attributes (opset 9)": _one(
        "Slice", {"data": _data(4, 3)}, opset=9, starts=[1, -2], ends=[3, 100], axes=[0, 1]
    ),
    "slice one axis by attribute (opset 9)": _one(
        "Slice", {"data": _data(4, 3)}, opset=9, starts=[1], ends=[3], axes=[1]
    ),
    "slice without starts (opset 9)": _one("Slice", {"data": _data(4, 3)}, opset=9, ends=[3]),
    "slice without axes or steps (opset 10)": _one(
        "Slice", {"data": _data(4, 3), "starts": _ints(1), "ends": _ints(3)}, opset=10
    ),
    "slice float starts": _one(
        "Slice", {"data": _data(4, 3), "starts": np.zeros(1), "ends": _ints(3)}
    ),
    # Gather: axes, negative and out-of-range indices, index shapes
    "gather rows": _gather((4, 3), [2, 0]),
    "gather negative index": _gather((4, 3), [-1, 1], axis=1),
    "gather scalar index": _gather((4, 3), 2, axis=-1),
    "gather 2-D indices": _gather((4, 3), [[0, 3], [1, 2]]),
    "gather index out of range": _gather((4, 3), [4]),
    "gather negative index out of range": _gather((4, 3), [-5]),
    "gather axis out of range": _gather((4, 3), [0], axis=2),
    "gather axis -rank": _gather((4, 3), [3, 0], axis=-2),
    "gather without indices": _one("Gather", {"data": _data(4, 3)}),
    "gather float indices": _one("Gather", {"data": _data(4, 3), "indices": np.zeros(1)}),
    "gather int32 indices": _one(
        "Gather", {"data": _data(4, 3), "indices": np.array([3, -4], np.int32)}
    ),
    # Squeeze / Unsqueeze: attribute and input forms, negative, unsorted, repeated axes
    "squeeze all ones": _axes_op("Squeeze", (1, 3, 1), None),
    "squeeze one axis": _axes_op("Squeeze", (1, 3, 1), (-1,)),
    "squeeze attribute": _axes_op("Squeeze", (1, 3, 1), (0,), opset=11),
    "squeeze a dim that is not 1": _axes_op("Squeeze", (1, 3, 1), (1,)),
    "squeeze axis out of range": _axes_op("Squeeze", (1, 3, 1), (3,)),
    "squeeze repeated axis": dataclasses.replace(  # ONNX Runtime squeezes it once
        _axes_op("Squeeze", (1, 3, 1), (0, -3)), refused=True
    ),
    "unsqueeze unsorted": _axes_op("Unsqueeze", (2, 3), (3, 0)),
    "unsqueeze negative": _axes_op("Unsqueeze", (2, 3), (-1,)),
    "unsqueeze attribute": _axes_op("Unsqueeze", (2, 3), (1,), opset=11),
    "unsqueeze repeated": _axes_op("Unsqueeze", (2, 3), (1, 1)),
    "unsqueeze out of range": _axes_op("Unsqueeze", (2, 3), (3,)),
    "unsqueeze without axes": _axes_op("Unsqueeze", (2, 3), None),
    "unsqueeze 0-D axes": _one("Unsqueeze", {"data": _data(2, 3), "axes": np.array(0, np.int64)}),
    "unsqueeze 2-D axes": _one(
        "Unsqueeze", {"data": _data(2, 3), "axes": np.array([[0]], np.int64)}
    ),
    "squeeze empty axes": _one(  # ONNX Runtime reads no axes as all
        "Squeeze", {"data": _data(1, 3), "axes": _ints()}, refused=True
    ),
    # Transpose
    "transpose perm": _one("Transpose", {"data": _data(2, 3, 4)}, perm=[1, 2, 0]),
    "transpose default reverses": _one("Transpose", {"data": _data(2, 3, 4)}),
    "transpose bad perm": _one("Transpose", {"data": _data(2, 3, 4)}, perm=[0, 0, 1]),
    "transpose short perm": _one("Transpose", {"data": _data(2, 3, 4)}, perm=[1, 0]),
    "identity": _one("Identity", {"data": _data(2, 3)}),
    "identity of a missing input": Case(
        (helper.make_node("Identity", [""], ["out0"]),), {"unused": _data(1)}
    ),
    "computed value read by two nodes": Case(
        (
            helper.make_node("Transpose", ["data"], ["t"]),
            helper.make_node("Identity", ["t"], ["a"]),
            helper.make_node("Identity", ["t"], ["b"]),
            helper.make_node("Concat", ["a", "b"], ["out0"], axis=0),
        ),
        {"data": _data(2, 3)},
    ),
    # Concat, and what follows it while it is kept lazy
    "concat negative axis": _one("Concat", {"a": _data(2, 3), "b": _data(2, 1)}, axis=-1),
    "concat axis out of range": _one("Concat", {"a": _data(2, 3), "b": _data(2, 3)}, axis=2),
    "concat without axis": _one("Concat", {"a": _data(2, 3), "b": _data(2, 3)}),
    "concat axis -rank": _one("Concat", {"a": _data(2, 3), "b": _data(1, 3)}, axis=-2),
    "concat of one input": _one("Concat", {"a": _data(2, 3)}, axis=1),
    "concat without inputs": _one("Concat", {}, axis=0),
    "concat of other shapes": _one("Concat", {"a": _data(2, 3), "b": _data(3, 3)}, axis=1),
    "concat of other ranks": _one("Concat", {"a": _data(2, 3), "b": _data(2)}, axis=1),
    "concat of two dtypes": _one(
        "Concat", {"a": _data(2, 3), "b": _data(2, 3, dtype=np.float64)}, axis=0
    ),
    "concat with a missing input": Case(
        (helper.make_node("Concat", ["a", ""], ["out0"], axis=0),), {"a": _data(2, 3)}
    ),
    "concat then transpose": _after_concat("Transpose", perm=[2, 0, 1]),
    "concat then default transpose": _after_concat("Transpose"),
    "concat then unsqueeze": _after_concat("Unsqueeze", axes=[0, 4]),
    "concat then unsqueeze unsorted": _after_concat("Unsqueeze", axes=[4, 0, 2]),
    "concat then squeeze": _after_concat("Squeeze", axes=[0]),
    "concat then squeeze of its axis": _squeeze_concat((1, 1, 3), (0, 1, 3), 0, [0]),
    "concat then squeeze keeps other ones": _squeeze_concat((1, 1, 3), (1, 2, 3), 1, [0]),
    "concat then squeeze of every 1": Case(
        (
            helper.make_node("Concat", ["a", "b"], ["joined"], axis=1),
            helper.make_node("Squeeze", ["joined"], ["out0"]),
        ),
        {"a": _data(1, 2, 1), "b": _data(1, 2, 1)},
    ),
    "concat then reshape": Case(
        (
            helper.make_node("Concat", ["a", "b"], ["joined"], axis=1),
            helper.make_node("Reshape", ["joined", "shape"], ["out0"]),
        ),
        {"a": _data(1, 2, 3), "b": _data(1, 2, 3), "shape": _ints(4, -1)},
    ),
    # Cast: rounding and the two-step double -> float16, integer targets, bool
    # ONNX Runtime rounds via float, onnx.reference once: folded only where they agree
    "cast double to half": _cast(np.array([1 + 2**-11, 65520.0, -0.1], np.float64), F16),
    "cast double to half rounding twice": _cast(
        np.array([1 + 2**-11 + 2**-40], np.float64), F16, refused=True
    ),
    "cast float to int truncates": _cast(np.array([1.7, -1.7, 2.5], np.float32), I32),
    # undefined in C++ (x86 and ARM differ): ONNX Runtime gives a value, folding refuses
    "cast float to int out of range": _cast(np.array([3e9], np.float32), I32, refused=True),
    "cast negative to uint8": _cast(np.array([-1.0], np.float32), U8, refused=True),
    "cast nan to int": _cast(np.array([np.nan], np.float32), I64, refused=True),
    "cast to uint8 below 0": _cast(np.array([-128.9, 255.9], np.float32), U8, refused=True),
    "cast to int8 inside the range": _cast(np.array([-128.99, 127.99], np.float32), I8),
    "cast to int8 at min - 1": _cast(np.array([-129.0], np.float32), I8, refused=True),
    "cast to int8 below min - 1": _cast(np.array([-129.5], np.float32), I8, refused=True),
    "cast to int8 at max + 1": _cast(np.array([0.0, 128.0], np.float32), I8, refused=True),
    "cast to int8 above max + 1": _cast(np.array([128.5], np.float32), I8, refused=True),
    "cast float to bool": _cast(np.array([0.0, -2.0, 0.5], np.float32), BOOL),
    "cast int64 to half": _cast(np.array([70000, -3], np.int64), F16),
    "cast bool to double": _cast(np.array([True, False]), F64),
    "cast half to float": _cast(np.array([0.1, 6e-8], np.float16), F32),
    "cast overflow to inf": _cast(np.array([1e300], np.float64), F32),
    "cast without to": _one("Cast", {"data": np.array([1.5], np.float32)}),
    "cast from string": _one(
        "Cast", {"data": np.array(["1.5"], dtype=object)}, refused=True, to=F32
    ),
    "cast from complex": _cast(np.array([1 + 2j], np.complex64), F32),
    "cast to bfloat16": _cast(np.array([1.0], np.float32), onnx.TensorProto.BFLOAT16, refused=True),
}

#: Each refusal's reason (after ``cannot evaluate <value>: ``).
REASONS = {
    "reshape copies a dim it lacks": "Reshape copies a dim the input does not have",
    "reshape two -1": "invalid Reshape target [-1, -1]",
    "reshape -2": "invalid Reshape target [-2, 12]",
    "reshape -1 does not divide": "Reshape of (2, 3, 4) to [5, -1]",
    "reshape wrong size": "Reshape of (2, 3, 4) to [5, 5]",
    "reshape allowzero 0 is not a copy": "Reshape of (2, 3, 4) to [0, 24]",
    "reshape allowzero keeps a 0 a copy would fill": "Reshape of (2, 3, 4) to [0, 12]",
    "reshape -1 next to a copied 0": "Reshape of (2, 0, 4) to [-1, 0]",
    "reshape 2-D shape": "shape is not a 1-D integer tensor",
    "reshape without shape": "Reshape without shape",
    "split without input": "Split without input",
    "gather without indices": "Gather without indices",
    "identity of a missing input": "Identity without input",
    "concat with a missing input": "Concat with an empty input",
    "cast without to": "Cast to UNDEFINED is not folded",
    "cast from string": "STRING tensors are not folded",
    "cast from complex": "Cast from complex64 is not folded",
    "split unequal without sizes": "Split of 7 into 3 equal parts",
    "split sizes not summing": "Split sizes [1, 2] of a dim of 4",
    "split negative size": "Split sizes [-1, 5] of a dim of 4",
    "split axis out of range": "Split axis 2 out of range",
    "split num_outputs disagrees": "Split num_outputs disagrees with its outputs",
    "slice step 0": "Slice step 0",
    "slice repeated axis": "repeated Slice axes [0, 0]",
    "slice axis out of range": "Slice axis 2 out of range for rank 2",
    "slice ends shorter than starts": "Slice starts/ends missing or of different lengths",
    "slice axes of another length": "Slice inputs of different lengths",
    "slice steps of another length": "Slice inputs of different lengths",
    "slice without starts (opset 9)": "Slice starts/ends missing or of different lengths",
    "slice float starts": "starts is not a 1-D integer tensor",
    "gather index out of range": "Gather index out of range",
    "gather negative index out of range": "Gather index out of range",
    "gather axis out of range": "Gather axis 2 out of range",
    "gather float indices": "Gather indices are not integers",
    "squeeze a dim that is not 1": "Squeeze of axes [1] of shape (1, 3, 1)",
    "squeeze axis out of range": "Squeeze axis 3 out of range for rank 3",
    "squeeze repeated axis": "repeated Squeeze axes [0, -3]",
    "unsqueeze repeated": "repeated Unsqueeze axes [1, 1]",
    "unsqueeze out of range": "Unsqueeze axis 3 out of range for rank 3",
    "unsqueeze without axes": "Unsqueeze without axes",
    "unsqueeze 2-D axes": "axes is not a 1-D integer tensor",
    "squeeze empty axes": "Squeeze with empty axes",
    "transpose bad perm": "Transpose perm (0, 0, 1) for rank 3",
    "transpose short perm": "Transpose perm (1, 0) for rank 3",
    "concat axis out of range": "Concat axis 2 out of range for rank 2",
    "concat without axis": "Concat without axis",
    "concat without inputs": "Concat without input",
    "concat of other shapes": "Concat of shapes (2, 3) and (3, 3)",
    "concat of other ranks": "Concat of shapes (2, 3) and (2,)",
    "concat of two dtypes": "Concat inputs of different dtypes",
    "cast float to int out of range": "Cast of values out of the int32 range is platform-dependent",
    "cast negative to uint8": "Cast of values out of the uint8 range is platform-dependent",
    "cast nan to int": "Cast of values out of the int64 range is platform-dependent",
    "cast to uint8 below 0": "Cast of values out of the uint8 range is platform-dependent",
    "cast to int8 at min - 1": "Cast of values out of the int8 range is platform-dependent",
    "cast to int8 below min - 1": "Cast of values out of the int8 range is platform-dependent",
    "cast to int8 at max + 1": "Cast of values out of the int8 range is platform-dependent",
    "cast to int8 above max + 1": "Cast of values out of the int8 range is platform-dependent",
    "cast to bfloat16": "Cast to BFLOAT16 is not folded",
    "cast double to half rounding twice": (
        "Cast of float64 to float16 rounds differently in ONNX Runtime (via float32) "
        "and onnx.reference (once)"
    ),
}


def _model(case: Case) -> onnx.ModelProto:
    last = case.nodes[-1]
    graph = helper.make_graph(
        list(case.nodes),
        "constants",
        [],
        [onnx.ValueInfoProto(name=name) for name in last.output],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in case.constants.items()],
    )
    for output in graph.output:  # element type only; ONNX Runtime infers the rest
        output.type.tensor_type.elem_type = _output_type(case)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model.ir_version = 8
    return model


def _output_type(case: Case) -> int:
    last = case.nodes[-1]
    if last.op_type == "Cast":
        return next((a.i for a in last.attribute if a.name == "to"), onnx.TensorProto.FLOAT)
    data = next(iter(case.constants.values()), _data(1))
    return helper.np_dtype_to_tensor_dtype(np.asarray(data).dtype)


@pytest.mark.parametrize("name", list(CASES))
def test_folding_computes_what_onnxruntime_computes_or_refuses(name: str) -> None:
    case = CASES[name]
    model = _model(case)
    if case.aborts:
        with pytest.raises(onnx.checker.ValidationError):
            onnx.checker.check_model(model, full_check=True)
        expected = None
    else:
        try:
            expected = runtime.run(model, {}, optimize=False)
        except Exception:  # ONNX Runtime rejects it: so must the evaluator
            expected = None
    ir_model = ir.serde.deserialize_model(model)
    last = list(ir_model.graph)[-1]
    for index, value in enumerate(last.outputs):
        folded = fold_value(value)
        if expected is None or case.refused:
            assert folded == f"cannot evaluate {value.name}: {REASONS[name]}", (name, folded)
            continue
        assert isinstance(folded, np.ndarray), (name, folded)
        # the contract: C-contiguous, owning its data (never a view of the model's tensors)
        assert folded.flags.c_contiguous and folded.flags.owndata and folded.base is None
        assert folded.dtype == expected[index].dtype and folded.shape == expected[index].shape
        np.testing.assert_array_equal(folded, expected[index], err_msg=name)


def test_every_listed_reason_belongs_to_a_case() -> None:
    assert set(REASONS) <= set(CASES)


def _chain() -> ir.Model:
    """``t = Identity(c)``, ``y = Unsqueeze(t, [0])``, ``z = Concat(x, c)`` for a constant
    ``c`` and an input ``x``."""
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[2] x) => (float[1, 2] y, float[4] z) {
            c = Constant <value = float[2] {1.0, -2.0}> ()
            zero = Constant <value = int64[1] {0}> ()
            t = Identity (c)
            y = Unsqueeze (t, zero)
            z = Concat <axis = 0> (x, c)
        }
    """)
    return ir.serde.deserialize_model(model)


def _node(model: ir.Model, op_type: str) -> ir.Node:
    (node,) = [n for n in model.graph if n.op_type == op_type]
    return node


def test_given_nodes_must_compute_every_operand() -> None:
    """``fold_value(value, nodes)``: an operand computed by a node not given is refused."""
    model = _chain()
    y = _node(model, "Unsqueeze").outputs[0]
    unsqueeze, identity = _node(model, "Unsqueeze"), _node(model, "Identity")
    reason = "cannot evaluate y: t is not computed by the sub-graph"
    assert fold_value(y, [unsqueeze]) == reason
    assert fold_value(y, [identity, unsqueeze]).tolist() == [[1.0, -2.0]]


def test_a_runtime_operand_has_no_constant_value() -> None:
    model = _chain()
    z = _node(model, "Concat").outputs[0]
    assert fold_value(z, [_node(model, "Concat")]) == "cannot evaluate z: x has no constant value"


def test_an_op_the_evaluator_does_not_know_is_refused() -> None:
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g () => (float[2] y) {
            c = Constant <value = float[2] {1.0, -2.0}> ()
            y = Relu (c)
        }
    """)
    ir_model = ir.serde.deserialize_model(model)
    y = _node(ir_model, "Relu").outputs[0]
    assert fold_value(y, [_node(ir_model, "Relu")]) == "cannot evaluate y: Relu is not foldable"


@pytest.mark.parametrize("shape", [(), (3,), (2, 3, 4)])
def test_a_constant_not_read_yet_is_tracked_on_a_zero_strided_read_only_probe(shape) -> None:
    """What lets folding follow a big weight's views without reading it: its probe has
    the tensor's shape and dtype on one element (zero strides), and cannot be written."""
    tensor = ir.tensor(_data(*shape))
    probe = constant._View(tensor).probe
    assert probe.shape == shape and probe.dtype == np.float32
    assert probe.strides == (0,) * len(shape) and not probe.flags.writeable


def test_the_topological_sort_lists_each_node_once_after_its_producers() -> None:
    """``preparation_nodes`` falls back to ``_toposort`` when the nodes are not all in the
    value's graph (an outer scope's): given a diamond in reverse order, with an omitted
    operand, it returns each node once, every producer before its readers."""
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[2] x) => (float[2] d) {
            a = Neg (x)
            b = Relu (a)
            c = Add (a, b)
            e = Clip (c, , a)
            d = Mul (e, a)
        }
    """)
    nodes = list(ir.serde.deserialize_model(model).graph)
    ordered = constant._toposort(nodes[::-1])
    assert len(ordered) == len(nodes) and set(ordered) == set(nodes)
    position = {node: i for i, node in enumerate(ordered)}
    for node in ordered:
        for operand in node.inputs:
            producer = None if operand is None else operand.producer()
            assert producer is None or position[producer] < position[node], node.op_type

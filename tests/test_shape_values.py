"""What ``shape.values`` proves of a tensor: all zeros, finite. One case per guard.

Written from mutation testing (docs/mutation.md): each case is the nearest graph on the
other side of one condition of ``is_all_zeros``/``is_finite``, so changing that condition
fails a test here, not only (by luck) a rule's end-to-end test.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules.shape.values import is_all_zeros, is_finite

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def _values(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, int] | None = None,
    constants: dict[str, np.ndarray] | None = None,
    *,
    overridable: tuple[str, ...] = (),
) -> dict[str, ir.Value]:
    """Every named value of a graph: ``inputs`` (name -> dtype) are graph inputs, and
    ``constants`` initializers (also graph inputs when named in ``overridable``)."""
    constants = constants or {}
    declared = [helper.make_tensor_value_info(n, t, None) for n, t in (inputs or {}).items()]
    declared += [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(constants[n].dtype), None)
        for n in overridable
    ]
    outputs = [o for node in nodes for o in node.output]
    graph = helper.make_graph(
        nodes,
        "g",
        declared,
        [helper.make_empty_tensor_value_info(name) for name in outputs],
        [numpy_helper.from_array(a, n) for n, a in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    ir_graph = ir.serde.deserialize_model(model).graph
    found = {v.name: v for v in ir_graph.inputs}
    found.update(ir_graph.initializers)
    found.update({o.name: o for node in ir_graph for o in node.outputs})
    return found


ZEROS = np.zeros((2, 3), np.float32)
ONES = np.ones((2, 3), np.float32)
SOME_ZERO = np.array([0.0, 0.0, 1.0], np.float32)


def _chain(op: str, length: int, start: str, **attrs: object) -> list[onnx.NodeProto]:
    names = [start] + [f"c{i}" for i in range(length)]
    return [helper.make_node(op, [a], [b], **attrs) for a, b in itertools.pairwise(names)]


#: One-input forms of the ops the proofs follow, for the depth-limit tests.
CHAIN_OPS = [("Relu", {}), ("Concat", {"axis": 0}), ("Cast", {"to": FLOAT})]


# is_all_zeros ------------------------------------------------------------------------


def test_none_and_graph_inputs_are_not_zeros() -> None:
    values = _values([], {"x": FLOAT}, {"z": ZEROS}, overridable=("z",))
    assert not is_all_zeros(None)
    assert not is_all_zeros(values["x"])
    assert not is_all_zeros(values["z"])  # an initializer a caller can override


def test_zero_constants_are_zeros_and_others_are_not() -> None:
    values = _values([], constants={"z": ZEROS, "o": ONES, "s": SOME_ZERO})
    assert is_all_zeros(values["z"])
    assert not is_all_zeros(values["o"])
    assert not is_all_zeros(values["s"])  # every element, not any


@pytest.mark.parametrize(("fill", "zeros"), [(None, True), (0.0, True), (2.0, False)])
def test_constant_of_shape_is_zeros_by_its_fill(fill: float | None, zeros: bool) -> None:
    attrs = {} if fill is None else {"value": helper.make_tensor("v", FLOAT, [1], [fill])}
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"], **attrs)
    values = _values([node], constants={"shape": np.array([2, 3], np.int64)})
    assert is_all_zeros(values["y"]) is zeros


def test_zero_preserving_ops_follow_their_data_input() -> None:
    nodes = [
        helper.make_node("Relu", ["z"], ["rz"]),
        helper.make_node("Relu", ["o"], ["ro"]),
        helper.make_node("Reshape", ["z", "shape"], ["reshaped"]),
        helper.make_node("Reshape", ["o", "zeros_shape"], ["reshaped_ones"]),
    ]
    constants = {
        "z": ZEROS,
        "o": ONES,
        "shape": np.array([3, 2], np.int64),
        "zeros_shape": np.zeros(2, np.int64),  # zeros in a shape input do not make zeros
    }
    values = _values(nodes, constants=constants)
    assert is_all_zeros(values["rz"]) and is_all_zeros(values["reshaped"])
    assert not is_all_zeros(values["ro"]) and not is_all_zeros(values["reshaped_ones"])


def test_an_op_of_another_domain_is_not_zeros() -> None:
    node = helper.make_node("Relu", ["z"], ["y"], domain="com.example")
    values = _values([node], constants={"z": ZEROS})
    assert not is_all_zeros(values["y"])
    assert not is_finite(values["y"])


def test_an_unknown_op_is_not_zeros() -> None:
    node = helper.make_node("Add", ["z", "z"], ["y"])
    values = _values([node], constants={"z": ZEROS})
    assert not is_all_zeros(values["y"])


def test_concat_is_zeros_only_when_every_part_is() -> None:
    nodes = [
        helper.make_node("Concat", ["z", "z"], ["both"], axis=0),
        helper.make_node("Concat", ["z", "o"], ["mixed"], axis=0),
        helper.make_node("Concat", ["o", "z"], ["mixed2"], axis=0),
    ]
    values = _values(nodes, constants={"z": ZEROS, "o": ONES})
    assert is_all_zeros(values["both"])
    assert not is_all_zeros(values["mixed"]) and not is_all_zeros(values["mixed2"])


def test_mul_by_zeros_is_zeros_only_for_a_finite_factor() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Cast", ["s"], ["finite"], to=FLOAT),
        helper.make_node("Mul", ["z", "finite"], ["zf"]),
        helper.make_node("Mul", ["finite", "z"], ["fz"]),
        helper.make_node("Mul", ["z", "x"], ["zx"]),
        helper.make_node("Mul", ["x", "z"], ["xz"]),
        helper.make_node("Mul", ["o", "finite"], ["of"]),
        helper.make_node("Mul", ["finite", "o"], ["fo"]),
    ]
    values = _values(nodes, {"x": FLOAT}, {"z": ZEROS, "o": ONES})
    assert is_all_zeros(values["zf"]) and is_all_zeros(values["fz"])
    for name in ("zx", "xz", "of", "fo"):
        assert not is_all_zeros(values[name]), name


def test_dequantize_linear_is_zeros_where_x_equals_its_zero_point() -> None:
    q = np.array([3, 3], np.uint8)
    nodes = [
        helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["equal"]),
        helper.make_node("DequantizeLinear", ["q", "scale", "zp0"], ["differs"]),
        helper.make_node("DequantizeLinear", ["q0", "scale"], ["no_zp_zero"]),
        helper.make_node("DequantizeLinear", ["q", "scale"], ["no_zp_nonzero"]),
        helper.make_node("DequantizeLinear", ["q", "scale", "zp_input"], ["zp_fed"]),
        helper.make_node("DequantizeLinear", ["q_input", "scale", "zp"], ["x_fed"]),
    ]
    constants = {
        "q": q,
        "q0": np.zeros(2, np.uint8),
        "scale": np.array(0.5, np.float32),
        "zp": np.array(3, np.uint8),
        "zp0": np.array(0, np.uint8),
    }
    values = _values(
        nodes, {"zp_input": TensorProto.UINT8, "q_input": TensorProto.UINT8}, constants
    )
    assert is_all_zeros(values["equal"])
    assert is_all_zeros(values["no_zp_zero"])
    for name in ("differs", "no_zp_nonzero", "zp_fed", "x_fed"):
        assert not is_all_zeros(values[name]), name


def test_dequantize_linear_by_a_scale_that_may_be_inf_is_not_zeros() -> None:
    """(x - zero_point) * scale with x == zero_point is 0 * scale: NaN for an inf scale."""
    nodes = [
        helper.make_node("DequantizeLinear", ["q", "scale_input", "zp"], ["fed"]),
        helper.make_node("DequantizeLinear", ["q", "inf", "zp"], ["infinite"]),
        helper.make_node("DequantizeLinear", ["q0", "scale_input"], ["fed_no_zp"]),
        helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["finite"]),
    ]
    constants = {
        "q": np.array([3, 3], np.uint8),
        "q0": np.zeros(2, np.uint8),
        "zp": np.array(3, np.uint8),
        "scale": np.array(0.5, np.float32),
        "inf": np.array(np.inf, np.float32),
    }
    values = _values(nodes, {"scale_input": FLOAT}, constants)
    assert is_all_zeros(values["finite"])
    for name in ("fed", "infinite", "fed_no_zp"):
        assert not is_all_zeros(values[name]), name


@pytest.mark.parametrize(("op", "attrs"), CHAIN_OPS, ids=[op for op, _ in CHAIN_OPS])
def test_zeros_are_followed_through_sixteen_ops_and_no_more(op: str, attrs: dict) -> None:
    values = _values(_chain(op, 17, "z", **attrs), constants={"z": ZEROS})
    assert is_all_zeros(values["c15"])  # the constant is 16 producers up
    assert not is_all_zeros(values["c16"])  # 17: past the depth limit, not proven


# is_finite ---------------------------------------------------------------------------


def test_graph_inputs_are_finite_only_when_integer() -> None:
    values = _values([], {"f": FLOAT, "i": INT64, "b": TensorProto.BOOL})
    assert not is_finite(None)
    assert not is_finite(values["f"])
    assert is_finite(values["i"]) and is_finite(values["b"])


def test_constants_are_finite_by_their_elements() -> None:
    constants = {
        "ok": ONES,
        "inf": np.array([1.0, np.inf], np.float32),
        "nan": np.array([np.nan, 1.0], np.float32),
        "int": np.array([1, 2], np.int64),
    }
    values = _values([], constants=constants)
    assert is_finite(values["ok"]) and is_finite(values["int"])
    assert not is_finite(values["inf"]) and not is_finite(values["nan"])


def test_integer_outputs_and_integer_casts_are_finite() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Cast", ["x"], ["to_int"], to=INT64),
        helper.make_node("Cast", ["x"], ["to_float"], to=FLOAT),
        helper.make_node("Cast", ["shape"], ["int_to_float"], to=FLOAT),
    ]
    values = _values(nodes, {"x": FLOAT})
    assert is_finite(values["shape"]) and is_finite(values["to_int"])
    assert is_finite(values["int_to_float"])
    assert not is_finite(values["to_float"])


def test_a_cast_without_to_is_not_finite_and_does_not_raise() -> None:
    """``to`` is required; a model that lacks it proves nothing (no exception either)."""
    values = _values([helper.make_node("Cast", ["x"], ["y"])], {"x": FLOAT})
    assert not is_finite(values["y"])


@pytest.mark.parametrize(("fill", "finite"), [(None, True), (1.5, True), (np.inf, False)])
def test_constant_of_shape_is_finite_by_its_fill(fill: float | None, finite: bool) -> None:
    attrs = {} if fill is None else {"value": helper.make_tensor("v", FLOAT, [1], [fill])}
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"], **attrs)
    values = _values([node], constants={"shape": np.array([2], np.int64)})
    assert is_finite(values["y"]) is finite


def test_finite_preserving_ops_and_concat_follow_their_inputs() -> None:
    nodes = [
        helper.make_node("Tanh", ["o"], ["tanh_const"]),
        helper.make_node("Tanh", ["x"], ["tanh_input"]),
        helper.make_node("Concat", ["o", "o"], ["concat_const"], axis=0),
        helper.make_node("Concat", ["o", "x"], ["concat_input"], axis=0),
        helper.make_node("Add", ["o", "o"], ["add"]),
    ]
    values = _values(nodes, {"x": FLOAT}, {"o": ONES})
    assert is_finite(values["tanh_const"]) and is_finite(values["concat_const"])
    for name in ("tanh_input", "concat_input", "add"):
        assert not is_finite(values[name]), name


@pytest.mark.parametrize(("op", "attrs"), CHAIN_OPS, ids=[op for op, _ in CHAIN_OPS])
def test_finiteness_is_followed_through_sixteen_ops_and_no_more(op: str, attrs: dict) -> None:
    values = _values(_chain(op, 17, "o", **attrs), constants={"o": ONES})
    assert is_finite(values["c15"])
    assert not is_finite(values["c16"])


def test_dequantize_linear_counts_toward_the_depth_limit() -> None:
    """DequantizeLinear without a zero point is one more producer, like any other."""
    q = {"q": np.zeros(2, np.int8), "scale": np.array(0.5, np.float32)}
    within = [
        *_chain("Identity", 15, "q"),
        helper.make_node("DequantizeLinear", ["c14", "scale"], ["y"]),
    ]
    beyond = [
        *_chain("Identity", 16, "q"),
        helper.make_node("DequantizeLinear", ["c15", "scale"], ["y"]),
    ]
    assert is_all_zeros(_values(within, constants=q)["y"])  # the constant is 16 producers up
    assert not is_all_zeros(_values(beyond, constants=q)["y"])  # 17


@pytest.mark.parametrize("zeros_first", [True, False], ids=["zeros*finite", "finite*zeros"])
@pytest.mark.parametrize("long_side", ["zeros", "finite"])
def test_mul_counts_toward_the_depth_limit_on_both_sides(zeros_first: bool, long_side: str) -> None:
    """Mul is one more producer for either factor: 15 ops up from it still count, 16 not."""
    for length, proven in [(15, True), (16, False)]:
        chain = _chain("Identity", length, "z" if long_side == "zeros" else "o")
        end = f"c{length - 1}"
        zeros, finite = (end, "o") if long_side == "zeros" else ("z", end)
        factors = [zeros, finite] if zeros_first else [finite, zeros]
        nodes = [*chain, helper.make_node("Mul", factors, ["y"])]
        values = _values(nodes, constants={"z": ZEROS, "o": ONES})
        assert is_all_zeros(values["y"]) is proven, length


def test_a_dequantized_zero_scale_counts_toward_the_depth_limit() -> None:
    """The scale's finiteness is proven within the same 16 producers as the zeros: a
    scale 15 Relu up (16 from the DequantizeLinear) is proven, 16 up is not."""
    nodes = _chain("Relu", 16, "scale")
    nodes += [
        helper.make_node("DequantizeLinear", ["q", "c14", "zp"], ["within"]),
        helper.make_node("DequantizeLinear", ["q", "c15", "zp"], ["beyond"]),
    ]
    constants = {
        "q": np.array([3, 3], np.uint8),
        "zp": np.array(3, np.uint8),
        "scale": np.array(0.5, np.float32),
    }
    values = _values(nodes, constants=constants)
    assert is_all_zeros(values["within"])
    assert not is_all_zeros(values["beyond"])

"""What the shape prover proves, exactly: the sizes, elements and unknowns of small graphs.

Written from mutation testing (docs/mutation.md). ``test_shape_prover.py`` checks that
every fact the prover states holds at run time (soundness); these pin down that it
states them (a prover that answered "unknown" everywhere would pass those), and where
it must not.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules.shape import Dim, ShapeProver
from rnn_rewrite_rules.shape import prover as prover_module
from rnn_rewrite_rules.shape.fact import MAX_ELEMENTS

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _graph(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto] = (),  # type: ignore[assignment]
    constants: dict[str, np.ndarray] | None = None,
    outputs: tuple[str, ...] = ("out",),
) -> dict[str, ir.Value]:
    """The model's values by name (inputs, initializers, node outputs)."""
    graph = helper.make_graph(
        nodes,
        "g",
        list(inputs),
        [helper.make_empty_tensor_value_info(name) for name in outputs],
        [numpy_helper.from_array(a, n) for n, a in (constants or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    ir_graph = ir.serde.deserialize_model(model).graph
    values = {v.name: v for v in ir_graph.inputs}
    values.update(ir_graph.initializers)
    values.update({v.name: v for node in ir_graph for v in node.outputs})
    return values


def _c(*sizes: int) -> tuple[Dim, ...]:
    return tuple(Dim.const(s) for s in sizes)


def test_declared_input_sizes_and_symbols() -> None:
    v = _graph([], [helper.make_tensor_value_info("x", FLOAT, ["seq", 4])])
    x, prover = v["x"], ShapeProver(v["x"].graph)
    assert prover.dims(x) == (Dim.sym(x, 0), Dim.const(4))
    assert prover.rank(x) == 2
    assert prover.dim(x, -1) == Dim.const(4) and prover.dim(x, -2) == Dim.sym(x, 0)
    assert prover.dim(x, 1) == Dim.const(4) and prover.dim(x, 0) == Dim.sym(x, 0)
    assert prover.dim(x, 2) is None and prover.dim(x, -3) is None
    assert prover.elements(x) is None and prover.vector(x) is None and prover.ints(x) is None


def test_input_without_a_shape_has_no_rank() -> None:
    v = _graph([], [helper.make_tensor_value_info("x", FLOAT, None)])
    prover = ShapeProver()
    assert prover.dims(v["x"]) is None and prover.rank(v["x"]) is None
    assert prover.dim(v["x"], 0) is None
    assert prover.fact(None).dims is None and prover.dims(None) is None


def test_integer_constants_carry_their_elements() -> None:
    constants = {
        "vec": np.array([2, 0, 5], np.int64),
        "scalar": np.array(7, np.int64),
        "flags": np.array([True, False]),
        "floats": np.array([1.5, 2.0], np.float32),
        "matrix": np.zeros((2, 2), np.int64),
        "largest": np.arange(MAX_ELEMENTS, dtype=np.int64),
        "too_large": np.arange(MAX_ELEMENTS + 1, dtype=np.int64),
    }
    v, prover = _graph([], constants=constants), ShapeProver()
    assert prover.dims(v["vec"]) == _c(3)
    assert prover.elements(v["vec"]) == _c(2, 0, 5) == prover.vector(v["vec"])
    assert prover.ints(v["vec"]) == [2, 0, 5]
    assert prover.dims(v["scalar"]) == ()
    assert prover.elements(v["scalar"]) == _c(7) and prover.ints(v["scalar"]) == [7]
    assert prover.vector(v["scalar"]) is None  # rank 0: not a Reshape target
    assert prover.elements(v["flags"]) == _c(1, 0)
    assert prover.dims(v["floats"]) == _c(2) and prover.elements(v["floats"]) is None
    assert prover.dims(v["matrix"]) == _c(2, 2) and prover.elements(v["matrix"]) is None
    assert prover.ints(v["largest"]) == list(range(MAX_ELEMENTS))
    assert prover.dims(v["too_large"]) == _c(MAX_ELEMENTS + 1)
    assert prover.elements(v["too_large"]) is None


def test_constant_node_carries_its_elements() -> None:
    node = helper.make_node("Constant", [], ["out"], value_ints=[4, -1])
    v = _graph([node])
    assert ShapeProver().fact(v["out"]).elements == _c(4, -1)


def test_an_initializer_that_is_also_an_input_is_only_its_declared_shape() -> None:
    """The caller may feed another value: its content is not a fact, its shape is."""
    x = helper.make_tensor_value_info("x", INT64, [3])
    v = _graph([], [x], constants={"x": np.array([1, 2, 3], np.int64)})
    prover = ShapeProver(v["x"].graph)
    assert prover.dims(v["x"]) == _c(3) and prover.elements(v["x"]) is None


def test_unknown_ops_and_outputs_past_the_transfer_are_unknown() -> None:
    x = helper.make_tensor_value_info("x", FLOAT, [2, 3])
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"]),  # no transfer function: ONNX's own
        helper.make_node("Relu", ["x"], ["custom"], domain="my.domain"),
        helper.make_node("Dropout", ["x"], ["out", "mask"]),  # the transfer gives output 0
    ]
    v = _graph(nodes, [x])
    prover = ShapeProver(v["x"].graph)
    assert prover.dims(v["nz"]) == (Dim.const(2), Dim.sym(v["nz"], 1))  # the count: unknown
    assert prover.dims(v["custom"]) is None  # no schema
    assert prover.dims(v["out"]) == _c(2, 3)
    assert prover.dims(v["mask"]) is None


def test_an_unproven_size_is_named_by_the_output_axis() -> None:
    a = helper.make_tensor_value_info("a", FLOAT, ["n", 3])
    b = helper.make_tensor_value_info("b", FLOAT, ["m", 3])
    nodes = [helper.make_node("Add", ["a", "b"], ["out"]), helper.make_node("Relu", ["out"], ["r"])]
    v = _graph(nodes, [a, b])
    prover = ShapeProver(v["a"].graph)
    out = v["out"]
    assert prover.dims(out) == (Dim.sym(out, 0), Dim.const(3))
    assert prover.dims(v["r"]) == (Dim.sym(out, 0), Dim.const(3))  # the same size downstream


def test_shape_elements_survive_the_anchoring_of_an_unknown_size() -> None:
    """Reshape(Shape(x), [n // 2]): the target's element is unknown, so the output's length
    is named by its own axis; its elements are still x's sizes."""
    x = helper.make_tensor_value_info("x", FLOAT, ["seq", 4])
    y = helper.make_tensor_value_info("y", FLOAT, ["n"])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Shape", ["y"], ["n"]),
        helper.make_node("Div", ["n", "two"], ["target"]),
        helper.make_node("Reshape", ["s", "target"], ["out"]),
    ]
    v = _graph(nodes, [x, y], {"two": np.array([2], np.int64)})
    prover = ShapeProver(v["x"].graph)
    assert prover.elements(v["target"]) == (None,)
    fact = prover.fact(v["out"])
    assert fact.dims == (Dim.sym(v["out"], 0),)
    assert fact.elements == (Dim.sym(v["x"], 0), Dim.const(4))


def _if(cond: str, then_shape: list, else_shape: list | None) -> list[onnx.NodeProto]:
    def branch(name: str, shape: list) -> onnx.GraphProto:
        const = helper.make_node(
            "Constant", [], [f"{name}_v"], value_ints=shape
        )  # an int vector: its elements are facts
        return helper.make_graph(
            [const], name, [], [helper.make_empty_tensor_value_info(f"{name}_v")]
        )

    attrs = {"then_branch": branch("then", then_shape)}
    if else_shape is not None:
        attrs["else_branch"] = branch("else", else_shape)
    return [helper.make_node("If", [cond], ["out"], **attrs)]


def test_if_with_a_proven_condition_takes_its_branch() -> None:
    for cond, expected in ((True, _c(1, 2)), (False, _c(1, 3))):
        v = _graph(_if("c", [1, 2], [1, 3]), constants={"c": np.array([cond])})
        fact = ShapeProver().fact(v["out"])
        assert fact.dims == _c(2) and fact.elements == expected


def test_if_with_an_unknown_condition_keeps_what_both_branches_agree_on() -> None:
    c = helper.make_tensor_value_info("c", BOOL, [])
    v = _graph(_if("c", [1, 2], [1, 3]), [c])
    fact = ShapeProver().fact(v["out"])
    assert fact.dims == _c(2) and fact.elements == (Dim.const(1), None)


def test_if_condition_of_two_elements_is_not_a_proven_branch() -> None:
    v = _graph(_if("c", [1, 2], [1, 3]), constants={"c": np.array([True, True])})
    assert ShapeProver().fact(v["out"]).elements == (Dim.const(1), None)


def test_if_branches_of_other_ranks_or_lengths_agree_on_nothing_more() -> None:
    c = helper.make_tensor_value_info("c", BOOL, [])
    v = _graph(_if("c", [1, 2], [1, 2, 3]), [c])
    fact = ShapeProver().fact(v["out"])
    assert fact.dims == (Dim.sym(v["out"], 0),) and fact.elements is None


def test_if_branches_of_other_ranks_agree_on_no_rank() -> None:
    c = helper.make_tensor_value_info("c", BOOL, [])
    then_branch = helper.make_graph(
        [helper.make_node("Constant", [], ["t"], value_ints=[1, 2])],
        "then",
        [],
        [helper.make_empty_tensor_value_info("t")],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Constant", [], ["e"], value_int=1)],
        "else",
        [],
        [helper.make_empty_tensor_value_info("e")],
    )
    for then, other in ((then_branch, else_branch), (else_branch, then_branch)):
        node = helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other)
        assert ShapeProver().fact(_graph([node], [c])["out"]).dims is None


def test_if_without_an_else_branch_is_unknown() -> None:
    v = _graph(_if("c", [1, 2], None), constants={"c": np.array([True])})
    assert ShapeProver().fact(v["out"]).dims is None


def _identity_chain(length: int) -> list[ir.Value]:
    value = ir.Value(name="x", shape=ir.Shape([5]), type=ir.TensorType(ir.DataType.FLOAT))
    graph = ir.Graph([value], [], nodes=[], name="g")
    chain = [value]
    for _ in range(length):
        node = ir.Node("", "Identity", [chain[-1]])
        graph.append(node)
        chain.append(node.outputs[0])
    return chain


def test_a_query_visits_at_most_max_visits_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prover_module, "_MAX_VISITS", 5)
    short = _identity_chain(5)
    assert ShapeProver(short[0].graph).dims(short[-1]) == _c(5)
    chain = _identity_chain(6)
    prover = ShapeProver(chain[0].graph)
    assert prover.dims(chain[-1]) is None
    assert prover.fact(chain[1]).dims is None  # the value past the bound: unknown, not None
    assert prover.dims(chain[0]) == _c(5)
    # past the bound the query goes on: Concat(chain end, x) still has x's rank
    concat = ir.Node("", "Concat", [chain[-1], chain[0]], [ir.AttrInt64("axis", 0)])
    chain[-1].producer().graph.append(concat)
    assert ShapeProver(chain[0].graph).rank(concat.outputs[0]) == 1


def test_an_absent_optional_input_is_absent_not_unknown() -> None:
    """ReduceSum(x, ""): no axes input, so every axis is reduced (an unknown axes input
    would leave the sizes unknown)."""
    x = helper.make_tensor_value_info("x", FLOAT, [2, 3])
    v = _graph([helper.make_node("ReduceSum", ["x", ""], ["out"])], [x])
    assert ShapeProver(v["x"].graph).dims(v["out"]) == _c(1, 1)


def test_rnn_sizes_from_attributes_and_weights() -> None:
    constants = {
        "w": np.zeros((1, 12, 2), np.float32),
        "r": np.zeros((1, 12, 3), np.float32),
        "w2": np.zeros((2, 12, 2), np.float32),
    }
    nodes = [
        helper.make_node("LSTM", ["x", "w", "r"], ["y0"]),
        helper.make_node("LSTM", ["x", "w", "r"], ["y1"], hidden_size=3, layout=1),
        helper.make_node("LSTM", ["x", "w2", "r"], ["y2"], direction="bidirectional"),
        helper.make_node("LSTM", ["x", "w", "r"], ["y3"], hidden_size=4),
        helper.make_node("LSTM", ["x", "w", "r"], ["y4"], direction="sideways"),
    ]
    x = helper.make_tensor_value_info("x", FLOAT, ["seq", 2, 2])
    v = _graph(nodes, [x], constants)
    prover = ShapeProver(v["x"].graph)

    def sizes(name: str):
        return prover.rnn_sizes(v[name].producer())

    assert sizes("y0") == (1, 3, 0)
    assert sizes("y1") == (1, 3, 1)
    assert sizes("y2") == "direction 'bidirectional' disagrees with a weight of 1 directions"
    assert sizes("y3") == "hidden_size=4 disagrees with R's hidden size 3"
    assert sizes("y4") == "unknown direction 'sideways'"
    assert prover.dims(v["y0"]) == (Dim.sym(v["x"], 0), Dim.const(1), Dim.const(2), Dim.const(3))


def test_rnn_sizes_read_the_directions_of_a_weight_of_unknown_gates() -> None:
    """W declared [2, g, 2] (its gate axis unknown): still two directions, which a forward
    node disagrees with."""
    x = helper.make_tensor_value_info("x", FLOAT, ["seq", 2, 2])
    w = helper.make_tensor_value_info("w", FLOAT, [2, "g", 2])
    node = helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=3)
    v = _graph([node], [x, w], {"r": np.zeros((2, 12, 3), np.float32)})
    reason = ShapeProver().rnn_sizes(v["y"].producer())
    assert reason == "direction 'forward' disagrees with a weight of 2 directions"


def test_a_hidden_size_neither_given_nor_proven_is_refused() -> None:
    """No ``hidden_size`` attribute, and R declared [1, g, h]: nothing fixes H."""
    x = helper.make_tensor_value_info("x", FLOAT, ["seq", 2, 2])
    w = helper.make_tensor_value_info("w", FLOAT, [1, "g", 2])
    r = helper.make_tensor_value_info("r", FLOAT, [1, "g", "h"])
    node = helper.make_node("LSTM", ["x", "w", "r"], ["y"])
    v = _graph([node], [x, w, r], {})
    reason = ShapeProver().rnn_sizes(v["y"].producer())
    assert reason == "hidden_size is not static (no attribute, and R's size is not proven)"


def test_a_hidden_size_of_zero_is_refused() -> None:
    x = helper.make_tensor_value_info("x", FLOAT, ["seq", 2, 2])
    constants = {"w": np.zeros((1, 0, 2), np.float32), "r": np.zeros((1, 0, 0), np.float32)}
    node = helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=0)
    v = _graph([node], [x], constants)
    reason = ShapeProver().rnn_sizes(v["y"].producer())
    assert reason == "hidden_size=0 is not positive"


def test_zeros_of_a_possibly_negative_length_are_unknown_not_an_error() -> None:
    """ConstantOfShape(Shape(x)[:1] - 1): seq - 1 may be negative, so its size is not
    proven (this raised AttributeError before)."""
    x = helper.make_tensor_value_info("x", FLOAT, ["seq", 2])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], end=1),
        helper.make_node("Sub", ["s", "one"], ["n"]),
        helper.make_node("ConstantOfShape", ["n"], ["out"]),
    ]
    v = _graph(nodes, [x], {"one": np.array([1], np.int64)})
    prover = ShapeProver(v["x"].graph)
    assert prover.elements(v["n"]) == (Dim.sym(v["x"], 0) - 1,)
    fact = prover.fact(v["out"])
    assert fact.dims == (Dim.sym(v["out"], 0),) and fact.elements is None


@pytest.mark.parametrize(
    "value", [np.array([3], np.int64), np.array(3, np.int64)], ids=["1-D", "0-D"]
)
def test_constant_of_shape_reads_a_one_element_value_of_either_rank(value) -> None:
    """ConstantOfShape([2]) filled with 3: its elements are proven from a 1-D value (the
    spec's form) and read the same, without an error, from a 0-D one (ONNX Runtime
    rejects that model; the prover must not crash on it)."""
    node = helper.make_node("ConstantOfShape", ["n"], ["out"], value=numpy_helper.from_array(value))
    v = _graph([node], [], {"n": np.array([2], np.int64)})
    assert ShapeProver().elements(v["out"]) == _c(3, 3)


def _if_of_x_or_zeros(rows: int) -> onnx.NodeProto:
    """``If(c)``: ``Identity(x)`` (``x`` a graph input ``[b, 3]``), else zeros ``[rows, 3]``."""
    then_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])],
        "then",
        [],
        [helper.make_empty_tensor_value_info("t")],
    )
    zeros = numpy_helper.from_array(np.zeros((rows, 3), np.float32))
    else_branch = helper.make_graph(
        [helper.make_node("Constant", [], ["e"], value=zeros)],
        "else",
        [],
        [helper.make_empty_tensor_value_info("e")],
    )
    return helper.make_node("If", ["c"], ["out"], then_branch=then_branch, else_branch=else_branch)


def test_branch_dims_say_what_each_branch_of_an_if_gives() -> None:
    x = helper.make_tensor_value_info("x", FLOAT, ["b", 3])
    c = helper.make_tensor_value_info("c", BOOL, [])
    v = _graph([_if_of_x_or_zeros(5)], [x, c])
    prover = ShapeProver(v["x"].graph)
    # the branches disagree on axis 0: the If's own symbol, each branch's size known apart
    assert prover.dims(v["out"]) == (Dim.sym(v["out"], 0), Dim.const(3))
    assert prover.branch_dims(v["out"]) == [(Dim.sym(v["x"], 0), Dim.const(3)), _c(5, 3)]
    assert prover.branch_dims(v["x"]) == []  # not an If's output


def test_a_guarded_batch_is_a_graph_input_size_where_a_branch_gives_one() -> None:
    """The zero-step guard's batch check (loop_scan.zero_step): ONNX's inference of an If
    keeps a number only where both branches infer it, so an If axis one branch gives as a
    graph input's symbolic size holds no number, nor does one the branches give as two
    numbers; one number both give may be known, and is checked against the declaration."""
    from rnn_rewrite_rules.rules.loop_scan.zero_step import _batch_reason

    def why(x_batch: int | str, rows: int, declared: int | None) -> str | None:
        x = helper.make_tensor_value_info("x", FLOAT, [x_batch, 3])
        c = helper.make_tensor_value_info("c", BOOL, [])
        v = _graph([_if_of_x_or_zeros(rows)], [x, c])
        prover = ShapeProver(v["x"].graph)
        model = ir.Model(v["x"].graph, ir_version=10)
        return _batch_reason(prover.dim(v["out"], 0), declared, model, prover)

    assert why("b", 5, None) is None
    assert why(2, 5, None) is None  # 2 and 5: inference of the If knows no number
    assert why(5, 5, 5) is None  # both 5, declared 5
    # near misses: both branches give 5, which the declaration leaves open or contradicts
    assert why(5, 5, None) == "X's batch is the number 5, which inference fills in"
    assert why(5, 5, 4) == "X's batch is the number 5, not the declared 4"

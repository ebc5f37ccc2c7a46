"""fold_if: an If whose condition the shape prover decides becomes the branch that runs;
near misses, each refused with its reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import fold_if
from tests.reasons import refusal_reasons
from tests.support import apply, op_counts

RULES = fold_if.FAMILY.rules


def _tensor(name: str, rank: int = 3) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * rank)


def _branch(name: str, nodes, outputs, initializers=()) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [_tensor(o) for o in outputs], list(initializers))


def _if_model(
    *,
    rank: int = 3,
    then_branch: onnx.GraphProto | None = None,
    else_branch: onnx.GraphProto | None = None,
    omit_else: bool = False,
    outputs: int = 1,
) -> onnx.ModelProto:
    """``If(Equal(Size(Shape(x)), 3), then, else)`` over ``x`` declared of ``rank``: true
    for rank 3 (then: Identity(x)), false otherwise (else: Relu(x))."""
    names = [f"y{i}" for i in range(outputs)]
    then_branch = then_branch or _branch(
        "then",
        [helper.make_node("Identity", ["x"], [f"t{i}"]) for i in range(outputs)],
        [f"t{i}" for i in range(outputs)],
    )
    else_branch = else_branch or _branch(
        "else",
        [helper.make_node("Relu", ["x"], [f"e{i}"]) for i in range(outputs)],
        [f"e{i}" for i in range(outputs)],
    )
    attrs = {"then_branch": then_branch}
    if not omit_else:
        attrs["else_branch"] = else_branch
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Size", ["shape"], ["rank"]),
        helper.make_node("Equal", ["rank", "three"], ["cond"]),
        helper.make_node("If", ["cond"], names, name="check_rank", **attrs),
    ]
    graph = helper.make_graph(
        nodes,
        "rank_check",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", "c", "d"][:rank])],
        [_tensor(n, rank) for n in names],
        [numpy_helper.from_array(np.array(3, np.int64), "three")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("rank", [3, 2])
def test_a_proven_condition_runs_its_branch(rank: int) -> None:
    """Rank 3: the then branch (Identity: the If becomes x itself); rank 2: the else
    branch (Relu)."""
    model = _if_model(rank=rank)
    after, count = apply(RULES, model)
    assert count == 1 and op_counts(after)["If"] == 0
    assert op_counts(after)["Relu"] == (rank != 3)
    x = np.linspace(-1, 1, 2 * 3 * 4 if rank == 3 else 6).astype(np.float32)
    x = x.reshape((2, 3, 4) if rank == 3 else (2, 3))
    assert runtime.max_abs_diff(runtime.run(model, {"x": x}), runtime.run(after, {"x": x})) == 0


def _refusals(model: onnx.ModelProto) -> list[str]:
    """The reasons, but the rules for more outputs, which refuse a one-output If as such."""
    found = set(refusal_reasons(RULES, model))
    assert "If has 1 outputs" in found
    return sorted(found - {"If has 1 outputs"})


def test_a_runtime_condition_is_not_folded() -> None:
    model = _if_model()
    model.graph.node[-1].input[0] = "flag"  # If(flag), a graph input
    del model.graph.node[:3]  # the rank check, now unused
    model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    assert apply(RULES, model)[1] == 0
    assert _refusals(model) == [
        "the If condition is not provable from the graph (a runtime value or size)"
    ]


def test_a_branch_with_initializers_is_not_inlined() -> None:
    then = _branch(
        "then",
        [helper.make_node("Add", ["x", "bias"], ["t0"])],
        ["t0"],
        [numpy_helper.from_array(np.ones(1, np.float32), "bias")],
    )
    model = _if_model(then_branch=then)
    assert apply(RULES, model)[1] == 0
    assert _refusals(model) == ["the branch that runs has initializers"]


def test_a_branch_with_a_nested_subgraph_is_not_inlined() -> None:
    """The branch that runs holds an If of its own (on a runtime flag)."""
    inner = helper.make_node(
        "If",
        ["flag"],
        ["t0"],
        then_branch=_branch("inner_then", [helper.make_node("Neg", ["x"], ["n"])], ["n"]),
        else_branch=_branch("inner_else", [helper.make_node("Abs", ["x"], ["a"])], ["a"]),
    )
    model = _if_model(then_branch=_branch("then", [inner], ["t0"]))
    model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    assert apply(RULES, model)[1] == 0
    assert _refusals(model) == [
        "the If condition is not provable from the graph (a runtime value or size)",
        "the branch that runs has a nested subgraph",
    ]


def test_a_branch_of_another_output_count_is_not_inlined() -> None:
    then = _branch(
        "then",
        [helper.make_node("Identity", ["x"], ["t0"]), helper.make_node("Neg", ["x"], ["t1"])],
        ["t0", "t1"],
    )
    model = _if_model(then_branch=then)
    assert apply(RULES, model, check=False)[1] == 0
    assert _refusals(model) == ["the branch's outputs do not match the If's"]


def test_a_missing_branch_is_not_inlined() -> None:
    model = _if_model(rank=2, omit_else=True)  # the else branch runs, and is absent
    assert apply(RULES, model, check=False)[1] == 0
    assert _refusals(model) == ["the If has no such branch"]


# ---------------------------------------------------------------- what replaces the If's outputs


def _read_if_model(then_branch: onnx.GraphProto, *, outputs: int = 1) -> onnx.ModelProto:
    """``t = Relu(x)``, ``w`` an initializer; the If (proven true: rank 3) runs
    ``then_branch``; each If output ``o{i}`` is read by ``Neg`` into graph output ``y{i}``
    (the If's outputs are not the graph's)."""
    model = _if_model(then_branch=then_branch, outputs=outputs)
    graph = model.graph
    if_node = graph.node[-1]
    if_node.output[:] = [f"o{i}" for i in range(outputs)]
    graph.node.insert(0, helper.make_node("Relu", ["x"], ["t"], name="relu"))
    graph.node.extend(
        helper.make_node("Neg", [f"o{i}"], [f"y{i}"], name=f"neg{i}") for i in range(outputs)
    )
    graph.initializer.append(numpy_helper.from_array(np.full((1, 1, 1), 2.0, np.float32), "w"))
    return model


def _folded(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its If folded: no If left, the same outputs in ONNX Runtime."""
    after, count = apply(RULES, model)
    assert count == 1 and op_counts(after)["If"] == 0
    x = np.linspace(-1, 1, 24).astype(np.float32).reshape(2, 3, 4)
    assert runtime.max_abs_diff(runtime.run(model, {"x": x}), runtime.run(after, {"x": x})) == 0
    return after


def _producer(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    (node,) = [n for n in model.graph.node if name in n.output]
    return node


def _source(model: onnx.ModelProto, output: str = "y0") -> onnx.NodeProto:
    """The node whose output the Neg that computes ``output`` reads."""
    return _producer(model, _producer(model, output).input[0])


@pytest.mark.parametrize("domain", ["", "custom"])
def test_a_forwarded_outer_value_replaces_the_output(domain: str) -> None:
    """The branch only forwards ``t`` (``Identity(t)``): the If's reader reads ``t`` (the
    rewriter names it after the If's output). A custom domain's Identity is any op."""
    node = helper.make_node("Identity", ["t"], ["t0"], domain=domain)
    model = _read_if_model(_branch("then", [node], ["t0"]))
    if domain:
        model.opset_import.append(helper.make_opsetid(domain, 1))
        after, count = apply(RULES, model, check=False)
        assert count == 1 and _source(after).domain == domain
        return
    after = _folded(model)
    assert _source(after).op_type == "Relu"


@pytest.mark.parametrize("source", ["x", "w"])
def test_a_forwarded_graph_input_or_initializer_keeps_its_identity(source: str) -> None:
    """The rewriter names a replacement after the value it replaces: a graph input or an
    initializer must keep its own name, so the branch's Identity stays."""
    then = _branch("then", [helper.make_node("Identity", [source], ["t0"])], ["t0"])
    after = _folded(_read_if_model(then))
    forward = _source(after)
    assert forward.op_type == "Identity" and list(forward.input) == [source]


def test_a_branch_output_it_does_not_compute_is_refused() -> None:
    """A branch returning the outer ``t`` itself (invalid ONNX: the checker and ONNX
    Runtime reject it) is left as it is."""
    model = _read_if_model(helper.make_graph([], "then", [], [_tensor("t")]))
    assert apply(RULES, model, check=False)[1] == 0
    assert _refusals(model) == ["the branch's output 't' is not computed in it (invalid ONNX)"]


def test_a_computing_branch_is_inlined_without_identity() -> None:
    then = _branch("then", [helper.make_node("Abs", ["t"], ["t0"])], ["t0"])
    after = _folded(_read_if_model(then))
    assert _source(after).op_type == "Abs"


def test_two_outputs_are_both_replaced() -> None:
    then = _branch(
        "then",
        [helper.make_node("Abs", ["t"], ["t0"]), helper.make_node("Sqrt", ["t"], ["t1"])],
        ["t0", "t1"],
    )
    after = _folded(_read_if_model(then, outputs=2))
    assert _source(after).op_type == "Abs" and _source(after, "y1").op_type == "Sqrt"


# ---------------------------------------------- conditions the prover must not decide


def _condition_model(case: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``If(Equal(Size(Shape(v)), 0), Identity(x), Relu(x))`` (or ``Equal(v, n)``) where
    ``v`` reads an optional operand fed at run time, or wraps in a narrowing Cast: read as
    absent (or unwrapped), the condition is true; at run time it is false."""
    nodes = {
        "Squeeze": [helper.make_node("Squeeze", ["ones", "k"], ["v"])],  # fed [0]: rank 1
        "Slice": [
            helper.make_node("Slice", ["ones", "zero", "one", "k"], ["sliced"]),  # fed [1]
            helper.make_node("Shape", ["sliced"], ["sliced_shape"]),
            helper.make_node("Gather", ["sliced_shape", "zero_scalar"], ["v"]),
        ],
        "Split": [
            helper.make_node("Split", ["six", "k"], ["part", "rest"]),  # fed [2, 4]
            helper.make_node("Shape", ["part"], ["part_shape"]),
            helper.make_node("Gather", ["part_shape", "zero_scalar"], ["v"]),
        ],
        "Cast": [
            helper.make_node("Shape", ["six"], ["six_shape"]),
            helper.make_node("Mul", ["six_shape", "big"], ["scaled"]),
            helper.make_node("Cast", ["scaled"], ["v32"], to=TensorProto.INT32),
            helper.make_node("Cast", ["v32"], ["v"], to=TensorProto.INT64),
        ],
    }[case]
    if case == "Squeeze":  # rank of v: 0 read as absent axes, 1 at run time
        nodes += [
            helper.make_node("Shape", ["v"], ["v_shape"]),
            helper.make_node("Size", ["v_shape"], ["v_rank"]),
            helper.make_node("Equal", ["v_rank", "zero_scalar"], ["cond"]),
        ]
    else:  # v read wrongly: 1, 3, 6 * 2**32; at run time 3, 2, 0
        expected = {"Slice": 1, "Split": 3, "Cast": 6 * 2**32}[case]
        nodes.append(helper.make_node("Equal", ["v", "expected"], ["cond"]))
    then = _branch("then", [helper.make_node("Identity", ["x"], ["t0"])], ["t0"])
    other = _branch("else", [helper.make_node("Relu", ["x"], ["e0"])], ["e0"])
    nodes.append(helper.make_node("If", ["cond"], ["y0"], then_branch=then, else_branch=other))
    k = {"Squeeze": [0], "Slice": [1], "Split": [2, 4], "Cast": [0]}[case]
    inits = [
        numpy_helper.from_array(
            np.ones((1, 1), np.float32) if case == "Squeeze" else np.ones((3, 4), np.float32),
            "ones",
        ),
        numpy_helper.from_array(np.ones(6, np.float32), "six"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array(0, np.int64), "zero_scalar"),
        numpy_helper.from_array(np.array([2**32], np.int64), "big"),
    ]
    if case != "Squeeze":
        inits.append(numpy_helper.from_array(np.array([expected], np.int64), "expected"))
    graph = helper.make_graph(
        nodes,
        "runtime_operand",
        [_tensor("x"), helper.make_tensor_value_info("k", TensorProto.INT64, [len(k)])],
        [_tensor("y0")],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    x = np.linspace(-1, 1, 24).astype(np.float32).reshape(2, 3, 4)
    return model, {"x": x, "k": np.array(k, np.int64)}


@pytest.mark.parametrize("case", ["Squeeze", "Slice", "Split", "Cast"])
def test_a_runtime_operand_or_a_wrapping_cast_decides_nothing(case: str) -> None:
    """Squeeze axes, Slice axes, Split sizes fed at run time are unknown, not absent; a
    narrowing Cast wraps. The If runs the else branch (Relu) at run time."""
    model, feeds = _condition_model(case)
    (expected,) = runtime.run(model, feeds)
    assert np.array_equal(expected, np.maximum(feeds["x"], 0))  # the else branch runs
    after, count = apply(RULES, model)
    assert count == 0 or np.array_equal(runtime.run(after, feeds)[0], expected)
    assert count == 0
    assert _refusals(model) == [
        "the If condition is not provable from the graph (a runtime value or size)"
    ]


def _same_as_reference(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    """``after`` computes in ONNX Runtime what ``before`` does in ``onnx.reference`` (ONNX
    Runtime 1.32 leaves the second output of a branch returning one value twice unset)."""
    from onnx.reference import ReferenceEvaluator

    x = np.linspace(-1, 1, 24).astype(np.float32).reshape(2, 3, 4)
    expected = ReferenceEvaluator(before).run(None, {"x": x})
    assert runtime.max_abs_diff(expected, runtime.run(after, {"x": x})) == 0


@pytest.mark.parametrize("op_type", ["Abs", "Identity"])
def test_one_branch_value_for_two_graph_outputs_keeps_both(op_type: str) -> None:
    """The branch that runs returns one value twice, for two graph outputs ``y0``, ``y1``:
    both stay graph outputs, with their names, in their order."""
    then = _branch("then", [helper.make_node(op_type, ["x"], ["t0"])], ["t0", "t0"])
    model = _if_model(then_branch=then, outputs=2)
    after, count = apply(RULES, model)
    assert count == 1 and op_counts(after)["If"] == 0
    assert [o.name for o in after.graph.output] == ["y0", "y1"]
    _same_as_reference(model, after)


def test_one_branch_value_for_two_if_outputs_is_read_by_both() -> None:
    """The same, the If's outputs read by nodes (not graph outputs)."""
    then = _branch("then", [helper.make_node("Abs", ["t"], ["t0"])], ["t0", "t0"])
    model = _read_if_model(then, outputs=2)
    after, count = apply(RULES, model)
    assert count == 1 and op_counts(after)["If"] == 0
    assert [o.name for o in after.graph.output] == ["y0", "y1"]
    _same_as_reference(model, after)


def _loop_body_rank_check() -> onnx.ModelProto:
    """``Loop`` (one trip) carrying ``x``; its body input ``v`` is declared of rank 3 and
    the body runs ``If(Equal(Size(Shape(v)), 3), Identity(v), Neg(v))``."""
    check_rank = helper.make_node(
        "If",
        ["is3"],
        ["picked"],
        then_branch=_branch("then", [helper.make_node("Identity", ["v"], ["t0"])], ["t0"]),
        else_branch=_branch("else", [helper.make_node("Neg", ["v"], ["e0"])], ["e0"]),
    )
    body = helper.make_graph(
        [
            helper.make_node("Shape", ["v"], ["s"]),
            helper.make_node("Size", ["s"], ["r"]),
            helper.make_node("Equal", ["r", "three"], ["is3"]),
            check_rank,
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, ["a", "b", "c"]),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _tensor("picked")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trip", "", "x"], ["y"], body=body)],
        "loop_rank_check",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["x0", "x1"])],
        [_tensor("y", 2)],
        [
            numpy_helper.from_array(np.array(1, np.int64), "trip"),
            numpy_helper.from_array(np.array(3, np.int64), "three"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def test_a_loop_body_input_declared_rank_decides_nothing() -> None:
    """ONNX Runtime does not check a body input against its declaration: fed rank 2, the
    body's rank check is false and ``Neg`` runs. The declared rank is not a fact."""
    model = _loop_body_rank_check()
    x = np.linspace(-1, 1, 6).astype(np.float32).reshape(2, 3)
    (expected,) = runtime.run(model, {"x": x})
    assert np.array_equal(expected, -x)
    after, count = apply(RULES, model)
    assert count == 0 or np.array_equal(runtime.run(after, {"x": x})[0], expected)
    assert count == 0
    assert _refusals(model) == [
        "the If condition is not provable from the graph (a runtime value or size)"
    ]

"""rules._graph: the names and the int64 constants rewrites emit, and same_value."""

from __future__ import annotations

import numpy as np
import onnx.parser
import onnx_ir as ir
import pytest
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet

from rnn_rewrite_rules.rules._graph import fresh_name, int64_constant, same_value


def _graph() -> ir.Graph:
    """An input ``x``, an initializer ``w``, a node output ``y``, and an If whose branch
    computes ``inner`` (subgraph names are taken too: ONNX forbids shadowing)."""
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[2] x, bool c) => (float[2] z) <float[2] w = {1.0, 2.0}> {
            y = Add (x, w)
            z = If (c) <
                then_branch = t () => (float[2] inner) { inner = Neg (y) },
                else_branch = e () => (float[2] other) { other = Abs (y) }
            >
        }
    """)
    return ir.serde.deserialize_model(model).graph


def test_a_free_name_is_kept() -> None:
    assert fresh_name(_graph(), "free") == "free"


def test_a_taken_name_gets_the_first_free_suffix() -> None:
    graph = _graph()
    for taken in ("x", "w", "y", "inner", "z"):
        assert fresh_name(graph, taken) == f"{taken}_1"


def test_suffixes_already_taken_are_skipped() -> None:
    graph = _graph()
    node = ir.node("Identity", [graph.inputs[0]])
    node.outputs[0].name = "y_1"
    graph.append(node)
    node = ir.node("Identity", [graph.inputs[0]])
    node.outputs[0].name = "y_2"
    graph.append(node)
    assert fresh_name(graph, "y") == "y_3"


class _ReshapeIdentity(RewriteRuleClassBase):
    """``Identity(x)`` -> ``Reshape(x, int64_constant([3, -1]))``: the helper in a real
    rewrite, as the rules call it (``as_node`` left at its default: an initializer)."""

    def pattern(self, op, x):
        return op.Identity(x)

    def check(self, context, x: ir.Value, **_) -> MatchResult:
        self._graph = context.graph_or_function
        return MatchResult()

    def rewrite(self, op, x: ir.Value):
        return op.Reshape(x, int64_constant(op, self._graph, [3, -1]))


_BASE = "rnn_rewrite_rules_3_m1"


def _reshaped(initializers: dict[str, tuple[object, bool]]) -> ir.Model:
    """``y = Identity(x)`` rewritten, over ``initializers`` (name -> (values, also a graph
    input)); int lists are int64, float lists float."""
    model = ir.serde.deserialize_model(
        onnx.parser.parse_model("""
            <ir_version: 8, opset_import: ["" : 18]>
            g (float[2, 3] x) => (float[3, 2] y) { y = Identity (x) }
        """)
    )
    for name, (values, is_input) in initializers.items():
        array = np.array(values, np.int64 if isinstance(values[0], int) else np.float32)
        value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
        model.graph.register_initializer(value)
        if is_input:
            model.graph.inputs.append(value)
    assert RewriteRuleSet([_ReshapeIdentity().rule()]).apply_to_model(model) == 1
    return model


def _target(model: ir.Model) -> str:
    (reshape,) = [n for n in model.graph if n.op_type == "Reshape"]
    assert reshape.inputs[1].is_initializer()  # not a Constant node
    return reshape.inputs[1].name


@pytest.mark.parametrize(
    ("initializers", "target"),
    [
        ({}, _BASE),  # new, named for its values ("-" read as "m")
        ({_BASE: ([3, -1], False)}, _BASE),  # an earlier rewrite's: reused
        ({_BASE: ([6], False), f"{_BASE}_1": ([3, -1], False)}, f"{_BASE}_1"),
        (
            {
                _BASE: ([3.0, -1.0], False),  # float, not int64
                f"{_BASE}_1": ([3, -1], True),  # overridable
                f"{_BASE}_2": ([3, -1], False),
            },
            f"{_BASE}_2",
        ),
        ({_BASE: ([6], False), f"{_BASE}_1": ([3, -1], True)}, f"{_BASE}_2"),  # new
    ],
)
def test_an_int64_initializer_is_reused_only_when_it_holds_the_values(
    initializers: dict, target: str
) -> None:
    model = _reshaped(initializers)
    assert _target(model) == target
    tensor = model.graph.initializers[target].const_value
    assert tensor.dtype == ir.DataType.INT64 and tensor.numpy().tolist() == [3, -1]
    assert len(model.graph.initializers) == len(initializers) + (target not in initializers)


# ---------------------------------------------------------------- same_value


def _values(body: str, inputs: str = "float[2] x, float[2] y") -> dict[str, ir.Value]:
    """Every named value of a graph ``body`` (initializers ``one``/``one_again`` = 1.0 and
    ``two`` = 2.0; ``fed`` = 1.0 is also a graph input, a caller can override it)."""
    model = onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : 18, "custom" : 1]>
        g ({inputs}, float fed) => (float[2] out)
        <float one = {{1.0}}, float one_again = {{1.0}}, float two = {{2.0}},
         float fed = {{1.0}}> {{
            {body}
            out = Identity (x)
        }}
    """)
    graph = ir.serde.deserialize_model(model).graph
    values = {v.name: v for v in graph.inputs}
    values.update(graph.initializers)
    values.update({o.name: o for node in graph for o in node.outputs})
    return values


@pytest.mark.parametrize(
    ("body", "a", "b"),
    [
        ("a = Mul (x, one)\n b = Mul (x, one)", "a", "b"),
        ("a = Mul (x, one)\n b = Mul (x, one_again)", "a", "b"),  # equal constants
        ("c = Cast <to = 10> (x)\n d = Cast <to = 10> (x)\n"
         "a = Abs (c)\n b = Abs (d)", "a", "b"),  # two levels
        ("s = Split <num_outputs = 2> (x)\n t = Split <num_outputs = 2> (x)\n"
         "a = Identity (s)\n b = Identity (t)", "a", "b"),
    ],
    ids=["one_constant", "equal_constants", "nested", "same_output_index"],
)  # fmt: skip
def test_one_computation_written_twice_is_the_same_value(body: str, a: str, b: str) -> None:
    values = _values(body)
    assert same_value(values[a], values[b])
    assert same_value(values[b], values[a])


@pytest.mark.parametrize(
    ("body", "a", "b"),
    [
        ("a = Mul (x, one)\n b = Mul (x, two)", "a", "b"),
        ("a = Mul (x, one)\n b = Mul (x, fed)", "a", "b"),  # an input can be fed
        ("a = Mul (x, one)\n b = Mul (y, one)", "a", "b"),
        ("a = Mul (x, one)\n b = Mul (one, x)", "a", "b"),  # operands in another order
        ("a = Cast <to = 10> (x)\n b = Cast <to = 11> (x)", "a", "b"),
        ("a = Mul (x, one)\n b = Add (x, one)", "a", "b"),
        ("a = RandomUniformLike (x)\n b = RandomUniformLike (x)", "a", "b"),
        ("a = Dropout (x)\n b = Dropout (x)", "a", "b"),
        ("a = custom.Op (x)\n b = custom.Op (x)", "a", "b"),
        ("a1, a2 = Split <num_outputs = 2> (x)\n b1, b2 = Split <num_outputs = 2> (x)",
         "a1", "b2"),
        ("a = Mul (x, one)", "a", "x"),
    ],
    ids=[
        "other_constant", "overridable_initializer", "other_input", "operand_order",
        "other_attribute", "other_op", "random", "dropout", "custom_domain",
        "other_output", "value_and_its_producer",
    ],
)  # fmt: skip
def test_different_computations_are_not_the_same_value(body: str, a: str, b: str) -> None:
    values = _values(body)
    assert not same_value(values[a], values[b])
    assert not same_value(values[b], values[a])


def test_same_value_looks_only_so_deep() -> None:
    chain = "\n".join(f"a{i + 1} = Neg (a{i})\n b{i + 1} = Neg (b{i})" for i in range(4))
    values = _values(f"a0 = Abs (x)\n b0 = Abs (x)\n{chain}")
    assert same_value(values["a4"], values["b4"], depth=5)
    assert not same_value(values["a4"], values["b4"], depth=4)


def test_none_is_no_value() -> None:
    values = _values("a = Abs (x)")
    assert not same_value(None, None)
    assert not same_value(values["a"], None)
    assert same_value(values["a"], values["a"])

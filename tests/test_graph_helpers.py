"""rules._graph: the names and the int64 constants rewrites emit."""

from __future__ import annotations

import numpy as np
import onnx.parser
import onnx_ir as ir
import pytest
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet

from rnn_rewrite_rules.rules._graph import fresh_name, int64_constant


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

"""rules._constants: the names and the int64 constants rewrites emit."""

from __future__ import annotations

import onnx.parser
import onnx_ir as ir

from rnn_rewrite_rules.rules._constants import fresh_name


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

"""The onnx-ir passes run after the rules (``rnn_rewrite_rules.passes``)."""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules.passes import RemoveDeadNodesPass, RemoveUnusedSubgraphInitializersPass

_MODEL = """
<ir_version: 8, opset_import: ["" : 18]>
agraph (bool flag, float[2] x) => (float[2] y)
<float[2] outer = {1.0, 2.0}>
{
  y = If (flag) <
    then_branch = g1 () => (float[2] a) <float[2] used = {3.0, 4.0}, float[2] dead = {5.0, 6.0}> {
      a = Add (used, outer)
    },
    else_branch = g2 () => (float[2] b) <float[2] kept = {7.0, 8.0}> {
      b = Identity (kept)
    }
  >
}
"""


def _branch_initializers(model: ir.Model) -> set[str]:
    return {name for g in model.graphs() if g is not model.graph for name in g.initializers}


def test_unused_subgraph_initializers_are_removed_and_the_rest_kept() -> None:
    model = ir.from_onnx_text(_MODEL)
    assert _branch_initializers(model) == {"used", "dead", "kept"}
    result = RemoveUnusedSubgraphInitializersPass()(model)
    assert result.modified
    assert _branch_initializers(model) == {"used", "kept"}
    assert set(model.graph.initializers) == {"outer"}  # the main graph is left alone
    assert not RemoveUnusedSubgraphInitializersPass()(model).modified  # idempotent


def test_dead_nodes_before_their_producer_are_all_removed() -> None:
    """A dead chain whose first reader sits before the producer it reads (the order a
    rewrite leaves): all of it goes, the live node stays."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    producer = ir.node("Abs", [x])
    reader = ir.node("Neg", [producer.outputs[0]])
    last = ir.node("Exp", [reader.outputs[0]])
    live = ir.node("Relu", [x])
    graph = ir.Graph([x], live.outputs, nodes=[reader, last, producer, live], name="g")
    model = ir.Model(graph, ir_version=8)
    assert RemoveDeadNodesPass()(model).modified
    assert [n.op_type for n in model.graph] == ["Relu"]
    assert not RemoveDeadNodesPass()(model).modified

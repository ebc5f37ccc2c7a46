"""The onnx-ir passes run after the rules (``rnn_rewrite_rules.passes``)."""

from __future__ import annotations

import onnx_ir as ir
import pytest

from rnn_rewrite_rules.passes import (
    RemoveDeadNodesPass,
    RemoveUnusedSubgraphInitializersPass,
    UniqueRewrittenNodeNamesPass,
)
from rnn_rewrite_rules.passes.unique_rewritten_node_names import model_nodes

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


_NAMED = """
<ir_version: 8, opset_import: ["" : 18]>
agraph (bool flag, float[2] x) => (float[2] y, float[2] z, float[2] w)
{
  z = Neg (x)
  w = Abs (x)
  y = If (flag) <
    then_branch = g1 () => (float[2] a) { a = Relu (x) },
    else_branch = g2 () => (float[2] b) { b = Sigmoid (x) }
  >
}
"""


def _nodes_named(names: list[str]) -> tuple[ir.Model, list[ir.Node]]:
    """``_NAMED`` with its nodes (Neg, Abs, If, Relu, Sigmoid) named ``names``."""
    model = ir.from_onnx_text(_NAMED)
    nodes = model_nodes(model)
    for node, name in zip(nodes, names, strict=True):
        node.name = name
    return model, nodes


@pytest.mark.parametrize("by_tag", [False, True], ids=["original_nodes", "onnxscript_tag"])
def test_emitted_nodes_get_unique_names_and_original_ones_keep_theirs(by_tag: bool) -> None:
    """The two branches' Relu and Sigmoid were emitted (each branch counts from 0), so was
    Abs (its name is taken); Neg and If are the model's own and share a name."""
    model, (neg, absolute, if_node, relu, sigmoid) = _nodes_named(
        ["n", "n_1", "n", "node_0", "node_0"]
    )
    emitted = [absolute, relu, sigmoid]
    if by_tag:
        for node in emitted:
            node.metadata_props["pkg.onnxscript.rewriter.rule_name"] = "SomeRule"
        result = UniqueRewrittenNodeNamesPass()(model)
    else:
        result = UniqueRewrittenNodeNamesPass([neg, if_node])(model)
    assert result.modified
    assert [n.name for n in (neg, if_node)] == ["n", "n"]
    assert [n.name for n in emitted] == ["n_1", "node_0", "node_0_1"]


def test_a_node_emitted_under_a_name_no_one_else_has_keeps_it() -> None:
    """A node re-emitted under its original name (the original is gone) keeps it."""
    model, nodes = _nodes_named(["neg", "abs", "if", "relu", "sigmoid"])
    result = UniqueRewrittenNodeNamesPass(nodes[:2])(model)
    assert not result.modified
    assert [n.name for n in model_nodes(model)] == ["neg", "abs", "if", "relu", "sigmoid"]


_OUTPUT_INITIALIZER = """
<ir_version: 8, opset_import: ["" : 18]>
agraph (float[2] x) => (float[2] y, float[2] w, float[2] z)
<float[2] w = {1.0, 2.0}>
{
  shape = Shape (x)
  rank = Size (shape)
  one = Constant <value = int64 {1}> ()
  cond = Equal (rank, one)
  y = If (cond) <
    then_branch = g1 () => (float[2] a) { a = Abs (x) },
    else_branch = g2 () => (float[2] b) { b = Neg (x) }
  >
  z = If (flag) <
    then_branch = g3 () => (float[2] c) <float[2] c = {3.0, 4.0}> { },
    else_branch = g4 () => (float[2] d) { d = Identity (x) }
  >
}
"""


def test_an_initializer_that_is_an_output_keeps_its_type() -> None:
    """A graph output must declare its type (the checker rejects one without): an
    initializer that is a graph output, of the main graph or a branch, keeps it."""
    import onnx

    from rnn_rewrite_rules import rewrite
    from rnn_rewrite_rules.passes import InitializerInfoFromTensorPass

    text = _OUTPUT_INITIALIZER.replace("(float[2] x)", "(float[2] x, bool flag)")
    model = ir.from_onnx_text(text)
    InitializerInfoFromTensorPass()(model)
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    after = rewrite(proto, ["fold_if"])  # a rule fires, then the passes run
    assert [n.op_type for n in after.graph.node].count("If") == 1
    onnx.checker.check_model(after, full_check=True)
    assert [o.name for o in after.graph.output] == ["y", "w", "z"]

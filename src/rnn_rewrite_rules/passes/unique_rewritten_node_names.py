"""Model-unique names for the nodes rules emitted and for the values they compute."""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import onnx_ir as ir

from rnn_rewrite_rules._ir import subgraph_owners

__all__ = ["UniqueRewrittenNodeNamesPass", "model_nodes"]

#: The metadata key onnxscript's rewriter (0.6.0 and later) puts on every node a rule emitted.
_RULE_NAME_TAG = "pkg.onnxscript.rewriter.rule_name"


def model_nodes(model: ir.Model) -> list[ir.Node]:
    """Every node of ``model``: its graph's, its subgraphs' and its functions'."""
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    for function in model.functions.values():
        nodes.extend(ir.traversal.RecursiveGraphIterator(function))
    return nodes


class UniqueRewrittenNodeNamesPass(ir.passes.InPlacePass):
    """Rename nodes a rule emitted whose name another node of the model already has.

    Each graph and subgraph names new nodes with its own counter (``node_Constant_0`` in
    both branches of an ``If``). A node a rewrite re-emitted under its original name keeps
    it (the original is gone); nodes of the original model are never renamed.

    A rule emitted the nodes not in ``original`` (the model's nodes before the rules ran,
    held weakly so that the nodes the rules removed are freed). Without it, those that
    carry onnxscript's rule-name tag, which onnxscript 0.5 does not put.
    """

    def __init__(self, original: Iterable[ir.Node] | None = None) -> None:
        super().__init__()
        self._original = None if original is None else weakref.WeakSet(original)

    def _emitted(self, node: ir.Node) -> bool:
        if self._original is None:
            return _RULE_NAME_TAG in node.metadata_props
        return node not in self._original

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        nodes = model_nodes(model)
        emitted = [n for n in nodes if self._emitted(n)]
        taken = {n.name for n in nodes if n.name and not self._emitted(n)}
        modified = False
        for node in emitted:
            if node.name:
                node.name, renamed = _unique(node.name, taken)
                modified |= renamed
        # value names: ONNX's single assignment spans subgraphs, and older onnxscript
        # releases name a subgraph's new values with the subgraph's own counter (val_0 in
        # the main graph and in a branch)
        values = {v.name for v in _fixed_values(model, nodes, emitted) if v.name}
        for node in emitted:
            for value in node.outputs:
                if value.name and not value.is_graph_output():
                    value.name, renamed = _unique(value.name, values)
                    modified |= renamed
        return ir.passes.PassResult(model, modified=modified)


def _unique(name: str, taken: set[str]) -> tuple[str, bool]:
    """``name``, or ``name_k`` with the smallest k not in ``taken``, added to it; True when
    renamed."""
    renamed = name in taken
    if renamed:
        base, index = name, 1
        while f"{base}_{index}" in taken:
            index += 1
        name = f"{base}_{index}"
    taken.add(name)
    return name, renamed


def _fixed_values(model: ir.Model, nodes: list[ir.Node], emitted: list[ir.Node]) -> list[ir.Value]:
    """The values whose names stay: every graph's inputs, initializers and outputs, and
    what the original nodes compute."""
    tops: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    graphs = [*tops, *(sub for top in tops for sub in subgraph_owners(top))]
    fixed: list[ir.Value] = []
    for graph in graphs:
        fixed.extend(graph.inputs)
        fixed.extend(graph.outputs)
        if isinstance(graph, ir.Graph):
            fixed.extend(graph.initializers.values())
    new = set(emitted)
    fixed.extend(v for n in nodes if n not in new for v in n.outputs)
    return fixed
